"""DCN-v2 (Wang et al., 2021) with tnet tables and tfrs' Cross layer."""
from __future__ import annotations

from typing import Optional, Sequence

import tensorflow as tf
import tensorflow_recommenders as tfrs

from tnet import layers
from tnet.models.base import CTRModel, mlp


class DCN(CTRModel):
    """x0 = [embeddings, dense]; `num_cross` stacked `tfrs.layers.dcn.Cross`
    layers (low-rank when `projection_dim` is set), then an MLP.

    Args:
      categorical: id feature names, or embedding columns (see CTRModel).
      dense: float feature names.
      embedding_dim: width of each id's embedding.
      hidden_units: the MLP after the cross layers.
      num_cross: how many cross layers.
      projection_dim: the cross layers' low rank (None: full rank).
      **kwargs: CTRModel's arguments.

    Example:
        ```python
        model = tn.models.DCN(tn.data.CRITEO_CAT_COLUMNS, tn.data.CRITEO_INT_COLUMNS,
                              num_cross=3, projection_dim=16)
        model.compile(tn.optimizer.Adagrad(0.05))
        ```
    """

    def __init__(self, categorical: Sequence[str], dense: Sequence[str] = (),
                 embedding_dim: int = 8,
                 hidden_units: Sequence[int] = (400, 400),
                 num_cross: int = 2, projection_dim: Optional[int] = None,
                 **kwargs):
        super().__init__(categorical, dense, embedding_dim, **kwargs)
        self.embeddings = layers.EmbeddingFeatures(self.embedding_columns,
                                                   name="dcn_embeddings")
        self.cross = [tfrs.layers.dcn.Cross(projection_dim=projection_dim,
                                            kernel_initializer="glorot_uniform",
                                            name=f"cross_{i}")
                      for i in range(num_cross)]
        self.deep = mlp(hidden_units, "deep")

    def logits(self, features, training):
        """DCN's logits (before the sigmoid).

        Args:
          features: the features dict.
          training: as in Keras.

        Returns:
          `[B, 1]` float32 logits.
        """
        x0 = self.embeddings(features, training=training)
        dense = self.dense_input(features)
        if dense is not None:
            x0 = tf.concat([x0, dense], axis=1)
        x = x0
        for layer in self.cross:
            x = layer(x0, x)
        return self.deep(x, training=training)
