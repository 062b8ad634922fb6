"""The models and data of tests/test_conformance.py.

Each case is (input form, id dtype, model style, sparse rule). The models
are written the way users write them, not the way tnet's own models are:
a TFRS-style subclass, a Keras subclass with `call` + `compile(loss=...)`,
a functional `tn.Model(inputs, outputs)` over Keras `Input`s (sparse=True /
ragged=True included), and `tn.models.WideDeep`. All defaults are left
alone except the rule.

Imported by the test and by the fresh process that restores every
checkpoint (`python conformance_models.py restore JOBS.json`): both build
the same models from the same code.
"""
from __future__ import annotations

import json
import sys

import numpy as np

import tnet as tn
import tensorflow as tf
import tensorflow_recommenders as tfrs
import tf_keras

from tnet import feature_column as fc

FORMS = ("B", "B1", "padded", "sparse", "ragged")
# One form per feature: the shared table is read by a ragged and a [B]
# column at once (one segment combine for both), f2's own table padded.
MIXED = "mixed"
MIXED_FORMS = {"f0": "ragged", "f1": "B", "f2": "padded"}
DTYPES = ("int64", "string")
STYLES = ("tfrs", "keras_subclass", "functional", "tn_models")
RULES = ("sgd", "adagrad", "rowwise_adagrad", "adam", "ftrl")
IDS = ("f0", "f1", "f2")   # f0 and f1 share a table; f2 has its own
WIDTH = 3                  # ids per example in the multi-valued forms
ROWS = 96
BATCH = 32


def cases():
    """Every (form, dtype, style) once; the rule is chosen so that every
    rule meets every form and every style (tn.models.WideDeep, which takes
    single ids, meets four)."""
    out = []
    for s, style in enumerate(STYLES):
        for f, form in enumerate(FORMS):
            if style == "tn_models" and form not in ("B", "B1"):
                continue
            for d, dtype in enumerate(DTYPES):
                rule = RULES[(2 * s + d + 2 * f) % len(RULES)]
                out.append((form, dtype, style, rule))
    out += [(MIXED, "int64", "functional", "adagrad"),
            (MIXED, "string", "keras_subclass", "ftrl")]
    return out


def feature_form(form: str, name: str) -> str:
    """The form of one feature's ids in a case of `form`."""
    return MIXED_FORMS[name] if form == MIXED else form


def case_id(case) -> str:
    return "-".join(case)


def optimizer(rule: str):
    lr = {"sgd": 0.1, "adagrad": 0.1, "rowwise_adagrad": 0.1, "adam": 0.01,
          "ftrl": 0.1}[rule]
    return {"sgd": tn.optimizer.SGD, "adagrad": tn.optimizer.Adagrad,
            "rowwise_adagrad": tn.optimizer.RowwiseAdagrad,
            "adam": tn.optimizer.Adam, "ftrl": tn.optimizer.Ftrl}[rule](lr)


# ------------------------------------------------------------------ data
def padded_ids(seed: int, rows: int = ROWS, offset: int = 0):
    """{feature: int64 [rows, WIDTH] padded with -1 at the end} + dense x +
    labels. Some rows have no id at all."""
    rng = np.random.default_rng(seed)
    out = {}
    for i, name in enumerate(IDS):
        ids = rng.integers(0, 20 * (i + 1), (rows, WIDTH)) + offset
        lengths = rng.integers(0, WIDTH + 1, rows)
        lengths = np.where(rng.random(rows) < 0.7, np.maximum(lengths, 1),
                           lengths)
        ids[np.arange(WIDTH)[None, :] >= lengths[:, None]] = -1
        out[name] = ids
    x = rng.normal(size=rows).astype(np.float32)
    label = ((out["f0"][:, 0] % 3 == 0) ^ (x > 0.5)).astype(np.float32)
    return out, x, label


