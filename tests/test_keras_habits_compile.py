"""Keras habits, the compile / feed / callbacks half: what a Keras user types
from habit works on a tnet model as on the stock tf_keras model, or fails
with one line naming what to do instead.

Each tnet model here has a stock twin: the same layers with a stock
`Embedding` whose rows start as the tnet table's rows start (a table row's
initial value is drawn from its key and the table's seed, fixed here), trained with SGD, whose in-table rule
is the stock update. So fit, evaluate, predict, metrics, sample and class
weights and learning-rate callbacks must give the stock model's numbers.
"""
from __future__ import annotations

import csv

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_recommenders as tfrs
import tf_keras

import tnet as tn
from tnet import feature_column as fc

V = 40      # ids 0..V-1
DIM = 4
B = 16
N = 128     # training examples
LR = 0.2


def _data(n, seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, V, n).astype(np.int64)
    p = 1 / (1 + np.exp(-(ids % 7 - 3.0)))
    y = (rng.random(n) < p).astype(np.float32)
    w = rng.uniform(0.2, 2.0, n).astype(np.float32)
    return ids, y, w


@pytest.fixture(scope="module")
def data():
    train, val = _data(N, 0), _data(48, 1)
    # Validation ids the training saw: an id a table never trained reads
    # zeros in inference (nothing is inserted), a stock Embedding its
    # initial row.
    seen = np.unique(train[0])
    return {"train": train, "val": (seen[val[0] % len(seen)], *val[1:])}


@pytest.fixture(scope="module")
def start():
    """Initial table rows of ids 0..V-1 and a dense kernel both twins use."""
    rows = tn.SparseTable("twin_rows", DIM, seed=0).pull(np.arange(V, dtype=np.int64),
                                                 training=True).numpy()
    rng = np.random.default_rng(7)
    return rows, rng.normal(0, 0.5, (DIM, 1)).astype(np.float32)


def _column():
    return fc.embedding_column(fc.category_column("user"), DIM)


def _functional(start, tnet_model: bool, activation="sigmoid", l2=0.0):
    rows, kernel = start
    user = tf_keras.Input((), dtype=tf.int64, name="user")
    if tnet_model:
        emb = tn.layers.EmbeddingFeatures([_column()], seed=0)(
            {"user": user})
    else:
        emb = tf_keras.layers.Embedding(
            V, DIM, embeddings_initializer=tf_keras.initializers.Constant(
                rows))(user)
    out = tf_keras.layers.Dense(
        1, activation=activation,
        kernel_initializer=tf_keras.initializers.Constant(kernel),
        kernel_regularizer=tf_keras.regularizers.L2(l2) if l2 else None,
        bias_initializer="zeros")(emb)
    if tnet_model:
        return tn.Model({"user": user}, out)
    return tf_keras.Model({"user": user}, out)


class Ranker(tn.Model):
    """The README Quickstart's style: call returns logits, compute_loss a
    tfrs Ranking task; sample weights, when the element has them, go to the
    task."""

    def __init__(self, start):
        super().__init__()
        rows, kernel = start
        self.embed = tn.layers.EmbeddingFeatures([_column()], seed=0)
        self.dense = tf_keras.layers.Dense(
            1, kernel_initializer=tf_keras.initializers.Constant(kernel),
            bias_initializer="zeros")
        self.task = tfrs.tasks.Ranking(
            loss=tf_keras.losses.BinaryCrossentropy(from_logits=True))

    def call(self, features, training=False):
        return self.dense(self.embed(features, training=training))

    def compute_loss(self, inputs, training=False):
        features, labels, *weight = inputs
        return self.task(labels=labels[:, None],
                         predictions=self(features, training),
                         sample_weight=weight[0] if weight else None)


METRICS = lambda logits: [  # noqa: E731
    tf_keras.metrics.AUC(name="auc", from_logits=logits),
    tf_keras.metrics.BinaryAccuracy(
        name="acc", threshold=0.0 if logits else 0.5)]


