"""The stages of `make bench-scale` (tools/bench_scale.py) at 1M rows, each
in its own process: train + save, restore (bit-exact) + export, load and
serve without tnet (predictions equal the training process's), and the
same save / restore / export of a table sharded over 2 ps tasks."""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.long  # ~1 minute idle; `make test-long` (and make bench-scale)
def test_bench_scale_stages_at_1m_rows(tmp_path):
    out = tmp_path / "scale.json"
    run = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "bench_scale.py"),
         "--rows", "1000000", "--pss_rows", "300000", "--calls", "20",
         "--work", str(tmp_path / "work"), "--out", str(out)],
        capture_output=True, text=True, timeout=1200, cwd=ROOT)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    res = json.loads(out.read_text())["stages"]
    ts, re_, sv, pss = (res[k] for k in ("train_save", "restore_export",
                                          "serve", "pss"))
    assert ts["rows"] == 1_000_000 and re_["rows"] == 1_000_000
    assert re_["restore"]["bit_exact"]
    assert re_["export"]["payload_bytes"] == (1_000_001) * (8 + 4 * 8)
    assert not sv["tnet_imported"]
    assert sv["max_abs_diff"] < 1e-5
    assert set(sv["latency"]) == {"1", "64", "512"}
    stages = pss["stages"]
    assert stages["create"]["rows"] == 300_000
    assert stages["create"]["shards"] == 2
    assert stages["restore"]["bit_exact"]
    assert {"chief", "ps:0", "ps:1"} <= set(stages["export"]["peak_rss"])
    assert not (tmp_path / "work").exists()  # cleaned up without --keep
