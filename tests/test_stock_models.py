"""The stock tf_keras reference models' multi-valued pooling (the
SPARSE-HEAVY baseline): every input form computes the same mean / sum."""
from __future__ import annotations

import numpy as np
import pytest

from tnet.models.stock import PooledEmbedding, stock_wide_deep  # first: tnet selects tf_keras
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402


def _padded(rng, rows=64, width=7, bins=50):
    lengths = rng.integers(0, width + 1, rows)  # a row may have no id
    ids = rng.integers(0, 3 * bins, (rows, width))  # floormod folds them
    ids[np.arange(width) >= lengths[:, None]] = -1
    return ids


@pytest.mark.parametrize("combiner", ["mean", "sum"])
def test_pooled_embedding_forms_agree_with_numpy(combiner):
    rng = np.random.default_rng(0)
    ids = _padded(rng)
    layers = {p: PooledEmbedding(50, 3, combiner, pooling=p) for p in ("ragged", "masked")}
    ragged_input = tf.RaggedTensor.from_tensor(ids, padding=-1)
    for layer in layers.values():
        layer(tf.constant(ids))  # builds the weights
    table = rng.normal(size=(50, 3)).astype(np.float32)
    for layer in layers.values():
        layer.embedding.embeddings.assign(table)
    out = {p: layer(tf.constant(ids)).numpy() for p, layer in layers.items()}
    out["ragged input"] = layers["ragged"](ragged_input).numpy()
    valid = ids >= 0
    rows = np.where(valid[..., None], table[np.mod(ids, 50)], 0.0).sum(axis=1)
    if combiner == "mean":
        rows = rows / np.maximum(valid.sum(axis=1), 1)[:, None]
    assert (valid.sum(axis=1) == 0).any()
    for name, got in out.items():
        np.testing.assert_allclose(got, rows, rtol=1e-5, atol=1e-6, err_msg=name)


def test_pooled_embedding_ragged_updates_only_real_ids():
    ids = np.array([[3, 5, -1], [5, -1, -1]])
    layer = PooledEmbedding(10, 2, pooling="ragged")
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(tf.constant(ids)))
    grad = tape.gradient(loss, layer.embedding.embeddings)
    assert isinstance(grad, tf.IndexedSlices)
    assert sorted(grad.indices.numpy().tolist()) == [3, 5, 5]
    with pytest.raises(ValueError, match="pooling"):
        PooledEmbedding(10, 2, pooling="dense")


@pytest.mark.parametrize("ragged", [False, True])
def test_stock_wide_deep_with_multi_valued_columns_trains(ragged):
    rng = np.random.default_rng(1)
    n = 256
    ids = _padded(rng, n, 5, 100)
    multi = tf.RaggedTensor.from_tensor(ids, padding=-1) if ragged else tf.constant(ids)
    features = {"C1": tf.constant(rng.integers(0, 1000, n)), "M1": multi,
                "I1": tf.constant(rng.normal(size=n).astype(np.float32))}
    labels = tf.constant((rng.random(n) < 0.3).astype(np.float32))
    model = stock_wide_deep(["C1"], ["I1"], embedding_dim=4, num_bins=64,
                            hidden_units=(8,), multi_valued=["M1"],
                            max_length=5, ragged=ragged)
    model.compile(tf_keras.optimizers.Adagrad(0.05),
                  tf_keras.losses.BinaryCrossentropy(from_logits=True))
    history = model.fit(features, labels, batch_size=64, epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    assert model.predict(features, batch_size=64, verbose=0).shape == (n, 1)
    with pytest.raises(ValueError, match="floormod"):
        stock_wide_deep(["C1"], multi_valued=["M1"], reduce="hashing")
