"""The streamed serving structure of tnet.serving.serving_table: mixed sorted
keys + searchsorted, written slice by slice. Compared with the live table's
own inference pull, key by key, including the int64 extremes."""
from __future__ import annotations

import numpy as np
import pytest

import tnet as tn  # noqa: I001  (before tensorflow: selects tf_keras)
import tensorflow as tf

from tnet.serving import serving_table as st

EDGE = np.array([0, 1, -1, 2, np.iinfo(np.int64).min, np.iinfo(np.int64).max,
                 np.iinfo(np.int64).max - 1, np.iinfo(np.int64).min + 1,
                 1 << 32, -(1 << 40)], np.int64)


def test_mix_keys_numpy_and_tf_agree_and_stay_distinct():
    rng = np.random.default_rng(0)
    keys = np.concatenate([EDGE, rng.integers(-(1 << 63), (1 << 63) - 1,
                                              100_000, dtype=np.int64),
                           np.arange(100_000, dtype=np.int64)])
    keys = np.unique(keys)
    mixed = st.mix_keys_np(keys)
    np.testing.assert_array_equal(mixed, st.mix_keys(keys).numpy())
    assert np.unique(mixed).size == keys.size  # a bijection keeps them apart
    # Consecutive ids spread over the top bits (what makes buckets even).
    top = (st.mix_keys_np(np.arange(1 << 16, dtype=np.int64)) >> 56) + 128
    counts = np.bincount(top, minlength=256)
    assert counts.min() > 0.7 * counts.mean(), counts


def _table(rows, dim, seed=0):
    table = tn.SparseTable(dim=dim, num_shards=3, name=f"t{rows}_{dim}")
    rng = np.random.default_rng(seed)
    keys = np.unique(np.concatenate([
        EDGE, np.arange(rows // 2, dtype=np.int64),
        rng.integers(-(1 << 62), 1 << 62, rows - rows // 2, dtype=np.int64)]))
    if rows == 0:
        keys = keys[:0]
    weights = rng.normal(size=(keys.size, dim)).astype(np.float32)
    weights[::7] = 0.0  # all-zero rows: int8 scale 0
    table.import_rows(keys, weights,
                      np.zeros((keys.size, table.num_slots), np.float32),
                      np.zeros((keys.size, 3)))
    return table, keys


def _export(table, path, quantize):
    """What export_for_serving does for one table, without a model."""
    module = tf.Module()
    serving = st.ServingTable("t", table.dim, quantize)
    module.table = serving
    module.streamed_variables = serving.placeholders()
    fn = tf.function(serving.lookup,
                     input_signature=[tf.TensorSpec([None], tf.int64)])
    module.lookup = fn
    tf.saved_model.save(module, str(path))
    st.write_sliced(str(path), module, [(serving, table)],
                    str(path / "scratch"))
    return serving


@pytest.mark.parametrize("quantize", [None, "float16", "int8"])
@pytest.mark.parametrize("rows", [0, 1, 5000])
def test_streamed_lookup_matches_the_table(tmp_path, monkeypatch, rows,
                                           quantize):
    # Small buckets: a 5000-row table spills into 64 of them (many slices).
    monkeypatch.setattr(st, "BUCKET_ROWS", 64)
    table, keys = _table(rows, dim=6)
    serving = _export(table, tmp_path / "m", quantize)
    assert serving.rows == keys.size
    loaded = tf.saved_model.load(str(tmp_path / "m"))
    rng = np.random.default_rng(1)
    unknown = rng.integers(1 << 62, (1 << 63) - 1, 1000, dtype=np.int64)
    unknown = np.setdiff1d(unknown, keys)
    query = np.concatenate([keys, unknown, EDGE])
    served = loaded.lookup(tf.constant(query)).numpy()
    want = table.pull(query, training=False).numpy()
    if quantize is None:
        np.testing.assert_array_equal(served, want)
    elif quantize == "float16":
        np.testing.assert_array_equal(served,
                                      want.astype(np.float16).astype(np.float32))
    else:
        scale = np.abs(want).max(axis=1, keepdims=True) / 127.0
        assert np.all(np.abs(served - want) <= scale / 2 + 1e-6)
    np.testing.assert_array_equal(served[keys.size:keys.size + unknown.size],
                                  0.0)
    # One full tensor per variable, rows + 1 long (the zero row).
    shapes = tf.train.load_checkpoint(
        str(tmp_path / "m" / "variables" / "variables")
    ).get_variable_to_shape_map()
    assert sorted(s[0] for n, s in shapes.items()
                  if n.startswith("table/")) == \
        [keys.size + 1] * (3 if quantize == "int8" else 2)


def test_bucket_files_are_removed_and_keys_sorted(tmp_path, monkeypatch):
    monkeypatch.setattr(st, "BUCKET_ROWS", 100)
    table, keys = _table(3000, dim=2)
    spilled = st.SpilledTable(table, "t", str(tmp_path / "spill"))
    assert spilled.rows == keys.size
    assert spilled.counts.size == 32 and spilled.counts.min() > 0
    got = np.concatenate([k for k, _ in spilled.sorted_buckets()])
    np.testing.assert_array_equal(got, np.sort(st.mix_keys_np(keys)))
    assert list((tmp_path / "spill").iterdir()) == []