def _as_dtype(ids: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "int64":
        return ids.astype(np.int64)
    flat = [b"" if v < 0 else f"id{v}".encode() for v in ids.reshape(-1)]
    return np.array(flat, dtype=object).reshape(ids.shape)


def served_inputs(form: str, dtype: str, ids: dict, x) -> dict:
    """numpy arrays as a TF Serving client sends them: the form's dense
    shape; sparse / ragged forms as [B, L] padded with -1 / ""."""
    out = {}
    for name, v in ids.items():
        kind = feature_form(form, name)
        if kind in ("B", "B1"):
            v = v[:, :1]
            v = v[:, 0] if kind == "B" else v
        out[name] = _as_dtype(v, dtype)
    out["x"] = x
    return out


def model_inputs(form: str, dtype: str, ids: dict, x) -> dict:
    """The features dict the model trains on (tensors of the form)."""
    served = served_inputs(form, dtype, ids, x)
    out = {"x": tf.constant(x)}
    for name in IDS:
        v = served[name]
        t = tf.constant(v.tolist() if v.dtype == object else v)
        kind = feature_form(form, name)
        if kind in ("sparse", "ragged"):
            pad = "" if dtype == "string" else tf.constant(-1, tf.int64)
            ragged = tf.ragged.boolean_mask(t, tf.not_equal(t, pad))
            t = ragged.to_sparse() if kind == "sparse" else ragged
        out[name] = t
    return out


def dataset(case, seed: int = 0):
    form, dtype, _, _ = case
    ids, x, label = padded_ids(seed)
    feats = model_inputs(form, dtype, ids, x)
    return tf.data.Dataset.from_tensor_slices((feats, label)).batch(BATCH)


# ---------------------------------------------------------------- models
def columns(dtype: str):
    tdtype = tf.string if dtype == "string" else tf.int64
    cats = [fc.category_column(n, dtype=tdtype) for n in IDS]
    return [fc.embedding_column(cats[0], 4, table="shared"),
            fc.embedding_column(cats[1], 4, table="shared", combiner="sum"),
            fc.embedding_column(cats[2], 4, combiner="sqrtn")]


def _tower():
    return tf_keras.Sequential([tf_keras.layers.Dense(8, activation="relu"),
                                tf_keras.layers.Dense(1)])


def _concat_x(emb, x):
    x = tf.reshape(tf.cast(x, tf.float32), [-1, 1])
    return tf.concat([emb, x], axis=1)


class TfrsStyle(tn.Model):
    def __init__(self, dtype):
        super().__init__()
        self.embed = tn.layers.EmbeddingFeatures(columns(dtype))
        self.tower = _tower()
        self.task = tfrs.tasks.Ranking(
            loss=tf_keras.losses.BinaryCrossentropy(from_logits=True))

    def call(self, features, training=False):
        emb = self.embed(features, training=training)
        return self.tower(_concat_x(emb, features["x"]))

    def compute_loss(self, inputs, training=False):
        features, labels = inputs
        logits = self(features, training=training)
        return self.task(labels=tf.reshape(labels, [-1, 1]),
                         predictions=logits)


class KerasSubclass(tn.Model):
    def __init__(self, dtype):
        super().__init__()
        self.embed = tn.layers.EmbeddingFeatures(columns(dtype))
        self.tower = _tower()

    def call(self, features, training=False):
        emb = self.embed(features, training=training)
        return self.tower(_concat_x(emb, features["x"]))


def functional(form: str, dtype: str):
    kind = "string" if dtype == "string" else "int64"
    inputs = {}
    for name in IDS:
        one = feature_form(form, name)
        if one == "B":
            inputs[name] = tf_keras.Input(shape=(), dtype=kind, name=name)
        elif one == "B1":
            inputs[name] = tf_keras.Input(shape=(1,), dtype=kind, name=name)
        elif one == "padded":
            inputs[name] = tf_keras.Input(shape=(WIDTH,), dtype=kind,
                                          name=name)
        else:
            inputs[name] = tf_keras.Input(
                shape=(None,), dtype=kind, name=name,
                sparse=one == "sparse", ragged=one == "ragged")
    inputs["x"] = tf_keras.Input(shape=(), dtype="float32", name="x")
    emb = tn.layers.EmbeddingFeatures(columns(dtype))(inputs)
    x = tf_keras.layers.Reshape((1,))(inputs["x"])
    out = _tower()(tf_keras.layers.Concatenate()([emb, x]))
    return tn.Model(inputs, out)


def build(case):
    """The compiled model of a case (same weights init for the same case)."""
    form, dtype, style, rule = case
    tf_keras.utils.set_random_seed(sum(map(ord, case_id(case))))
    if style == "tfrs":
        model = TfrsStyle(dtype)
        model.compile(optimizer(rule))
    elif style == "keras_subclass":
        model = KerasSubclass(dtype)
        model.compile(optimizer(rule), loss=tf_keras.losses.BinaryCrossentropy(
            from_logits=True))
    elif style == "functional":
        model = functional(form, dtype)
        model.compile(optimizer(rule), loss=tf_keras.losses.BinaryCrossentropy(
            from_logits=True))
    else:
        model = tn.models.WideDeep(list(IDS), ["x"], embedding_dim=4,
                                   hidden_units=(8,),
                                   string_ids=dtype == "string")
        model.compile(optimizer(rule))
    return model


def predict(model, case, seed: int = 1):
    """Predictions on held-out rows (known and unknown ids mixed)."""
    form, dtype, _, _ = case
    ids, x, _ = padded_ids(seed, rows=40)
    unknown, _, _ = padded_ids(seed + 1, rows=40, offset=10_000)
    for name in ("f1",):  # a column of never-seen ids in half the rows
        ids[name][20:] = np.where(ids[name][20:] >= 0, unknown[name][20:], -1)
    feats = model_inputs(form, dtype, ids, x)
    out = model.predict(tf.data.Dataset.from_tensors(feats), verbose=0)
    return np.asarray(out, np.float32).reshape(-1), served_inputs(
        form, dtype, ids, x)


# ------------------------------------------------- fresh-process restore
def restore_all(jobs_path: str) -> None:
    """For each job {case, ckpt, out}: build, restore, predict -> out."""
    with open(jobs_path) as f:
        jobs = json.load(f)
    for job in jobs:
        case = tuple(job["case"])
        model = build(case)
        tn.saving.restore(model, job["ckpt"], progress=lambda _: None)
        got, _ = predict(model, case)
        np.save(job["out"], got)
    print(json.dumps({"restored": len(jobs)}))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "restore":
        restore_all(sys.argv[2])
    else:
        sys.exit("usage: conformance_models.py restore JOBS.json")
