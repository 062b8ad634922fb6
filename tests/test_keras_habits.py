"""Keras-habits matrix, saving half: every way a Keras user saves, loads
and inspects weights, on every way of writing a tnet model.

Model styles (the columns): a TFRS-style subclass with `compute_loss`, a
subclass with its own `train_step` (around tn.Model's), a functional
`tn.Model(inputs, outputs)` and `tn.models.WideDeep` (whose wide table has
its own FTRL rule). Habits (the rows): `save_weights` / `load_weights` in
HDF5 and TF formats into the same and a fresh model, compiled or not, with
the same and another optimizer; `get_weights` / `set_weights`;
`EarlyStopping(restore_best_weights=True)`; `ModelCheckpoint` (weights
only and whole model); `BackupAndRestore`; `model.save` +
`tf_keras.models.load_model`; `summary()`; `set_random_seed`.

Each cell either gives what it gives for a stock tf_keras model (dense
weights and every table's rows, slots and meta bit-exact; predictions
equal; training continued after a load equal to training continued without
one) or raises one clear error naming what to use instead. A cell that
runs without either fails. One trained model per style is shared by the
cells (module fixture) to keep the matrix fast.
"""
from __future__ import annotations

import numpy as np
import pytest

import tnet as tn   # first: it selects Keras 2 (tf_keras) for TensorFlow
import tensorflow as tf
import tensorflow_recommenders as tfrs
import tf_keras

from tnet import feature_column as fc
from tnet.saving import keras_weights

STYLES = ("tfrs", "train_step", "functional", "tn_models")
ROWS, BATCH = 128, 32


# ------------------------------------------------------------------ data
def _data(seed=0, rows=ROWS):
    rng = np.random.default_rng(seed)
    u = rng.integers(0, 40, rows).astype(np.int64)
    c = rng.integers(0, 25, rows).astype(np.int64)
    x = rng.normal(size=rows).astype(np.float32)
    y = ((u % 3 == 0) ^ (x > 0.3)).astype(np.float32)
    return {"u": u, "c": c, "x": x}, y


def _dataset(seed=0):
    feats, y = _data(seed)
    return tf.data.Dataset.from_tensor_slices((feats, y)).batch(BATCH)


def _probe():
    """Known and never-seen ids."""
    feats, _ = _data(7, rows=24)
    feats["u"][12:] += 10_000
    return feats


# ---------------------------------------------------------------- models
def _columns():
    return [fc.embedding_column(fc.category_column("u"), 4, table="shared"),
            fc.embedding_column(fc.category_column("c"), 3, table="c3")]


def _tower():
    return tf_keras.Sequential([tf_keras.layers.Dense(6, activation="relu"),
                                tf_keras.layers.Dense(1)])


def _join(emb, x):
    return tf.concat([emb, tf.reshape(tf.cast(x, tf.float32), [-1, 1])], 1)


class TfrsStyle(tn.Model):
    def __init__(self):
        super().__init__()
        self.embed = tn.layers.EmbeddingFeatures(_columns())
        self.tower = _tower()
        self.task = tfrs.tasks.Ranking(
            loss=tf_keras.losses.BinaryCrossentropy(from_logits=True))

    def call(self, features, training=False):
        return self.tower(_join(self.embed(features, training=training),
                                features["x"]))

    def compute_loss(self, inputs, training=False):
        features, labels = inputs
        return self.task(labels=tf.reshape(labels, [-1, 1]),
                         predictions=self(features, training=training))


class OwnTrainStep(tn.Model):
    """A Keras subclass with its own train_step (counting its steps around
    tn.Model's, as a user adds logging or a schedule)."""

    def __init__(self):
        super().__init__()
        self.embed = tn.layers.EmbeddingFeatures(_columns())
        self.tower = _tower()
        self.steps_seen = tf.Variable(0, trainable=False, dtype=tf.int64)

    def call(self, features, training=False):
        return self.tower(_join(self.embed(features, training=training),
                                features["x"]))

    def train_step(self, data):
        self.steps_seen.assign_add(1)
        return super().train_step(data)


class OwnTape(tn.Model):
    """A train_step written from scratch, as in the Keras guide: the tape
    sees the dense variables only, so the tables could not train."""

    def __init__(self):
        super().__init__()
        self.embed = tn.layers.EmbeddingFeatures(_columns())
        self.tower = _tower()

    def call(self, features, training=False):
        return self.tower(_join(self.embed(features, training=training),
                                features["x"]))

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compiled_loss(tf.reshape(y, [-1, 1]),
                                      self(x, training=True))
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        return {"loss": loss}