def _close_histories(got, want, keys):
    for key in keys:
        assert key in got.history, f"{key} missing from {sorted(got.history)}"
        np.testing.assert_allclose(got.history[key], want.history[key],
                                   rtol=2e-4, atol=2e-5, err_msg=key)


# ------------------------------------------------------------ compile / fit
@pytest.fixture(scope="module")
def functional_pair(data, start):
    """Functional tnet model and its stock twin after the same fit with
    metrics, weighted metrics, loss weights, class weights, validation data
    and a kernel regularizer (whose loss Keras' "loss" includes)."""
    histories = {}
    models = {}
    ids, y, _ = data["train"]
    vids, vy, vw = data["val"]
    for kind in ("tnet", "stock"):
        model = _functional(start, kind == "tnet", l2=0.05)
        opt = (tn.optimizer.SGD(LR) if kind == "tnet"
               else tf_keras.optimizers.SGD(LR))
        model.compile(opt, loss="binary_crossentropy",
                      metrics=METRICS(False),
                      weighted_metrics=[tf_keras.metrics.BinaryAccuracy(
                          name="wacc")],
                      loss_weights=[0.5])
        histories[kind] = model.fit(
            {"user": ids}, y, batch_size=B, epochs=2, shuffle=False,
            class_weight={0: 1.0, 1: 3.0},
            validation_data=({"user": vids}, vy, vw), verbose=0)
        models[kind] = model
    return models, histories


def test_functional_fit_metrics_weights_validation_match_stock(functional_pair):
    _, h = functional_pair
    _close_histories(h["tnet"], h["stock"], [
        "loss", "auc", "acc", "wacc", "val_loss", "val_auc", "val_acc",
        "val_wacc"])
    assert sorted(h["tnet"].history) == sorted(h["stock"].history)


def test_functional_evaluate_and_predict_match_stock(functional_pair, data):
    models, _ = functional_pair
    vids, vy, vw = data["val"]
    got = models["tnet"].evaluate({"user": vids}, vy, sample_weight=vw,
                                  batch_size=B, return_dict=True, verbose=0)
    want = models["stock"].evaluate({"user": vids}, vy, sample_weight=vw,
                                    batch_size=B, return_dict=True, verbose=0)
    assert sorted(got) == sorted(want)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=2e-4, atol=2e-5)
    want_p = models["stock"].predict({"user": vids}, batch_size=B, verbose=0)
    dataset = tf.data.Dataset.from_tensor_slices({"user": vids}).batch(B)
    for x in ({"user": vids}, dataset,
              tf.data.Dataset.from_tensor_slices(({"user": vids}, vy)).batch(B)):
        got_p = models["tnet"].predict(x, batch_size=None if isinstance(
            x, tf.data.Dataset) else B, verbose=0)
        np.testing.assert_allclose(got_p, want_p, rtol=1e-4, atol=1e-6)


@pytest.fixture(scope="module")
def ranker_pair(data, start):
    """The Quickstart-style Ranker compiled with metrics, and a stock model
    with the same loss and metrics, after the same fit (sample weights,
    validation data)."""
    ids, y, w = data["train"]
    vids, vy, vw = data["val"]
    ranker = Ranker(start)
    ranker.compile(tn.optimizer.SGD(LR), metrics=METRICS(True),
                   weighted_metrics=[tf_keras.metrics.BinaryAccuracy(
                       name="wacc", threshold=0.0)])
    got = ranker.fit({"user": ids}, y[:, None], sample_weight=w,
                     batch_size=B, epochs=2, shuffle=False,
                     validation_data=({"user": vids}, vy[:, None], vw),
                     verbose=0)
    stock = _functional(start, False, activation=None)
    stock.compile(tf_keras.optimizers.SGD(LR),
                  loss=tf_keras.losses.BinaryCrossentropy(from_logits=True),
                  metrics=METRICS(True),
                  weighted_metrics=[tf_keras.metrics.BinaryAccuracy(
                      name="wacc", threshold=0.0)])
    want = stock.fit({"user": ids}, y[:, None], sample_weight=w,
                     batch_size=B, epochs=2, shuffle=False,
                     validation_data=({"user": vids}, vy[:, None], vw),
                     verbose=0)
    return ranker, stock, got, want


