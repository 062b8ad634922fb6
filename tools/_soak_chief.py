"""Chief program of tools/soak.py: trains until a deadline on a bounded key space.

Run by tools/launch_local.py as the chief of a local cluster (or alone, in
one process). The data is generated in the workers' tf.data graphs from
`Dataset.random`: each categorical id is drawn from a fixed range of `keys`
ids (skewed, so some ids are hot), so the tables fill up in the first
minutes and then stop growing. Any memory growth after that is not
explained by table rows, which is what the soak looks for.

Every epoch it prints one line `SOAK {json}` with the elapsed seconds, the
optimizer step and each table's live rows and bytes; every
`--checkpoint_every` epochs it saves a checkpoint (keep 2), so saving is
part of the steady state too. It stops at the first epoch end after
`--minutes`.
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time

import tnet as tn  # noqa: F401  (first: selects tf_keras)
import tensorflow as tf
import tf_keras

from tnet.models import WideDeep
from tnet.models.base import Calibration
from tnet.models.stock import stock_wide_deep

CATS = [f"c{i}" for i in range(4)]
DENSE = ["d0"]


def make_dataset(keys: int, batch: int, seed: int) -> tf.data.Dataset:
    """Endless (features, label) batches over ids 0..keys-1 per column."""
    width = len(CATS) + 1

    def to_batch(raw):
        x = tf.reshape(raw, [batch, width])
        u = tf.cast(x % (1 << 24), tf.float64) / float(1 << 24)
        ids = tf.cast(tf.floor(keys * u[:, :len(CATS)] ** 2), tf.int64)
        feats = {c: ids[:, i] for i, c in enumerate(CATS)}
        feats["d0"] = tf.cast(u[:, -1], tf.float32)
        label = tf.math.logical_xor(ids[:, 0] % 7 < 3, u[:, -1] > 0.7)
        return feats, tf.cast(label, tf.float32)

    return (tf.data.Dataset.random(seed=seed).batch(batch * width, drop_remainder=True)
            .map(to_batch).prefetch(2))


class Report(tf_keras.callbacks.Callback):
    """Prints table sizes each epoch and stops training at the deadline."""

    def __init__(self, seconds: float, tables: bool = True):
        super().__init__()
        self.seconds = seconds
        self.read_tables = tables
        self.start = time.monotonic()

    def on_epoch_end(self, epoch, logs=None):
        tables = ({name: {"rows": int(t.size()), "bytes": int(t.memory_bytes())}
                   for name, t in self.model.tables().items()}
                  if hasattr(self.model, "tables") and self.read_tables else {})
        elapsed = time.monotonic() - self.start
        print("SOAK " + json.dumps({
            "t": round(elapsed, 2), "epoch": epoch + 1,
            "step": int(self.model.optimizer.iterations.numpy()),
            "loss": float((logs or {}).get("loss", float("nan"))),
            "tables": tables}), flush=True)
        if elapsed >= self.seconds:
            self.model.stop_training = True


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--keys", type=int, default=20_000,
                   help="distinct ids per categorical column")
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--steps_per_epoch", type=int, default=50)
    p.add_argument("--checkpoint_every", type=int, default=10,
                   help="save a checkpoint every N epochs (0: never)")
    p.add_argument("--checkpoint_dir", default="")
    p.add_argument("--model", choices=("tnet", "stock"), default="tnet",
                   help="stock: the same Wide&Deep in plain tf_keras with one "
                        "Embedding of `keys` rows per column (no tnet op)")
    p.add_argument("--train_metrics", type=int, default=-1,
                   help="AUC / log-loss metrics on training steps: -1 the "
                        "model's default (tnet on, stock off), 0 off "
                        "(WideDeep(train_metrics=False)), 1 on (stock: "
                        "compiled with the same two metrics); a memory probe")
    p.add_argument("--report_tables", type=int, default=1,
                   help="0: the per-epoch report reads no table size (no "
                        "remote table call from the chief); a memory probe")
    args = p.parse_args()
    if args.model == "stock" and args.checkpoint_every:
        p.error("--model stock runs without checkpoints (--checkpoint_every 0)")
    tf_keras.utils.set_random_seed(0)
    strategy = tn.distribute.ParameterServerStrategy()
    pss = tn.distribute.is_parameter_server_strategy(strategy)
    with strategy.scope():
        if args.model == "stock":
            model = stock_wide_deep(CATS, DENSE, embedding_dim=16,
                                    num_bins=args.keys, hidden_units=[64, 32])
            metrics = ([tf_keras.metrics.AUC(from_logits=True, name="auc"),
                        tf_keras.metrics.BinaryCrossentropy(from_logits=True,
                                                            name="logloss"),
                        Calibration(name="calibration")]
                       if args.train_metrics == 1 else None)
            model.compile(tf_keras.optimizers.Adagrad(0.05),
                          tf_keras.losses.BinaryCrossentropy(from_logits=True),
                          metrics=metrics)
        else:
            model = WideDeep(CATS, DENSE, embedding_dim=16,
                             hidden_units=[64, 32],
                             train_metrics=args.train_metrics != 0)
            model.compile(tn.optimizer.Adagrad(0.05))
    callbacks: list = [Report(args.minutes * 60, tables=bool(args.report_tables))]
    directory = None
    if args.checkpoint_every:
        directory = args.checkpoint_dir or tempfile.mkdtemp(prefix="tnet_soak_ckpt_")
        callbacks.insert(0, tn.callbacks.Checkpoint(
            directory, every_n_epochs=args.checkpoint_every, keep=2,
            restore=False, verbose=0))
        print(f"SOAK_CHECKPOINTS {directory}", flush=True)
    if pss:
        data = tf_keras.utils.experimental.DatasetCreator(
            lambda ctx: make_dataset(args.keys, args.batch, ctx.input_pipeline_id))
    else:
        data = make_dataset(args.keys, args.batch, 0)
    model.fit(data, epochs=10**6, steps_per_epoch=args.steps_per_epoch,
              callbacks=callbacks, verbose=0)
    if directory and not args.checkpoint_dir:
        shutil.rmtree(directory, ignore_errors=True)
    print("SOAK_DONE", flush=True)


if __name__ == "__main__":
    main()
