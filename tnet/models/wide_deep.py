"""Wide & Deep (Cheng et al., 2016) with tnet tables."""
from __future__ import annotations

from typing import Sequence

from tnet import layers
from tnet.models.base import CTRModel, mlp


class WideDeep(CTRModel):
    """logit = wide(ids) + deep([embeddings, dense]).

    The wide part is `tn.layers.LinearFeatures` (one weight per id, FTRL in
    the table by default); the deep part embeds every id column
    (`embedding_dim`) and runs an MLP with `hidden_units`.

    Args:
      categorical: id feature names, or embedding columns (see CTRModel).
      dense: float feature names.
      embedding_dim: width of each id's embedding.
      hidden_units: the deep part's MLP.
      wide_optimizer: the wide part's in-table rule (default FTRL, lr 0.1
        from 2.5e-4: `tn.layers.LinearFeatures`).
      **kwargs: CTRModel's arguments (`shared_table`, `label_key`, ...).

    Example:
        ```python
        model = tn.models.WideDeep(tn.data.CRITEO_CAT_COLUMNS, tn.data.CRITEO_INT_COLUMNS)
        model.compile(tn.optimizer.Adagrad(0.05))
        model.fit(tn.data.SyntheticCriteo().dataset(100_000, batch_size=1024))
        ```
    """

    def __init__(self, categorical: Sequence[str], dense: Sequence[str] = (),
                 embedding_dim: int = 8,
                 hidden_units: Sequence[int] = (400, 400, 400),
                 wide_optimizer=None, **kwargs):
        super().__init__(categorical, dense, embedding_dim, **kwargs)
        self.wide = layers.LinearFeatures(self.category_columns,
                                          optimizer=wide_optimizer,
                                          name="wide")
        self.embeddings = layers.EmbeddingFeatures(self.embedding_columns,
                                                   name="deep_embeddings")
        self.deep = mlp(hidden_units, "deep")

    def logits(self, features, training):
        """WideDeep's logits (before the sigmoid).

        Args:
          features: the features dict.
          training: as in Keras.

        Returns:
          `[B, 1]` float32 logits.
        """
        deep_in = self.embeddings(features, training=training)
        dense = self.dense_input(features)
        if dense is not None:  # read as their concat (ConcatDense)
            deep_in = [deep_in, dense]
        return (self.wide(features, training=training)
                + self.deep(deep_in, training=training))
