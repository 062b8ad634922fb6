"""The small checkpoint models and their comparisons, shared by
test_checkpoint.py, test_checkpoint_resume.py, test_faults.py,
test_stream.py, test_stream_event_time.py and
tests/programs/export_kill.py."""
from __future__ import annotations

import numpy as np

import tnet as tn  # noqa: I001  (before tensorflow: selects tf_keras)
import tensorflow as tf
import tf_keras

from tests.programs.ckpt_train import CATS, make_data
from tnet import feature_column as fc


class Tiny(tn.Model):
    """Two tables ("emb": Adagrad dim 4, "lin": FTRL dim 1) with
    `shards` local shards each, and a dense head."""

    def __init__(self, shards=2, dim=4):
        super().__init__()
        cats = [fc.category_column(c) for c in CATS]
        self.emb = tn.layers.EmbeddingFeatures(
            [fc.embedding_column(c, dim, table="emb") for c in cats],
            num_shards=shards, name="emb_layer")
        self.lin = tn.layers.LinearFeatures(cats, num_shards=shards,
                                            name="lin")
        self.head = tf_keras.layers.Dense(1)

    def call(self, features, training=False):
        x = tf.concat([self.emb(features, training=training),
                       tf.reshape(features["d0"], [-1, 1])], axis=1)
        return self.head(x) + self.lin(features, training=training)


def tiny(shards=2, dim=4):
    model = Tiny(shards, dim)
    model.compile(tn.optimizer.Adagrad(0.05),
                  loss=tf_keras.losses.BinaryCrossentropy(from_logits=True))
    return model


def wide_deep():
    model = tn.models.WideDeep(CATS, ["d0"], embedding_dim=4, hidden_units=[8])
    model.compile(tn.optimizer.Adagrad(0.05))
    return model


def dataset(rows=640, seed=0, batch=64):
    feats, labels = make_data(rows, seed)
    return tf.data.Dataset.from_tensor_slices((feats, labels)).batch(batch)


def fit(model, rows=640, seed=0, epochs=1):
    model.fit(dataset(rows, seed), epochs=epochs, verbose=0)


def quiet(_):
    pass


def snapshot(model):
    """{table: (keys, weights, slots, meta)} sorted by key, plus step."""
    out = {}
    for name, table in model.tables().items():
        keys, weights, slots, meta = (t.numpy() for t in table.export())
        order = np.argsort(keys)
        out[name] = tuple(a[order] for a in (keys, weights, slots, meta))
    return out


def assert_same_tables(a, b):
    assert sorted(a) == sorted(b)
    for name in a:
        for what, x, y in zip(("keys", "weights", "slots", "meta"), a[name],
                              b[name]):
            assert x.shape == y.shape and x.dtype == y.dtype, (name, what)
            # Bit-exact (also tells -0.0 from 0.0 and NaN payloads apart).
            assert x.tobytes() == y.tobytes(), (name, what)


def spec_wide_deep(spec):
    """WideDeep over a feature spec's columns (hidden [8], Adagrad 0.05,
    seeded): the streaming tests' model."""
    tf_keras.utils.set_random_seed(0)
    model = tn.models.WideDeep(spec.embedding_columns(), spec.dense,
                               hidden_units=[8])
    model.compile(tn.optimizer.Adagrad(0.05))
    return model


def assert_same_model(a, b):
    """Every table (keys, weights, slots, meta) and every variable of two
    models, bit for bit."""
    assert_same_tables(snapshot(a), snapshot(b))
    assert len(a.variables) == len(b.variables)
    for x, y in zip(a.variables, b.variables):
        assert x.numpy().tobytes() == y.numpy().tobytes(), x.name


def dense_state(model):
    return [v.numpy() for v in model.variables + model.optimizer.variables]


def resumed_equals_whole(make_model, tmp_path, rows=320):
    """`make_model()` fit on two datasets in a row, against one fit on the
    first, saved, restored into a fresh `make_model()` and fit on the
    second: every table and dense variable bit for bit. Returns the
    resumed model."""
    whole = make_model()
    whole.fit(dataset(rows, 0), verbose=0)
    whole.fit(dataset(rows, 1), verbose=0)
    first = make_model()
    first.fit(dataset(rows, 0), verbose=0)
    tn.saving.save(first, tmp_path, progress=quiet)
    resumed = make_model()
    tn.saving.restore(resumed, tmp_path, progress=quiet)
    resumed.fit(dataset(rows, 1), verbose=0)
    assert_same_tables(snapshot(whole), snapshot(resumed))
    for a, b in zip(dense_state(whole), dense_state(resumed)):
        assert a.tobytes() == b.tobytes()
    return resumed


def build(model):
    feats, _ = next(iter(dataset(64, seed=99)))
    model(feats, training=False)
    model.optimizer.build(model.trainable_variables)


def assert_dumps_equal(a_path, b_path):
    a, b = np.load(a_path), np.load(b_path)
    assert sorted(a.files) == sorted(b.files)
    assert any(k.endswith("/keys") and len(a[k]) for k in a.files)
    for k in a.files:
        assert a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes(), k
