"""Bring your own data: the feature spec, the TFRecord / CSV / TSV / Parquet
readers against a Python model of their parsing (tests/support/byod_data),
damaged records, and the CTR metrics against numpy references."""
from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
import tensorflow as tf

import tnet as tn
from tnet.data import metrics, spec as spec_lib
from support import byod_data as bd
from tests.support import forkrun


def _collect(ds):
    out = {k: [] for k in ("user_id", "city", "tags", "history", "price", "user", "label")}
    for features, label in ds:
        for k, v in features.items():
            out[k].extend(v.to_list() if isinstance(v, tf.RaggedTensor) else v.numpy().tolist())
        out["label"].extend(label.numpy().tolist())
    return out


def _close(got, want):
    assert got["label"] == want["label"]
    for key in ("user_id", "city", "tags", "history", "user"):
        assert got[key] == want[key], key
    np.testing.assert_allclose(got["price"], want["price"], rtol=1e-6)


def _write(fmt, path, rs, **kw):
    if fmt == "tfrecord":
        return bd.write_tfrecord(path.with_suffix(".tfrecord"), rs, **kw)
    if fmt == "tfrecord_gz":
        return bd.write_tfrecord(path.with_suffix(".tfrecord.gz"), rs, gzip_it=True)
    if fmt in ("csv", "tsv"):
        return bd.write_csv(path.with_suffix("." + fmt), rs, "," if fmt == "csv" else "\t", **kw)
    pytest.importorskip("pyarrow")
    return bd.write_parquet(path.with_suffix(".parquet"), rs, **kw)


@pytest.mark.parametrize("fmt", ["tfrecord", "tfrecord_gz", "csv", "tsv", "parquet"])
def test_reader_matches_python_model(tmp_path, fmt):
    spec = spec_lib.load(bd.write_spec(tmp_path / "spec.json"))
    rs = bd.rows(300, seed=1)
    files = [_write(fmt, tmp_path / "a", rs[:170]), _write(fmt, tmp_path / "b", rs[170:])]
    reader_fmt = "tfrecord" if fmt.startswith("tfrecord") else fmt
    got = _collect(spec.dataset([str(f) for f in files], reader_fmt, 64, with_group=True))
    _close(got, bd.expected(rs))
    assert tn.data.count_records([str(f) for f in files], reader_fmt) == 300
    # Without with_group the group key is not a model input.
    features, _ = next(iter(spec.dataset(str(files[0]), reader_fmt, 8)))
    assert "user" not in features and set(features) == {
        "user_id", "city", "tags", "history", "price"}


@pytest.mark.parametrize("fmt", ["tfrecord", "csv", "parquet"])
def test_reader_shards_every_row_once(tmp_path, fmt):
    spec = spec_lib.load(bd.write_spec(tmp_path / "spec.json"))
    rs = bd.rows(200, seed=2)
    one = [str(_write(fmt, tmp_path / "a", rs))]          # by record / row group
    many = [str(_write(fmt, tmp_path / f"p{i}", rs[i::3])) for i in range(3)]  # by file
    for files in (one, many):
        seen = []
        for pipe in range(2):
            ctx = tf.distribute.InputContext(2, pipe, 1)
            seen += _collect(spec.dataset(files, fmt, 16, input_context=ctx))["price"]
        np.testing.assert_allclose(sorted(seen), sorted(r["price"] for r in rs), rtol=1e-6)


