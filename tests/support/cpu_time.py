"""A pytest plugin: the CPU seconds of every test, its own and its
subprocesses' (those it waited for, and the commands tests/support/forkrun.py
ran for it), one JSON line per test.

    make test PYTEST_ARGS="-p tests.support.cpu_time" TNET_CPU_LOG=/tmp/cpu
    python tools/cpu_by_file.py /tmp/cpu [/tmp/cpu-after]

Most of the suite's CPU is in subprocesses (a CLI run, a cluster's tasks:
each Python + TensorFlow start is ~5 s of CPU), which pytest's
--durations cannot see and which a shared machine's wall time hides.
Each pytest-xdist worker appends to $TNET_CPU_LOG/<worker>.jsonl."""
from __future__ import annotations

import json
import os
import resource
import sys
import time

import pytest


def _cpu(who: int) -> float:
    r = resource.getrusage(who)
    cpu = r.ru_utime + r.ru_stime
    if who == resource.RUSAGE_CHILDREN:  # commands forked elsewhere for it
        forkrun = sys.modules.get("tests.support.forkrun")
        cpu += forkrun.child_cpu if forkrun else 0.0
    return cpu


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    out = os.environ.get("TNET_CPU_LOG")
    if not out:
        yield
        return
    own, children = _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
    wall = time.monotonic()
    yield
    record = {"id": item.nodeid,
              "self": _cpu(resource.RUSAGE_SELF) - own,
              "children": _cpu(resource.RUSAGE_CHILDREN) - children,
              "wall": time.monotonic() - wall}
    os.makedirs(out, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(os.path.join(out, f"{worker}.jsonl"), "a") as f:
        f.write(json.dumps(record) + "\n")
