"""Conformance matrix: what users feed tnet, not what tnet's own models do.

Every input form (`[B]`, `[B, 1]`, `[B, L]` padded with -1 / "",
`tf.SparseTensor`, `tf.RaggedTensor`) with int64 and string ids, in every
way of writing a model (TFRS-style subclass, Keras subclass with
`compile(loss=...)`, functional `tn.Model(inputs, outputs)` over Keras
`Input`s including `sparse=True` / `ragged=True`, `tn.models.WideDeep`),
with every sparse rule, plus two cases whose features come in different
forms (a table read by a ragged and a `[B]` column at once), goes through:

  fit a few steps -> tn.saving.save -> restore in a fresh process ->
  predictions equal -> export_for_serving (signature inferred) -> load in
  a process that never imports tnet -> predictions equal to the model's.

The models live in tests/programs/conformance_models.py. The fresh-process
steps run once for all the cases (one restoring process, one loading
process) to keep the matrix fast.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import tnet as tn
from tnet.serving import export as export_lib
from tests.support import forkrun

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "programs"))
import conformance_models as cm  # noqa: E402

CASES = cm.cases()
PROGRAM = os.path.join(os.path.dirname(__file__), "programs",
                       "conformance_models.py")

# Loads every export with stock TensorFlow only and serves the inputs.
_LOADER = r"""
import json, sys
import numpy as np
import tensorflow as tf
jobs = json.loads(open(sys.argv[1]).read())
for job in jobs:
    sig = tf.saved_model.load(job["export"]).signatures["serving_default"]
    feats = dict(np.load(job["inputs"], allow_pickle=True))
    got = sig(**{k: tf.constant(v.tolist() if v.dtype == object else v)
                 for k, v in feats.items()})["prediction"]
    np.save(job["out"], got.numpy().reshape(-1))
print(json.dumps({"tnet_imported": any(m == "tnet" or m.startswith("tnet.")
                                       for m in sys.modules),
                  "served": len(jobs)}))
"""


def _fresh_env():
    env = dict(os.environ)
    env.pop("TF_USE_LEGACY_KERAS", None)
    env.pop("LD_PRELOAD", None)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env


# The whole matrix is built by one module fixture: one restoring and one
# loading process for all the cases. (Built in two halves, one per
# pytest-xdist worker, it cost two more Python + TensorFlow starts; make
# test sends a file to one worker, so the halves did not overlap.)
@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    return _matrix(CASES, tmp_path_factory)


def _matrix(cases, tmp_path_factory):
    root = tmp_path_factory.mktemp("conformance")
    results, restore_jobs, load_jobs = {}, [], []
    for case in cases:
        name = cm.case_id(case)
        model = cm.build(case)
        history = model.fit(cm.dataset(case), epochs=2, verbose=0)
        want, served = cm.predict(model, case)
        ckpt = str(root / name / "ckpt")
        tn.saving.save(model, ckpt, progress=lambda _: None)
        export = tn.serving.export_for_serving(model, str(root / name / "1"))
        inputs = str(root / name / "inputs.npz")
        np.savez(inputs, **served)
        restore_jobs.append({"case": list(case), "ckpt": ckpt,
                             "out": str(root / name / "restored.npy")})
        load_jobs.append({"export": export, "inputs": inputs,
                          "out": str(root / name / "served.npy")})
        results[case] = {"want": want, "loss": history.history["loss"],
                         "export": export,
                         "rows": {n: int(t.size())
                                  for n, t in model.tables().items()}}
    # The restores (a fresh process with tnet) and the loads (a fresh
    # process without it) are independent: they run side by side.
    runs = []
    for kind, jobs, cmd in (("restore", restore_jobs, [PROGRAM, "restore"]),
                            ("load", load_jobs, ["-c", _LOADER])):
        path = root / f"jobs-{kind}.json"  # both exist at once
        path.write_text(json.dumps(jobs))
        env = _fresh_env() if cmd[0] == "-c" else dict(os.environ)
        # Output to files: a full pipe would stall one while we wait on
        # the other.
        out, err = root / f"{kind}.out", root / f"{kind}.err"
        # The restore forks from a process that imported tnet and nothing
        # else (tests/support/forkrun.py); the loader starts afresh.
        with open(out, "w") as o, open(err, "w") as e:
            runs.append((jobs, cmd, out, err, forkrun.Popen(
                [sys.executable, *cmd, str(path)], env=env, cwd=str(root),
                stdout=o, stderr=e, script_imports_tnet=cmd[0] != "-c")))
    for jobs, cmd, out, err, proc in runs:
        try:
            proc.wait(timeout=900)
        except subprocess.TimeoutExpired:
            for *_, p in runs:
                p.kill()
            raise
        assert proc.returncode == 0, err.read_text()[-4000:]
        status = json.loads(out.read_text().strip().splitlines()[-1])
        if cmd[0] == "-c":
            assert status == {"tnet_imported": False, "served": len(jobs)}
    for case, job_r, job_l in zip(cases, restore_jobs, load_jobs):
        results[case]["restored"] = np.load(job_r["out"])
        results[case]["served"] = np.load(job_l["out"])
    return results


@pytest.mark.parametrize("case", CASES, ids=cm.case_id)
def test_fit_restore_export_serve(matrix, case):
    r = matrix[case]
    # fit trained: finite losses, rows were created in every table.
    assert np.all(np.isfinite(r["loss"])), r["loss"]
    assert r["rows"] and all(n > 0 for n in r["rows"].values()), r["rows"]
    assert np.all(np.isfinite(r["want"]))
    # Restored in a fresh process: the same predictions.
    np.testing.assert_allclose(r["restored"], r["want"], rtol=0, atol=1e-6)
    # Served by stock TensorFlow without tnet: the same predictions.
    np.testing.assert_allclose(r["served"], r["want"], rtol=0, atol=1e-5)
    # No op a process without tnet lacks, of any name.
    assert export_lib.tnet_ops_in(r["export"]) == {}


def test_matrix_covers_every_form_style_and_rule():
    assert {c[0] for c in CASES} == set(cm.FORMS) | {cm.MIXED}
    assert {c[1] for c in CASES} == set(cm.DTYPES)
    assert {c[2] for c in CASES} == set(cm.STYLES)
    for form in cm.FORMS:
        assert {c[3] for c in CASES if c[0] == form} == set(cm.RULES), form
    for style in cm.STYLES:
        rules = {c[3] for c in CASES if c[2] == style}
        assert len(rules) >= (4 if style == "tn_models" else 5), style
