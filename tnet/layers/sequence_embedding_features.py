"""SequenceEmbeddingFeatures: behaviour sequences as [B, L, dim] + lengths,
or pooled to one vector per example (mean or attention)."""
from __future__ import annotations

from typing import Optional

import tensorflow as tf
import tf_keras

from tnet import feature_column as fc
from tnet.layers.embedding_features import EmbeddingFeatures, _embed

__all__ = ["SequenceEmbeddingFeatures", "SequencePooling"]

POOLINGS = (None, "mean", "attention")


class SequencePooling(tf_keras.layers.Layer):
    """Pools left-aligned sequences [B, L, d] with lengths [B] to [B, d].

    Pure TensorFlow (no table): SequenceEmbeddingFeatures uses it on the
    rows it pulls, and a stock Keras model can use it on `Embedding`
    outputs, so both pool identically (see SequenceEmbeddingFeatures for
    "mean" and "attention").

    Args:
      pooling: "mean" or "attention".
      dim: d, the width of each position.
      max_length: L.
      **kwargs: Keras layer arguments.

    Call:
      `layer(sequence [B, L, d], lengths [B], query=None)` -> `[B, d]`.

    Example:
        ```python
        pool = tn.layers.SequencePooling("mean", dim=8, max_length=5)
        out = pool(tf.ones([2, 5, 8]), tf.constant([3, 0]))   # [2, 8]; 0 ids: zeros
        ```
    """

    def __init__(self, pooling: str, dim: int, max_length: int, **kwargs):
        super().__init__(**kwargs)
        if pooling not in POOLINGS or pooling is None:
            raise ValueError(f"SequencePooling: pooling must be 'mean' or "
                             f"'attention', got {pooling!r}")
        self.pooling = pooling
        self.dim = dim
        self.max_length = max_length
        if pooling == "attention":
            self.key_projection = tf_keras.layers.Dense(
                dim, use_bias=False, name="attention_key")
            self.query_projection = tf_keras.layers.Dense(
                dim, use_bias=False, name="attention_query")
            self.default_query = self.add_weight(
                name="attention_default_query", shape=[dim],
                initializer="zeros")
            self.recency = self.add_weight(
                name="attention_recency", shape=[max_length],
                initializer="zeros")

    def call(self, sequence, lengths, query=None):
        lengths = tf.cast(lengths, tf.int64)
        mask = tf.sequence_mask(lengths, self.max_length)  # [B, L]
        if self.pooling == "mean":
            total = tf.reduce_sum(sequence, axis=1)
            count = tf.cast(lengths, sequence.dtype)[:, tf.newaxis]
            return tf.math.divide_no_nan(total, count)
        dim = self.dim
        keys = self.key_projection(sequence)  # [B, L, d]
        if query is None:
            q = tf.broadcast_to(self.default_query,
                                [tf.shape(sequence)[0], dim])
        else:
            # + 0 * the default query (unused here): its gradient is zero,
            # not missing, so Keras does not warn at every step that a
            # variable gets none; no optimizer moves it (zeros stay zeros).
            q = (self.query_projection(tf.cast(query, sequence.dtype))
                 + 0.0 * self.default_query)
        scores = tf.einsum("bld,bd->bl", keys, q) / tf.sqrt(float(dim))
        # distance from the most recent kept event: length - 1 - position
        distance = (lengths[:, tf.newaxis] - 1
                    - tf.range(self.max_length, dtype=tf.int64))
        distance = tf.clip_by_value(distance, 0, self.max_length - 1)
        scores += tf.gather(self.recency, distance)
        scores = tf.where(mask, scores, tf.fill(tf.shape(scores), -1e9))
        weights = tf.nn.softmax(scores, axis=1)
        weights *= tf.cast(mask, weights.dtype)  # empty rows -> all zero
        return tf.einsum("bl,bld->bd", weights, sequence)


