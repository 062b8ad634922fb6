"""examples/ run as users run them, at small sizes.

Each example ends by checking something that could fail (a served or
restored prediction against the trained model's, rows on disk, rows on
every ps) and exits non-zero if it does not hold; these tests run each one
and read what it printed.

The in-process examples run one after another in ONE Python process
(`runpy`, each with its own `sys.argv`, as `python examples/X.py ARGS`
would run it): TensorFlow is imported once for all of them, which keeps
this file to seconds per example. The local cluster, the CLI (a training
process, then an export check in another), MovieLens at full size and the
TensorNet-style rerun need processes of their own and are marked long
(their behaviour is covered in `make test` by the tests named beside
them).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import ROOT, SHARED_DATA, data_file
from tests.support import forkrun

EXAMPLES = ROOT / "examples"

# name -> arguments for `make test` (small sizes).
FAST = {
    "quickstart": ["--rows", "4096", "--epochs", "3"],
    "ranking_tfrs": ["--rows", "8000", "--epochs", "2"],
    "functional": ["--rows", "2048", "--epochs", "2"],
    "fresh_serving": ["--rounds", "2", "--rows", "512"],
    "disk_tier": ["--ids", "20000", "--rows", "4096", "--epochs", "1"],
    "two_tower": ["--generated", "--epochs", "3"],
    "tensornet_style": ["--days", "2", "--rows_per_day", "1000"],
}
LONG = {"local_cluster", "cli_csv"}

RUNNER = textwrap.dedent("""
    import contextlib, io, json, runpy, sys, time, traceback
    jobs, out = json.loads(sys.argv[1]), sys.argv[2]
    results = {}
    for name, path, args in jobs:
        sys.argv = [path, *args]
        buf, start = io.StringIO(), time.monotonic()
        try:
            with contextlib.redirect_stdout(buf):
                runpy.run_path(path, run_name="__main__")
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (e.code is not None)
        except BaseException:
            code = "raised"
            buf.write(traceback.format_exc())
        results[name] = {"code": code, "output": buf.getvalue(),
                         "seconds": round(time.monotonic() - start, 1)}
        print(f"{name}: {code} in {results[name]['seconds']}s", flush=True)
        with open(out, "w") as f:
            json.dump(results, f)
