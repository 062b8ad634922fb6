"""Stock tf_keras reference models (no tnet ops) for tests and benchmarks.

`stock_wide_deep` is the Wide&Deep a competent Keras user writes today:
every id column reduced into `num_bins` rows feeding an `Embedding` (deep)
and a 1-wide `Embedding` (wide), dense features concatenated, the same
MLP. int64 ids are reduced with `tf.math.floormod` (one cheap op, the
strongest stock baseline); `reduce="hashing"` uses
`tf_keras.layers.Hashing`, which turns every int into a string and hashes
it each step (slower; kept as a second baseline). String ids are always
hashed. It is the baseline tnet's tests and benchmarks compare against; it
is not part of tnet's API.
"""
from __future__ import annotations

from typing import Sequence

import tensorflow as tf
import tf_keras


def stock_wide_deep(categorical: Sequence[str], dense: Sequence[str] = (),
                    embedding_dim: int = 8, num_bins: int = 2**20,
                    hidden_units: Sequence[int] = (400, 400, 400),
                    string_ids: bool = False,
                    partitioner_shards: int = 0,
                    reduce: str = "floormod") -> tf_keras.Model:
    """Functional Wide&Deep over reduced ids; outputs logits [B, 1]."""
    if reduce not in ("floormod", "hashing"):
        raise ValueError(f"reduce must be 'floormod' or 'hashing', got "
                         f"{reduce!r}")
    dtype = tf.string if string_ids else tf.int64
    inputs = {n: tf_keras.Input((), dtype=dtype, name=n) for n in categorical}
    inputs.update({n: tf_keras.Input((), dtype=tf.float32, name=n)
                   for n in dense})
    deep, wide = [], []
    for n in categorical:
        if string_ids or reduce == "hashing":
            hashed = tf_keras.layers.Hashing(num_bins,
                                             name=f"hash_{n}")(inputs[n])
        else:
            hashed = tf_keras.layers.Lambda(
                lambda t: tf.math.floormod(t, num_bins),
                name=f"floormod_{n}")(inputs[n])
        deep.append(tf_keras.layers.Embedding(
            num_bins, embedding_dim, name=f"emb_{n}")(hashed))
        wide.append(tf_keras.layers.Embedding(
            num_bins, 1, embeddings_initializer="zeros",
            name=f"wide_{n}")(hashed))
    x = tf_keras.layers.Concatenate()(
        deep + ([tf.stack([inputs[n] for n in dense], axis=1)] if dense else []))
    for i, units in enumerate(hidden_units):
        x = tf_keras.layers.Dense(units, activation="relu", name=f"dnn_{i}")(x)
    deep_logit = tf_keras.layers.Dense(1, name="deep_logit")(x)
    wide_logit = tf_keras.layers.Add(name="wide_logit")(wide) if len(wide) > 1 else wide[0]
    logits = tf_keras.layers.Add(name="logits")([deep_logit, wide_logit])
    return tf_keras.Model(inputs, logits, name="stock_wide_deep")
