"""tn.serving.export_for_serving: SavedModels that serve without tnet.

Three small models (WideDeep and DCN on int ids, DeepFM on string ids) train
a few steps on synthetic data and are exported in every quantize mode. One
fresh Python process that never imports tnet (and runs with Keras 3 selected,
TF_USE_LEGACY_KERAS unset) loads every export, calls `serving_default` with
plain tensors and with the inputs of a TF Serving `PredictRequest`, and
returns the predictions, which must match `model.predict` here.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tnet as tn
from tnet.layers import lookup
from tnet.models import DCN, DeepFM, WideDeep
from tnet.serving import export as export_lib
from tnet.serving import op_check
from tnet import scopes
from tnet.serving import export_for_serving
from tests.support import forkrun

CATEGORICAL = ["C1", "C2", "C3"]
DENSE = ["I1", "I2"]
VOCAB = {"C1": 40, "C2": 25, "C3": 12}
MODES = {"float32": None, "float16": "float16", "int8": "int8"}
TOLERANCE = {"float32": 1e-5, "float16": 1e-3, "int8": 1e-2}
MODELS = {  # name: (class, string ids, extra kwargs)
    "widedeep": (WideDeep, False, {}),
    "deepfm": (DeepFM, True, {}),
    "dcn": (DCN, False, {"num_cross": 2}),
}


def _ids(values, string_ids):
    if not string_ids:
        return values.astype(np.int64)
    out = np.array([f"id{v}".encode() for v in values], dtype=object)
    out[values == -1] = b""  # padding
    return out


def _features(rng, n, string_ids, offset=0, padding=0.0):
    feats = {}
    for name in CATEGORICAL:
        ids = rng.integers(0, VOCAB[name], n) + offset
        ids[rng.random(n) < padding] = -1
        feats[name] = _ids(ids, string_ids)
    for name in DENSE:
        feats[name] = rng.normal(size=n).astype(np.float32)
    return feats


def _train(cls, string_ids, kwargs, seed):
    tf.keras.utils.set_random_seed(seed)
    rng = np.random.default_rng(seed)
    feats = _features(rng, 256, string_ids)
    labels = (rng.random(256) < 0.3).astype(np.float32)
    model = cls(CATEGORICAL, DENSE, embedding_dim=8, hidden_units=(16,),
                string_ids=string_ids, **kwargs)
    model.compile(tn.optimizer.Adagrad(0.1))
    model.fit(tf.data.Dataset.from_tensor_slices((feats, labels)).batch(64),
              epochs=1, verbose=0)
    return model, rng


def _eval_sets(rng, string_ids):
    """known ids (some padding), ids never trained, and a mix of both."""
    known = _features(rng, 48, string_ids, padding=0.1)
    unknown = _features(rng, 16, string_ids, offset=10_000)
    mixed = _features(rng, 16, string_ids)
    mixed["C2"] = unknown["C2"]
    return {"known": known, "unknown": unknown, "mixed": mixed}


# Runs in a fresh interpreter: stock TensorFlow and tensorflow-serving-api only.
_LOADER = r"""
import json, sys
import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2

jobs = json.loads(sys.argv[1])
results = {}
for job in jobs:
    loaded = tf.saved_model.load(job["export"])
    sig = loaded.signatures["serving_default"]
    for set_name, path in job["inputs"].items():
        feats = dict(np.load(path, allow_pickle=True))
        direct = sig(**{k: tf.constant(v.tolist() if v.dtype == object else v)
                        for k, v in feats.items()})
        key = job["key"] + "/" + set_name
        results[key + "/direct"] = direct["prediction"].numpy()
        # What TF Serving receives: a PredictRequest on the wire.
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "tnet"
        request.model_spec.signature_name = "serving_default"
        for k, v in feats.items():
            request.inputs[k].CopyFrom(tf.make_tensor_proto(v.tolist() if v.dtype == object else v))
        request = predict_pb2.PredictRequest.FromString(request.SerializeToString())
        assert set(request.inputs) == set(sig.structured_input_signature[1])
        served = sig(**{k: tf.constant(tf.make_ndarray(request.inputs[k]))
                        for k in request.inputs})
        results[key + "/request"] = served["prediction"].numpy()
np.savez(sys.argv[2], **results)
print(json.dumps({"tnet_imported": "tnet" in sys.modules,
                  "keras_env": __import__("os").environ.get("TF_USE_LEGACY_KERAS")}))
