"""Training program for tests/test_checkpoint_resume.py's kill-and-resume tests.

Trains a small Wide&Deep (tn.models.WideDeep) on deterministic synthetic
rows with tn.callbacks.Checkpoint, in one process or as the chief of a
local ParameterServerStrategy cluster (tools/launch_local.py sets
TF_CONFIG). After every checkpoint it dumps the live tables (and the
optimizer step) to <dump_dir>/saved-<step>.npz; after the callback restored
a checkpoint it dumps <dump_dir>/restored-<step>.npz, so a test can compare
the state a killed run saved with the state a restarted run restored.

With --build_first the model is built before fit and the dumps also hold
every dense and optimizer variable.

Lines it prints: CKPT_START, CKPT_RESTORED step=N, CKPT_SAVED step=N,
CKPT_DONE iterations=N.
"""
import argparse
import os
import time

import numpy as np

import tnet as tn
import tensorflow as tf
import tf_keras

from tnet.models import WideDeep

CATS = ["c0", "c1", "c2"]
DENSE = ["d0"]


def make_data(rows, seed=0):
    rng = np.random.default_rng(seed)
    feats = {c: rng.integers(0, 400 * (i + 1), rows).astype(np.int64)
             for i, c in enumerate(CATS)}
    feats["d0"] = rng.random(rows).astype(np.float32)
    labels = ((feats["c0"] % 7 < 3) ^ (feats["d0"] > 0.7)).astype(np.float32)
    return feats, labels


def dump(model, path, dense=False):
    out = {"iterations": np.array(int(model.optimizer.iterations.numpy()))}
    if dense:
        for i, v in enumerate(model.variables + model.optimizer.variables):
            out[f"dense/{i}"] = v.numpy()
    for name, table in model.tables().items():
        keys, weights, slots, meta = (t.numpy() for t in table.export())
        order = np.argsort(keys)
        out[f"{name}/keys"] = keys[order]
        out[f"{name}/weights"] = weights[order]
        out[f"{name}/slots"] = slots[order]
        out[f"{name}/meta"] = meta[order]
    tmp = path + ".tmp.npz"
    np.savez(tmp, **out)
    os.replace(tmp, path)


class Dumper(tf_keras.callbacks.Callback):
    """Runs after the Checkpoint callback in the same hooks."""

    def __init__(self, ckpt, dump_dir, sleep, batch_hooks, dense):
        super().__init__()
        self.ckpt, self.dump_dir, self.sleep = ckpt, dump_dir, sleep
        self.dense = dense
        self.batch_hooks = batch_hooks
        self.seen = None

    def _implements_train_batch_hooks(self):
        return self.batch_hooks

    def on_train_begin(self, logs=None):
        step = self.ckpt.restored_step
        self.seen = step
        if step is not None:
            dump(self.model, os.path.join(self.dump_dir, f"restored-{step}.npz"),
                 self.dense)
            print(f"CKPT_RESTORED step={step}", flush=True)

    def _check(self):
        step = self.ckpt.last_saved_step
        if step is not None and step != self.seen:
            self.seen = step
            dump(self.model, os.path.join(self.dump_dir, f"saved-{step}.npz"),
                 self.dense)
            print(f"CKPT_SAVED step={step}", flush=True)

    def on_train_batch_end(self, batch, logs=None):
        self._check()
        if self.sleep:
            time.sleep(self.sleep)

    def on_epoch_end(self, epoch, logs=None):
        self._check()
        if self.sleep and not self.batch_hooks:
            time.sleep(self.sleep)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--dump_dir", required=True)
    p.add_argument("--rows", type=int, default=1280)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--every_n_steps", type=int, default=0)
    p.add_argument("--incremental", action="store_true")
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--build_first", action="store_true",
                   help="call the model (and build its optimizer) before "
                   "fit, so the restore is immediate and the dumps hold the "
                   "dense variables too")
    args = p.parse_args()
    os.makedirs(args.dump_dir, exist_ok=True)
    tf_keras.utils.set_random_seed(0)
    strategy = tn.distribute.ParameterServerStrategy()
    pss = tn.distribute.is_parameter_server_strategy(strategy)
    with strategy.scope():
        model = WideDeep(CATS, DENSE, embedding_dim=4, hidden_units=[8])
        model.compile(tn.optimizer.Adagrad(0.05))
    ckpt = tn.callbacks.Checkpoint(
        args.dir, every_n_steps=args.every_n_steps or None,
        every_n_epochs=1, keep=3, incremental=args.incremental)
    dumper = Dumper(ckpt, args.dump_dir, args.sleep,
                    batch_hooks=not pss, dense=args.build_first)
    feats, labels = make_data(args.rows)
    if args.build_first:
        with strategy.scope():
            model({k: v[:8] for k, v in feats.items()}, training=False)
            model.optimizer.build(model.trainable_variables)
    steps = args.rows // args.batch
    print(f"CKPT_START pss={pss} steps_per_epoch={steps}", flush=True)
    if pss:
        def dataset_fn(ctx):
            ds = tf.data.Dataset.from_tensor_slices((feats, labels))
            return ds.repeat().batch(args.batch)
        model.fit(tf_keras.utils.experimental.DatasetCreator(dataset_fn),
                  epochs=args.epochs, steps_per_epoch=steps,
                  callbacks=[ckpt, dumper], verbose=0)
    else:
        ds = tf.data.Dataset.from_tensor_slices((feats, labels)).batch(
            args.batch, drop_remainder=True)
        model.fit(ds, epochs=args.epochs, callbacks=[ckpt, dumper], verbose=0)
    print(f"CKPT_DONE iterations={int(model.optimizer.iterations.numpy())}",
          flush=True)


if __name__ == "__main__":
    main()
