"""A TensorNet-style model on tf.Example TFRecords, for the defaults study.

The model is written the way a TensorNet user writes one (as
examples/tensornet_style.py does): every slot a `VarLenFeature` of int64
feature signs, sparse Keras `Input`s, a dim-1 "linear" and a dim-8
"deep" `EmbeddingFeatures`, each given the sparse optimizer, the linear
outputs concatenated with the DNN's and one sigmoid unit on top. The
stock tf_keras model a competent user writes instead reduces the same
signs with `floormod` into `BINS` rows per slot and averages each slot's
rows (`safe_embedding_lookup_sparse`); Keras' defaults everywhere (the
linear rows start at zero, as a linear model's weights). Both train with
Adagrad (lr 0.05) on the same files in the same seeded order, and are
scored by hold-out AUC.

The data are generated once (fixed seed, whatever the run's seed) into
DATA_DIR (under /tmp, never the repository): TRAIN_FILES files of
ROWS_PER_FILE examples to train on and one more to score. Each slot
holds 1-5 ids drawn from a power law over VOCAB ids per slot; an id is a
random 62-bit sign, as TensorNet's slots hold hashed feature values. The
label is Bernoulli(sigmoid(logit)), logit = -0.3 + the mean true weight of
each slot's ids + the dot product of the mean latent vectors of slot_1's
and slot_2's ids (a "user x item" term only the deep part can learn).
"""
from __future__ import annotations

import os
import pathlib
import shutil
import tempfile

import numpy as np

import tnet as tn
import tensorflow as tf
import tf_keras

from tnet import feature_column as fc

SLOTS = tuple(f"slot_{i}" for i in range(1, 9))
LINEAR_SLOTS = SLOTS[:6]
DEEP_SLOTS = SLOTS
VOCAB = 20_000            # ids per slot
ZIPF = 1.05
LATENT = 4
TRAIN_FILES = 4
ROWS_PER_FILE = 12_000
BATCH = 256
HIDDEN = (64, 32)
LR = 0.05
BINS = 2**18              # stock rows per slot (floormod of the signs)
DATA_VERSION = 1
DATA_DIR = pathlib.Path(os.environ.get(
    "TNET_TFRECORD_MV_DIR", "/tmp/tnet-defaults-data")) / (
        f"tfrecord_mv-v{DATA_VERSION}")


def _truth():
    rng = np.random.default_rng(2025)
    signs = {s: rng.integers(1, 2**62, VOCAB, dtype=np.int64) for s in SLOTS}
    weights = {s: rng.normal(0.0, 0.7, VOCAB) for s in SLOTS}
    latent = {s: rng.normal(0.0, 0.6, (VOCAB, LATENT))
              for s in ("slot_1", "slot_2")}
    zipf = 1.0 / np.arange(1, VOCAB + 1) ** ZIPF
    return rng, signs, weights, latent, zipf / zipf.sum()


def write_data(data_dir: pathlib.Path = DATA_DIR) -> pathlib.Path:
    """Writes the files once (into a temporary directory renamed into
    place, so concurrent runs never read a half-written file)."""
    if (data_dir / "DONE").exists():
        return data_dir
    rng, signs, weights, latent, p = _truth()
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(dir=data_dir.parent))
    cdf = np.cumsum(p)
    for f in range(TRAIN_FILES + 1):
        name = (f"train-{f:05d}.tfrecord" if f < TRAIN_FILES
                else "holdout.tfrecord")
        lengths = rng.integers(1, 6, (len(SLOTS), ROWS_PER_FILE))
        logit = np.full(ROWS_PER_FILE, -0.3)
        ids, z = {}, {}
        for k, s in enumerate(SLOTS):
            flat = np.minimum(np.searchsorted(cdf, rng.random(
                lengths[k].sum())), VOCAB - 1)
            starts = np.concatenate([[0], np.cumsum(lengths[k])[:-1]])
            logit += np.add.reduceat(weights[s][flat], starts) / lengths[k]
            if s in latent:
                z[s] = (np.add.reduceat(latent[s][flat], starts)
                        / lengths[k][:, None])
            ids[s] = np.split(signs[s][flat], starts[1:])
        logit += (z["slot_1"] * z["slot_2"]).sum(axis=1)
        label = (rng.random(ROWS_PER_FILE)
                 < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)
        if f == TRAIN_FILES:   # the true model's scores, for oracle_auc
            np.savez(tmp / "holdout_truth.npz", logit=logit, label=label)
        with tf.io.TFRecordWriter(str(tmp / name)) as w:
            for r in range(ROWS_PER_FILE):
                feats = {s: tf.train.Feature(int64_list=tf.train.Int64List(
                    value=ids[s][r].tolist())) for s in SLOTS}
                feats["label"] = tf.train.Feature(
                    int64_list=tf.train.Int64List(value=[int(label[r])]))
                w.write(tf.train.Example(features=tf.train.Features(
                    feature=feats)).SerializeToString(deterministic=True))
    (tmp / "DONE").touch()
    try:
        os.rename(tmp, data_dir)
    except OSError:          # another run got there first
        shutil.rmtree(tmp, ignore_errors=True)
    return data_dir