def test_tfrecord_damaged_records(tmp_path):
    spec = spec_lib.load(bd.write_spec(tmp_path / "spec.json"))
    rs = bd.rows(120, seed=3)
    wrong_type = tf.train.Example(features=tf.train.Features(feature={
        "click": tf.train.Feature(int64_list=tf.train.Int64List(value=[0])),
        "user_id": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"x"]))})
    ).SerializeToString()
    bad_label = dict(rs[50], click=3)
    damaged = {7: b"not a proto", 50: bd.example(bad_label), 80: wrong_type, 119: b"\x00"}
    path = bd.write_tfrecord(tmp_path / "d.tfrecord", rs, damaged=damaged)
    # fail: a record of the wrong type is named by file:record and feature
    # (an unparseable one only by its bytes: TF's parser does not name it).
    spec_path = bd.write_tfrecord(tmp_path / "t.tfrecord", rs, damaged={80: wrong_type})
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"t\.tfrecord:81, Key: user_id"):
        for _ in spec.dataset(str(spec_path), "tfrecord", 256):
            pass
    label_path = bd.write_tfrecord(tmp_path / "l.tfrecord", rs, damaged={50: damaged[50]})
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"l\.tfrecord:51: feature .{1,2}click.{1,2} value 3\.0* is not a label"):
        for _ in spec.dataset(str(label_path), "tfrecord", 256):
            pass
    stats = tn.data.ReadStats()
    got = _collect(spec.dataset(str(path), "tfrecord", 32, bad_rows="skip",
                                stats=stats, with_group=True))
    good = [r for i, r in enumerate(rs) if i not in damaged]
    _close(got, bd.expected(good))
    assert (stats.lines_read, stats.rows, stats.skipped) == (120, 116, 4)
    assert any("d.tfrecord:8" in e for e in stats.examples)


def test_csv_damaged_lines_and_header(tmp_path):
    spec = spec_lib.load(bd.write_spec(tmp_path / "spec.json"))
    rs = bd.rows(60, seed=4)
    damaged = {3: "1,abc,c1,,,0.5,x", 10: "0,1,c1", 20: "2,1,c1,,,0.5,x"}
    path = bd.write_csv(tmp_path / "d.csv", rs, damaged=damaged)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"d\.csv:5: user_id `abc`"):
        for _ in spec.dataset(str(path), "csv", 16):
            pass
    stats = tn.data.ReadStats()
    got = _collect(spec.dataset(str(path), "csv", 16, bad_rows="skip", stats=stats,
                                with_group=True))
    _close(got, bd.expected([r for i, r in enumerate(rs) if i not in damaged]))
    assert stats.skipped == 3
    other = tmp_path / "h.csv"
    other.write_text("click,user\n1,2\n")
    with pytest.raises(ValueError, match=r"h\.csv:1: the header has no column for "
                                         r"feature\(s\) user_id"):
        spec.dataset(str(other), "csv", 4)


def test_parquet_bad_rows_and_types(tmp_path):
    pytest.importorskip("pyarrow")
    spec = spec_lib.load(bd.write_spec(tmp_path / "spec.json"))
    rs = bd.rows(100, seed=5)
    path = bd.write_parquet(tmp_path / "d.parquet", rs, row_group_size=30,
                            null_label_rows=(40, 41))
    with pytest.raises(Exception, match=r"d\.parquet:41: feature 'click'"):
        for _ in spec.dataset(str(path), "parquet", 16):
            pass
    stats = tn.data.ReadStats()
    got = _collect(spec.dataset(str(path), "parquet", 16, bad_rows="skip", stats=stats,
                                with_group=True))
    _close(got, bd.expected([r for i, r in enumerate(rs) if i not in (40, 41)]))
    assert stats.skipped == 2
    wrong = json.loads(json.dumps(bd.SPEC))
    wrong["features"][1]["dtype"] = "string"   # user_id is int64 in the file
    wrong["features"][6]["dtype"] = "string"   # the group key reads it too
    bad_spec = spec_lib.from_dict(wrong, "wrong.json")
    with pytest.raises(Exception, match=r"d\.parquet: feature 'user(_id)?' .*spec says string"):
        for _ in bad_spec.dataset(str(path), "parquet", 16):
            pass