def test_a_train_step_of_ones_own_that_skips_the_tables_is_refused():
    model = OwnTape()
    model.compile(_optimizer(), loss=tf_keras.losses.BinaryCrossentropy(
        from_logits=True))
    with pytest.raises(TypeError, match=r"OwnTape.train_step looks up the "
                       r"tnet tables \['c3', 'shared'\].*super\(\)"
                       r".train_step\(data\)"):
        model.fit(_dataset(), epochs=1, verbose=0)


def _functional():
    inputs = {"u": tf_keras.Input(shape=(), dtype="int64", name="u"),
              "c": tf_keras.Input(shape=(), dtype="int64", name="c"),
              "x": tf_keras.Input(shape=(), dtype="float32", name="x")}
    emb = tn.layers.EmbeddingFeatures(_columns())(inputs)
    x = tf_keras.layers.Reshape((1,))(inputs["x"])
    return tn.Model(inputs, _tower()(tf_keras.layers.Concatenate()([emb, x])))


def _optimizer(kind="adam"):
    return {"adam": lambda: tn.optimizer.Adam(0.02),
            "adagrad": lambda: tn.optimizer.Adagrad(0.1)}[kind]()


def build(style, compiled="adam"):
    tf_keras.utils.set_random_seed(11)
    if style == "tfrs":
        model = TfrsStyle()
    elif style == "train_step":
        model = OwnTrainStep()
    elif style == "functional":
        model = _functional()
    else:
        model = tn.models.WideDeep(["u", "c"], ["x"], embedding_dim=4,
                                   hidden_units=(6,))
    if compiled:
        loss = (None if style in ("tfrs", "tn_models") else
                tf_keras.losses.BinaryCrossentropy(from_logits=True))
        model.compile(_optimizer(compiled), loss=loss)
    return model


def _call_once(model):
    """Creates the variables of a subclassed model, as Keras asks before an
    HDF5 load (inference: no rows are created)."""
    model.predict(_probe(), verbose=0)


def predict(model):
    return np.asarray(model.predict(_probe(), verbose=0)).reshape(-1)


def tables(model):
    """{name: (keys, weights, slots, meta)} sorted by key, numpy."""
    out = {}
    for name, t in model.tables().items():
        k, w, s, m = (x.numpy() for x in t.export())
        order = np.argsort(k)
        out[name] = (k[order], w[order], s[order], m[order])
    return out


def dense(model):
    return [v.numpy() for v in model.weights]


def assert_same_state(got_model, want_tables, want_dense=None):
    got = tables(got_model)
    assert sorted(got) == sorted(want_tables)
    for name in want_tables:
        assert len(want_tables[name][0]) > 0, name
        for a, b, what in zip(got[name], want_tables[name],
                              ("keys", "weights", "slots", "meta")):
            np.testing.assert_array_equal(a, b, err_msg=f"{name} {what}")
    if want_dense is not None:
        got_dense = dense(got_model)
        assert len(got_dense) == len(want_dense)
        for a, b in zip(got_dense, want_dense):
            np.testing.assert_array_equal(a, b)


class Trained:
    def __init__(self, style, root):
        self.style = style
        self.model = build(style)
        self.model.fit(_dataset(), epochs=2, verbose=0)
        self.tables = tables(self.model)
        self.dense = dense(self.model)
        self.pred = predict(self.model)
        self.root = root


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("habits")
    return {s: Trained(s, root / s) for s in STYLES}


def _check_untouched(t):
    """The shared model is as trained (cells must not change it)."""
    assert_same_state(t.model, t.tables, t.dense)


# ------------------------------------------- save_weights / load_weights
@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("fmt", ["h5", "weights.h5", "tf"])
def test_save_weights_into_fresh_compiled_model_is_bit_exact(
        trained, style, fmt, tmp_path):
    t = trained[style]
    path = str(tmp_path / ("w" if fmt == "tf" else f"w.{fmt}"))
    t.model.save_weights(path)
    fresh = build(style)
    if fmt != "tf":
        _call_once(fresh)  # stock Keras needs built variables for HDF5 too
    fresh.load_weights(path)
    np.testing.assert_array_equal(predict(fresh), t.pred)
    assert_same_state(fresh, t.tables, t.dense if fmt == "tf" else None)
    if fmt != "tf":   # HDF5 holds no optimizer state, as in Keras
        for a, b in zip([v.numpy() for v in fresh.trainable_weights],
                        [v.numpy() for v in t.model.trainable_weights]):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("style", STYLES)
