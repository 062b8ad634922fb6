"""DeepFM (Guo et al., 2017) with tnet tables."""
from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from tnet import layers
from tnet.models.base import CTRModel, mlp
from tnet.optimizer import sparse


class DeepFM(CTRModel):
    """logit = first order(ids) + FM pairwise term + deep MLP.

    The first-order term is `LinearFeatures`; the FM term is
    0.5 * sum_k((sum_f v_fk)^2 - sum_f v_fk^2) over the id embeddings, which
    the MLP shares.

    The embeddings' rows run the compiled optimizer's in-table rule, but
    where it leaves the rows' Adagrad accumulator start at tnet's default
    (1e-6) they start at 3e-3
    (tn.optimizer.sparse.DEEPFM_ROW_INITIAL_ACCUMULATOR_VALUE): every row
    enters each pairwise product of the FM term, and on real Criteo and
    Avazu rows DeepFM does better from 3e-3 than from 1e-6 (measured:
    BENCHMARKS.md "Defaults"). A start you
    give (`tn.optimizer.Adagrad(0.05, row_initial_accumulator_value=1e-6)`)
    is kept.

    Args:
      categorical: id feature names, or embedding columns (see CTRModel).
      dense: float feature names.
      embedding_dim: width of each id's embedding (the FM factors).
      hidden_units: the deep part's MLP.
      **kwargs: CTRModel's arguments.

    Example:
        ```python
        model = tn.models.DeepFM(tn.data.CRITEO_CAT_COLUMNS, tn.data.CRITEO_INT_COLUMNS)
        model.compile(tn.optimizer.Adagrad(0.05))
        ```
    """

    def __init__(self, categorical: Sequence[str], dense: Sequence[str] = (),
                 embedding_dim: int = 8,
                 hidden_units: Sequence[int] = (400, 400, 400), **kwargs):
        super().__init__(categorical, dense, embedding_dim, **kwargs)
        dims = {c.key: c.dimension for c in self.embedding_columns}
        if len(set(dims.values())) > 1:
            raise ValueError("DeepFM's FM term needs one embedding dim for "
                             f"every id feature; got {dims} (give them the "
                             "same dim, e.g. in the feature spec)")
        self.embedding_dim = next(iter(dims.values()))
        self.first_order = layers.LinearFeatures(self.category_columns,
                                                 name="first_order")
        self.embeddings = layers.EmbeddingFeatures(
            self.embedding_columns, name="fm_embeddings",
            row_defaults=sparse.DEEPFM_ROW_DEFAULTS)
        self.deep = mlp(hidden_units, "deep")

    def logits(self, features, training):
        """DeepFM's logits (before the sigmoid).

        Args:
          features: the features dict.
          training: as in Keras.

        Returns:
          `[B, 1]` float32 logits.
        """
        flat = self.embeddings(features, training=training)
        v = tf.reshape(flat, [-1, len(self.categorical), self.embedding_dim])
        fm = 0.5 * tf.reduce_sum(
            tf.square(tf.reduce_sum(v, axis=1)) - tf.reduce_sum(tf.square(v), axis=1),
            axis=1, keepdims=True)
        deep_in = flat
        dense = self.dense_input(features)
        if dense is not None:  # read as their concat (ConcatDense)
            deep_in = [flat, dense]
        return (self.first_order(features, training=training) + fm
                + self.deep(deep_in, training=training))
