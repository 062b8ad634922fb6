"""Row accumulator starts scaled by the batch (start_reference_batch).

A row inserted by a training step of B examples starts its accumulator at
initial_accumulator_value * (256 / B)^2, so a batch-mean loss's 1 / B on
the gradients leaves a new row's first step the same at every batch size.
Checked against float numpy math through tn.Model.fit for every ids form
(B counts examples, not ids), for Adagrad rows and the wide part's FTRL;
at batch 256 nothing changes; a checkpointed run goes on as the
uninterrupted one; checkpoints from before the setting restore as before.
"""
from __future__ import annotations

import json
import logging

import numpy as np
import pytest

import tnet as tn  # noqa: I001  (before tensorflow: selects tf_keras)
import tensorflow as tf
import tf_keras

from tnet import feature_column as fc
from tests.support.ckpt import (assert_same_tables, dataset, dense_state,
                                quiet, resumed_equals_whole, snapshot)
from tests.programs.ckpt_train import CATS

LR = 0.1
START = 1e-3
FORMS = ("B", "B1", "padded", "sparse", "ragged")


class _Sum(tn.Model):
    """y = sum of the ids' rows (dim 1, zeros at the start) + a bias; MSE
    against 1, so every id of every example gets -2 / B."""

    def __init__(self, wide: bool, rule=None):
        super().__init__()
        col = fc.category_column("ids")
        if wide:
            self.ids = tn.layers.LinearFeatures([col], optimizer=rule,
                                                use_bias=False)
        else:
            self.ids = tn.layers.EmbeddingFeatures(
                [fc.embedding_column(col, 1, combiner="sum",
                                     initializer="zeros")], optimizer=rule)
        self.bias = tf.Variable(0.0)

    def call(self, features, training=False):
        return self.ids(features, training=training) + self.bias


def _ids(form: str, batch: int, offset: int):
    """Distinct ids: one per example ([B], [B, 1]) or two (padded with a
    -1 slot, sparse, ragged)."""
    first = np.arange(batch, dtype=np.int64) * 2 + offset
    if form == "B":
        return tf.constant(first)
    if form == "B1":
        return tf.constant(first[:, None])
    pairs = np.stack([first, first + 1, np.full(batch, -1)], axis=1)
    if form == "padded":
        return tf.constant(pairs)
    ragged = tf.ragged.boolean_mask(tf.constant(pairs), pairs >= 0)
    return ragged.to_sparse() if form == "sparse" else ragged


def _first_rows(form: str, batch: int, wide: bool, reference="default"):
    """(rows' weights, accumulators) after one step of `batch` examples."""
    kw = {} if reference == "default" else {"start_reference_batch": reference}
    if wide:
        model = _Sum(True, tn.optimizer.sparse.Ftrl(
            LR, initial_accumulator_value=START, **kw))
        model.compile(tf_keras.optimizers.SGD(0.0), loss="mse")
    else:
        model = _Sum(False)
        model.compile(tn.optimizer.Adagrad(
            LR, row_initial_accumulator_value=START, **kw), loss="mse")
    ids = _ids(form, batch, offset=1000 * batch)
    data = tf.data.Dataset.from_tensors(({"ids": ids}, tf.ones([batch, 1])))
    model.fit(data, verbose=0)
    (table,) = model.tables().values()
    keys, weights, slots, _ = (t.numpy() for t in table.export())
    assert len(keys) == batch * (1 if form in ("B", "B1") else 2)
    return weights[:, 0], slots[:, 0]


def _expected(batch: int, reference, wide: bool):
    """float32 numpy: the first step from start * (reference / B)^2 with
    gradient -2 / B (Adagrad: lr g / (sqrt(acc) + eps); FTRL from zero
    weights, no regularization: -lr z / sqrt(n) with z = g)."""
    f32 = np.float32
    g = f32(-2.0) / f32(batch)
    scale = 1.0 if reference is None else (reference / batch) ** 2
    acc = f32(f32(START) * f32(scale)) + g * g
    if wide:
        return -f32(LR) * g / np.sqrt(acc), acc
    return -f32(LR) * g / (np.sqrt(acc) + f32(1e-7)), acc


@pytest.mark.parametrize("form", FORMS)
def test_first_step_is_the_same_at_two_batch_sizes(form):
    """Adagrad rows: at B = 64 and B = 1024 a new row's first step from the
    scaled start matches numpy and is the same (up to epsilon's share);
    B counts examples (padded, sparse and ragged carry two ids each)."""
    steps = {}
    for batch in (64, 1024):
        w, acc = _first_rows(form, batch, wide=False)
        want_w, want_acc = _expected(batch, 256, wide=False)
        np.testing.assert_allclose(acc, want_acc, rtol=1e-6)
        np.testing.assert_allclose(w, want_w, rtol=1e-5)
        steps[batch] = w[0]
    np.testing.assert_allclose(steps[64], steps[1024], rtol=1e-4)