def test_tf_format_load_then_training_goes_on_as_without_the_save(
        trained, style, tmp_path):
    """Slots and optimizer state come back: one more epoch after the load
    ends where one more epoch of the saved model ends."""
    t = trained[style]
    path = str(tmp_path / "w")
    t.model.save_weights(path)
    fresh = build(style)
    fresh.load_weights(path)
    fresh.fit(_dataset(1), epochs=1, verbose=0)
    again = build(style)
    again.load_weights(path)
    again.fit(_dataset(1), epochs=1, verbose=0)
    assert_same_state(fresh, tables(again), dense(again))
    first = sorted(t.tables)[0]
    assert tables(fresh)[first][1].tolist() != t.tables[first][1].tolist()
    _check_untouched(t)


@pytest.mark.parametrize("style", STYLES)
def test_tf_train_checkpoint_holds_the_tables(trained, style, tmp_path):
    t = trained[style]
    path = tf.train.Checkpoint(model=t.model).write(str(tmp_path / "ck"))
    fresh = build(style)
    tf.train.Checkpoint(model=fresh).read(path)
    np.testing.assert_array_equal(predict(fresh), t.pred)
    assert_same_state(fresh, t.tables, t.dense)


@pytest.mark.parametrize("style", STYLES)
def test_h5_load_into_the_same_model_undoes_later_training(
        trained, style, tmp_path):
    t = trained[style]
    model = build(style)
    model.fit(_dataset(), epochs=1, verbose=0)
    path = str(tmp_path / "w.h5")
    model.save_weights(path)
    want_tables, want_pred = tables(model), predict(model)
    model.fit(_dataset(2), epochs=1, verbose=0)   # new ids, changed rows
    assert not np.array_equal(predict(model), want_pred)
    model.load_weights(path)
    np.testing.assert_array_equal(predict(model), want_pred)
    assert_same_state(model, want_tables)


@pytest.mark.parametrize("style,fmt,other", [
    *[(s, "tf", "uncompiled") for s in STYLES],
    *[(s, "h5", "adagrad") for s in STYLES],
    ("functional", "h5", "uncompiled"), ("tfrs", "tf", "adagrad")])
def test_load_weights_saved_with_another_optimizer_names_the_cause(
        trained, style, fmt, other, tmp_path):
    t = trained[style]
    path = str(tmp_path / ("w.h5" if fmt == "h5" else "w"))
    t.model.save_weights(path)
    fresh = build(style, compiled=None if other == "uncompiled" else other)
    if fmt == "h5":
        _call_once(fresh)
    before = tables(fresh)
    with pytest.raises(keras_weights.TableWeightsError,
                       match="different optimizer") as e:
        fresh.load_weights(path)
    assert "compile()" in str(e.value)
    assert any(repr(n) in str(e.value) for n in t.tables)
    for name, got in tables(fresh).items():   # no row changed
        want = before.get(name)
        assert len(got[0]) == (0 if want is None else len(want[0]))


def test_load_into_uncompiled_model_works_when_the_rule_matches(tmp_path):
    """Uncompiled tables use Adagrad: weights saved with Adagrad load, and
    compiling with Adagrad afterwards keeps them."""
    model = build("functional", compiled="adagrad")
    model.fit(_dataset(), epochs=1, verbose=0)
    model.save_weights(str(tmp_path / "w"))
    fresh = build("functional", compiled=None)
    fresh.load_weights(str(tmp_path / "w"))
    np.testing.assert_array_equal(predict(fresh), predict(model))
    fresh.compile(_optimizer("adagrad"),
                  loss=tf_keras.losses.BinaryCrossentropy(from_logits=True))
    assert_same_state(fresh, tables(model))


def test_h5_file_of_a_stock_model_is_refused_for_a_model_with_tables(
        tmp_path):
    model = build("functional")
    stock = tf_keras.Model(model.inputs, model.outputs)  # no tn.Model
    path = str(tmp_path / "stock.h5")
    tf_keras.Model.save_weights(stock, path)
    with pytest.raises(keras_weights.TableWeightsError,
                       match="holds no tnet tables"):
        model.load_weights(path)


