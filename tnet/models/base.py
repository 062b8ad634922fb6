"""CTRModel: the shared frame of tnet's ranking models.

A subclass builds its layers in `__init__` and implements
`logits(features, training)`; CTRModel supplies `call` (click probability,
what serving returns), `compute_loss` (a `tfrs.tasks.Ranking` on logits with
AUC and log loss metrics), the id columns and the dense-feature stack.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

import tensorflow as tf
import tensorflow_recommenders as tfrs
import tf_keras

from tnet import feature_column as fc
from tnet.model import Model


class CTRModel(Model):
    """Binary click model over id features and dense float features.

    Args:
      categorical: names of the id features (int64 ids, or strings when
        `string_ids=True`), or `tn.feature_column.embedding_column`s (e.g.
        `tn.data.spec.load(path).embedding_columns()`), which bring their
        own dtype, table, dim, combiner and lifecycle options.
      dense: names of the float features (each [B]); may be empty.
      embedding_dim: width of each id's embedding.
      shared_table: name of the one table every id column uses (the
        column is mixed into the key), or None for one table per column.
        One table means one fused lookup and one push per step.
      label_key: when the dataset yields a features dict that also holds
        the label, its key; with `(features, labels)` tuples leave it None.
      train_metrics: update AUC and log loss on training batches too (the
        progress bar shows them). Evaluation always computes them. Off, a
        step skips the AUC bookkeeping (200 thresholds per example), which
        is what benchmarks against metric-less stock models use.

    Example:
        ```python
        model = tn.models.WideDeep(["user_id", "ad_id"], ["price"], embedding_dim=8)
        model.compile(tn.optimizer.Adagrad(0.05))
        model.fit(data, epochs=1)
        print(model.evaluate_exact(holdout))   # {'auc': ..., 'logloss': ..., ...}
        ```
    """

    # What `call` returns, hence what an export's "prediction" holds.
    prediction_kind = "probabilities"

    def __init__(self, categorical: Sequence[str], dense: Sequence[str] = (),
                 embedding_dim: int = 8, string_ids: bool = False,
                 shared_table: Optional[str] = "embedding",
                 label_key: Optional[str] = None, train_metrics: bool = True,
                 **kwargs):
        super().__init__(**kwargs)
        if not categorical:
            raise ValueError(f"{type(self).__name__} needs at least one "
                             "categorical feature")
        dtype = tf.string if string_ids else tf.int64
        self.dense_names = list(dense)
        self.embedding_dim = embedding_dim
        self.label_key = label_key
        self.train_metrics = train_metrics
        if all(isinstance(c, fc.EmbeddingColumn) for c in categorical):
            self.embedding_columns = list(categorical)
            self.category_columns = [c.categorical_column
                                     for c in self.embedding_columns]
        else:
            self.category_columns = [fc.category_column(n, dtype)
                                     for n in categorical]
            self.embedding_columns = [
                fc.embedding_column(c, embedding_dim, table=shared_table)
                for c in self.category_columns]
        self.categorical = [c.key for c in self.category_columns]
        self.task = tfrs.tasks.Ranking(
            loss=tf_keras.losses.BinaryCrossentropy(from_logits=True),
            metrics=[tf_keras.metrics.AUC(from_logits=True, name="auc"),
                     tf_keras.metrics.BinaryCrossentropy(from_logits=True,
                                                         name="logloss"),
                     Calibration(name="calibration")])

    def dense_input(self, features: Dict[str, Any]) -> Optional[tf.Tensor]:
        """[B, len(dense)] float32 from the dense feature names.

        Args:
          features: the features dict (each dense feature `[B]` or `[B, 1]`).

        Returns:
          `[B, len(dense)]` float32, or None without dense features.
        """
        if not self.dense_names:
            return None
        missing = [n for n in self.dense_names if n not in features]
        if missing:
            raise KeyError(f"{type(self).__name__}: dense features {missing} "
                           f"are missing from the input; got {sorted(features)}")
        return tf.stack([tf.cast(tf.reshape(features[n], [-1]), tf.float32)
                         for n in self.dense_names], axis=1)

    def logits(self, features: Dict[str, Any], training: bool) -> tf.Tensor:
        """The model's logits (a subclass builds them from its layers).

        Args:
          features: the features dict.
          training: as in Keras (tables insert new ids only when training).

        Returns:
          `[B, 1]` float32 logits; `call` applies the sigmoid.
        """
        raise NotImplementedError

    def call(self, features, training=False):
        return tf.sigmoid(self.logits(features, training))

    def compute_loss(self, inputs, training=False):
        features, labels, sample_weight = self._unpack(inputs)
        logits = self.logits(features, training)
        labels = tf.reshape(tf.cast(labels, tf.float32), [-1, 1])
        if self.compiled_metrics_wanted():  # they see what call returns
            self.record_predictions(labels, tf.sigmoid(logits), sample_weight)
        return self.task(labels=labels, predictions=logits,
                         sample_weight=sample_weight, training=training,
                         compute_metrics=self.train_metrics or not training)

    def evaluate_exact(self, dataset, max_batches: Optional[int] = None,
                       group_key: Optional[str] = None) -> Dict[str, float]:
        """Exact AUC, log loss and calibration over a (features, labels)
        dataset; with `group_key` (a feature of the dataset that the model
        does not use, e.g. the user id) also group AUC.

        Runs here (on the chief under ParameterServerStrategy), pulling in
        inference mode, so every hold-out row is scored exactly once (Keras'
        AUC metric bins scores into 200 thresholds; this does not).
        calibration = sum(predicted CTR) / sum(clicks) (1.0: calibrated);
        gauc = the impression-weighted mean AUC of the groups that have
        both clicks and non-clicks (`gauc_groups` of them). Sample weights
        are ignored (every example counts once).

        Args:
          dataset: (features, labels) batches.
          max_batches: stop after this many batches (None: all).
          group_key: a feature of the dataset for group AUC, or None.

        Example:
            ```python
            print(model.evaluate_exact(holdout, group_key="user_id"))
            ```
        """
        import numpy as np  # noqa: PLC0415
        from tnet.data.metrics import auc, calibration, group_auc  # noqa: PLC0415
        predict = getattr(self, "_exact_predict", None)
        if predict is None:
            predict = self._exact_predict = tf.function(
                lambda f: self.logits(f, training=False))
        labels, logits, groups = [], [], []
        for i, element in enumerate(dataset):
            if max_batches is not None and i >= max_batches:
                break
            features, y, _ = self._unpack(element)
            if group_key is not None:
                features = dict(features)
                groups.append(np.asarray(features.pop(group_key)).reshape(-1))
            logits.append(predict(features).numpy().reshape(-1))
            labels.append(np.asarray(y).reshape(-1))
        y = np.concatenate(labels).astype(np.float64)
        z = np.concatenate(logits).astype(np.float64)
        # log loss from logits, stable for large |z|
        logloss = float(np.mean(np.logaddexp(0.0, z) - y * z))
        result = {"auc": auc(y, z), "logloss": logloss,
                  "calibration": calibration(y, 1.0 / (1.0 + np.exp(-z))),
                  "examples": int(y.size)}
        if group_key is not None:
            result["gauc"], result["gauc_groups"] = group_auc(
                y, z, np.concatenate(groups))
        return result

    def _unpack(self, inputs):
        if isinstance(inputs, dict):
            if self.label_key is None or self.label_key not in inputs:
                raise KeyError(
                    f"{type(self).__name__}: the dataset yields a dict; set "
                    f"label_key to the label's key (got keys {sorted(inputs)})")
            features = {k: v for k, v in inputs.items() if k != self.label_key}
            return features, inputs[self.label_key], None
        if len(inputs) == 2:
            return inputs[0], inputs[1], None
        if len(inputs) == 3:
            return inputs
        raise ValueError("expected (features, labels[, sample_weight]) "
                         f"elements, got {len(inputs)} parts")


# Registered so that tf_keras.models.load_model of a model.save() finds it.
@tf_keras.saving.register_keras_serializable(package="tnet")
class Calibration(tf_keras.metrics.Metric):
    """Predicted CTR / observed CTR over the batches seen (1.0 is
    calibrated): sum(sigmoid(logits) * w) / sum(labels * w). Streaming, so
    it shows in the progress bar and Keras logs; the exact hold-out value
    comes from `CTRModel.evaluate_exact`."""

    def __init__(self, name: str = "calibration", **kwargs):
        super().__init__(name=name, **kwargs)
        self.predicted = self.add_weight("predicted", initializer="zeros",
                                         dtype=tf.float64)
        self.observed = self.add_weight("observed", initializer="zeros",
                                        dtype=tf.float64)

    def update_state(self, y_true, y_pred, sample_weight=None):
        p = tf.reshape(tf.cast(tf.sigmoid(y_pred), tf.float64), [-1])
        y = tf.reshape(tf.cast(y_true, tf.float64), [-1])
        if sample_weight is not None:
            w = tf.reshape(tf.cast(sample_weight, tf.float64), [-1])
            p, y = p * w, y * w
        return tf.group(self.predicted.assign_add(tf.reduce_sum(p)),
                        self.observed.assign_add(tf.reduce_sum(y)))

    def result(self):
        return tf.math.divide_no_nan(self.predicted, self.observed)

    def reset_state(self):
        self.predicted.assign(0.0)
        self.observed.assign(0.0)


def mlp(hidden_units: Sequence[int], name: str) -> tf_keras.Sequential:
    """ReLU layers of `hidden_units`, then one logit. Its input is one
    tensor, or a list of tensors it reads as their concatenation (the
    first layer is a `ConcatDense`)."""
    units = list(hidden_units) + [1]
    return tf_keras.Sequential(
        [ConcatDense(units[0], activation="relu" if hidden_units else None)]
        + [tf_keras.layers.Dense(u, activation="relu")
           for u in hidden_units[1:]]
        + ([tf_keras.layers.Dense(1)] if hidden_units else []), name=name)


class ConcatDense(tf_keras.layers.Dense):
    """A Dense layer over the concatenation of a list of [B, n_i] inputs,
    without building it: x @ W = sum over i of x_i @ W[rows of input i].

    The embeddings of a CTR model ([B, sum of dims], ~8 MB for a SPARSE-
    HEAVY batch) and its dense features would otherwise be copied into a
    concat forward, and the concat's gradient sliced back out of the
    layer's input gradient. Its variables are a Dense layer's (one kernel
    over the concatenated width), so checkpoints are the same; a single
    tensor input is a plain Dense."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.input_spec = None  # one tensor or a list: checked in build

    def build(self, input_shape):
        self._widths = None
        if isinstance(input_shape, (list, tuple)) and input_shape and all(
                isinstance(s, (list, tuple, tf.TensorShape))
                for s in input_shape):
            self._widths = [int(tf.TensorShape(s)[-1]) for s in input_shape]
            input_shape = tf.TensorShape([None, sum(self._widths)])
        super().build(input_shape)
        if self._widths is not None:
            self.input_spec = None  # Dense's spec is for one tensor

    def call(self, inputs):
        if self._widths is None:
            return super().call(inputs)
        if len(inputs) != len(self._widths):
            raise ValueError(f"{self.name}: built for {len(self._widths)} "
                             f"inputs, got {len(inputs)}")
        # Split, not sliced: the kernel's gradient is one concat. The
        # first product takes the bias before the others are added, so
        # that TensorFlow's remapper fuses MatMul + BiasAdd into one
        # oneDNN op (the Add and the activation run apart).
        parts = tf.split(self.kernel, self._widths, axis=0)
        out = tf.matmul(inputs[0], parts[0])
        if self.use_bias:
            out = tf.nn.bias_add(out, self.bias)
        for x, w in zip(inputs[1:], parts[1:]):
            out = out + tf.matmul(x, w)
        return self.activation(out)