def test_wide_ftrl_first_step_is_the_same_at_two_batch_sizes():
    steps = {}
    for batch in (64, 1024):
        w, acc = _first_rows("B", batch, wide=True)
        want_w, want_acc = _expected(batch, 256, wide=True)
        np.testing.assert_allclose(acc, want_acc, rtol=1e-6)
        np.testing.assert_allclose(w, want_w, rtol=1e-5)
        steps[batch] = w[0]
    np.testing.assert_allclose(steps[64], steps[1024], rtol=1e-5)


@pytest.mark.parametrize("wide", [False, True])
def test_none_keeps_the_start_fixed(wide):
    """start_reference_batch=None: the start as given at any batch, and
    the first step at B = 1024 then differs from the one at 64."""
    steps = {}
    for batch in (64, 1024):
        w, acc = _first_rows("B", batch, wide=wide, reference=None)
        want_w, want_acc = _expected(batch, None, wide=wide)
        np.testing.assert_allclose(acc, want_acc, rtol=1e-6)
        np.testing.assert_allclose(w, want_w, rtol=1e-5)
        steps[batch] = w[0]
    assert steps[64] > 2 * steps[1024]


def test_direct_pull_and_push_take_batch_size():
    """SparseTable.pull/push: batch_size scales the rows they insert;
    without it the start is as given."""
    table = tn.SparseTable("direct", 2, tn.optimizer.sparse.Adagrad(
        0.1, initial_accumulator_value=1e-3), num_shards=2)
    table.pull([1, 2], training=True, batch_size=1024)
    table.push([3], tf.zeros([1, 2]), batch_size=128)
    table.push([4], tf.zeros([1, 2]))
    keys, _, slots, _ = (t.numpy() for t in table.export())
    got = dict(zip(keys.tolist(), slots[:, 0].tolist()))
    f32 = np.float32
    np.testing.assert_allclose(
        [got[1], got[2], got[3], got[4]],
        [f32(1e-3) * f32(1 / 16)] * 2 + [f32(1e-3) * f32(4.0),
                                              f32(1e-3)], rtol=1e-6)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="batch_size must be >= 0"):
        table.pull([5], training=True, batch_size=-1)


def _two_tables(reference):
    tf_keras.utils.set_random_seed(3)
    cats = [fc.category_column(c) for c in CATS]

    class M(tn.Model):
        def __init__(self):
            super().__init__()
            self.emb = tn.layers.EmbeddingFeatures(
                [fc.embedding_column(c, 4, table="emb") for c in cats])
            self.lin = tn.layers.LinearFeatures(
                cats, optimizer=tn.optimizer.sparse.Ftrl(
                    0.2, initial_accumulator_value=1e-3,
                    start_reference_batch=reference))
            self.head = tf_keras.layers.Dense(1)

        def call(self, features, training=False):
            x = tf.concat([self.emb(features, training=training),
                           tf.reshape(features["d0"], [-1, 1])], axis=1)
            return self.head(x) + self.lin(features, training=training)

    model = M()
    model.compile(tn.optimizer.Adagrad(0.05, start_reference_batch=reference),
                  loss=tf_keras.losses.BinaryCrossentropy(from_logits=True))
    return model


def test_batch_256_is_unchanged_bit_for_bit():
    """At the reference batch the scale is exactly 1: the same tables and
    dense variables as with the starts fixed (start_reference_batch=None);
    at batch 64 they differ."""
    for batch, same in ((256, True), (64, False)):
        a, b = (_two_tables(ref).fit(dataset(512, 0, batch=batch),
                                     verbose=0).model
                for ref in (256, None))
        sa, sb = snapshot(a), snapshot(b)
        if same:
            assert_same_tables(sa, sb)
            for x, y in zip(dense_state(a), dense_state(b)):
                assert x.tobytes() == y.tobytes()
        else:
            assert sa["emb"][2].tobytes() != sb["emb"][2].tobytes()


def _wide_deep():
    tf_keras.utils.set_random_seed(3)
    model = tn.models.WideDeep(CATS, ["d0"], embedding_dim=4, hidden_units=[8])
    model.compile(tn.optimizer.Adagrad(0.05))
    return model


def test_checkpointed_run_goes_on_as_the_uninterrupted_one(tmp_path):
    """Batch 64 (scale 16 on every new row): k steps, save, restore into
    a fresh model, m steps == k + m steps, bit for bit (new rows after the
    restore start from the same scaled value)."""
    resumed_equals_whole(_wide_deep, tmp_path)


