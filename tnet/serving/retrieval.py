"""The retrieval flavour of `export_for_serving`: raw query features in,
top-K candidate ids and scores out.

A two-tower model serves in two halves: the candidate tower runs once per
corpus, the query tower once per request. So at export time every
candidate is embedded here (inference mode, reading the trained tables)
into a `[N, d]` matrix, and the SavedModel's function computes the query
embedding from raw features (the query tables replaced by stock lookups,
as for ranking exports), scores all N candidates with one matmul and keeps
the best k with `tf.math.top_k`: the same brute-force search as
`tfrs.layers.factorized_top_k.BruteForce`, written with plain variables so
that the SavedModel holds no Keras object and loads anywhere.

The candidate matrix and ids are variables (saved in `variables/`, not as
graph constants), for the same 2 GB graph-proto reason as the tables. The
candidate tables themselves are not exported: serving never reads them.
An unknown user id reads the zero row of the exported user table, exactly
like the in-process model (see tn.models.TwoTower on cold start).
"""
from __future__ import annotations

from typing import Any, Dict, Mapping

import numpy as np
import tensorflow as tf

__all__ = ["RetrievalExport", "CandidateIndex"]


class CandidateIndex(tf.Module):
    """Candidate ids [N] and embeddings [N, d] as (non-trainable) variables."""

    def __init__(self, ids: np.ndarray, embeddings: np.ndarray):
        super().__init__(name="candidate_index")
        self.ids = tf.Variable(ids, trainable=False, name="candidate_ids")
        self.embeddings = tf.Variable(embeddings, trainable=False,
                                      name="candidate_embeddings")


class RetrievalExport:
    """What export_for_serving needs to write a top-K retriever."""

    OUTPUT_KEYS = ("ids", "scores")

    def __init__(self, model, candidates: Mapping[str, Any], k: int):
        for attr in ("query_embedding", "embed_candidates", "query_tables"):
            if not hasattr(model, attr):
                raise TypeError(
                    f"export_for_serving(candidates=...) exports a retrieval "
                    f"model such as tn.models.TwoTower; "
                    f"{type(model).__name__} has no {attr}()")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"export_for_serving: k must be a positive int, "
                             f"got {k!r}")
        self.model = model
        self.candidates = candidates
        self.k = k
        self._ids = None

    def input_signature(self) -> Dict[str, tf.TensorSpec]:
        return self.model.serving_input_signature()

    def query_tables(self, tables: Dict[str, Any]) -> Dict[str, Any]:
        wanted = self.model.query_tables()
        missing = sorted(set(wanted) - set(tables))
        if missing:
            raise ValueError(f"query tables {missing} are not in "
                             "model.tables(); build the model before export")
        return {n: tables[n] for n in wanted}

    def build_index(self) -> CandidateIndex:
        ids, emb = self.model.embed_candidates(self.candidates)
        if np.unique(ids).size != ids.size:
            raise ValueError("export_for_serving: candidate ids must be "
                             "unique (one row per item)")
        if self.k > ids.size:
            raise ValueError(f"export_for_serving: k={self.k} exceeds the "
                             f"{ids.size} candidates")
        self._ids = ids
        return CandidateIndex(ids, emb.astype(np.float32))

    def serve_fn(self, index: CandidateIndex):
        model, k = self.model, self.k

        def serve(features):
            query = model.query_embedding(features, training=False)
            scores = tf.matmul(query, index.embeddings, transpose_b=True)
            top, rows = tf.math.top_k(scores, k=k)
            return {"ids": tf.gather(index.ids, rows, name="ids"),
                    "scores": tf.identity(top, name="scores")}
        return serve

    def info(self) -> Dict[str, Any]:
        return {"k": self.k, "candidates": int(self._ids.size)
                if self._ids is not None else None}
