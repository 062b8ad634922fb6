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

`compile(metrics=..., weighted_metrics=...)` works in both styles, as for a
stock Keras model: the metrics see the labels, what the model's `call`
returns and the sample weights. A `compute_loss` model gets them from the
element `(features, labels[, sample_weight])` and from its one call of
`self(...)` inside `compute_loss` (or from `record_predictions`, for a
`compute_loss` that does not call the model). `loss=` and `loss_weights=`
weight compiled losses, which a `compute_loss` model has none of: compile
refuses them there instead of ignoring them.
"""
from __future__ import annotations

import contextlib
import functools
import os
import threading
from typing import List, Sequence, Tuple

import tensorflow as tf
import tensorflow_recommenders as tfrs
import tf_keras

from tf_keras.src.engine import functional as keras_functional
from tf_keras.src.engine import training as keras_training
from tf_keras.src.utils import io_utils

from tnet import feature_column as fc
from tnet import scopes
from tnet.layers.embedding_features import EmbeddingFeatures
from tnet.saving import keras_weights


# The predictions of a compute_loss model's step, for its compiled metrics:
# set by train_step / test_step while compute_loss runs (thread-local: Keras
# traces a step on the calling thread).
_STEP = threading.local()


class _StepPredictions:
    def __init__(self, model):
        self.model = model
        self.calls: list = []       # outputs of model(...) inside compute_loss
        self.recorded: list = []    # record_predictions(y, y_pred, sw)


class _TnetTraining:
    """train/test steps shared by tn.Model and its functional form."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("train_step")
        if own is not None and not getattr(own, "_tnet_checked", False):
            cls.train_step = _checked_train_step(cls.__name__, own)

    def compile(self, optimizer="rmsprop", loss=None, metrics=None,
                loss_weights=None, *args, **kwargs):
        if self._tfrs_style() and (loss is not None
                                   or loss_weights is not None):
            given = "loss" if loss is not None else "loss_weights"
            raise ValueError(
                f"{type(self).__name__}.compile({given}=...): this model "
                "computes its loss in compute_loss, so a compiled loss or "
                "loss weights would be ignored. Compute (and weight) the loss "
                "in compute_loss, or drop compute_loss and compile with a "
                "loss. compile(metrics=..., weighted_metrics=...) works.")
        super().compile(optimizer, loss, metrics, loss_weights, *args,
                        **kwargs)
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

    def create_tables(self) -> None:
        """Creates the tables of every tnet layer not called yet (a layer
        creates them at its first call; compile() with a new sparse rule
        recreates them empty)."""
        with self.distribute_strategy.scope():
            for layer in self.tnet_layers():
                layer._create_tables()

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

    # ------------------------------------------- Keras' weights methods
    # Each includes the tables or refuses clearly (tnet.saving.keras_weights).
    def save_weights(self, filepath, overwrite=True, save_format=None,
                     options=None):
        """Keras' save_weights with the tables: the TF format holds them as
        the model's trackables; HDF5 (`.h5`) gets them in its
        `tnet_tables` group. Large tables: prefer tn.saving.save."""
        super().save_weights(filepath, overwrite=overwrite,
                             save_format=save_format, options=options)
        if keras_weights.weights_format(filepath, save_format) == "h5":
            keras_weights.write_tables_h5(self, os.fspath(filepath))

    def load_weights(self, filepath, skip_mismatch=False, by_name=False,
                     options=None):
        """Keras' load_weights with the tables (every table is cleared and
        gets exactly the saved rows). A file saved with another sparse rule
        (optimizer) is refused, naming that, before anything changes."""
        path = os.fspath(filepath)
        self.create_tables()  # so every table restores now, none later
        h5 = keras_weights.is_h5_file(path)
        if h5:
            keras_weights.read_tables_h5(self, path, apply=False)
        else:
            keras_weights.check_tf_checkpoint(self, path)
        status = super().load_weights(filepath, skip_mismatch=skip_mismatch,
                                      by_name=by_name, options=options)
        if h5:
            keras_weights.read_tables_h5(self, path)
        return status

    def save(self, filepath, overwrite=True, save_format=None, **kwargs):
        """Keras' save. The SavedModel format (a directory) holds the
        tables and loads back with `tf_keras.models.load_model` in a
        process that imports tnet; HDF5 and `.keras` files cannot hold
        tables and are refused. For training checkpoints use
        tn.saving.save; for serving, tn.serving.export_for_serving."""
        from tf_keras.src.saving import saving_api  # noqa: PLC0415
        fmt = (saving_api.get_save_format(filepath, save_format)
               if not hasattr(filepath, "attrs") else "h5")
        if fmt != "tf":
            raise NotImplementedError(
                f"model.save({os.fspath(filepath)!r}): the {fmt} format "
                "cannot hold tnet tables (their rows are not Keras "
                "weights). Use model.save(a_directory) (SavedModel, loads "
                "with tnet imported), model.save_weights(...) or "
                "tn.saving.save(model, dir) for checkpoints, and "
                "tn.serving.export_for_serving(model, dir) for serving.")
        return super().save(filepath, overwrite=overwrite,
                            save_format=save_format, **kwargs)

    def get_weights(self):
        """Keras' dense weights (same list as a stock model's), as a
        `TableWeights` list whose `.tables` holds a snapshot of every
        table's rows, so `set_weights(get_weights())` (and
        `EarlyStopping(restore_best_weights=True)`) restores the tables
        too. Tables above keras_weights.MAX_SNAPSHOT_BYTES are refused."""
        self.create_tables()
        weights = keras_weights.TableWeights(super().get_weights())
        weights.tables = keras_weights.snapshot_tables(self)
        return weights

    def set_weights(self, weights, tables=None):
        """Sets the dense weights and, from get_weights' snapshot, the
        tables. A plain list (no snapshot) is refused for a model with
        tables unless `tables="keep"` (dense weights only)."""
        snapshot = getattr(weights, "tables", None)
        if tables not in (None, "keep"):
            raise ValueError(f"set_weights: tables must be None or 'keep', "
                             f"got {tables!r}")
        if tables == "keep":
            snapshot = None
        elif snapshot is None and keras_weights.expected_tables(self):
            raise keras_weights.TableWeightsError(
                "set_weights: these weights hold no table rows (a plain "
                "list, not what tn.Model.get_weights returned), so the "
                f"tables {sorted(keras_weights.expected_tables(self))} would "
                "keep the rows they have. Pass the list get_weights "
                "returned, or set_weights(weights, tables='keep') to set "
                "the dense weights only.")
        if snapshot is not None:
            self.create_tables()
            keras_weights.restore_snapshot(self, snapshot, apply=False)
        super().set_weights(list(weights))
        if snapshot is not None:
            keras_weights.restore_snapshot(self, snapshot)

    def summary(self, *args, print_fn=None, **kwargs):
        """Keras' summary, then each table's dim, rows so far and their
        parameter count (rows grow as training sees new ids)."""
        super().summary(*args, print_fn=print_fn, **kwargs)
        out = print_fn or io_utils.print_msg
        for line in keras_weights.table_summary_lines(self):
            out(line)

    # ----------------------------------------------------------- training
    def __call__(self, *args, **kwargs):
        outputs = super().__call__(*args, **kwargs)
        step = getattr(_STEP, "current", None)
        if step is not None and step.model is self:
            step.calls.append(outputs)
        return outputs

    def record_predictions(self, y_true, y_pred, sample_weight=None) -> None:
        """For a `compute_loss` that does not call the model itself (e.g.
        it computes logits through another method): the labels, the
        predictions (what `call` returns) and the sample weights that the
        compiled metrics should see this step. No-op outside a step."""
        step = getattr(_STEP, "current", None)
        if step is not None and step.model is self:
            step.recorded.append((y_true, y_pred, sample_weight))

    def compiled_metrics_wanted(self) -> bool:
        """True when compile() was given metrics or weighted_metrics."""
        container = getattr(self, "compiled_metrics", None)
        return container is not None and any(
            m is not None for m in
            tf.nest.flatten(container._user_metrics)
            + tf.nest.flatten(container._user_weighted_metrics))

    @contextlib.contextmanager
    def _step_predictions(self):
        previous = getattr(_STEP, "current", None)
        _STEP.current = step = _StepPredictions(self)
        try:
            yield step
        finally:
            _STEP.current = previous

    def _run_compute_loss(self, data, training: bool):
        """compute_loss(data), with the predictions it made recorded."""
        with self._step_predictions() as step:
            try:
                loss = self.compute_loss(data, training=training)
            except ValueError as e:
                if (isinstance(data, tuple) and len(data) == 3
                        and "unpack" in str(e)):
                    raise ValueError(
                        f"{type(self).__name__}.compute_loss: with "
                        "sample_weight or class_weight each element is "
                        "(features, labels, sample_weight); unpack three "
                        "values and pass the weights on (e.g. "
                        "tfrs.tasks.Ranking(..., sample_weight=...)). "
                        f"Original error: {e}") from e
                raise
        return loss, step

    def _metric_inputs(self, data, step):
        """(y_true, y_pred, sample_weight) for the compiled metrics of a
        compute_loss model."""
        if step.recorded:
            return step.recorded[-1]
        name = type(self).__name__
        if not (isinstance(data, tuple) and len(data) in (2, 3)):
            raise ValueError(
                f"{name}: compile(metrics=...) needs the labels, but the "
                f"dataset's elements are {type(data).__name__}s, not "
                "(features, labels[, sample_weight]). Yield tuples, call "
                "self.record_predictions(labels, predictions, sample_weight) "
                "in compute_loss, or give the metrics to your tfrs task.")
        if len(step.calls) != 1:
            raise ValueError(
                f"{name}: compile(metrics=...) measures what the model "
                "returns, but compute_loss called the model "
                f"{len(step.calls)} times (not once). Call "
                "self.record_predictions(labels, predictions, sample_weight) "
                "in compute_loss, or give the metrics to your tfrs task.")
        _, y, sample_weight = tf_keras.utils.unpack_x_y_sample_weight(data)
        return y, step.calls[0], sample_weight

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
        tfrs_style = self._tfrs_style()
        with tf.GradientTape() as tape:
            with scopes.recording(tape, _examples(data)) as recorder:
                if tfrs_style:
                    loss, predictions = self._run_compute_loss(data, True)
                    regularization_loss = _sum_losses(self.losses)
                    total_loss = loss + regularization_loss
                else:
                    x, y, sample_weight = tf_keras.utils.unpack_x_y_sample_weight(data)
                    y_pred = self(x, training=True)
                    # As Keras' compute_loss: the compiled loss metric
                    # ("loss") includes the regularization losses.
                    total_loss = self.compiled_loss(
                        y, y_pred, sample_weight,
                        regularization_losses=self.losses)
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
        if tfrs_style:
            return self._tfrs_metrics(loss, regularization_loss, data,
                                      predictions)
        return self.compute_metrics(x, y, y_pred, sample_weight)

    def _tfrs_metrics(self, loss, regularization_loss, data, predictions):
        trackers = getattr(self, "_tnet_loss_trackers", None)
        if trackers is None:
            raise RuntimeError(f"{type(self).__name__}: compile() the model "
                               "before fit/evaluate")
        for tracker, value in zip(trackers, (loss, regularization_loss,
                                             loss + regularization_loss)):
            tracker.update_state(value)
        if self.compiled_metrics_wanted():
            self.compiled_metrics.update_state(
                *self._metric_inputs(data, predictions))
        return {m.name: m.result() for m in self.metrics}

    def test_step(self, data):
        _allow_mean_reduction(self)
        if self._tfrs_style():
            loss, predictions = self._run_compute_loss(data, False)
            return self._tfrs_metrics(loss, _sum_losses(self.losses), data,
                                      predictions)
        x, y, sample_weight = tf_keras.utils.unpack_x_y_sample_weight(data)
        y_pred = self(x, training=False)
        self.compiled_loss(y, y_pred, sample_weight,
                           regularization_losses=self.losses)
        return self.compute_metrics(x, y, y_pred, sample_weight)

    def compute_metrics(self, x, y, y_pred, sample_weight):
        self.compiled_metrics.update_state(y, y_pred, sample_weight)
        return {m.name: m.result() for m in self.metrics}