def test_a_checkpoint_from_before_the_setting_restores_without_warning(
        tmp_path, caplog):
    """A manifest without start_reference_batch (written before it
    existed) restores with no warning and the same rows."""
    from tnet.saving import manifest as manifest_mod
    model = _wide_deep()
    model.fit(dataset(128, 0), verbose=0)
    path = tn.saving.save(model, tmp_path, progress=quiet)
    mfile = f"{path}/{manifest_mod.MANIFEST}"
    manifest = json.load(open(mfile))
    for info in manifest["tables"].values():
        assert info["optimizer"]["attrs"].pop("start_reference_batch") == 256
    manifest["manifest_sha256"] = manifest_mod._manifest_digest(manifest)
    json.dump(manifest, open(mfile, "w"))

    caplog.set_level(logging.WARNING)
    restored = _wide_deep()
    tn.saving.restore(restored, tmp_path, progress=quiet)
    assert not [r for r in caplog.records if "differ" in r.getMessage()]
    assert_same_tables(snapshot(model), snapshot(restored))


def test_setting_survives_config():
    opt = tn.optimizer.Adagrad(0.05, start_reference_batch=None)
    again = tn.optimizer.Adagrad.from_config(opt.get_config())
    assert again.sparse_rule.start_reference_batch is None
    assert tn.optimizer.Adagrad(0.05).sparse_rule.start_reference_batch == 256
    ftrl = tn.optimizer.Ftrl(0.1, start_reference_batch=1024)
    assert tn.optimizer.Ftrl.from_config(
        ftrl.get_config()).sparse_rule.start_reference_batch == 1024
    assert tn.layers.LinearFeatures(
        [fc.category_column("a")])._rule.start_reference_batch == 256
    with pytest.raises(ValueError, match="start_reference_batch must be >= 1"):
        tn.optimizer.sparse.Adagrad(0.1, start_reference_batch=0.5)


# make test-long (a cluster start, ~45 s): the in-process tests above take
# the same path; this one checks that a worker's step carries its batch
# to the ps.
@pytest.mark.long
def test_under_parameter_server_strategy_each_step_scales_by_its_batch():
    """2 ps x 1 worker: one step of 1024 examples (ragged, two ids each)
    inserts every row from the start scaled for 1024 examples."""
    import sys

    from tests.conftest import ROOT
    from tests.support.cluster import assert_all_stopped
    from tests.support.cluster import cluster as start_cluster
    cluster = start_cluster(2, 1, [sys.executable, str(
        ROOT / "tests" / "programs" / "batch_start_pss.py")])
    code = cluster.wait(300)
    assert_all_stopped(cluster)
    assert code == 0, cluster.output[-3000:]
    line = next(x for x in cluster.lines if "BATCH_START " in x)
    report = json.loads(line.split("BATCH_START ", 1)[1])
    assert report["rows"] == 2048 and report["shards"] == 2, report
    assert report["acc_rel_err"] < 1e-6 and report["w_rel_err"] < 1e-5, report


def test_a_saved_model_of_the_former_ops_loads_and_runs(tmp_path):
    """A SavedModel whose graph calls the pull and push ops of before the
    batch-aware starts (SparseTablePull/Push, no batch_size input) loads
    and runs: their rows start at the fixed start, as they did."""
    from tnet import _ops  # noqa: PLC0415
    table = tn.SparseTable("former_ops", 2, tn.optimizer.sparse.Adagrad(
        LR, initial_accumulator_value=START), num_shards=1)
    handle_of = lambda: table.shards[0].resource_handle  # noqa: E731

    class Former(tf.Module):
        def __init__(self):
            super().__init__()
            self.shard = table.shards[0]

        @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
        def pull(self, keys):
            return _ops.sparse_table_pull(handle_of(), keys, True, dim=2)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.int64),
                                      tf.TensorSpec([None, 2], tf.float32)])
        def push(self, keys, grads):
            n = tf.shape(keys)[:1]
            _ops.sparse_table_push(
                handle_of(), keys, grads, tf.constant(LR), tf.constant(
                    0, tf.int64), tf.zeros(n), tf.zeros(n), dim=2)

        @tf.function(input_signature=[])
        def rows(self):  # keys and their accumulators
            keys, _, slots, _, _ = _ops.sparse_table_export(
                handle_of(), tf.constant(0, tf.int64),
                tf.constant(100, tf.int64), dim=2, weights_only=False)
            return keys, slots[:, 0]

    tf.saved_model.save(Former(), str(tmp_path / "former"))
    graph = (tmp_path / "former" / "saved_model.pb").read_bytes()
    assert b"SparseTablePull" in graph and b"SparseTablePullV2" not in graph
    loaded = tf.saved_model.load(str(tmp_path / "former"))
    rows = loaded.pull(tf.constant([11, 12], tf.int64)).numpy()
    assert rows.shape == (2, 2)
    loaded.push(tf.constant([11], tf.int64), tf.ones([1, 2]))
    keys, accumulators = (t.numpy() for t in loaded.rows())
    got = dict(zip(keys.tolist(), accumulators.tolist()))
    f32 = np.float32
    np.testing.assert_allclose(got[12], f32(START), rtol=1e-6)
    np.testing.assert_allclose(got[11], f32(START) + 1, rtol=1e-6)