# ------------------------------------------------ get / set weights
@pytest.mark.parametrize("style", STYLES)
def test_get_set_weights_carry_the_tables(trained, style):
    t = trained[style]
    weights = t.model.get_weights()
    # The dense list is Keras' own: same length and order as model.weights.
    assert len(weights) == len(t.model.weights)
    for a, b in zip(weights, t.dense):
        np.testing.assert_array_equal(a, b)
    fresh = build(style)
    _call_once(fresh)
    fresh.set_weights(weights)
    np.testing.assert_array_equal(predict(fresh), t.pred)
    assert_same_state(fresh, t.tables, t.dense)


@pytest.mark.parametrize("style", STYLES)
def test_set_weights_of_a_plain_list_is_refused_or_keeps_tables_on_request(
        trained, style):
    t = trained[style]
    fresh = build(style)
    _call_once(fresh)
    plain = [w.copy() for w in t.model.get_weights()]
    with pytest.raises(keras_weights.TableWeightsError,
                       match="tables='keep'"):
        fresh.set_weights(plain)
    fresh.set_weights(plain, tables="keep")
    for a, b in zip(dense(fresh), t.dense):
        np.testing.assert_array_equal(a, b)
    assert all(len(v[0]) == 0 for v in tables(fresh).values())


def test_get_weights_refuses_tables_above_the_snapshot_limit(
        trained, monkeypatch):
    t = trained["functional"]
    monkeypatch.setattr(keras_weights, "MAX_SNAPSHOT_BYTES", 100)
    with pytest.raises(keras_weights.TableWeightsError,
                       match="tn.saving.save"):
        t.model.get_weights()


class _Script(tf_keras.callbacks.Callback):
    """Puts a scripted `score` into the epoch logs and records the model
    (tables, dense weights) as each epoch ends."""

    def __init__(self, scores):
        super().__init__()
        self.scores = list(scores)
        self.seen = []

    def on_epoch_end(self, epoch, logs=None):
        logs["score"] = self.scores[epoch]
        self.seen.append((tables(self.model), dense(self.model)))


@pytest.mark.parametrize("style", STYLES)
def test_early_stopping_restores_the_best_tables(style):
    model = build(style)
    script = _Script([0.5, 0.1, 0.7, 0.9, 0.9])
    stop = tf_keras.callbacks.EarlyStopping(
        monitor="score", mode="min", patience=2, restore_best_weights=True)
    hist = model.fit(_dataset(), epochs=5, verbose=0,
                     callbacks=[script, stop])
    assert len(hist.epoch) == 4 and len(script.seen) == 4
    best_tables, best_dense = script.seen[1]
    first = sorted(best_tables)[0]
    assert best_tables[first][1].tolist() != \
        script.seen[3][0][first][1].tolist()
    assert_same_state(model, best_tables, best_dense)


# ------------------------------------------------------- callbacks
@pytest.mark.parametrize("style,fmt", [
    ("tfrs", "h5"), ("train_step", "tf"), ("functional", "tf"),
    ("tn_models", "h5")])
def test_model_checkpoint_weights_only_restores_tables(style, fmt, tmp_path):
    model = build(style)
    script = _Script([0.0] * 2)
    path = str(tmp_path / ("ep{epoch}.h5" if fmt == "h5" else "ep{epoch}"))
    model.fit(_dataset(), epochs=2, verbose=0, callbacks=[
        script, tf_keras.callbacks.ModelCheckpoint(path,
                                                   save_weights_only=True)])
    fresh = build(style)
    if fmt == "h5":
        _call_once(fresh)
    fresh.load_weights(path.format(epoch=1))
    assert_same_state(fresh, script.seen[0][0])


