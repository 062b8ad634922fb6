"""SequenceEmbeddingFeatures: input layouts, truncation and pooling, checked
against numpy on the rows the table holds."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tnet as tn
from tnet import feature_column as fc

DIM = 4
MAX_LEN = 3
# Three histories, oldest first: longer than max_length, short, empty.
HISTORIES = [[11, 12, 13, 14, 15], [21], []]


def _layer(pooling=None):
    col = fc.embedding_column(
        fc.sequence_category_column("h", max_length=MAX_LEN), DIM)
    return tn.layers.SequenceEmbeddingFeatures([col], pooling=pooling, seed=3)


def _layouts():
    """The same histories as padded dense, ragged and sparse tensors."""
    width = max(len(h) for h in HISTORIES)
    padded = np.full((len(HISTORIES), width), -1, np.int64)
    for i, h in enumerate(HISTORIES):
        padded[i, :len(h)] = h
    ragged = tf.ragged.constant(HISTORIES, dtype=tf.int64)
    sparse = ragged.to_sparse()
    return {"padded": padded, "ragged": ragged, "sparse": sparse}


def _kept(history):
    return history[-MAX_LEN:]  # the most recent max_length ids


def test_layouts_agree_and_keep_the_most_recent_ids():
    layer = _layer()
    out = {name: layer({"h": ids}, training=True)
           for name, ids in _layouts().items()}
    seq, lengths = out["padded"]
    for name in ("ragged", "sparse"):
        np.testing.assert_array_equal(seq.numpy(), out[name][0].numpy())
        np.testing.assert_array_equal(lengths.numpy(), out[name][1].numpy())
    np.testing.assert_array_equal(lengths.numpy(),
                                  [len(_kept(h)) for h in HISTORIES])
    table = layer.tables["h"]
    for i, history in enumerate(HISTORIES):
        kept = _kept(history)
        expected = np.zeros((MAX_LEN, DIM), np.float32)
        if kept:
            expected[:len(kept)] = table.pull(kept).numpy()  # oldest first
        np.testing.assert_array_equal(seq[i].numpy(), expected)
    # ids older than the kept window were never pulled, so never inserted
    assert int(table.size()) == 4


def test_padding_inside_a_row_is_skipped_in_order():
    layer = _layer()
    ids = np.array([[-1, 5, -1, 6, 7, -1, 8]], np.int64)
    seq, lengths = layer({"h": ids}, training=True)
    assert int(lengths[0]) == 3
    np.testing.assert_array_equal(seq[0].numpy(),
                                  layer.tables["h"].pull([6, 7, 8]).numpy())


def test_all_empty_batch():
    layer = _layer("mean")
    out = layer({"h": np.full((2, 4), -1, np.int64)}, training=False)
    np.testing.assert_array_equal(out.numpy(), np.zeros((2, DIM)))


@pytest.mark.parametrize("layout", ["padded", "ragged", "sparse"])
def test_mean_pooling_matches_numpy(layout):
    layer = _layer("mean")
    out = layer({"h": _layouts()[layout]}, training=True).numpy()
    table = layer.tables["h"]
    for i, history in enumerate(HISTORIES):
        kept = _kept(history)
        want = table.pull(kept).numpy().mean(0) if kept else np.zeros(DIM)
        np.testing.assert_allclose(out[i], want, rtol=1e-6, atol=1e-7)


def _attention_reference(layer, rows, query=None):
    """numpy: softmax over kept positions of key(e).q/sqrt(d) + recency."""
    wk = layer.pooler.key_projection.kernel.numpy()
    if query is None:
        q = layer.pooler.default_query.numpy()
    else:
        q = query @ layer.pooler.query_projection.kernel.numpy()
    if rows.shape[0] == 0:
        return np.zeros(DIM)
    recency = layer.pooler.recency.numpy()
    n = rows.shape[0]
    scores = (rows @ wk) @ q / np.sqrt(DIM) + recency[n - 1 - np.arange(n)]
    w = np.exp(scores - scores.max())
    w /= w.sum()
    return w @ rows


@pytest.mark.parametrize("with_query", [False, True])
def test_attention_pooling_matches_numpy(with_query):
    layer = _layer("attention")
    ids = _layouts()["ragged"]
    rng = np.random.default_rng(0)
    query = rng.normal(size=(3, 5)).astype(np.float32) if with_query else None
    layer({"h": ids}, training=True, query=query)  # builds; inserts rows
    # non-trivial weights: the zero-initialised ones would give a plain mean
    layer.pooler.default_query.assign(rng.normal(size=DIM).astype(np.float32))
    layer.pooler.recency.assign([2.0, -1.0, 0.5])
    out = layer({"h": ids}, training=False, query=query).numpy()
    table = layer.tables["h"]
    for i, history in enumerate(HISTORIES):
        kept = _kept(history)
        rows = table.pull(kept).numpy() if kept else np.zeros((0, DIM))
        want = _attention_reference(
            layer, rows, None if query is None else query[i])
        np.testing.assert_allclose(out[i], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out[2], np.zeros(DIM))  # empty history


def test_attention_weights_favour_the_recency_bias():
    """A large bias at distance 0 makes the pool the most recent row."""
    layer = _layer("attention")
    ids = _layouts()["padded"]
    layer({"h": ids}, training=True)
    layer.pooler.recency.assign([50.0, 0.0, 0.0])
    out = layer({"h": ids}, training=False).numpy()
    table = layer.tables["h"]
    np.testing.assert_allclose(out[0], table.pull([15]).numpy()[0], atol=1e-5)
    np.testing.assert_allclose(out[1], table.pull([21]).numpy()[0], atol=1e-5)


def test_pooled_layer_trains_its_rows():
    """Gradients of a pooled history reach the table through tn.Model."""
    layer = _layer("attention")

    class M(tn.Model):
        def __init__(self):
            super().__init__()
            self.seq = layer

        def compute_loss(self, inputs, training=False):
            return tf.reduce_sum(tf.square(self.seq(inputs, training=training) - 1.0))

    model = M()
    model.compile(tn.optimizer.SGD(0.1))
    ids = _layouts()["padded"]
    layer({"h": ids}, training=True)  # inserts the rows
    before = layer.tables["h"].pull([15, 21]).numpy()
    model.fit(tf.data.Dataset.from_tensors({"h": ids}), epochs=1, verbose=0)
    after = layer.tables["h"].pull([15, 21]).numpy()
    assert np.abs(after - before).min() > 0


def test_bad_pooling_and_stray_query():
    with pytest.raises(ValueError, match="pooling must be one of"):
        _layer("max")
    layer = _layer()
    with pytest.raises(ValueError, match="only used with pooling='attention'"):
        layer({"h": _layouts()["padded"]}, query=np.zeros((3, 2), np.float32))


def test_attention_with_a_query_warns_of_no_missing_gradient():
    """With a query the layer's default query is unused: its gradient is
    zero, not missing, so Keras does not warn at every fit that the
    variable gets no gradient, and it stays as it was (zeros)."""
    import logging  # noqa: PLC0415

    import tf_keras  # noqa: PLC0415
    pool = tn.layers.SequencePooling("attention", dim=4, max_length=3)
    seq = tf_keras.Input((3, 4))
    lengths = tf_keras.Input((), dtype="int64")
    query = tf_keras.Input((2,))
    out = tf_keras.layers.Dense(1)(pool(seq, lengths, query=query))
    model = tf_keras.Model([seq, lengths, query], out)
    model.compile(tf_keras.optimizers.Adagrad(0.1), "mse")
    rng = np.random.default_rng(0)
    x = [rng.normal(size=(64, 3, 4)).astype("float32"),
         rng.integers(0, 4, 64), rng.normal(size=(64, 2)).astype("float32")]
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("tensorflow")
    logger.addHandler(handler)
    try:
        model.fit(x, rng.normal(size=(64, 1)), batch_size=16, verbose=0)
    finally:
        logger.removeHandler(handler)
    assert not [r for r in records
                if "Gradients do not exist" in r.getMessage()], records
    np.testing.assert_array_equal(pool.default_query.numpy(), np.zeros(4))
