"""Concurrency stress: many threads pull, push, export and evict one table
at once (tests/programs/stress_ops.py); afterwards no SGD update is lost,
exports saw each live key once and size equals the live keys.

STRESS_SECONDS sets the run's length (default 15); `make stress` runs long.
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROGRAM = ROOT / "tests" / "programs" / "stress_ops.py"
SECONDS = float(os.environ.get("STRESS_SECONDS", "15"))


def run_stress(*args: str, seconds: float) -> tuple[int, dict, str]:
    proc = subprocess.run(
        [sys.executable, str(PROGRAM), "--seconds", str(seconds), *args],
        capture_output=True, text=True, timeout=120 + 2 * seconds, cwd=ROOT,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    lines = [l for l in proc.stdout.splitlines() if l.startswith("STRESS ")]
    report = json.loads(lines[-1][len("STRESS "):]) if lines else {}
    return proc.returncode, report, proc.stderr[-3000:]


def test_concurrent_pull_push_export_evict_keep_every_invariant():
    rc, report, err = run_stress("--threads", "8", "--num-stripes", "4",
                                 seconds=SECONDS)
    assert rc == 0 and report.get("ok"), (report.get("errors"), report, err)
    ops = report["ops"]
    # Every role really ran, many times over.
    for role in ("push", "pull_train", "pull_infer", "export_walk", "evict"):
        assert ops.get(role, 0) >= 5, ops
    assert ops["evicted_rows"] > 0, ops
    assert report["live_rows_at_end"] >= report["hot_keys"]


def test_the_stress_checks_catch_a_lost_update():
    rc, report, err = run_stress("--threads", "2", "--self-test-forget-push",
                                 seconds=1)
    assert rc == 1, (report, err)
    assert any("lost or doubled updates" in e for e in report["errors"]), report
