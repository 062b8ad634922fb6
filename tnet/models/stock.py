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

Multi-valued id columns (`multi_valued=`) go through `PooledEmbedding`:
floormod into the same kind of `Embedding`, then the mean (deep) or sum
(wide, as a linear model and tnet's LinearFeatures combine) over the row's
ids. They come as a `tf.RaggedTensor` [B, None] (`ragged=True`, what a
reader of list cells yields: only the real ids are looked up) or as int64
[B, max_length] padded with -1, pooled one of two ways a Keras user writes
it (`pooling=`): "ragged" drops the padding first (`tf.boolean_mask`), so
the gradient and the sparse optimizer touch only the real ids' rows;
"masked" looks up all L slots and multiplies the padding by 0 (simpler,
but gathers and updates L rows per example).
"""
from __future__ import annotations

from typing import Sequence

import tensorflow as tf
import tf_keras


_POOLINGS = ("ragged", "masked")


class PooledEmbedding(tf_keras.layers.Layer):
    """Ids of a multi-valued column -> [B, dim]: the combiner ("mean" or
    "sum") of `Embedding(num_bins, dim)` rows of floormod(id, num_bins)
    over each row's ids (a row without ids gives zeros).

    Takes a `tf.RaggedTensor` [B, None] (its values are looked up), or
    int64 [B, L] padded with -1: pooling "ragged" looks up only the real
    ids (boolean_mask), "masked" all L slots, the padding multiplied by 0.
    """

    def __init__(self, num_bins: int, dim: int, combiner: str = "mean",
                 pooling: str = "ragged",
                 embeddings_initializer="uniform", **kwargs):
        super().__init__(**kwargs)
        if combiner not in ("mean", "sum"):
            raise ValueError(f"combiner must be 'mean' or 'sum', got {combiner!r}")
        if pooling not in _POOLINGS:
            raise ValueError(f"pooling must be one of {_POOLINGS}, got {pooling!r}")
        self.num_bins, self.dim = int(num_bins), int(dim)
        self.combiner, self.pooling = combiner, pooling
        self.embedding = tf_keras.layers.Embedding(
            self.num_bins, self.dim,
            embeddings_initializer=embeddings_initializer, name="embedding")

    def call(self, ids):
        if isinstance(ids, tf.RaggedTensor):
            values = tf.cast(ids.flat_values, tf.int64)
            rows = self.embedding(tf.math.floormod(values, self.num_bins))
            total = tf.math.unsorted_segment_sum(rows, ids.value_rowids(),
                                                 ids.nrows())
            count = tf.cast(ids.row_lengths(), total.dtype)[:, tf.newaxis]
        else:
            ids = tf.cast(ids, tf.int64)
            mask = ids >= 0
            count = tf.reduce_sum(tf.cast(mask, tf.float32), axis=1, keepdims=True)
            if self.pooling == "masked":
                rows = self.embedding(tf.math.floormod(ids, self.num_bins))
                total = tf.reduce_sum(rows * tf.cast(mask, rows.dtype)[..., None], axis=1)
            else:
                rows = self.embedding(tf.math.floormod(tf.boolean_mask(ids, mask),
                                                       self.num_bins))
                total = tf.math.unsorted_segment_sum(
                    rows, tf.where(mask)[:, 0], tf.shape(ids, out_type=tf.int64)[0])
        if self.combiner == "sum":
            return total
        return total / tf.maximum(tf.cast(count, total.dtype), 1.0)

    def get_config(self):
        config = super().get_config()
        config.update(num_bins=self.num_bins, dim=self.dim,
                      combiner=self.combiner, pooling=self.pooling)
        return config


def stock_wide_deep(categorical: Sequence[str], dense: Sequence[str] = (),
                    embedding_dim: int = 8, num_bins: int = 2**20,
                    hidden_units: Sequence[int] = (400, 400, 400),
                    string_ids: bool = False,
                    partitioner_shards: int = 0,
                    reduce: str = "floormod",
                    multi_valued: Sequence[str] = (),
                    max_length: int = 50,
                    pooling: str = "ragged",
                    ragged: bool = False) -> tf_keras.Model:
    """Functional Wide&Deep over reduced ids; outputs logits [B, 1].

    multi_valued: names of multi-valued int64 id features (floormod only):
    `tf.RaggedTensor` [B, None] when `ragged`, else [B, max_length] padded
    with -1 and pooled as `pooling` says; see `PooledEmbedding`. Mean in
    the deep part, sum in the wide part.
    """
    if reduce not in ("floormod", "hashing"):
        raise ValueError(f"reduce must be 'floormod' or 'hashing', got "
                         f"{reduce!r}")
    if multi_valued and (string_ids or reduce != "floormod"):
        raise ValueError("multi_valued columns take int64 ids reduced with "
                         "floormod (string_ids=False, reduce='floormod')")
    dtype = tf.string if string_ids else tf.int64
    inputs = {n: tf_keras.Input((), dtype=dtype, name=n) for n in categorical}
    inputs.update({n: tf_keras.Input((None,), dtype=tf.int64, name=n, ragged=True)
                   if ragged else tf_keras.Input((max_length,), dtype=tf.int64, name=n)
                   for n in multi_valued})
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
    for n in multi_valued:
        deep.append(PooledEmbedding(num_bins, embedding_dim, "mean", pooling,
                                    name=f"emb_{n}")(inputs[n]))
        wide.append(PooledEmbedding(num_bins, 1, "sum", pooling,
                                    embeddings_initializer="zeros",
                                    name=f"wide_{n}")(inputs[n]))
    x = tf_keras.layers.Concatenate()(
        deep + ([tf.stack([inputs[n] for n in dense], axis=1)] if dense else []))
    for i, units in enumerate(hidden_units):
        x = tf_keras.layers.Dense(units, activation="relu", name=f"dnn_{i}")(x)
    deep_logit = tf_keras.layers.Dense(1, name="deep_logit")(x)
    wide_logit = tf_keras.layers.Add(name="wide_logit")(wide) if len(wide) > 1 else wide[0]
    logits = tf_keras.layers.Add(name="logits")([deep_logit, wide_logit])
    return tf_keras.Model(inputs, logits, name="stock_wide_deep")
