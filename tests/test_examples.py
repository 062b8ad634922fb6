"""examples/ run as users run them (a subprocess each, as on the command
line): the TensorNet-style daily loop trains, resumes without retraining a
day, and exports a SavedModel that serves in a process without tnet."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT


def _run(*cmd: str) -> str:
    proc = subprocess.run([sys.executable, *cmd], capture_output=True,
                          text=True, timeout=900, cwd=ROOT,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


# make test-long: the daily loop's kill and resume are in test_exact_resume.
@pytest.mark.long
def test_tensornet_style_daily_loop_resumes_and_serves(tmp_path):
    example = str(ROOT / "examples" / "tensornet_style.py")
    args = ["--workdir", str(tmp_path), "--days", "3",
            "--rows_per_day", "8000"]
    first = _run(example, *args)
    assert first.count("trained and checkpointed") == 3, first
    aucs = [float(a) for a in re.findall(r"AUC (\d\.\d+)", first)]
    assert len(aucs) == 2 and aucs[-1] > 0.52, first   # it learns
    # Rerun: every day is done; nothing is trained twice or exported again.
    again = _run(example, *args)
    assert "3 day(s) already trained" in again, again
    assert "trained and checkpointed" not in again, again
    assert "nothing new to export" in again, again
    check = _run(str(ROOT / "tools" / "check_export.py"), "--export_dir",
                 str(tmp_path / "export" / "3"), "--sample",
                 str(tmp_path / "export_sample.npz"))
    assert "tnet imported: False" in check, check