def test_compute_loss_model_compiled_metrics_match_stock(ranker_pair):
    """compile(metrics=["AUC"]) on the Quickstart's style of model used to
    be ignored (history held only the losses)."""
    _, _, got, want = ranker_pair
    _close_histories(got, want, ["loss", "auc", "acc", "wacc", "val_loss",
                                 "val_auc", "val_acc", "val_wacc"])


def test_compute_loss_model_evaluate_return_dict(ranker_pair, data):
    ranker, stock, _, _ = ranker_pair
    vids, vy, _ = data["val"]
    got = ranker.evaluate({"user": vids}, vy[:, None], batch_size=B,
                          return_dict=True, verbose=0)
    want = stock.evaluate({"user": vids}, vy[:, None], batch_size=B,
                          return_dict=True, verbose=0)
    for key in ("loss", "auc", "acc", "wacc"):
        np.testing.assert_allclose(got[key], want[key], rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(
        ranker.predict({"user": vids}, batch_size=B, verbose=0),
        stock.predict({"user": vids}, batch_size=B, verbose=0),
        rtol=1e-4, atol=1e-6)


def test_compute_loss_model_class_weight_matches_stock(data, start):
    ids, y, _ = data["train"]
    ranker = Ranker(start)
    ranker.compile(tn.optimizer.SGD(LR), metrics=METRICS(True))
    got = ranker.fit({"user": ids}, y[:, None], class_weight={0: 1, 1: 4},
                     batch_size=B, epochs=1, shuffle=False, verbose=0)
    stock = _functional(start, False, activation=None)
    stock.compile(tf_keras.optimizers.SGD(LR),
                  loss=tf_keras.losses.BinaryCrossentropy(from_logits=True),
                  metrics=METRICS(True))
    want = stock.fit({"user": ids}, y[:, None], class_weight={0: 1, 1: 4},
                     batch_size=B, epochs=1, shuffle=False, verbose=0)
    _close_histories(got, want, ["loss", "auc", "acc"])


def test_compute_loss_model_refuses_compiled_loss_and_loss_weights(start):
    for kwargs in ({"loss": "binary_crossentropy"}, {"loss_weights": [2.0]}):
        with pytest.raises(ValueError, match="computes its loss in "
                           "compute_loss"):
            Ranker(start).compile(tn.optimizer.SGD(LR), **kwargs)


def test_compiled_metrics_without_labels_say_what_to_do(start):
    class DictRanker(Ranker):
        def compute_loss(self, inputs, training=False):
            labels = inputs.pop("label")
            return self.task(labels=labels[:, None],
                             predictions=self(inputs, training))

    model = DictRanker(start)
    model.compile(tn.optimizer.SGD(LR), metrics=["AUC"])
    ds = tf.data.Dataset.from_tensors({"user": np.arange(4),
                                       "label": np.ones(4, np.float32)})
    with pytest.raises(ValueError, match="record_predictions"):
        model.fit(ds, verbose=0)


def test_two_part_compute_loss_given_sample_weights_is_told_why(start):
    class TwoPart(Ranker):
        def compute_loss(self, inputs, training=False):
            features, labels = inputs
            return self.task(labels=labels[:, None],
                             predictions=self(features, training))

    model = TwoPart(start)
    model.compile(tn.optimizer.SGD(LR))
    with pytest.raises(ValueError, match="unpack three values"):
        model.fit({"user": np.arange(4)}, np.ones((4, 1), np.float32),
                  sample_weight=np.ones(4, np.float32), verbose=0)


def test_tn_models_take_compiled_metrics():
    """tnet's own models (compute_loss through their logits) feed compiled
    metrics what `call` returns, the click probability."""
    model = tn.models.WideDeep(["user"], embedding_dim=4)
    model.compile(tn.optimizer.Adagrad(0.05),
                  metrics=[tf_keras.metrics.MeanSquaredError(name="mse")])
    ids, y, _ = _data(64, 3)
    ds = tf.data.Dataset.from_tensor_slices(({"user": ids}, y)).batch(B)
    got = model.evaluate(ds, return_dict=True, verbose=0)
    p = model.predict(ds, verbose=0).reshape(-1)
    np.testing.assert_allclose(got["mse"], np.mean((p - y) ** 2), rtol=1e-4)


# ---------------------------------------------------------------- callbacks
class _Bias(tf_keras.layers.Layer):
    """x + b: a dense variable, so the optimizer's step advances."""

    def build(self, input_shape):
        self.b = self.add_weight(name="b", shape=(1,), initializer="zeros")

    def call(self, x):
        return x + self.b


def _sum_model():
    """Loss = sum of the row of id 7 (+ b): every push's gradient is exactly
    1, so SGD moves the row by -lr per step, one step per epoch."""
    col = fc.embedding_column(fc.category_column("a"), DIM,
                              initializer="zeros")
    inputs = {"a": tf_keras.Input((), dtype=tf.int64, name="a")}
    emb = tn.layers.EmbeddingFeatures([col])
    summed = tf_keras.layers.Lambda(
        lambda e: tf.reduce_sum(e, axis=1, keepdims=True))(emb(inputs))
    model = tn.Model(inputs, _Bias()(summed))
    model.compile(tn.optimizer.SGD(0.5), loss=lambda y, p: tf.reduce_sum(p))
    rows = []
    record = tf_keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: rows.append(
            emb.tables["a"].pull(np.array([7])).numpy()[0, 0]))
    return model, rows, record


