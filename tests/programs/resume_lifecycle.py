"""Program for tests/test_exact_resume.py: a small user model whose table
has a lifecycle option, trained in two segments of fixed data.

  --mode whole: fit k steps, [evict], fit m steps, [evict], dump
  --mode first: fit k steps, [evict], tn.saving.save to --ckpt (then the
                test kills the process with SIGKILL)
  --mode second: a fresh process: tn.saving.restore --ckpt, fit m steps,
                [evict], dump

The dump (--out, .npz) holds every key, row, slot and meta of every table,
the pending admission entries (key, count, age), the lifecycle counters,
the optimizer's step and the predictions on a probe batch.
"""
import argparse
import os
import signal
import sys

import numpy as np

import tnet as tn  # noqa: I001  (before tensorflow)
import tensorflow as tf
import tf_keras

from tnet import feature_column as fc

RULES = {"sgd": lambda: tn.optimizer.SGD(0.1),
         "adagrad": lambda: tn.optimizer.Adagrad(0.1),
         "rowwise_adagrad": lambda: tn.optimizer.RowwiseAdagrad(0.1),
         "adam": lambda: tn.optimizer.Adam(0.01),
         "ftrl": lambda: tn.optimizer.Ftrl(0.1)}
BATCH = 64


class Ranker(tn.Model):
    """README-style: string and int ids in one table, a dense head."""

    def __init__(self, lifecycle):
        super().__init__()
        opts = {}
        if lifecycle == "min_count":
            opts = {"min_count": 3}
        elif lifecycle == "max_rows":
            opts = {"max_rows": 150}
        user = fc.category_column("user")
        item = fc.category_column("item", dtype=tf.string)
        self.embed = tn.layers.EmbeddingFeatures(
            [fc.embedding_column(user, 4, table="t", **opts),
             fc.embedding_column(item, 4, table="t")])
        self.head = tf_keras.layers.Dense(1)

    def call(self, features, training=False):
        return self.head(self.embed(features, training=training))


def data(rows, seed=0):
    rng = np.random.default_rng(seed)
    user = (rng.zipf(1.3, rows) % 500).astype(np.int64)
    item = np.array([f"i{x}" for x in rng.zipf(1.5, rows) % 300])
    label = ((user % 5 < 2) ^ (rng.random(rows) < 0.2)).astype(np.float32)
    return {"user": user, "item": item}, label


def dataset(first_batch, batches):
    feats, label = data(BATCH * 40)
    ds = tf.data.Dataset.from_tensor_slices((feats, label)).batch(BATCH)
    return ds.skip(first_batch).take(batches)


def build(args):
    model = Ranker(args.lifecycle)
    model.compile(RULES[args.rule](),
                  loss=tf_keras.losses.BinaryCrossentropy(from_logits=True))
    feats, _ = data(8)
    model(feats)  # build: tables exist before a restore
    return model


def maybe_evict(model, args):
    if args.lifecycle == "evict":
        step = int(model.optimizer.iterations.numpy())
        for table in model.tables().values():
            table.evict(show_decay_rate=0.8, show_threshold=1.5,
                        ttl_steps=6, current_step=step)


def dump(model, path):
    out = {"iterations": np.array(int(model.optimizer.iterations.numpy()))}
    for name, table in model.tables().items():
        keys, weights, slots, meta = (t.numpy() for t in table.export())
        order = np.argsort(keys)
        for field, v in (("keys", keys), ("weights", weights),
                         ("slots", slots), ("meta", meta)):
            out[f"{name}/{field}"] = v[order]
        p = table.export_pending()
        order = np.argsort(p["keys"])
        for field in ("keys", "counts", "ages"):
            out[f"{name}/pending_{field}"] = p[field][order]
        out[f"{name}/counters"] = p["counters"].sum(axis=0)
    probe, _ = data(200, seed=9)
    out["predictions"] = model.predict(probe, verbose=0)
    np.savez(path, **out)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=("whole", "first", "second"))
    p.add_argument("--rule", choices=sorted(RULES))
    p.add_argument("--lifecycle", choices=("min_count", "max_rows", "evict"))
    p.add_argument("--k", type=int, default=12)
    p.add_argument("--m", type=int, default=12)
    p.add_argument("--ckpt")
    p.add_argument("--out")
    args = p.parse_args()
    tf_keras.utils.set_random_seed(0)
    model = build(args)
    if args.mode in ("whole", "first"):
        model.fit(dataset(0, args.k), verbose=0)
        maybe_evict(model, args)
    if args.mode == "first":
        tn.saving.save(model, args.ckpt, progress=lambda _: None)
        print("SAVED", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)  # no clean shutdown
    if args.mode == "second":
        tn.saving.restore(model, args.ckpt, progress=lambda _: None)
    model.fit(dataset(args.k, args.m), verbose=0)
    maybe_evict(model, args)
    dump(model, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
