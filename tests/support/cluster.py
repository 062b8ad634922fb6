"""The one harness for tests that run a local cluster or a tnet program."""
from __future__ import annotations

import os

from tests.conftest import ROOT
from tnet.launch import LocalCluster


def cluster(ps: int, workers: int, command, timeout: float = 600
            ) -> LocalCluster:
    """`command` as the chief of a ps x workers cluster on 127.0.0.1,
    started in the background from the repository root."""
    return LocalCluster(ps, workers, [str(c) for c in command],
                        timeout=timeout, cwd=str(ROOT), pythonpath=str(ROOT))


def assert_all_stopped(c: LocalCluster, timeout: float = 20) -> None:
    """Every task the launcher started is gone (waits up to `timeout` s)."""
    import time
    deadline = time.monotonic() + timeout
    alive = c.alive()
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = c.alive()
    assert not alive, f"left running: {alive}"


def env() -> dict:
    """Environment for a tnet program run in one process: no TF_CONFIG,
    the checkout on PYTHONPATH, TensorFlow's info logs off."""
    out = dict(os.environ)
    out.pop("TF_CONFIG", None)
    out["PYTHONPATH"] = str(ROOT) + os.pathsep + out.get("PYTHONPATH", "")
    out.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return out