def _fit_sum_model(model, callbacks, epochs=3):
    return model.fit({"a": np.array([7])}, np.zeros(1, np.float32),
                     batch_size=1, epochs=epochs, verbose=0,
                     callbacks=callbacks)


def test_learning_rate_scheduler_reaches_the_tables():
    model, rows, record = _sum_model()
    rates = [0.5, 0.05, 0.2]
    history = _fit_sum_model(model, [
        tf_keras.callbacks.LearningRateScheduler(lambda epoch: rates[epoch]),
        record])
    np.testing.assert_allclose(rows, -np.cumsum(rates), rtol=1e-6)
    np.testing.assert_allclose(history.history["lr"], rates, rtol=1e-6)


def test_reduce_lr_on_plateau_reaches_the_tables():
    model, rows, record = _sum_model()
    # mode="max" on a falling loss: no improvement after the first epoch,
    # so the rate is cut by 10 after epochs 2 and 3.
    history = _fit_sum_model(model, [
        tf_keras.callbacks.ReduceLROnPlateau(monitor="loss", mode="max",
                                             factor=0.1, patience=0),
        record], epochs=4)
    rates = np.array(history.history["lr"])
    np.testing.assert_allclose(rates, [0.5, 0.5, 0.05, 0.005], rtol=1e-6)
    np.testing.assert_allclose(rows, -np.cumsum(rates), rtol=1e-6)


