"""LinearFeatures: the wide (linear) part over id features."""
from __future__ import annotations

from typing import Any, Optional, Sequence

import tensorflow as tf

from tnet import feature_column as fc
from tnet.layers.embedding_features import EmbeddingFeatures
from tnet.optimizer import sparse


class LinearFeatures(EmbeddingFeatures):
    """sum over columns of w[id] (+ a bias): [B, 1] logits.

    Every column gets a 1-wide row per id in one shared table (ids are salted
    per column). The default in-table rule is FTRL, the classic choice for
    sparse linear models, at learning rate sparse.WIDE_FTRL_LEARNING_RATE
    (0.1) with its accumulators starting at
    sparse.WIDE_FTRL_INITIAL_ACCUMULATOR_VALUE (2.5e-4, not Keras' 0.1: a
    rare id's weight moves in its first examples); pass `optimizer=` to
    change it (`sparse.Ftrl(0.2)`: TensorFlow's canned linear models' rate
    and Keras' start). Weights start at 0.

    Args:
      columns: `tn.feature_column.category_column`s (or embedding columns,
        whose categorical columns are used).
      optimizer: the in-table rule (default: FTRL, learning rate 0.1,
        accumulators from 2.5e-4).
      table: the shared table's name (default: the layer's name).
      use_bias: add a learned bias.
      **kwargs: Keras layer arguments (`name`, ...).

    Call:
      `layer(features, training=False)` -> `[B, 1]` float32.

    Example:
        ```python
        wide = tn.layers.LinearFeatures([tn.feature_column.category_column("user_id")])
        logits = wide({"user_id": tf.constant([1, 2, 3])})   # [3, 1]
        ```
    """

    def __init__(self, columns: Sequence[Any], optimizer: Any = None,
                 table: Optional[str] = None, use_bias: bool = True,
                 **kwargs):
        name = kwargs.get("name") or "linear_features"
        kwargs["name"] = name
        table = table or name
        cats = []
        for col in columns:
            cat = col.categorical_column if isinstance(
                col, fc.EmbeddingColumn) else col
            if not isinstance(cat, fc.CategoryColumn):
                raise TypeError(
                    "LinearFeatures takes tn.feature_column.category_column "
                    f"items, got {type(col).__name__}")
            cats.append(fc.embedding_column(cat, 1, combiner="sum",
                                            table=table, initializer="zeros"))
        if optimizer is None:
            optimizer = sparse.Ftrl(
                learning_rate=sparse.WIDE_FTRL_LEARNING_RATE,
                initial_accumulator_value=(
                    sparse.WIDE_FTRL_INITIAL_ACCUMULATOR_VALUE))
        super().__init__(cats, optimizer=optimizer, **kwargs)
        self.use_bias = use_bias

    def build(self, input_shape=None):
        if self.use_bias:
            self.bias = self.add_weight("bias", shape=[1],
                                        initializer="zeros")
        super().build(input_shape)

    def call(self, features, training=None):
        per_column = super().call(features, training=training)
        logits = tf.reduce_sum(per_column, axis=1, keepdims=True)
        return logits + self.bias if self.use_bias else logits

    def compute_output_shape(self, input_shape):
        return tf.TensorShape([None, 1])
