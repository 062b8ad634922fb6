"""Adagrad rows whose start depends on their own update count
(accumulator_floor; tnet_ops/optimizers/adagrad.h):
bit-exact against a float32 numpy reference, on one and several shards,
element-wise and row-wise; the count lives in the accumulator, so a
checkpointed and restored model goes on exactly as an uninterrupted one.
"""
from __future__ import annotations

import numpy as np
import pytest

import tnet as tn  # noqa: I001  (before tensorflow: selects tf_keras)

from tests.programs.ckpt_train import CATS
from tests.support.ckpt import (dataset, quiet, resumed_equals_whole,
                                snapshot)

VOCAB = 30
DIM = 5
STEPS = 8


def _keys():
    return np.arange(VOCAB, dtype=np.int64) * 104729 - 7


def _batches(seed: int):
    """Pushes with duplicate keys (summed by the table) and keys absent
    from some pushes: rows reach different update counts."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(STEPS):
        n = int(rng.integers(5, 25))
        idx = rng.integers(0, VOCAB, size=n)
        grads = (rng.normal(size=(n, DIM)) * 10.0 ** rng.integers(-4, 1)
                 ).astype(np.float32)
        out.append((_keys()[idx], grads))
    return out


def _summed(keys, grads):
    uniq, inv = np.unique(keys, return_inverse=True)
    out = np.zeros((len(uniq), DIM), np.float32)
    for i, g in zip(inv, grads):   # in push order, as the table sums
        out[i] += g
    return uniq, out


def _by_key(table):
    keys, _, slots, _ = table.export()
    order = np.argsort(keys.numpy())
    return keys.numpy()[order], slots.numpy()[order]


CASES = [  # (initial, floor)
    (1e-6, 1e-4),
    (1e-6, 2e-3),
    (1e-3, 1e-6),   # a floor below the start: never acts
]


@pytest.mark.parametrize("num_shards", [1, 3])
@pytest.mark.parametrize("initial,floor", CASES)
def test_adagrad_matches_numpy_bit_exact(initial, floor, num_shards):
    f32 = np.float32
    lr, eps = f32(0.05), f32(1e-7)
    table = tn.SparseTable("count_start", DIM, tn.optimizer.Adagrad(
        float(lr), initial_accumulator_value=initial, epsilon=float(eps),
        accumulator_floor=floor), num_shards=num_shards)
    w = table.pull(_keys(), training=True).numpy()
    acc = np.full_like(w, f32(initial))
    n = np.zeros(VOCAB, int)
    pos = {int(k): i for i, k in enumerate(_keys())}
    for keys, grads in _batches(int(floor * 1e4) + num_shards):
        table.push(keys, grads)
        for k, g in zip(*_summed(keys, grads)):
            i = pos[int(k)]
            acc[i] += g * g
            w[i] -= lr * g / (np.sqrt(acc[i]) + eps)
            acc[i] = np.maximum(acc[i], f32(floor))
            n[i] += 1
    assert n.max() >= 4 and (n == 1).any()   # counts differ between rows
    np.testing.assert_array_equal(
        table.pull(_keys(), training=False).numpy(), w)
    keys, slots = _by_key(table)
    np.testing.assert_array_equal(slots, acc[[pos[int(k)] for k in keys]])


@pytest.mark.parametrize("num_shards", [1, 2])
def test_rowwise_adagrad_matches_numpy_bit_exact(num_shards):
    f32 = np.float32
    lr, eps, initial, floor = (f32(x) for x in (0.05, 1e-7, 1e-6, 1e-3))
    table = tn.SparseTable("count_start_rw", DIM, tn.optimizer.RowwiseAdagrad(
        float(lr), initial_accumulator_value=float(initial),
        epsilon=float(eps), accumulator_floor=float(floor)),
        num_shards=num_shards)
    w = table.pull(_keys(), training=True).numpy()
    acc = np.full(VOCAB, initial, np.float32)
    pos = {int(k): i for i, k in enumerate(_keys())}
    for keys, grads in _batches(7):
        table.push(keys, grads)
        for k, g in zip(*_summed(keys, grads)):
            i = pos[int(k)]
            sq = f32(0)
            for x in g:
                sq += x * x
            acc[i] += sq / f32(DIM)
            w[i] -= (lr / (np.sqrt(acc[i]) + eps)) * g
            acc[i] = np.maximum(acc[i], floor)
    np.testing.assert_array_equal(
        table.pull(_keys(), training=False).numpy(), w)
    keys, slots = _by_key(table)
    np.testing.assert_array_equal(slots[:, 0], acc[[pos[int(k)] for k in keys]])


def test_the_first_update_of_a_row_starts_from_initial_then_the_floor():
    """A gradient of 1 on a new row: step lr / sqrt(1 + 1e-6), after it
    the accumulator is max(1 + 1e-6 + 0, 1.5) = 1.5; the second step
    divides by sqrt(1.5 + 1)."""
    import tensorflow as tf
    table = tn.SparseTable("first", 1, tn.optimizer.Adagrad(
        0.1, accumulator_floor=1.5), initializer="zeros", num_shards=1)
    key = tf.constant([3], tf.int64)
    table.pull(key, training=True)
    table.push(key, np.ones((1, 1), np.float32))
    np.testing.assert_allclose(table.pull(key, training=False).numpy(),
                               [[-0.1 / np.sqrt(1 + 1e-6)]], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(table.export()[2]), [[1.5]])
    table.push(key, np.ones((1, 1), np.float32))
    np.testing.assert_allclose(
        table.pull(key, training=False).numpy(),
        [[-0.1 / np.sqrt(1 + 1e-6) - 0.1 / np.sqrt(2.5)]], rtol=1e-6)


def test_settings_survive_config_and_stock_adagrad_keeps_them_off():
    import tf_keras
    opt = tn.optimizer.Adagrad(0.05, accumulator_floor=1e-3)
    again = tn.optimizer.Adagrad.from_config(opt.get_config())
    for o in (opt, again):
        assert o.sparse_rule.accumulator_floor == 1e-3
    rule = tn.optimizer.sparse_rule_of(tf_keras.optimizers.Adagrad(0.05))
    assert rule.accumulator_floor == 0.0
    assert tn.optimizer.Adagrad(0.05).sparse_rule.accumulator_floor == 0.0
    with pytest.raises(Exception, match="accumulator_floor must be finite "
                       "and >= 0"):
        tn.SparseTable("bad", 2, tn.optimizer.Adagrad(
            0.05, accumulator_floor=-1.0), num_shards=1)


def _model():
    import tf_keras
    tf_keras.utils.set_random_seed(3)   # the same dense start each time
    model = tn.models.WideDeep(CATS, ["d0"], embedding_dim=4, hidden_units=[8])
    model.compile(tn.optimizer.Adagrad(0.05, accumulator_floor=1e-3))
    return model


def test_checkpointed_run_goes_on_as_the_uninterrupted_one(tmp_path):
    """k steps, save, restore into a fresh model, m steps == k + m steps:
    every row's accumulator (and with it its count) comes back."""
    resumed = resumed_equals_whole(_model, tmp_path)
    # The floor acted: no row of the deep table is below it after training.
    acc = snapshot(resumed)["embedding"][2]
    assert acc.size and acc.min() >= np.float32(1e-3)