def test_tensorboard_histograms_and_csv_logger(tmp_path, data, start):
    ids, y, _ = data["train"]
    vids, vy, _ = data["val"]
    model = _functional(start, True)
    model.compile(tn.optimizer.SGD(LR), loss="binary_crossentropy",
                  metrics=["AUC"])
    history = model.fit(
        {"user": ids}, y, batch_size=B, epochs=2, verbose=0,
        validation_data=({"user": vids}, vy),
        callbacks=[tf_keras.callbacks.TensorBoard(str(tmp_path / "tb"),
                                                  histogram_freq=1),
                   tf_keras.callbacks.CSVLogger(str(tmp_path / "log.csv"))])
    with open(tmp_path / "log.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2
    for key in ("loss", "auc", "val_loss", "val_auc"):
        np.testing.assert_allclose([float(r[key]) for r in rows],
                                   history.history[key], rtol=1e-6)
    tags = set()
    for path in (tmp_path / "tb" / "train").iterdir():
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            tags.update(v.tag for v in event.summary.value)
    assert {"epoch_loss", "epoch_auc"} <= tags
    # Histograms of the dense variables (the tables are not Keras weights).
    assert any(t.startswith("dense") and t.endswith("histogram")
               for t in tags), sorted(tags)


# -------------------------------------------------------------------- inputs
def _id_model(padding=None, dtype=tf.int64, combiner="sum"):
    """Functional: ids [B, L] -> the sum of their rows, one table."""
    col = fc.embedding_column(
        fc.category_column("ids", dtype, padding=padding), DIM,
        combiner=combiner)
    inputs = {"ids": tf_keras.Input((None,), dtype=dtype, name="ids")}
    emb = tn.layers.EmbeddingFeatures([col])
    model = tn.Model(inputs, emb(inputs))
    model.compile(tn.optimizer.SGD(LR), loss="mse")
    return model, emb


def test_float_ids_are_refused_naming_the_feature():
    """Keras would cast 2.7 fed to Input(dtype=int64) to id 2, silently."""
    model, _ = _id_model()
    for feed in (model.predict, lambda x, verbose: model.fit(
            x, np.zeros((2, DIM), np.float32), verbose=verbose)):
        with pytest.raises(TypeError, match="feature 'ids': ids must be "
                           "integers or strings, got float"):
            feed({"ids": np.array([[2.7], [3.0]])}, verbose=0)


def test_string_ids_in_an_int_column_name_the_feature_and_the_fix():
    model, _ = _id_model()
    with pytest.raises(TypeError, match=r"feature 'ids': got string ids but "
                       r"the column is int64.*dtype=tf.string"):
        model.predict({"ids": np.array([["a"], ["b"]])}, verbose=0)
    layer = tn.layers.EmbeddingFeatures([_column()])  # a subclass's layer
    with pytest.raises(TypeError, match="feature 'user'.*dtype=tf.string"):
        layer({"user": tf.constant(["a", "b"])})
    with pytest.raises(TypeError, match="feature 'user'.*got float"):
        layer({"user": tf.constant([1.5, 2.0])})


def test_padding_is_a_column_property_shown_in_its_repr():
    assert "padding=-1" in repr(fc.category_column("u"))
    assert "padding=''" in repr(fc.category_column("s", tf.string))
    assert "padding=0" in repr(fc.sequence_category_column("h", padding=0))
    assert fc.category_column("u", padding=0).padding == 0
    with pytest.raises(ValueError, match="padding of an int column"):
        fc.category_column("u", padding="x")


@pytest.mark.parametrize("dtype", [tf.int64, tf.string])
def test_default_padding_is_minus_one_or_empty_and_nothing_else(dtype):
    model, emb = _id_model(dtype=dtype)
    pad, other = (-1, -5) if dtype == tf.int64 else ("", "-5")
    ids = np.array([[pad, pad], [other, pad]], object if dtype == tf.string
                   else np.int64)
    model.fit({"ids": ids}, np.ones((2, DIM), np.float32), verbose=0)
    out = model.predict({"ids": ids}, verbose=0)
    np.testing.assert_array_equal(out[0], np.zeros(DIM))  # all padding
    assert np.abs(out[1]).sum() > 0                        # -5: an id
    assert int(emb.tables["ids"].size()) == 1


def test_custom_padding_in_every_input_form_and_the_export(tmp_path):
    """padding=0: 0 is no id, -1 an ordinary one, in dense, ragged and
    sparse ids alike, and in the export's padded serving input."""
    model, emb = _id_model(padding=0)
    dense = np.array([[3, 0, 0], [0, 0, 0], [-1, 3, 0], [5, -1, 0]])
    model.fit({"ids": dense}, np.ones((4, DIM), np.float32), epochs=2,
              verbose=0)
    assert int(emb.tables["ids"].size()) == 3  # 3, -1, 5
    got = model.predict({"ids": dense}, verbose=0)
    row = {i: model.predict({"ids": np.array([[i]])}, verbose=0)[0]
           for i in (3, -1, 5)}
    np.testing.assert_allclose(got, [row[3], np.zeros(DIM), row[-1] + row[3],
                                     row[5] + row[-1]], rtol=1e-6)
    assert not np.allclose(row[-1], 0)
    ragged = tf.ragged.constant([[3, 0], [0], [-1, 3], [5, -1]], tf.int64)
    sparse = ragged.to_sparse()
    for ids in (ragged, sparse):
        layer_out = emb({"ids": ids})
        np.testing.assert_allclose(layer_out, got, rtol=1e-6)

    # A model trained on ragged ids is served padded with the column's 0.
    inputs = {"ids": tf_keras.Input((None,), dtype=tf.int64, name="ids",
                                    ragged=True)}
    served = tn.Model(inputs, emb(inputs))
    served.compile(tn.optimizer.SGD(LR), loss="mse")
    served.predict({"ids": ragged}, verbose=0)
    export = tn.serving.export_for_serving(served, str(tmp_path / "1"))
    sig = tf.saved_model.load(export).signatures["serving_default"]
    padded = np.array([[3, 0, 0], [0, 0, 0], [-1, 3, 0], [5, 0, -1]])
    out = sig(ids=tf.constant(padded))
    np.testing.assert_allclose(out["prediction"], got, rtol=1e-6)


# ---------------------------------------------------------- serving contract
def _export_outputs(model, path, **kwargs):
    """(info, {output name: values}) of an export served ids 0..7."""
    import json  # noqa: PLC0415
    export = tn.serving.export_for_serving(model, str(path), **kwargs)
    with open(f"{export}/export_info.json") as f:
        info = json.load(f)
    sig = tf.saved_model.load(export).signatures["serving_default"]
    out = sig(user=tf.constant(np.arange(8, dtype=np.int64)))
    assert sorted(out) == info["outputs"]
    return info, {k: v.numpy().reshape(-1) for k, v in out.items()}


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def test_serving_outputs_are_named_by_what_they_hold(tmp_path, ranker_pair,
                                                     data, start):
    ids = np.arange(8, dtype=np.int64)
    # The Quickstart's model: call returns logits (a from_logits task).
    ranker = ranker_pair[0]
    info, out = _export_outputs(ranker, tmp_path / "ranker")
    logits = ranker.predict({"user": ids}, verbose=0).reshape(-1)
    assert info["prediction_holds"] == "logits"
    assert info["outputs"] == ["logits", "prediction", "probabilities"]
    np.testing.assert_allclose(out["prediction"], logits, rtol=1e-5)
    np.testing.assert_allclose(out["logits"], logits, rtol=1e-5)
    np.testing.assert_allclose(out["probabilities"], _sigmoid(logits),
                               rtol=1e-5)

    # A functional model with a sigmoid output and binary_crossentropy.
    functional = _functional(start, True)
    functional.compile(tn.optimizer.SGD(LR), loss="binary_crossentropy")
    functional.fit({"user": data["train"][0]}, data["train"][1], verbose=0)
    info, out = _export_outputs(functional, tmp_path / "functional")
    probs = functional.predict({"user": ids}, verbose=0).reshape(-1)
    assert info["prediction_holds"] == "probabilities"
    assert info["outputs"] == ["prediction", "probabilities"]
    np.testing.assert_allclose(out["probabilities"], probs, rtol=1e-5)

    # tnet's own models return the click probability.
    wide_deep = tn.models.WideDeep(["user"], embedding_dim=4)
    wide_deep.compile(tn.optimizer.Adagrad(0.05))
    wide_deep.fit(tf.data.Dataset.from_tensor_slices(
        ({"user": data["train"][0]}, data["train"][1])).batch(B), verbose=0)
    info, out = _export_outputs(wide_deep, tmp_path / "wide_deep")
    assert info["prediction_holds"] == "probabilities"
    np.testing.assert_allclose(
        out["probabilities"],
        wide_deep.predict({"user": ids}, verbose=0).reshape(-1), rtol=1e-5)


def test_unknown_outputs_are_said_and_can_be_named(tmp_path, start, capfd):
    model = _functional(start, True, activation=None)
    model.compile(tn.optimizer.SGD(LR), loss=lambda y, p: tf.reduce_mean(p))
    model.fit({"user": np.arange(8)}, np.zeros(8, np.float32), verbose=0)
    capfd.readouterr()
    info, out = _export_outputs(model, tmp_path / "a")
    assert info["prediction_holds"] == "unknown"
    assert sorted(out) == ["prediction"]
    assert "Pass prediction='logits'" in capfd.readouterr().err
    # Named by the caller (what export_for_serving(prediction=) passes on).
    from tnet.serving import outputs  # noqa: PLC0415
    kind, binary = outputs.prediction_kind(model, "logits")
    assert (kind, binary) == ("logits", False)  # not known to be binary
    assert sorted(outputs.serving_outputs(tf.zeros([2, 1]), kind,
                                          binary)) == ["logits", "prediction"]
    with pytest.raises(ValueError, match="must be one of"):
        tn.serving.export_for_serving(model, str(tmp_path / "c"),
                                     prediction="probs")


# ------------------------------------------------------------------ logging
def test_one_logging_mechanism(capsys):
    """tnet's messages go through the "tnet" logger: info to stdout, warnings
    and errors to stderr, the message alone; --verbosity's scale sets how
    much is said."""
    import logging  # noqa: PLC0415
    log = tn.log.get("test")
    try:
        log.info("tnet.test: info line")
        log.warning("tnet.test: warning line")
        log.debug("tnet.test: debug line")
        out, err = capsys.readouterr()
        assert out == "tnet.test: info line\n"
        assert err == "tnet.test: warning line\n"
        tn.log.set_verbosity(-1)
        log.info("hidden")
        log.error("tnet.test: error line")
        tn.log.set_verbosity(1)
        log.debug("tnet.test: debug line")
        out, err = capsys.readouterr()
        assert (out, err) == ("tnet.test: debug line\n",
                              "tnet.test: error line\n")
    finally:
        tn.log.set_verbosity(0)
    assert not logging.getLogger("tnet").propagate  # no double lines


def test_no_bare_print_outside_documented_output():
    """Every message goes through the logger; the print calls left are a
    CLI's documented output (the JSON summaries, the export checks' line,
    which run without tnet) and the uncaught-import-error line of
    tnet._ops. Calls are read from the syntax tree, so a docstring example
    or a script held in a string (run in a process without tnet) is no
    print of tnet's."""
    import ast  # noqa: PLC0415
    import pathlib  # noqa: PLC0415
    allowed = {"cli/train.py": 1, "cli/daily.py": 1, "cli/stream.py": 1,
               "serving/checks.py": 2, "_ops.py": 1}
    root = pathlib.Path(tn.__file__).parent
    found = {}
    for path in root.rglob("*.py"):
        n = sum(1 for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name) and node.func.id == "print")
        if n:
            found[path.relative_to(root).as_posix()] = n
    assert found == allowed