def _examples(data):
    """The number of examples in a training batch (int64 scalar), read
    from its first batched element ([B, ...] dense, sparse or ragged), or
    None if it has none. The tables scale the accumulator start of the
    rows a step inserts by it (the rule's start_reference_batch)."""
    for t in tf.nest.flatten(data):
        if isinstance(t, tf.SparseTensor):
            return t.dense_shape[0]
        if isinstance(t, tf.RaggedTensor):
            return t.nrows(out_type=tf.int64)
        if isinstance(t, tf.Tensor) and t.shape.rank != 0:
            return tf.shape(t, out_type=tf.int64)[0]
    return None


class Model(_TnetTraining, tfrs.models.Model):
    """A Keras model whose tnet tables train with it (extends
    `tfrs.models.Model`).

    Three ways to write one, all with the same training step:

    * functional: `tn.Model(inputs, outputs)` (an instance of
      `tn.model.FunctionalModel`), then `compile(optimizer, loss, metrics)`;
    * a subclass with `call`, then `compile(optimizer, loss, metrics)`;
    * TFRS style: a subclass overriding `compute_loss(inputs, training)`,
      then `compile(optimizer)`.

    `train_step` pushes each table lookup's gradient to its table (the
    in-table rule of the layer's or the compiled optimizer); `evaluate` and
    `predict` never create rows. Override `transform_gradients` to clip or
    scale dense and embedding gradients together.

    Args:
      *args: for the functional form, `inputs` and `outputs` as in
        `tf.keras.Model`.
      **kwargs: Keras model arguments (`name`, ...).

    Example:
        ```python
        inputs = {"user_id": tf.keras.Input(shape=(), dtype=tf.int64, name="user_id")}
        x = tn.layers.EmbeddingFeatures(
            [fc.embedding_column(fc.category_column("user_id"), 16)])(inputs)
        model = tn.Model(inputs, tf.keras.layers.Dense(1, "sigmoid")(x))
        model.compile(tn.optimizer.Adagrad(0.05), loss="binary_crossentropy")
        ```
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
    tn.Model's training step.

    Keras casts what is fed to an `Input` to the Input's dtype, so floats
    fed to an `Input(dtype=tf.int64)` would become truncated ids (2.7 ->
    2) and strings a raw cast error. For the Inputs that feed tnet id
    columns, both are refused with one line naming the feature (a check of
    dtypes while tracing: nothing runs per step).

    It takes Keras' functional arguments: `inputs` (Keras `Input`s: a
    dict, a list or one), `outputs`, `name`, `trainable`.

    Example:
        ```python
        inputs = {"user_id": tf.keras.Input(shape=(), dtype=tf.int64, name="user_id")}
        x = tn.layers.EmbeddingFeatures([tn.feature_column.embedding_column(
            tn.feature_column.category_column("user_id"), 8)])(inputs)
        model = tn.Model(inputs, tf.keras.layers.Dense(1, "sigmoid")(x))
        print(type(model).__name__)        # FunctionalModel
        ```
    """

    def _conform_to_reference_input(self, tensor, ref_input):
        want = getattr(ref_input, "dtype", None)
        got = getattr(tensor, "dtype", None)
        if (want is not None and got is not None and got != want
                and tf.as_dtype(want).is_integer):
            name = self._id_input_name(ref_input)
            if name is not None:
                got = tf.as_dtype(got)
                if got == tf.string:
                    raise TypeError(fc.string_ids_message(name))
                if got.is_floating or got == tf.bool:
                    raise TypeError(fc.float_ids_message(name, got))
        return super()._conform_to_reference_input(tensor, ref_input)

    def _id_input_name(self, ref_input):
        """The feature name of an Input that feeds a tnet id column, or
        None."""
        keys = {c.categorical_column.key for layer in self.tnet_layers()
                for c in layer.columns}
        nested = self._nested_inputs
        if isinstance(nested, dict):
            for key, value in nested.items():
                if value is ref_input:
                    return key if key in keys else None
        name = getattr(getattr(ref_input, "_keras_history", None), "layer",
                       None)
        name = getattr(name, "name", None)
        return name if name in keys else None