""")


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """{example: {"code", "output", "seconds"}} of every FAST example."""
    tmp = tmp_path_factory.mktemp("examples")
    jobs = [[name, str(EXAMPLES / f"{name}.py"),
             [*args, "--workdir", str(tmp / name)]]
            for name, args in FAST.items()]
    out = tmp / "results.json"
    proc = forkrun.run(  # forked from a process that imported tnet
        [sys.executable, "-c", RUNNER, json.dumps(jobs), str(out)],
        script_imports_tnet=True,
        cwd=tmp, capture_output=True, text=True, timeout=1200,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT)))
    results = json.loads(out.read_text()) if out.exists() else {}
    for name in FAST:   # a crash of the process fails every example left
        results.setdefault(name, {"code": "not run", "seconds": 0,
                                  "output": proc.stdout[-3000:] + proc.stderr[-5000:]})
    return results


def _ok(ran, name) -> str:
    r = ran[name]
    assert r["code"] == 0, f"examples/{name}.py exited {r['code']}:\n{r['output'][-5000:]}"
    assert "\nOK: " in "\n" + r["output"], r["output"][-3000:]
    assert "FAILED" not in r["output"], r["output"][-3000:]
    return r["output"]


def test_every_example_is_run_here_and_listed_in_the_index_and_site():
    files = {p.stem for p in EXAMPLES.glob("*.py")}
    assert files == set(FAST) | LONG, files ^ (set(FAST) | LONG)
    index = (EXAMPLES / "README.md").read_text()
    nav = (ROOT / "mkdocs.yml").read_text()   # docs/hooks.py makes the pages
    for name in files:
        assert f"({name}.py)" in index, f"examples/README.md does not link {name}.py"
        assert f"examples/{name}.md" in nav, f"mkdocs.yml's nav lacks {name}.py"


def test_quickstart(ran):
    out = _ok(ran, "quickstart")
    assert "rows in the user table: 1000" in out, out


def test_ranking_tfrs_restores_to_the_same_predictions(ran):
    out = _ok(ran, "ranking_tfrs")
    auc = float(re.search(r"held out: AUC (\d\.\d+)", out)[1])
    assert auc > 0.6, out


def test_functional_every_id_form_served(ran):
    out = _ok(ran, "functional")
    inputs = json.loads(re.search(r"serving inputs: (.*)", out)[1])
    assert "history" in json.dumps(inputs) and "category" in json.dumps(inputs), out


def test_fresh_serving_deltas_reach_the_served_model(ran):
    out = _ok(ran, "fresh_serving")
    rounds = re.findall(r"round (\d+): (\d+) delta\(s\) published, replica at "
                        r"delta (\d+)", out)
    assert [r[0] for r in rounds] == ["1", "2"], out
    assert int(rounds[-1][2]) >= 2, out   # deltas of both rounds applied


def test_disk_tier_trains_to_the_same_bits(ran):
    out = _ok(ran, "disk_tier")
    on_disk = int(re.search(r"([\d,]+) on disk", out)[1].replace(",", ""))
    assert on_disk > 0, out


def test_two_tower_serves_the_in_process_top_k(ran):
    out = _ok(ran, "two_tower")
    assert "generated interactions" in out, out


def test_tensornet_style_one_run(ran):
    out = _ok(ran, "tensornet_style")
    assert out.count("trained and checkpointed") == 2, out


def _run(*cmd: str) -> str:
    proc = subprocess.run([sys.executable, *cmd], capture_output=True,
                          text=True, timeout=900, cwd=ROOT,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


# make test-long. In make test: tests/test_distributed.py::
# test_rows_live_on_the_shard_that_owns_their_key trains a user program
# under a local 2-ps cluster and checks where every row lives; the export
# under a cluster is checked by tnet.train in tests/test_retrieval.py's
# cluster run and `make demo`.
@pytest.mark.long
def test_local_cluster(tmp_path):
    out = _run(str(EXAMPLES / "local_cluster.py"), "--ps", "2",
               "--workers", "1", "--rows", "4096",
               "--workdir", str(tmp_path))
    assert "OK: " in out and "FAILED" not in out, out
    per_ps = re.search(r"user_id rows per ps: \[(\d+), (\d+)\]", out)
    assert per_ps and min(int(per_ps[1]), int(per_ps[2])) > 0, out


# make test-long. In make test: tests/test_fresh.py::
# test_cli_publishes_deltas_that_bring_the_base_to_the_trained_model runs
# `python -m tnet.train` on a feature spec and checks its export against
# the trained model, tests/test_cli_bad_input.py::
# test_skip_counts_every_bad_row_per_file runs it on CSV files, and
# tests/test_readme.py runs the guide's spec and CSV reader in process.
@pytest.mark.long
def test_cli_csv_export_scores_what_the_cli_reported(tmp_path):
    out = _run(str(EXAMPLES / "cli_csv.py"), "--days", "3",
               "--rows_per_day", "1000", "--workdir", str(tmp_path))
    assert "OK: " in out and "FAILED" not in out, out
    got = re.search(r"reported by the CLI (\d\.\d+), of the served export "
                    r"(\d\.\d+)", out)
    assert got and got[1] == got[2], out


# make test-long: the same example on MovieLens 100k (test_two_tower_...
# above runs it on generated data; tests/test_retrieval.py trains, exports
# and serves TwoTower on MovieLens in make test).
@pytest.mark.long
def test_two_tower_on_movielens(tmp_path):
    data = data_file("movielens/ml-100k_ua.base").parent
    out = _run(str(EXAMPLES / "two_tower.py"), "--data_dir", str(data),
               "--train_rows", "30000", "--test_rows", "2000", "--epochs", "1",
               "--workdir", str(tmp_path))
    assert "MovieLens 100k from" in out and "OK: " in out, out


# make test-long: the daily loop's kill and resume are in test_exact_resume;
# one run of the example is test_tensornet_style_one_run above.
@pytest.mark.long
def test_tensornet_style_daily_loop_resumes_and_serves(tmp_path):
    example = str(EXAMPLES / "tensornet_style.py")
    args = ["--workdir", str(tmp_path), "--days", "3",
            "--rows_per_day", "8000"]
    first = _run(example, *args)
    assert first.count("trained and checkpointed") == 3, first
    aucs = [float(a) for a in re.findall(r"AUC (\d\.\d+)", first)]
    assert len(aucs) == 2 and aucs[-1] > 0.52, first   # it learns
    # Rerun: every day is done; nothing is trained twice or exported again,
    # and the restored model predicts what the export serves.
    again = _run(example, *args)
    assert "3 day(s) already trained" in again, again
    assert "trained and checkpointed" not in again, again
    assert "nothing new to export" in again, again
    assert "OK: " in again, again
    check = _run(str(ROOT / "tools" / "check_export.py"), "--export_dir",
                 str(tmp_path / "export" / "3"), "--sample",
                 str(tmp_path / "export_sample.npz"))
    assert "tnet imported: False" in check, check