def test_a_checkpoint_from_before_the_settings_restores_without_warning(
        tmp_path, caplog):
    """Checkpoints written before the floor existed do not name it: it
    reads as its default (0, which is what ran), so no warning; a model
    given another floor restores too, with one info line naming it (the
    floor changes later updates only)."""
    import json
    import logging

    from tnet.saving import manifest as manifest_mod
    from tests.support.ckpt import wide_deep
    model = wide_deep()
    model.fit(dataset(128, 0), verbose=0)
    path = tn.saving.save(model, tmp_path, progress=quiet)
    mfile = f"{path}/{manifest_mod.MANIFEST}"
    manifest = json.load(open(mfile))
    attrs = manifest["tables"]["embedding"]["optimizer"]["attrs"]
    assert attrs.pop("accumulator_floor") == 0.0
    manifest["manifest_sha256"] = manifest_mod._manifest_digest(manifest)
    json.dump(manifest, open(mfile, "w"))

    caplog.set_level(logging.WARNING)
    tn.saving.restore(wide_deep(), tmp_path, progress=quiet)
    assert not [r for r in caplog.records if "differ" in r.getMessage()]
    other = tn.models.WideDeep(CATS, ["d0"], embedding_dim=4,
                               hidden_units=[8])
    other.compile(tn.optimizer.Adagrad(0.05, accumulator_floor=1e-3))
    caplog.set_level(logging.INFO)
    tn.saving.restore(other, tmp_path, progress=quiet)
    assert not [r for r in caplog.records if "differ" in r.getMessage()]
    said = [r.getMessage() for r in caplog.records
            if "accumulator_floor" in r.getMessage()]
    assert said == ["table 'embedding': the model's accumulator_floor "
                    f"0.001 applies from now on (0 in {mfile})"]


# ---------------------------------------------------- width-1 rows' default
def _two_widths(optimizer):
    """A model with a width-1 table ("wide") and a width-4 one ("deep"),
    compiled with `optimizer`; fit once so the tables exist."""
    import tensorflow as tf
    import tf_keras
    from tnet import feature_column as fc
    from tests.programs.ckpt_train import make_data
    tf_keras.utils.set_random_seed(5)
    ids = {c: fc.category_column(c) for c in CATS}
    wide = tn.layers.EmbeddingFeatures(
        [fc.embedding_column(ids[c], 1, table="wide") for c in CATS],
        name="wide")
    deep = tn.layers.EmbeddingFeatures(
        [fc.embedding_column(ids[c], 4, table="deep") for c in CATS],
        name="deep")
    inputs = {c: tf_keras.Input((), dtype=tf.int64, name=c) for c in CATS}
    logit = (tf_keras.layers.Dense(1)(deep(inputs))
             + tf.reduce_sum(wide(inputs), axis=1, keepdims=True))
    model = tn.Model(inputs, tf_keras.layers.Activation("sigmoid")(logit))
    model.compile(optimizer, loss="binary_crossentropy")
    feats, labels = make_data(256, 0)
    model.fit({c: feats[c] for c in CATS}, labels, batch_size=64, verbose=0)
    return model, wide.tables["wide"], deep.tables["deep"]