"""


def _fresh_env():
    env = dict(os.environ)
    env.pop("TF_USE_LEGACY_KERAS", None)  # the loader needs no Keras 2
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    models, expected, jobs = {}, {}, []
    for seed, (name, (cls, string_ids, kwargs)) in enumerate(MODELS.items()):
        model, rng = _train(cls, string_ids, kwargs, seed)
        models[name] = model
        inputs = {}
        for set_name, feats in _eval_sets(rng, string_ids).items():
            path = root / f"{name}-{set_name}.npz"
            np.savez(path, **feats)
            inputs[set_name] = str(path)
            expected[(name, set_name)] = model.predict(
                {k: tf.constant(v.tolist() if v.dtype == object else v)
                 for k, v in feats.items()}, batch_size=64, verbose=0)
        for mode, quantize in MODES.items():
            path = export_for_serving(model, root / name / mode,
                                      quantize=quantize)
            jobs.append({"key": f"{name}/{mode}", "export": path,
                         "inputs": inputs})
    out = root / "served.npz"
    run = subprocess.run([sys.executable, "-c", _LOADER, json.dumps(jobs),
                          str(out)], env=_fresh_env(), capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    status = json.loads(run.stdout.strip().splitlines()[-1])
    return {"root": root, "models": models, "expected": expected,
            "served": dict(np.load(out)), "status": status,
            "dirs": {j["key"]: j["export"] for j in jobs},
            "inputs": {name: j["inputs"] for j in jobs
                       for name in [j["key"].split("/")[0]]}}


def test_loader_never_imported_tnet(exports):
    assert exports["status"] == {"tnet_imported": False, "keras_env": None}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("name", list(MODELS))
def test_round_trip_matches_predict(exports, name, mode):
    for set_name in ("known", "mixed"):
        want = exports["expected"][(name, set_name)]
        got = exports["served"][f"{name}/{mode}/{set_name}/direct"]
        assert got.shape == want.shape == (len(want), 1)
        np.testing.assert_allclose(got, want, rtol=0, atol=TOLERANCE[mode],
                                   err_msg=f"{name} {mode} {set_name}")
    if mode != "float32":  # quantization did change the numbers
        exact = exports["served"][f"{name}/float32/mixed/direct"]
        assert np.abs(got - exact).max() > 0


@pytest.mark.parametrize("name", list(MODELS))
def test_unknown_ids_read_zero_rows(exports, name):
    """Ids never trained: the export predicts what tnet's inference pull
    (zeros for unknown keys) predicts."""
    want = exports["expected"][(name, "unknown")]
    for mode in MODES:
        got = exports["served"][f"{name}/{mode}/unknown/direct"]
        np.testing.assert_allclose(got, want, rtol=0, atol=TOLERANCE[mode])
    # The predictions differ from the known-id ones: the rows matter.
    known = exports["expected"][(name, "known")][:len(want)]
    assert np.abs(known - want).max() > 1e-4


@pytest.mark.parametrize("name", list(MODELS))
def test_predict_request_round_trip(exports, name):
    for mode in MODES:
        for set_name in ("known", "unknown", "mixed"):
            key = f"{name}/{mode}/{set_name}"
            np.testing.assert_array_equal(exports["served"][key + "/request"],
                                          exports["served"][key + "/direct"])
            np.testing.assert_allclose(
                exports["served"][key + "/request"],
                exports["expected"][(name, set_name)], rtol=0,
                atol=TOLERANCE[mode])


def test_saved_model_cli_run(exports, tmp_path):
    feats = dict(np.load(exports["inputs"]["widedeep"]["known"]))
    # The CLI accepts Python literals only; the session feed casts them to
    # the signature's dtypes (float32 -> repr -> float32 is exact).
    exprs = ";".join(f"{k}={v.tolist()!r}" for k, v in feats.items())
    cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
    run = subprocess.run(
        [cli, "run", "--dir", exports["dirs"]["widedeep/float32"],
         "--tag_set", "serve", "--signature_def", "serving_default",
         "--input_exprs", exprs, "--outdir", str(tmp_path)],
        env=_fresh_env(), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    got = np.load(tmp_path / "prediction.npy")
    np.testing.assert_allclose(got, exports["expected"][("widedeep", "known")],
                               rtol=0, atol=1e-5)


def test_exports_hold_no_tnet_op_and_no_cluster_device(exports):
    for path in exports["dirs"].values():
        assert export_lib.tnet_ops_in(path) == {}
        _, nodes = op_check._saved_graph_nodes(path)
        assert not [n.device for _, n in nodes if "/job:" in n.device]
        assert sorted(os.listdir(path)) == ["assets", "export_info.json",
                                            "fingerprint.pb",
                                            "saved_model.pb", "variables"]
    parent = os.path.dirname(exports["dirs"]["dcn/int8"])
    assert sorted(os.listdir(parent)) == sorted(MODES)  # no temp dirs left


def test_scan_finds_tnet_ops(tmp_path):
    """The scanner itself: a SavedModel that does call a table op."""
    table = tn.SparseTable("scanned", dim=2)
    module = tf.Module()
    module.table = table
    module.pull = tf.function(
        lambda k: table.pull(k),
        input_signature=[tf.TensorSpec([None], tf.int64)])
    tf.saved_model.save(module, str(tmp_path / "raw"))
    found = export_lib.tnet_ops_in(str(tmp_path / "raw"))
    assert "SparseTablePullV2" in found


def test_scan_finds_custom_ops_of_any_name(tmp_path):
    """The check compares op types with what a process without tnet has
    registered, so an op not named SparseTable* (TnetSumRows) is found."""
    stock = export_lib.stock_op_types()
    assert {"MatMul", "UnsortedSegmentSum", "MutableHashTableV2"} <= stock
    assert not {"TnetSumRows", "SparseTablePull"} & stock
    module = tf.Module()
    module.sum = tf.function(
        lambda v, i: lookup.sum_rows(v, i, 3),
        input_signature=[tf.TensorSpec([None, 2], tf.float32),
                         tf.TensorSpec([None], tf.int32)])
    tf.saved_model.save(module, str(tmp_path / "raw"))
    assert set(export_lib.tnet_ops_in(str(tmp_path / "raw"))) == {
        "TnetSumRows"}


def test_export_fails_loudly_if_a_table_op_remains(exports, tmp_path,
                                                   monkeypatch):
    """If the serving override were not honoured, nothing is exported."""
    import contextlib
    monkeypatch.setattr(scopes, "serving_lookups",
                        lambda overrides: contextlib.nullcontext())
    target = tmp_path / "bad"
    with pytest.raises(RuntimeError, match="SparseTablePull"):
        export_for_serving(exports["models"]["widedeep"], target)
    assert os.listdir(tmp_path) == []


def test_quantized_exports_are_smaller(exports):
    for name in MODELS:
        info = {}
        for mode in MODES:
            with open(os.path.join(exports["dirs"][f"{name}/{mode}"],
                                   "export_info.json")) as f:
                info[mode] = json.load(f)
        tables = info["float32"]["tables"]
        assert set(tables) == set(exports["models"][name].tables())
        for table, entry in tables.items():
            assert entry["rows"] == int(exports["models"][name].tables()[table].size())
            f32 = entry["matrix_bytes"] + entry["scale_bytes"]
            f16 = (info["float16"]["tables"][table]["matrix_bytes"]
                   + info["float16"]["tables"][table]["scale_bytes"])
            i8 = (info["int8"]["tables"][table]["matrix_bytes"]
                  + info["int8"]["tables"][table]["scale_bytes"])
            assert f32 == (entry["rows"] + 1) * entry["dim"] * 4
            assert f16 * 2 == f32
            int8_dtype = info["int8"]["tables"][table]["dtype"]
            if entry["dim"] >= 5:  # int8 + a float32 scale per row
                assert int8_dtype == "int8" and i8 < f16
            else:  # 1-wide rows: the scale would cost more than it saves
                assert int8_dtype == "float16" and i8 == f16
        variables = {m: sum(
            os.path.getsize(os.path.join(exports["dirs"][f"{name}/{m}"],
                                         "variables", f))
            for f in os.listdir(os.path.join(exports["dirs"][f"{name}/{m}"],
                                             "variables"))) for m in MODES}
        assert variables["int8"] < variables["float16"] < variables["float32"]
        assert info["int8"]["quantize"] == "int8"


def test_int8_quantization_error_is_bounded():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(100, 8)).astype(np.float32)
    w[3] = 0.0
    q, scale = export_lib.quantize_int8(w)
    assert q.dtype == np.int8 and scale.dtype == np.float32
    back = q.astype(np.float32) * scale[:, None]
    assert np.all(np.abs(back - w) <= scale[:, None] / 2 + 1e-7)
    assert np.all(back[3] == 0.0)
    assert np.abs(q).max() == 127


def test_strip_cluster_devices(exports, tmp_path):
    """A graph traced next to ps variables loses only job/replica/task."""
    import shutil
    path = str(tmp_path / "copy")
    shutil.copytree(exports["dirs"]["widedeep/float32"], path)
    proto, nodes = op_check._saved_graph_nodes(path)
    for _, node in nodes:
        node.device = "/job:ps/replica:0/task:1/device:CPU:0"
    with open(os.path.join(path, "saved_model.pb"), "wb") as f:
        f.write(proto.SerializeToString())
    op_check.strip_cluster_devices(path)
    _, nodes = op_check._saved_graph_nodes(path)
    assert {n.device for _, n in nodes} == {"/device:CPU:0"}


def test_bad_arguments(exports, tmp_path):
    model = exports["models"]["widedeep"]
    with pytest.raises(ValueError, match="quantize"):
        export_for_serving(model, tmp_path / "q", quantize="int4")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(FileExistsError, match="not empty"):
        export_for_serving(model, tmp_path / "full")

    class NoSignature(tn.Model):
        def __init__(self):
            super().__init__()
            col = tn.feature_column.category_column("u")
            self.emb = tn.layers.EmbeddingFeatures(
                [tn.feature_column.embedding_column(col, 2)])

        def call(self, features, training=False):
            return self.emb(features, training=training)

    plain = NoSignature()
    plain.emb.build(None)  # tables exist, but the model was never called
    with pytest.raises(ValueError, match="not been called.*input_signature"):
        export_for_serving(plain, tmp_path / "nosig")
    # A signature that lacks a feature the model reads: named in the error.
    with pytest.raises(ValueError, match="'u'"):
        export_for_serving(
            plain, tmp_path / "lacks",
            input_signature={"v": tf.TensorSpec([None], tf.int64)})
    assert not (tmp_path / "lacks").exists()
    path = export_for_serving(
        plain, tmp_path / "sig",
        input_signature={"u": tf.TensorSpec([None], tf.int64)})
    assert export_lib.tnet_ops_in(path) == {}
    # Once called, the signature is inferred as Keras' model.save does.
    called = NoSignature()
    called({"u": tf.constant([[1], [2]], tf.int64)})
    path = export_for_serving(called, tmp_path / "inferred")
    with open(os.path.join(path, export_lib.INFO_FILE)) as f:
        assert json.load(f)["inputs"] == {
            "u": {"dtype": "int64", "shape": [None, 1]}}


def test_cli_export_of_a_string_id_model_is_checked_without_tnet(tmp_path):
    # Avazu ids are strings: the CLI's export check must carry them to the
    # fresh checker process (an .npz of object arrays needs pickle there).
    from tests.conftest import ROOT, data_file  # noqa: PLC0415
    data = data_file("avazu/avazu_train_oct21-22.csv")
    model_dir = tmp_path / "run"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    proc = forkrun.run(
        [sys.executable, "-m", "tnet.train",
         "--flagfile=configs/wide_deep_avazu.cfg", f"--train_files={data}",
         "--train_rows=600", "--epochs=1", f"--model_dir={model_dir}",
         f"--export_dir={tmp_path / 'export'}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "tnet imported: False" in proc.stdout
    summary = json.loads((model_dir / "summary.json").read_text())
    assert summary["export"]["checked_without_tnet"] is True


def test_serving_names_moved_from_saving_still_work():
    """The serving names moved from tn.saving to tn.serving; users' code
    that reads them from tn.saving (attribute or `from ... import`) gets
    the same objects."""
    from tnet.saving import (DeltaError, ExportWriteError,  # noqa: PLC0415
                             publish_delta)
    from tnet.saving import export_for_serving as old_export  # noqa: PLC0415
    assert old_export is tn.serving.export_for_serving is export_for_serving
    assert tn.saving.export_for_serving is export_lib.export_for_serving
    assert publish_delta is tn.serving.publish_delta
    assert DeltaError is tn.serving.DeltaError
    assert ExportWriteError is tn.serving.ExportWriteError
