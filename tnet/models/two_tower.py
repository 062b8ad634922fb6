"""TwoTower: candidate retrieval with tnet tables and tfrs' Retrieval task.

A query tower embeds the user (id, string features, recent history) and a
candidate tower embeds the item (id, genres); the score of a pair is the
dot product of the two outputs. Training is `tfrs.tasks.Retrieval`: an
in-batch softmax, where every other item of the batch is a negative.
Popular items are over-represented among in-batch negatives, so with
`sampling_probability_key` the logits are corrected by log(item frequency)
(Yi et al., 2019, "sampling-bias-corrected neural modeling").

Ids go through tnet tables, so the id space is unbounded and
collision-free and the tables train on a parameter server.

Cold start: an unseen user id reads the table's zero row in inference
(tnet never inserts rows outside training; the export maps unknown keys to
an all-zero row), so that slice of the query tower's input is zeros and the
query embedding comes from the user features and the history alone. Users
with no history get a zero history vector the same way.

Evaluation: `evaluate_exact` ranks *all* candidates for every hold-out
query with `tfrs.metrics.FactorizedTopK` over a
`tfrs.layers.factorized_top_k.BruteForce` index of the candidate
embeddings, computed once per evaluation here (on the chief under
ParameterServerStrategy: the index is a dense matrix local to this process,
and ranking the full corpus per batch on workers would duplicate it on
every worker for no gain at this size). Keras' `evaluate` runs the same
loss on hold-out batches (the task carries no factorized metrics, so
training steps never rank the corpus).
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_recommenders as tfrs
import tf_keras

from tnet import feature_column as fc
from tnet import layers
from tnet.model import Model

__all__ = ["TwoTower", "EMBEDDING_INITIALIZER"]

# The tables' initializer in TwoTower: Keras' Embedding default, uniform
# +-0.05, not tnet's table default normal(0, 0.01) (chosen on CTR models).
# Both towers end in an L2 normalization, whose gradient is
# (I - x x^T/|x|^2) / |x|: embeddings 3x smaller make the towers' first
# outputs ~3x smaller, their first gradients ~3x larger, and the dense
# Adagrad accumulators, which never forget them, grow larger (the towers'
# biases' 12x after 30 steps in the two-tower study), so the towers learn
# slower for the rest of the run. Measured: BENCHMARKS.md, "The two-tower
# gap: the initializer".
EMBEDDING_INITIALIZER = "uniform"


def _tower(hidden_units: Sequence[int], output_dim: int, name: str):
    return tf_keras.Sequential(
        [tf_keras.layers.Dense(u, activation="relu") for u in hidden_units]
        + [tf_keras.layers.Dense(output_dim)], name=name)


class TwoTower(Model):
    """Query tower x candidate tower, trained with in-batch softmax.

    Args:
      user_id: name of the int64 user id feature.
      item_id: name of the int64 item id feature.
      user_features: string feature names of the user (one token each).
        They share table "user" with the user id (keys salted per column):
        one fused lookup and one push per step for the whole user.
      item_features: string multi-valued item features (e.g. genres,
        [B, G] padded with ""), mean-combined; in table "item" with the
        item id.
      history: name of the int64 history feature ([B, L] padded with -1,
        ragged or sparse; most recent last), or None for no history.
      history_max_length: history ids kept (the most recent).
      pooling: "mean" or "attention" (see SequenceEmbeddingFeatures; the
        attention query is the user's id and feature embeddings).
      embedding_dim: width of every id embedding.
      hidden_units: each tower's MLP widths.
      output_dim: each tower's output width.
      normalize: L2-normalize both towers' outputs (cosine scores), which
        with a `temperature` below 1 trains faster and more stably than raw
        dot products on small data.
      temperature: softmax temperature of the Retrieval task.
      sampling_probability_key: feature holding each example's item
        sampling probability (its share of training interactions); when
        set, in-batch logits are corrected by it. None: no correction.
      ks: the k of the FactorizedTopK recall metrics.
      remove_accidental_hits: do not count an in-batch copy of the positive
        item as a negative.
      embedding_initializer: every table's initializer (see
        tn.SparseTable); by default EMBEDDING_INITIALIZER, Keras'
        Embedding default uniform +-0.05, with which the normalized towers
        train as the stock model's do (see EMBEDDING_INITIALIZER). None:
        tnet's table default, normal(0, 0.01).

    Example:
        ```python
        data = tn.data.load_movielens("../shared/data/movielens", history_max_length=20)
        model = tn.models.TwoTower(user_features=tn.data.movielens.USER_FEATURES,
                                   history_max_length=20)
        model.compile(tn.optimizer.Adagrad(0.1))
        model.fit(tn.data.movielens_dataset(data.train, 1024), epochs=3)
        print(model.evaluate_exact(tn.data.movielens_dataset(data.test, 4096),
                                   data.items))   # recall_at_10/50/100
        tn.saving.export_for_serving(model, "/export/1", candidates=data.items, k=100)
        ```
    """

    def __init__(self, user_id: str = "user_id",
                 user_features: Sequence[str] = (),
                 history: Optional[str] = "history",
                 history_max_length: int = 50, pooling: str = "mean",
                 item_id: str = "item_id",
                 item_features: Sequence[str] = ("genres",),
                 embedding_dim: int = 32, hidden_units: Sequence[int] = (64,),
                 output_dim: int = 32, normalize: bool = True,
                 temperature: Optional[float] = 0.1,
                 sampling_probability_key: Optional[str] = None,
                 ks: Sequence[int] = (10, 50, 100),
                 remove_accidental_hits: bool = True,
                 embedding_initializer: Any = EMBEDDING_INITIALIZER,
                 **kwargs):
        super().__init__(**kwargs)
        if pooling not in ("mean", "attention"):
            raise ValueError(f"TwoTower: pooling must be 'mean' or "
                             f"'attention', got {pooling!r}")
        self.user_id = user_id
        self.user_feature_names = list(user_features)
        self.history_name = history
        self.item_id = item_id
        self.item_feature_names = list(item_features)
        self.sampling_probability_key = sampling_probability_key
        self.normalize = normalize
        self.ks = tuple(int(k) for k in ks)
        self.embedding_dim = embedding_dim

        init = embedding_initializer
        user_cols = [fc.embedding_column(fc.category_column(user_id),
                                         embedding_dim, table="user",
                                         initializer=init)]
        user_cols += [fc.embedding_column(
            fc.category_column(n, tf.string), embedding_dim,
            table="user", initializer=init)
            for n in self.user_feature_names]
        self.user_embeddings = layers.EmbeddingFeatures(
            user_cols, name="user_embeddings")
        self.history_embeddings = None
        if history is not None:
            seq = fc.sequence_category_column(history,
                                              max_length=history_max_length)
            self.history_embeddings = layers.SequenceEmbeddingFeatures(
                [fc.embedding_column(seq, embedding_dim,
                                     table="history_item",
                                     initializer=init)],
                pooling=pooling, name="history_embeddings")
        item_cols = [fc.embedding_column(fc.category_column(item_id),
                                         embedding_dim, table="item",
                                         initializer=init)]
        item_cols += [fc.embedding_column(
            fc.category_column(n, tf.string), embedding_dim, combiner="mean",
            table="item", initializer=init)
            for n in self.item_feature_names]
        self.item_embeddings = layers.EmbeddingFeatures(
            item_cols, name="item_embeddings")
        self.query_tower = _tower(hidden_units, output_dim, "query_tower")
        self.candidate_tower = _tower(hidden_units, output_dim,
                                      "candidate_tower")
        self.task = tfrs.tasks.Retrieval(
            temperature=temperature,
            remove_accidental_hits=remove_accidental_hits)

    # ------------------------------------------------------------- towers
    def query_inputs(self, features: Mapping[str, Any],
                     training: bool = False) -> tf.Tensor:
        """The query tower's input: [user id emb, user feature embs,
        pooled history]. Exposed so cold start can be checked piece by
        piece (the id part is the first `embedding_dim` columns).

        Args:
          features: the query features (user id, user features, history).
          training: as in Keras.

        Returns:
          `[B, embedding_dim * (1 + len(user_features)) (+ embedding_dim with a
          history)]` float32.
        """
        user = self.user_embeddings(features, training=training)
        parts = [user]
        if self.history_embeddings is not None:
            query = user if self.history_embeddings.pooling == "attention" else None
            parts.append(self.history_embeddings(features, training=training,
                                                 query=query))
        return tf.concat(parts, axis=1) if len(parts) > 1 else user

    def query_embedding(self, features, training: bool = False) -> tf.Tensor:
        """[B, output_dim] query vectors from raw query features.

        Args:
          features: the query features.
          training: as in Keras.
        """
        return self._finish(self.query_tower(
            self.query_inputs(features, training), training=training))

    def candidate_embedding(self, features, training: bool = False
                            ) -> tf.Tensor:
        """[B, output_dim] candidate vectors from raw item features.

        Args:
          features: the candidate features (item id, item features).
          training: as in Keras.
        """
        return self._finish(self.candidate_tower(
            self.item_embeddings(features, training=training),
            training=training))

    def _finish(self, x):
        return tf.math.l2_normalize(x, axis=1) if self.normalize else x

    def call(self, features, training=False):
        """Query embeddings (what a retrieval index is queried with)."""
        return self.query_embedding(features, training)

    # ---------------------------------------------------------------- loss
    def compute_loss(self, inputs, training=False):
        features = inputs[0] if isinstance(inputs, (tuple, list)) else inputs
        query = self.query_embedding(features, training)
        candidate = self.candidate_embedding(features, training)
        probability = None
        if self.sampling_probability_key is not None:
            if self.sampling_probability_key not in features:
                raise KeyError(
                    f"TwoTower: sampling_probability_key "
                    f"{self.sampling_probability_key!r} is not a feature; got "
                    f"{sorted(features)}")
            # floor: an item unseen in training has probability 0
            probability = tf.maximum(tf.cast(tf.reshape(
                features[self.sampling_probability_key], [-1]), tf.float32),
                1e-9)
        return self.task(query, candidate,
                         candidate_sampling_probability=probability,
                         candidate_ids=tf.reshape(features[self.item_id], [-1]),
                         compute_metrics=False)

    # ---------------------------------------------------------- retrieval
    def query_feature_names(self):
        """The names of the query tower's features (user id, user features, history)."""
        names = [self.user_id] + self.user_feature_names
        if self.history_name is not None:
            names.append(self.history_name)
        return names

    def candidate_feature_names(self):
        """The names of the candidate tower's features (item id, item features)."""
        return [self.item_id] + self.item_feature_names

    def candidate_index(self, candidates: Mapping[str, Any],
                        batch_size: int = 4096
                        ) -> tfrs.layers.factorized_top_k.BruteForce:
        """A BruteForce index over every candidate (ids = item ids),
        embedded in inference mode, in this process.

        Args:
          candidates: {feature: array [N, ...]} of every candidate (e.g.
            `MovieLens.items`).
          batch_size: candidates embedded per call.

        Example:
            ```python
            scores, ids = model.candidate_index(data.items)(model.query_embedding(queries), k=10)
            ```
        """
        ids, emb = self.embed_candidates(candidates, batch_size)
        index = tfrs.layers.factorized_top_k.BruteForce(k=max(self.ks))
        index.index(tf.constant(emb), tf.constant(ids))
        return index

    def embed_candidates(self, candidates: Mapping[str, Any],
                         batch_size: int = 4096):
        """(ids [N] int64, embeddings [N, output_dim] float32) in numpy.

        Args:
          candidates: {feature: array [N, ...]} of every candidate.
          batch_size: candidates embedded per call.
        """
        names = self.candidate_feature_names()
        missing = [n for n in names if n not in candidates]
        if missing:
            raise KeyError(f"TwoTower: candidate features {missing} missing; "
                           f"got {sorted(candidates)}")
        cand = {n: np.asarray(candidates[n]) for n in names}
        n = cand[self.item_id].shape[0]
        fn = self._cached_fn("_candidate_fn", self.candidate_embedding)
        out = [fn({k: tf.constant(v[i:i + batch_size])
                   for k, v in cand.items()}).numpy()
               for i in range(0, n, batch_size)]
        return cand[self.item_id].astype(np.int64), np.concatenate(out)

    def _cached_fn(self, attr, fn):
        f = getattr(self, attr, None)
        if f is None:
            f = tf.function(lambda x: fn(x, training=False),
                            reduce_retracing=True)
            setattr(self, attr, f)
        return f

    def evaluate_exact(self, dataset, candidates: Mapping[str, Any],
                       max_batches: Optional[int] = None) -> Dict[str, float]:
        """Recall@k (FactorizedTopK's top-k categorical accuracy, id-based)
        of each hold-out example's item among all `candidates`.

        Runs in this process (the chief under ParameterServerStrategy),
        pulling in inference mode, so unseen ids read zeros and no row is
        created.

        Args:
          dataset: batches of examples (features dicts, or (features, _)).
          candidates: {feature: array [N, ...]} of every candidate.
          max_batches: stop after this many batches (None: all).

        Returns:
          {"recall_at_<k>": float for each k of `ks`, "examples": int}.
        """
        index = self.candidate_index(candidates)
        metric = tfrs.metrics.FactorizedTopK(candidates=index, ks=self.ks)
        query_fn = self._cached_fn("_query_fn", self.query_embedding)
        cand_fn = self._cached_fn("_candidate_fn", self.candidate_embedding)
        examples = 0
        for i, element in enumerate(dataset):
            if max_batches is not None and i >= max_batches:
                break
            features = element[0] if isinstance(element, tuple) else element
            # only each tower's features: one trace per tower, not one per
            # distinct feature dict
            q = query_fn({n: features[n] for n in self.query_feature_names()})
            c = cand_fn({n: features[n]
                         for n in self.candidate_feature_names()})
            metric.update_state(q, c, true_candidate_ids=tf.reshape(
                features[self.item_id], [-1]))
            examples += int(q.shape[0])
        out = {f"recall_at_{k}": float(v.numpy())
               for k, v in zip(self.ks, metric.result())}
        out["examples"] = examples
        return out

    def serving_input_signature(self) -> Dict[str, tf.TensorSpec]:
        """Raw query features of the export's signature. The history is a
        fixed-width [None, L] int64 tensor padded with -1."""
        sig = {self.user_id: tf.TensorSpec([None], tf.int64)}
        for n in self.user_feature_names:
            sig[n] = tf.TensorSpec([None], tf.string)
        if self.history_embeddings is not None:
            sig[self.history_name] = tf.TensorSpec(
                [None, self.history_embeddings.max_length], tf.int64)
        return sig

    def query_tables(self):
        """The tables serving needs (the candidate side is precomputed)."""
        layers_ = [self.user_embeddings]
        if self.history_embeddings is not None:
            layers_.append(self.history_embeddings)
        return {n: t for layer in layers_ for n, t in layer.tables.items()}