@pytest.mark.parametrize("change, message", [
    (lambda s: s["features"].pop(0), "exactly one feature of kind 'label'"),
    (lambda s: s["features"][1].update(kind="idd"), "'user_id': kind must be one of"),
    (lambda s: s["features"][1].update(dim=0), "'user_id': dim must be a positive"),
    (lambda s: s["features"][2].update(combiner="max"), "'city': combiner must be"),
    (lambda s: s["features"][5].update(table="t"), r"'price': \['table'\] apply to id"),
    (lambda s: s["features"][3].update(dtype="float32"), "'tags': a ids feature's dtype"),
    (lambda s: s["features"][1].update(colour=1), r"'user_id': unknown fields \['colour'\]"),
    (lambda s: s["features"].append(dict(s["features"][1])), "'user_id' is listed twice"),
    (lambda s: (s["features"][1].update(table="u", dim=8),
                s["features"][2].update(table="u", dim=4)),
     "'user_id' and 'city' share table 'u' but differ in dim"),
])
def test_spec_errors_name_file_and_feature(tmp_path, change, message):
    data = json.loads(json.dumps(bd.SPEC))
    change(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(spec_lib.SpecError, match=f"bad.json: .*{message}"):
        spec_lib.load(path)


def test_spec_columns_and_yaml(tmp_path):
    spec = spec_lib.load(bd.write_spec(tmp_path / "spec.json"))
    cols = spec.embedding_columns(default_dim=8)
    assert [(c.key, c.dimension, c.combiner, c.table) for c in cols] == [
        ("user_id", 4, "mean", "embedding"), ("city", 4, "mean", "embedding"),
        ("tags", 4, "sum", "embedding"), ("history", 4, "mean", "embedding")]
    assert spec.dense == ["price"] and spec.group_key == "user"
    (tmp_path / "s.yaml").write_text("features: []\n")
    try:
        import yaml  # noqa: F401
    except ImportError:
        with pytest.raises(spec_lib.SpecError, match="pip install pyyaml"):
            spec_lib.load(tmp_path / "s.yaml")
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(spec_lib.SpecError, match="broken.json: not valid JSON"):
        spec_lib.load(tmp_path / "broken.json")


def test_group_auc_and_calibration_against_numpy():
    rng = np.random.default_rng(0)
    for _ in range(30):
        n = int(rng.integers(2, 400))
        g = rng.integers(0, 12, n)
        y = rng.random(n) < 0.3
        s = rng.integers(0, 6, n) / 5.0          # many ties
        num = den = groups = 0
        for gg in np.unique(g):
            m = g == gg
            if y[m].all() or not y[m].any():
                continue
            num += metrics.auc(y[m], s[m]) * m.sum()
            den += m.sum()
            groups += 1
        got, counted = metrics.group_auc(y, s, g)
        assert counted == groups
        if den:
            assert got == pytest.approx(num / den, abs=1e-12)
        else:
            assert np.isnan(got)
        p = rng.random(n)
        if y.any():
            assert metrics.calibration(y, p) == pytest.approx(p.mean() / y.mean())


def test_model_reports_calibration_and_gauc(tmp_path):
    spec = spec_lib.load(bd.write_spec(tmp_path / "spec.json"))
    rs = bd.rows(400, seed=6)
    path = str(bd.write_tfrecord(tmp_path / "a.tfrecord", rs))
    model = tn.models.WideDeep(spec.embedding_columns(), spec.dense, hidden_units=[8])
    model.compile(tn.optimizer.Adagrad(0.05))
    logs = model.fit(spec.dataset(path, "tfrecord", 64), verbose=0).history
    assert "calibration" in logs
    result = model.evaluate_exact(spec.dataset(path, "tfrecord", 64, with_group=True),
                                  group_key="user")
    features, labels = next(iter(spec.dataset(path, "tfrecord", 400, with_group=True)))
    users = features.pop("user").numpy()
    p = model(features, training=False).numpy().reshape(-1)
    y = labels.numpy()
    assert result["calibration"] == pytest.approx(p.sum() / y.sum(), rel=1e-5)
    assert result["gauc"] == pytest.approx(metrics.group_auc(y, p, users)[0], abs=1e-6)
    assert result["auc"] == pytest.approx(metrics.auc(y, p), abs=1e-6)
    # Rows of users never trained on: evaluated, counted, no table grows.
    unseen = str(bd.write_tfrecord(tmp_path / "b.tfrecord", bd.rows(300, seed=7, users=500)))
    sizes = {n: int(t.size()) for n, t in model.tables().items()}
    assert model.evaluate_exact(spec.dataset(unseen, "tfrecord", 64))["examples"] == 300
    assert {n: int(t.size()) for n, t in model.tables().items()} == sizes


def _record_spans(data: bytes) -> list[tuple[int, int]]:
    """(start, end) byte span of each record of an uncompressed TFRecord
    file: 8-byte length, 4-byte crc, data, 4-byte crc."""
    spans, pos = [], 0
    while pos + 12 <= len(data):
        n = int.from_bytes(data[pos:pos + 8], "little")
        spans.append((pos, pos + 16 + n))
        pos += 16 + n
    return spans


def test_unreadable_tfrecord_names_file_and_record(tmp_path):
    """TF's DataLossError for a damaged TFRecord names neither the file nor
    the record; count_records (run by tnet.train first) and
    find_bad_records do."""
    spec = spec_lib.load(bd.write_spec(tmp_path / "spec.json"))
    good = bd.write_tfrecord(tmp_path / "good.tfrecord", bd.rows(120, seed=3))
    data = good.read_bytes()
    spans = _record_spans(data)
    assert len(spans) == 120
    flip = 500
    hit = next(i for i, (a, b) in enumerate(spans) if a <= flip < b)
    corrupt = bytearray(data)
    corrupt[flip] ^= 0xFF
    (tmp_path / "flipped.tfrecord").write_bytes(bytes(corrupt))
    (tmp_path / "cut.tfrecord").write_bytes(data[:-7])
    assert tn.data.count_records([str(good)], "tfrecord") == 120
    for name, record in (("flipped", hit + 1), ("cut", 120)):
        path = tmp_path / f"{name}.tfrecord"
        with pytest.raises(tf.errors.DataLossError,
                           match=rf"{name}\.tfrecord:{record}: unreadable TFRecord"):
            tn.data.count_records([str(good), str(path)], "tfrecord")
        found = tn.data.find_bad_records(spec, [str(good), str(path)],
                                                 "tfrecord")
        assert len(found) == 1 and f"{name}.tfrecord:{record}:" in found[0]


def test_unparseable_record_is_named_by_tnet_train(tmp_path):
    """In fail mode TF's parse error for a record that is not a tf.Example
    carries no file or record; tnet.train finds it and exits 4 naming it."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415
    spec_path = bd.write_spec(tmp_path / "spec.json")
    spec = spec_lib.load(spec_path)
    rs = bd.rows(200, seed=4)
    bad = bd.write_tfrecord(tmp_path / "train.tfrecord", rs,
                            damaged={150: b"not a proto"})
    good = bd.write_tfrecord(tmp_path / "eval.tfrecord", rs[:64])
    found = tn.data.find_bad_records(spec, [str(good), str(bad)], "tfrecord")
    assert len(found) == 1 and "train.tfrecord:151:" in found[0], found
    root = pathlib.Path(__file__).resolve().parents[1]
    proc = forkrun.run(
        [sys.executable, "-m", "tnet.train", f"--feature_spec={spec_path}",
         "--format=tfrecord", f"--train_files={bad}", f"--eval_files={good}",
         f"--model_dir={tmp_path / 'run'}", "--hidden_units=8",
         "--batch_size=32", "--shuffle_buffer=0"],
        cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 4, proc.stderr[-3000:]
    assert "train.tfrecord:151:" in proc.stderr, proc.stderr[-3000:]
    assert "--bad_rows=skip" in proc.stderr
