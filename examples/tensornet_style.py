"""A Wide&Deep written the way TensorNet users write theirs, on tnet.

tf.Example TFRecords partitioned by day with VarLen int64 "slots", sparse
Keras `Input`s, one `EmbeddingFeatures` per column group (dim 1 for the
wide part, dim 8 for the deep part) with its own sparse optimizer, a
functional `tn.Model`, and day-by-day training: each run restores the
newest checkpoint, skips the days it already trained, scores each new day
before training on it (progressive validation), checkpoints after each
day, and exports a servable SavedModel at the end.

    python examples/tensornet_style.py --workdir /tmp/tn_style --days 4

It ends by loading the export with stock TensorFlow and checking that it
predicts what the model predicts (exit status 1 if not). Run it again: it
restores the newest checkpoint, finds every day trained and the export
written, and checks the restored model against the export. The data are
generated (a known logistic model of the ids) under WORKDIR/data/<day>/.
docs/guides/migrating.md maps each TensorNet name used here.
"""
from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import sys

import numpy as np

import tnet as tn                 # before tensorflow: selects tf_keras
import tensorflow as tf
import tf_keras

from tnet import feature_column as fc

LINEAR_SLOTS = ["slot_1", "slot_2", "slot_3", "slot_4", "slot_5"]
DEEP_SLOTS = ["slot_1", "slot_2", "slot_3", "slot_4", "slot_5", "slot_6"]
SLOTS = sorted(set(LINEAR_SLOTS + DEEP_SLOTS))
VOCAB = 2000


# --------------------------------------------------------------- the data
def write_day(path: pathlib.Path, day_index: int, rows: int) -> None:
    """One day's tf.Example TFRecord: each slot holds 1-5 ids (VarLen)."""
    truth = np.random.default_rng(7)              # the same label model daily
    weights = {s: truth.normal(0, 0.7, VOCAB) for s in SLOTS}
    rng = np.random.default_rng(100 + day_index)
    zipf = 1.0 / np.arange(1, VOCAB + 1) ** 1.1
    zipf /= zipf.sum()
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as w:
        for _ in range(rows):
            feats, logit = {}, -0.3
            for s in SLOTS:
                ids = rng.choice(VOCAB, rng.integers(1, 6), p=zipf)
                logit += weights[s][ids].mean()
                feats[s] = tf.train.Feature(
                    int64_list=tf.train.Int64List(value=ids.tolist()))
            label = int(rng.random() < 1 / (1 + np.exp(-logit)))
            feats["label"] = tf.train.Feature(
                int64_list=tf.train.Int64List(value=[label]))
            w.write(tf.train.Example(features=tf.train.Features(
                feature=feats)).SerializeToString())



def parse(batch):
    """As TensorNet's examples parse: every slot a VarLenFeature."""
    spec = {s: tf.io.VarLenFeature(tf.int64) for s in SLOTS}
    spec["label"] = tf.io.FixedLenFeature([], tf.int64)
    features = tf.io.parse_example(batch, spec)
    return ({s: features[s] for s in SLOTS},
            tf.cast(features.pop("label"), tf.float32))


def read_day(data_dir: pathlib.Path, day: str, batch_size: int):
    files = sorted(str(p) for p in (data_dir / day).glob("*.tfrecord"))
    return (tf.data.TFRecordDataset(files).batch(batch_size).map(parse)
            .prefetch(2))