@pytest.mark.parametrize("style", STYLES)
def test_backup_and_restore_resumes_as_an_uninterrupted_run(style, tmp_path):
    whole = build(style)
    whole.fit(_dataset(), epochs=3, verbose=0)

    class Stop(tf_keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 2:
                raise RuntimeError("interrupted")

    backup = str(tmp_path / "backup")
    cut = build(style)
    with pytest.raises(RuntimeError, match="interrupted"):
        cut.fit(_dataset(), epochs=3, verbose=0, callbacks=[
            tf_keras.callbacks.BackupAndRestore(backup), Stop()])
    resumed = build(style)
    hist = resumed.fit(_dataset(), epochs=3, verbose=0, callbacks=[
        tf_keras.callbacks.BackupAndRestore(backup)])
    assert hist.epoch == [2]   # resumed after epoch 2 of 3
    assert_same_state(resumed, tables(whole), dense(whole))


# ------------------------------------------- model.save / load_model
@pytest.mark.parametrize("style", STYLES)
def test_model_save_h5_or_keras_format_is_refused_clearly(trained, style,
                                                          tmp_path):
    t = trained[style]
    for name in ("m.h5", "m.keras"):
        with pytest.raises((NotImplementedError, ValueError)) as e:
            t.model.save(str(tmp_path / name))
        assert "tn.saving" in str(e.value), str(e.value)


@pytest.mark.parametrize("style", STYLES)
def test_model_save_savedmodel_loads_with_tnet_and_predicts_the_same(
        trained, style, tmp_path):
    t = trained[style]
    path = str(tmp_path / "sm")
    t.model.save(path)
    loaded = tf_keras.models.load_model(path)
    got = np.asarray(loaded.predict(_probe(), verbose=0)).reshape(-1)
    np.testing.assert_array_equal(got, t.pred)
    # Training it would leave its tables as saved: refused, naming the fix.
    if style in ("tfrs", "tn_models"):   # compute_loss is not saved
        with pytest.raises(ValueError, match="No loss found"):
            loaded.fit(_dataset(), epochs=1, verbose=0)
        loaded.compile("adam", loss=tf_keras.losses.BinaryCrossentropy())
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="tables cannot train.*load_weights"):
        loaded.fit(_dataset(), epochs=1, verbose=0)
    _check_untouched(t)


@pytest.mark.parametrize("style", ["functional"])
def test_model_checkpoint_whole_model_loads_with_tnet(style, tmp_path):
    model = build(style)
    preds = []

    class Record(tf_keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            preds.append(predict(self.model))

    path = str(tmp_path / "ep{epoch}")
    model.fit(_dataset(), epochs=2, verbose=0, callbacks=[
        Record(), tf_keras.callbacks.ModelCheckpoint(path)])
    loaded = tf_keras.models.load_model(path.format(epoch=1))
    got = np.asarray(loaded.predict(_probe(), verbose=0)).reshape(-1)
    np.testing.assert_array_equal(got, preds[0])


# ------------------------------------------------------------ summary
@pytest.mark.parametrize("style", STYLES)
def test_summary_shows_every_table_with_dim_rows_and_params(trained, style):
    t = trained[style]
    lines = []
    t.model.summary(print_fn=lines.append)
    text = "\n".join(lines)
    assert "rows grow" in text
    start = [i for i, ln in enumerate(lines) if ln.startswith("tnet tables")]
    assert len(start) == 1, text
    lines = lines[start[0]:]
    total = 0
    for name, table in t.model.tables().items():
        rows = int(table.size())
        assert rows > 0
        row = [ln for ln in lines if ln.split()[:1] == [name]]
        assert len(row) == 1, text
        fields = row[0].split()
        assert fields[1:4] == [str(table.dim), f"{rows:,}",
                               f"{rows * table.dim:,}"], row[0]
        total += rows * table.dim
    assert f"Table params so far: {total:,}" in text


def test_summary_before_the_tables_exist_says_so():
    model = build("functional")   # built; compile() recreates its tables
    lines = []
    model.summary(print_fn=lines.append)
    assert "not created yet" in lines[-1] and "'shared'" in lines[-1]


# ------------------------------------------------------ random seeds
def _initial_rows(seed_global=None, seed_table=None):
    if seed_global is not None:
        tf_keras.utils.set_random_seed(seed_global)
    table = tn.SparseTable("seeded", 4, seed=seed_table)
    return table.pull(tf.constant([1, 2, 3], tf.int64), training=True).numpy()


def test_set_random_seed_moves_initial_rows_and_stays_reproducible():
    a1 = _initial_rows(1)
    a2 = _initial_rows(1)
    b = _initial_rows(2)
    np.testing.assert_array_equal(a1, a2)
    assert not np.array_equal(a1, b)
    # A table's own seed wins over the global one.
    np.testing.assert_array_equal(_initial_rows(1, seed_table=5),
                                  _initial_rows(2, seed_table=5))


@pytest.mark.parametrize("style", ["tfrs"])
def test_models_trained_at_one_seed_are_bit_exact(style):
    """(BackupAndRestore's cells compare two runs at one seed per style.)"""
    a = build(style)   # at set_random_seed(11)
    a.fit(_dataset(), epochs=1, verbose=0)
    b = build(style)
    b.fit(_dataset(), epochs=1, verbose=0)
    assert_same_state(a, tables(b), dense(b))