def _checked_train_step(class_name: str, train_step):
    """A user's own train_step, refused (when traced) if it looks tables up
    in training outside tn.Model.train_step: their gradients would never
    reach the tables, which would silently not train."""
    @functools.wraps(train_step)
    def checked(self, data):
        with scopes.recording(None) as outside:
            out = train_step(self, data)
        if outside.lookups:
            names = sorted({lk.table.table_name for lk in outside.lookups})
            raise TypeError(
                f"{class_name}.train_step looks up the tnet tables {names} "
                "in training outside tn.Model.train_step, so no gradient "
                "would reach them and they would not train. Call "
                "super().train_step(data) in it (override compute_loss or "
                "transform_gradients to change the loss or the gradients), "
                "or look them up with training=False.")
        return out
    checked._tnet_checked = True
    return checked


def _sum_losses(losses):
    return (tf.add_n([tf.reduce_sum(l) for l in losses]) if losses
            else tf.constant(0.0))


def _allow_mean_reduction(model: tf_keras.Model) -> None:
    """Lets the Keras losses held by the model's modules reduce by mean under
    a strategy (see the module docstring)."""
    for module in model._flatten_modules(include_self=True):
        for value in list(vars(module).values()):
            if isinstance(value, tf_keras.losses.Loss):
                value._allow_sum_over_batch_size = True
