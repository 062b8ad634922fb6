"""tn.model.Model: a Keras model whose tnet tables train with it.

Two ways to use it, like `tfrs.models.Model` (which it extends):

* TFRS style: subclass, build layers in `__init__`, override
  `compute_loss(inputs, training)` (and `call` for predictions). `fit` hands
  `compute_loss` each dataset element as it is, so `(features, labels)`
  tuples and dicts both work.
* Keras style: functional `tn.Model(inputs, outputs)` or a subclass with
  `call`, then `compile(optimizer, loss, metrics)` as usual.

`train_step` computes dense gradients and the embedding gradients (dE, one
per table lookup) in one tape, lets `transform_gradients` see both (clip or
scale them there), applies the dense ones with the Keras optimizer and pushes
dE to the tables, whose in-table rule runs on the ps with the optimizer's
current learning rate and step. `test_step` / `predict_step` pull in
inference mode, so evaluate and predict never create rows.

Stock Keras refuses a loss with the default (mean) reduction inside a custom
`compute_loss` under a distribution strategy. Under ParameterServerStrategy
each worker runs one replica on its own batch, so mean over the batch is
right: tn.Model lets the losses it contains reduce that way, and
`tfrs.tasks.Ranking(loss=BinaryCrossentropy())` works unchanged.
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

import tensorflow as tf
import tensorflow_recommenders as tfrs
import tf_keras

from tf_keras.src.engine import functional as keras_functional
from tf_keras.src.engine import training as keras_training

from tnet import scopes
from tnet.layers.embedding_features import EmbeddingFeatures


class _TnetTraining:
    """train/test steps shared by tn.Model and its functional form."""

    def compile(self, optimizer="rmsprop", *args, **kwargs):
        super().compile(optimizer, *args, **kwargs)
        for layer in self.tnet_layers():
            layer.attach_model_optimizer(self.optimizer)
        if self._tfrs_style() and not hasattr(self, "_tnet_loss_trackers"):
            # Epoch means of the losses, as Keras keeps for compiled losses
            # (also what ParameterServerStrategy's fit reads back).
            self._tnet_loss_trackers = [
                tf_keras.metrics.Mean(name=n)
                for n in ("loss", "regularization_loss", "total_loss")]

    def make_train_function(self, force=False):
        # Keep each step's freed memory in the process (glibc's top pad):
        # without it every step faults its buffers in again, page by page.
        from tnet.distribute import set_top_pad  # noqa: PLC0415
        set_top_pad()
        return super().make_train_function(force)

    # Between epochs `fit` itself reads and writes ps state from the chief:
    # it resets every metric's variables (epoch begin) and reads the
    # metrics' results back (epoch end; under ParameterServerStrategy the
    # last step's logs may not be the newest). A ps cut off then is waited
    # out for TNET_PS_TIMEOUT as the steps wait it out, not a lost ps at
    # once (measured: a 20 s cut at an epoch boundary ended the job in an
    # AssignVariableOp of reset_metrics, and in an AddN of a metric's
    # result). Both are safe to run again. One process: run once.
    # Inside a tf.function (a train_step of a user's that asks for the
    # results) they are graph ops: nothing to wait out there.
    def reset_metrics(self):
        from tnet.distribute import through_ps_cut  # noqa: PLC0415
        if not tf.executing_eagerly():
            return super().reset_metrics()
        return through_ps_cut(super().reset_metrics,
                              "resetting the metrics at an epoch begin")

    def get_metrics_result(self):
        from tnet.distribute import through_ps_cut  # noqa: PLC0415
        if not tf.executing_eagerly():
            return super().get_metrics_result()

        def read():
            result = super(_TnetTraining, self).get_metrics_result()
            for value in tf.nest.flatten(result):  # a remote failure shows
                if hasattr(value, "numpy"):        # here, inside the retry
                    value.numpy()
            return result
        return through_ps_cut(read, "reading the metrics at an epoch end")

    def tnet_layers(self) -> List[EmbeddingFeatures]:
        """The tnet embedding layers in this model (nested ones included)."""
        return [m for m in self._flatten_modules(include_self=False)
                if isinstance(m, EmbeddingFeatures)]

    def tables(self):
        """{name: tn.SparseTable} over all tnet layers."""
        out = {}
        for layer in self.tnet_layers():
            for name, table in layer.tables.items():
                if name in out and out[name] is not table:
                    raise ValueError(
                        f"two tnet layers define a table named {name!r}; give "
                        "their columns distinct table names")
                out[name] = table
        return out

    # ----------------------------------------------------------- training
    def _tfrs_style(self) -> bool:
        return type(self).compute_loss not in (
            tfrs.models.Model.compute_loss, tf_keras.Model.compute_loss)

    def transform_gradients(
            self, dense: Sequence, sparse: Sequence) -> Tuple[list, list]:
        """Hook: dense grads (per trainable variable) and sparse grads (per
        table lookup, dE) before they are applied. Default: unchanged."""
        return list(dense), list(sparse)

    def train_step(self, data):
        _allow_mean_reduction(self)
        with tf.GradientTape() as tape:
            with scopes.recording(tape) as recorder:
                if self._tfrs_style():
                    loss = self.compute_loss(data, training=True)
                else:
                    x, y, sample_weight = tf_keras.utils.unpack_x_y_sample_weight(data)
                    y_pred = self(x, training=True)
                    loss = self.compiled_loss(y, y_pred, sample_weight)
            regularization_loss = (tf.add_n([tf.reduce_sum(l) for l in self.losses])
                                   if self.losses else tf.constant(0.0))
            total_loss = loss + regularization_loss
        variables = self.trainable_variables
        embeddings = [lk.embeddings for lk in recorder.lookups]
        grads = tape.gradient(total_loss, list(variables) + embeddings)
        dense, sparse = self.transform_gradients(grads[:len(variables)],
                                                 grads[len(variables):])
        step = tf.identity(self.optimizer.iterations)
        learning_rate = tf.identity(self.optimizer.learning_rate)
        self.optimizer.apply_gradients(
            [(g, v) for g, v in zip(dense, variables) if g is not None])
        for lk, grad in zip(recorder.lookups, sparse):
            if grad is not None:
                lk.push(grad, learning_rate, step)
        if self._tfrs_style():
            return self._tfrs_metrics(loss, regularization_loss)
        return self.compute_metrics(x, y, y_pred, sample_weight)

    def _tfrs_metrics(self, loss, regularization_loss):
        trackers = getattr(self, "_tnet_loss_trackers", None)
        if trackers is None:
            raise RuntimeError(f"{type(self).__name__}: compile() the model "
                               "before fit/evaluate")
        for tracker, value in zip(trackers, (loss, regularization_loss,
                                             loss + regularization_loss)):
            tracker.update_state(value)
        return {m.name: m.result() for m in self.metrics}

    def test_step(self, data):
        _allow_mean_reduction(self)
        if self._tfrs_style():
            loss = self.compute_loss(data, training=False)
            regularization_loss = (tf.add_n([tf.reduce_sum(l) for l in self.losses])
                                   if self.losses else tf.constant(0.0))
            return self._tfrs_metrics(loss, regularization_loss)
        x, y, sample_weight = tf_keras.utils.unpack_x_y_sample_weight(data)
        y_pred = self(x, training=False)
        self.compiled_loss(y, y_pred, sample_weight,
                           regularization_losses=self.losses)
        return self.compute_metrics(x, y, y_pred, sample_weight)

    def compute_metrics(self, x, y, y_pred, sample_weight):
        self.compiled_metrics.update_state(y, y_pred, sample_weight)
        return {m.name: m.result() for m in self.metrics}


class Model(_TnetTraining, tfrs.models.Model):
    """Keras model with tnet tables; see the module docstring.

    `tn.Model(inputs, outputs)` builds a functional model with the same
    training step (an instance of `tn.model.FunctionalModel`).
    """

    def __new__(cls, *args, **kwargs):
        if cls is Model and keras_training.is_functional_model_init_params(
                args, kwargs):
            return FunctionalModel(*args, **kwargs)
        return super().__new__(cls, *args, **kwargs)

    def __init__(self, *args, **kwargs):
        if keras_training.is_functional_model_init_params(args, kwargs):
            raise TypeError(
                f"{type(self).__name__}: a tn.Model subclass cannot pass "
                "inputs and outputs to tn.Model.__init__ (Keras would rewrite "
                "tn.Model's class hierarchy). Use tn.Model(inputs, outputs) "
                "directly, or override call().")
        super().__init__(*args, **kwargs)


class FunctionalModel(_TnetTraining, keras_functional.Functional):
    """What tn.Model(inputs, outputs) returns: a Keras functional model with
    tn.Model's training step."""


def _allow_mean_reduction(model: tf_keras.Model) -> None:
    """Lets the Keras losses held by the model's modules reduce by mean under
    a strategy (see the module docstring)."""
    for module in model._flatten_modules(include_self=True):
        for value in list(vars(module).values()):
            if isinstance(value, tf_keras.losses.Loss):
                value._allow_sum_over_batch_size = True
