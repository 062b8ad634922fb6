"""Keras layers backed by tnet tables."""
from tnet.layers.embedding_features import EmbeddingFeatures
from tnet.layers.linear_features import LinearFeatures
from tnet.layers.sequence_embedding_features import (SequenceEmbeddingFeatures,
                                                     SequencePooling)

__all__ = ["EmbeddingFeatures", "SequenceEmbeddingFeatures", "SequencePooling",
           "LinearFeatures"]