def parse(batch):
    """As TensorNet's examples parse: every slot a VarLenFeature."""
    spec = {s: tf.io.VarLenFeature(tf.int64) for s in SLOTS}
    spec["label"] = tf.io.FixedLenFeature([], tf.int64)
    features = tf.io.parse_example(batch, spec)
    label = tf.cast(features.pop("label"), tf.float32)
    return features, label


def datasets(seed: int, data_dir: pathlib.Path = DATA_DIR,
             val_rows: int = 0):
    """(train, hold-out): the training files shuffled by `seed` (the
    examples are fixed), the hold-out file in order. With `val_rows`,
    (train, validation, hold-out): the validation rows are the last
    `val_rows` of the training files, and training keeps the rest."""
    data_dir = write_data(data_dir)
    files = [str(data_dir / f"train-{f:05d}.tfrecord")
             for f in range(TRAIN_FILES)]
    records = tf.data.TFRecordDataset(files)
    rows = TRAIN_FILES * ROWS_PER_FILE - val_rows
    train = ((records.take(rows) if val_rows else records)
             .shuffle(rows, seed=seed).batch(BATCH).map(parse).prefetch(2))
    hold = (tf.data.TFRecordDataset(str(data_dir / "holdout.tfrecord"))
            .batch(1024).map(parse))
    if not val_rows:
        return train, hold
    val = records.skip(rows).batch(1024).map(parse)
    return train, val, hold


def _inputs():
    return {s: tf_keras.Input(name=s, shape=(None,), dtype="int64",
                              sparse=True) for s in SLOTS}


def user_model(accumulator: float | None = None,
               initializer=None, metrics=None) -> tn.Model:
    """The TensorNet-style Wide&Deep (examples/tensornet_style.py), with
    Adagrad for the dense part too, so both sides run one optimizer.
    `accumulator`: the rows' Adagrad start (None: tnet's default);
    `initializer`: the deep columns' (None: tnet's default); `metrics`:
    compile's."""
    kw = ({} if accumulator is None
          else {"row_initial_accumulator_value": accumulator})
    inputs = _inputs()
    ids = {s: fc.category_column(s) for s in SLOTS}
    sparse_opt = tn.optimizer.Adagrad(LR, **kw)   # TensorNet: tn.core.AdaGrad
    linear = tn.layers.EmbeddingFeatures(
        [fc.embedding_column(ids[s], 1, table="linear") for s in LINEAR_SLOTS],
        sparse_opt, name="linear_input")
    deep = tn.layers.EmbeddingFeatures(
        [fc.embedding_column(ids[s], 8, table="deep",
                             **({} if initializer is None
                                else {"initializer": initializer}))
         for s in DEEP_SLOTS],
        sparse_opt, name="deep_input")
    x = deep(inputs)
    for i, units in enumerate(HIDDEN):
        x = tf_keras.layers.Dense(units, "relu", name=f"dnn_{i}")(x)
    both = tf_keras.layers.Concatenate()([x, linear(inputs)])
    output = tf_keras.layers.Dense(1, "sigmoid", name="pred")(both)
    model = tn.Model(inputs=inputs, outputs=output, name="full_model")
    model.compile(optimizer=tn.optimizer.Adagrad(LR, **kw),
                  loss="binary_crossentropy", metrics=metrics)
    return model