class SequenceEmbeddingFeatures(EmbeddingFeatures):
    """Embeds sequence columns position by position.

    Each column must be a `sequence_category_column`; ids are kept in order,
    truncated to the most recent `max_length`, and left-aligned: position 0
    is the oldest kept id, positions past an example's length are zeros.
    All columns of one layer must share max_length and describe the same
    events (e.g. item id and item category of the history): their
    embeddings are concatenated on the last axis.

    pooling:
      None: returns (sequence [B, max_length, sum of dims], lengths int64
        [B]); lengths come from the first column.
      "mean": returns [B, sum of dims], the mean over each example's kept
        positions (zeros for an empty history).
      "attention": returns [B, sum of dims], a softmax-weighted sum over the
        kept positions. A position's score is `key(e_p) . q / sqrt(d) +
        recency[length - 1 - p]`: q is the `query` passed to call (e.g. the
        user's other features; projected to d) or, without one, a learned
        vector; `recency` is a learned bias per distance from the most
        recent event, because which item was watched last matters beyond
        what it is. Padded positions get no weight; an empty history gives
        zeros, like "mean", so both degrade the same way for new users.

    Args:
      columns: `tn.feature_column.sequence_category_column`s embedded with
        `tn.feature_column.embedding_column`.
      optimizer: the in-table rule (None: the model's optimizer).
      pooling: None, "mean" or "attention" (above).
      **kwargs: Keras layer arguments, and the table options of
        `EmbeddingFeatures`.

    Example:
        ```python
        history = tn.feature_column.sequence_category_column("history", max_length=20)
        seq = tn.layers.SequenceEmbeddingFeatures(
            [tn.feature_column.embedding_column(history, 16)], pooling="mean")
        pooled = seq({"history": tf.constant([[3, 4, -1], [5, -1, -1]])})  # [2, 16]
        ```
    """

    def __init__(self, columns, optimizer=None, pooling: Optional[str] = None,
                 **kwargs):
        super().__init__(columns, optimizer=optimizer, **kwargs)
        lengths = set()
        for col in self._columns:
            cat = col.categorical_column
            if not isinstance(cat, fc.SequenceCategoryColumn):
                raise TypeError(
                    f"SequenceEmbeddingFeatures: column {cat.name!r} is not a "
                    "sequence_category_column")
            lengths.add(cat.max_length)
        if len(lengths) != 1:
            raise ValueError("SequenceEmbeddingFeatures: all columns must "
                             f"have the same max_length, got {sorted(lengths)}")
        if pooling not in POOLINGS:
            raise ValueError(f"SequenceEmbeddingFeatures: pooling must be one "
                             f"of {POOLINGS}, got {pooling!r}")
        self.max_length = lengths.pop()
        self.pooling = pooling
        self.pooler = (SequencePooling(pooling, self.output_dim,
                                       self.max_length, name="pooling")
                       if pooling is not None else None)

    def call(self, features, training=None, query=None):
        self._create_tables()
        parts = _embed(self, features, training, sequence=True)
        seqs, lengths = [], None
        for (emb, rows, batch, pos), col in zip(parts, self._columns):
            batch = tf.cast(batch, tf.int64)
            shape = tf.stack([batch, self.max_length, col.dimension])
            index = tf.stack([rows, pos], axis=1)
            seqs.append(tf.scatter_nd(index, emb, shape))
            if lengths is None:
                lengths = tf.math.unsorted_segment_sum(tf.ones_like(rows),
                                                       rows, batch)
        out = tf.concat(seqs, axis=-1) if len(seqs) > 1 else seqs[0]
        if self.pooling is None:
            if query is not None:
                raise ValueError("SequenceEmbeddingFeatures: a query is only "
                                 "used with pooling='attention'")
            return out, lengths
        return self.pool(out, lengths, query)

    def pool(self, sequence: tf.Tensor, lengths: tf.Tensor,
             query: Optional[tf.Tensor] = None) -> tf.Tensor:
        """[B, L, d] left-aligned sequences + lengths -> [B, d].

        Args:
          sequence: `[B, L, d]` float32, left-aligned.
          lengths: `[B]` int, the valid positions of each row.
          query: `[B, q]` for attention pooling (None for mean).
        """
        return self.pooler(sequence, lengths, query=query)

    def compute_output_shape(self, input_shape):
        if self.pooling is not None:
            return tf.TensorShape([None, self.output_dim])
        return (tf.TensorShape([None, self.max_length, self.output_dim]),
                tf.TensorShape([None]))