# -------------------------------------------------------------- the model
def wide_deep(hidden=(64, 32)) -> tn.Model:
    inputs = {s: tf_keras.Input(name=s, shape=(None,), dtype="int64",
                                sparse=True) for s in SLOTS}
    ids = {s: fc.category_column(s) for s in SLOTS}
    sparse_opt = tn.optimizer.Adagrad(0.05)       # TensorNet: tn.core.AdaGrad
    linear = tn.layers.EmbeddingFeatures(
        [fc.embedding_column(ids[s], 1, table="linear") for s in LINEAR_SLOTS],
        sparse_opt, name="linear_input")
    deep = tn.layers.EmbeddingFeatures(
        [fc.embedding_column(ids[s], 8, table="deep") for s in DEEP_SLOTS],
        sparse_opt, name="deep_input")
    x = deep(inputs)
    for i, units in enumerate(hidden):
        x = tf_keras.layers.Dense(units, "relu", name=f"dnn_{i}")(x)
    both = tf_keras.layers.Concatenate()([x, linear(inputs)])
    output = tf_keras.layers.Dense(1, "sigmoid", name="pred")(both)
    model = tn.Model(inputs=inputs, outputs=output, name="full_model")
    model.compile(optimizer=tn.optimizer.Adam(1e-3),   # the dense optimizer
                  loss="binary_crossentropy",
                  metrics=[tf_keras.metrics.AUC(name="auc")])
    return model


# ------------------------------------------------------------ the daily loop
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", required=True)
    p.add_argument("--days", type=int, default=4)
    p.add_argument("--rows_per_day", type=int, default=20_000)
    p.add_argument("--batch_size", type=int, default=256)
    p.add_argument("--first_day", default="2026-11-01")
    a = p.parse_args(argv)
    work = pathlib.Path(a.workdir)
    data_dir, ckpt_dir = work / "data", work / "checkpoints"
    start = datetime.date.fromisoformat(a.first_day)
    days = [(start + datetime.timedelta(d)).isoformat() for d in range(a.days)]
    for i, day in enumerate(days):
        part = data_dir / day / "part-00000.tfrecord"
        if not part.exists():
            write_day(part, i, a.rows_per_day)

    model = wide_deep()
    # Build the model (and its tables) with one batch before a restore.
    model(next(iter(read_day(data_dir, days[0], 8)))[0])
    done = 0
    latest = tn.saving.latest_checkpoint(ckpt_dir)
    if latest:                          # TensorNet: PsWeightCheckpoint(dt=...)
        done = tn.saving.restore(model, latest)   # the step = days trained
        print(f"restored {latest}: {done} day(s) already trained")
    for i in range(done, len(days)):
        data = read_day(data_dir, days[i], a.batch_size)
        if i > 0:   # progressive validation: score the day before training it
            m = model.evaluate(data, verbose=0, return_dict=True)
            print(f"{days[i]}: before training on it, AUC {m['auc']:.4f} "
                  f"log loss {m['loss']:.4f}")
        model.fit(data, epochs=1, verbose=0)
        tn.saving.save(model, ckpt_dir, step=i + 1, incremental=i > 0, keep=3)
        print(f"{days[i]}: trained and checkpointed (step {i + 1})", flush=True)

    version = work / "export" / str(len(days))   # one version per day count
    # A sample of the last day in its serving form (the sparse slots
    # arrive padded with -1) and this model's predictions for it.
    features, _ = next(iter(read_day(data_dir, days[-1], 16)))
    sample = {s: tf.sparse.to_dense(features[s], default_value=-1).numpy()
              for s in SLOTS}
    expected = model.predict(features, verbose=0).reshape(-1)
    if version.exists():
        print(f"{version} exists: nothing new to export")
    else:
        tn.serving.export_for_serving(model, version)
        # For tools/check_export.py (tnet/serving/checks.py: a check in a
        # process without tnet).
        np.savez(work / "export_sample.npz", __expected__=expected, **sample)
        print(f"exported {version}")

    # The export, loaded with stock TensorFlow, serves this model (on a
    # rerun: the model restored from the checkpoint).
    serve = tf.saved_model.load(str(version)).signatures["serving_default"]
    served = serve(**{s: tf.constant(v) for s, v in sample.items()})
    diff = float(np.abs(served["prediction"].numpy().reshape(-1)
                        - expected).max())
    if diff > 1e-5:
        print(f"FAILED: {version} differs from the model by up to {diff}")
        return 1
    print(f"OK: {version} serves the trained model (max diff {diff:.1e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