def _floors(optimizer):
    _, wide, deep = _two_widths(optimizer)
    return tuple(t.optimizer.table_attrs().get("accumulator_floor")
                 for t in (wide, deep))


def test_width1_rows_get_their_floor_unless_one_is_chosen():
    """Adagrad's (and RowwiseAdagrad's, a stock Keras Adagrad's) width-1
    tables get sparse.WIDTH1_ACCUMULATOR_FLOOR, wider ones none; a floor
    the user gives (0 too) holds for every table, also through
    get_config / from_config; other rules have no floor."""
    import tf_keras
    floor = tn.optimizer.sparse.WIDTH1_ACCUMULATOR_FLOOR
    assert floor > 0
    assert _floors(tn.optimizer.Adagrad(0.05)) == (floor, 0.0)
    assert _floors(tn.optimizer.RowwiseAdagrad(0.05)) == (floor, 0.0)
    assert _floors(tf_keras.optimizers.Adagrad(0.05)) == (floor, 0.0)
    assert _floors(tn.optimizer.Adagrad(
        0.05, accumulator_floor=0.0)) == (0.0, 0.0)
    assert _floors(tn.optimizer.Adagrad(
        0.05, accumulator_floor=1e-4)) == (1e-4, 1e-4)
    default = tn.optimizer.Adagrad(0.05)
    assert default.get_config()["accumulator_floor"] is None
    assert _floors(tn.optimizer.Adagrad.from_config(
        default.get_config())) == (floor, 0.0)
    off = tn.optimizer.Adagrad(0.05, accumulator_floor=0.0)
    assert _floors(tn.optimizer.Adagrad.from_config(
        off.get_config())) == (0.0, 0.0)
    assert _floors(tn.optimizer.Adam(1e-3)) == (None, None)


def test_a_model_cannot_switch_the_width1_floor_once_rows_exist():
    model, wide, _ = _two_widths(tn.optimizer.Adagrad(0.05))
    with pytest.raises(ValueError, match="layer 'wide': its tables already "
                       "hold rows for rule Adagrad.*accumulator_floor=3e-05"
                       ".*cannot switch to Adagrad.*accumulator_floor=0.0"):
        model.compile(tn.optimizer.Adagrad(0.05, accumulator_floor=0.0),
                      loss="binary_crossentropy")


@pytest.mark.parametrize("batch", [64, 256, 1024])
def test_the_floor_scales_with_the_batch_as_the_start(batch):
    """A push of a batch of B examples applies floor * (256 / B)^2 (the
    start's StartScale): a small gradient on a new row leaves its
    accumulator at the scaled floor; without start_reference_batch the
    floor as given."""
    import tensorflow as tf
    key = tf.constant([11], tf.int64)
    g = np.full((1, 1), 1e-3, np.float32)
    for ref, scale in ((256, (256.0 / batch) ** 2), (None, 1.0)):
        table = tn.SparseTable(f"scaled{batch}_{ref}", 1, tn.optimizer.Adagrad(
            0.1, accumulator_floor=1e-2, start_reference_batch=ref),
            initializer="zeros", num_shards=1)
        table.pull(key, training=True, batch_size=batch)
        table.push(key, g, batch_size=batch)
        np.testing.assert_allclose(np.asarray(table.export()[2]),
                                   [[1e-2 * scale]], rtol=1e-6)


def test_a_checkpoint_without_the_width1_floor_restores_into_the_default(
        tmp_path, caplog):
    """Saved with no floor (the former default, here chosen), restored into
    a model at today's defaults: the rows and accumulators come back as
    saved, one info line says the wide table's rows update with the floor
    from now on, no warning."""
    import logging
    import tensorflow as tf
    old, old_wide, _ = _two_widths(tn.optimizer.Adagrad(
        0.05, accumulator_floor=0.0))
    tn.saving.save(old, tmp_path, progress=quiet)
    new, new_wide, _ = _two_widths(tn.optimizer.Adagrad(0.05))
    caplog.set_level(logging.INFO)
    tn.saving.restore(new, tmp_path, progress=quiet)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    said = [r.getMessage() for r in caplog.records
            if "accumulator_floor" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(
        "table 'wide': the model's accumulator_floor 3e-05 applies from "
        "now on (0 in "), said
    keys = tf.constant(np.arange(0, 400, dtype=np.int64))
    np.testing.assert_array_equal(new_wide.pull(keys).numpy(),
                                  old_wide.pull(keys).numpy())
    np.testing.assert_array_equal(_by_key(new_wide)[1],
                                  _by_key(old_wide)[1])