def stock_model(accumulator: float | None = None,
                metrics=None) -> tf_keras.Model:
    """The same model in stock tf_keras: floormod'ed signs, one
    `BINS`-row variable per slot and part, Keras' defaults."""
    from tests.programs.user_models import SparseEmbedding
    inputs = _inputs()
    deep = [SparseEmbedding(BINS, 8, name=f"emb_{s}")(inputs[s])
            for s in DEEP_SLOTS]
    linear = [SparseEmbedding(BINS, 1, initializer="zeros",
                              name=f"linear_{s}")(inputs[s])
              for s in LINEAR_SLOTS]
    x = tf_keras.layers.Concatenate()(deep)
    for i, units in enumerate(HIDDEN):
        x = tf_keras.layers.Dense(units, "relu", name=f"dnn_{i}")(x)
    both = tf_keras.layers.Concatenate()([x] + linear)
    output = tf_keras.layers.Dense(1, "sigmoid", name="pred")(both)
    model = tf_keras.Model(inputs, output)
    kw = ({} if accumulator is None
          else {"initial_accumulator_value": accumulator})
    model.compile(optimizer=tf_keras.optimizers.Adagrad(LR, **kw),
                  loss="binary_crossentropy", metrics=metrics)
    return model


def collisions(data_dir: pathlib.Path = DATA_DIR) -> float:
    """Share of the training id occurrences whose stock row (floormod
    BINS) is shared with another id of the same slot."""
    _, signs, _, _, p = _truth()
    shared = 0.0
    for s in SLOTS:
        rows = np.mod(signs[s], BINS)
        _, inverse, counts = np.unique(rows, return_inverse=True,
                                       return_counts=True)
        shared += p[counts[inverse] > 1].sum()
    return shared / len(SLOTS)


def oracle_auc(data_dir: pathlib.Path = DATA_DIR) -> float:
    """Hold-out AUC of the true logits (the best any model can do)."""
    from tnet.data.metrics import auc
    truth = np.load(write_data(data_dir) / "holdout_truth.npz")
    return float(auc(truth["label"].astype(np.float32), truth["logit"]))


def _holdout_auc(model, hold) -> float:
    from tnet.data.metrics import auc
    labels, scores = [], []
    for features, y in hold:
        scores.append(np.asarray(model(features, training=False)).reshape(-1))
        labels.append(np.asarray(y).reshape(-1))
    return float(auc(np.concatenate(labels), np.concatenate(scores)))


class _EachEpoch(tf_keras.callbacks.Callback):
    """Appends the hold-out AUC after every epoch to `out` (scoring reads
    the model only, so the training is the same as without it)."""

    def __init__(self, hold, out: list):
        super().__init__()
        self.hold, self.out = hold, out

    def on_epoch_end(self, epoch, logs=None):
        self.out.append(_holdout_auc(self.model, self.hold))


def run(side: str, seed: int, epochs: int = 2,
        accumulator: float | None = None, initializer=None,
        curve: list | None = None) -> float:
    """One trained model's hold-out AUC (side "tnet" | "stock";
    `initializer`: tnet's deep columns only, None for the default;
    `curve`: a list that gets the hold-out AUC after every epoch)."""
    tf_keras.utils.set_random_seed(seed)
    train, hold = datasets(seed)
    model = (user_model(accumulator, initializer) if side == "tnet"
             else stock_model(accumulator))
    model.fit(train, epochs=epochs, verbose=0,
              callbacks=[] if curve is None else [_EachEpoch(hold, curve)])
    return _holdout_auc(model, hold)


VAL_ROWS = 4_800           # criterion 2's validation rows (10%)


def early_stopped_run(side: str, seed: int, max_epochs: int = 10) -> dict:
    """Criterion 2 of the defaults study: up to `max_epochs` epochs with
    EarlyStopping(monitor="val_auc", patience=1,
    restore_best_weights=True) on the last VAL_ROWS training rows; the
    hold-out AUC, the epochs run and the validation AUC per epoch."""
    tf_keras.utils.set_random_seed(seed)
    train, val, hold = datasets(seed, val_rows=VAL_ROWS)
    metrics = [tf_keras.metrics.AUC(name="auc")]
    model = (user_model(metrics=metrics) if side == "tnet"
             else stock_model(metrics=metrics))
    hist = model.fit(train, epochs=max_epochs, validation_data=val,
                     verbose=0, callbacks=[tf_keras.callbacks.EarlyStopping(
                         monitor="val_auc", mode="max", patience=1,
                         restore_best_weights=True)])
    val_auc = hist.history["val_auc"]
    return {"auc": _holdout_auc(model, hold), "epochs": len(hist.epoch),
            "val_auc": [round(v, 5) for v in val_auc],
            "best_epoch": int(np.argmax(val_auc)) + 1}
