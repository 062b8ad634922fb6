"""Program for tests/test_exact_resume.py: one small user model with many
tables, each with its own sparse rule and lifecycle option(s), trained on
fixed data in one run or in two segments around a save and a SIGKILL.

  --mode whole: fit k + m steps in one fit, dump
  --mode first: fit k steps, tn.saving.save to --ckpt, SIGKILL itself
  --mode second: a fresh process: tn.saving.restore --ckpt, fit the m
                 steps after the first k, dump

--cases is a JSON file: {"k", "m", "seed", "batch", "tables": [{"rule",
"options" (a subset of min_count, max_rows, ttl, decay), "num_shards",
"min_count", "max_rows", "ttl_steps", "decay_rate", "threshold", "every",
"users", "zipf"}, ...]}. Table i is fed by its own two columns (u<i> int
ids, i<i> string ids) drawn from its own stream. Table 0 trains with the
model's optimizer (its rule is the compiled one), the others with their
layer's own rule. A table with ttl / decay has its own TableMaintenance
callback running every `every` steps (so evictions fall inside either
segment, on the same steps in both runs).

The dump (--out, .npz) holds every key, row, slot and meta of every table,
its pending admission entries (key, count, age) and lifecycle counters per
shard, the optimizer's step, every dense and optimizer variable and the
predictions on a probe batch.
"""
import argparse
import json
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
OPTIONS = ("min_count", "max_rows", "ttl", "decay")


class Ranker(tn.Model):
    """One EmbeddingFeatures layer (one table, two columns) per case, a
    dense head over all of them."""

    def __init__(self, cases):
        super().__init__()
        self.embeds = []
        for i, case in enumerate(cases):
            opts = {}
            if "min_count" in case["options"]:
                opts["min_count"] = case["min_count"]
            if "max_rows" in case["options"]:
                opts["max_rows"] = case["max_rows"]
            user = fc.category_column(f"u{i}")
            item = fc.category_column(f"i{i}", dtype=tf.string)
            self.embeds.append(tn.layers.EmbeddingFeatures(
                [fc.embedding_column(user, 4, table=f"t{i}", **opts),
                 fc.embedding_column(item, 4, table=f"t{i}")],
                optimizer=None if i == 0 else RULES[case["rule"]](),
                num_shards=case["num_shards"], name=f"embed{i}"))
        self.head = tf_keras.layers.Dense(1)

    def call(self, features, training=False):
        return self.head(tf.concat(
            [e(features, training=training) for e in self.embeds], axis=1))


def data(spec, rows, seed):
    feats, label = {}, np.zeros(rows, np.float32)
    for i, case in enumerate(spec["tables"]):
        rng = np.random.default_rng([seed, i])
        user = (rng.zipf(case["zipf"], rows) % case["users"]).astype(np.int64)
        item = np.array([f"i{x}" for x in
                         rng.zipf(case["zipf"] + 0.2, rows) % case["users"]])
        feats[f"u{i}"], feats[f"i{i}"] = user, item
        label += (user % 5 < 2)
    rng = np.random.default_rng([seed, 1 << 20])
    label = ((label > len(spec["tables"]) / 2.5)
             ^ (rng.random(rows) < 0.2)).astype(np.float32)
    return feats, label


def dataset(spec, first_batch, batches):
    total = spec["k"] + spec["m"]
    feats, label = data(spec, spec["batch"] * total, spec["seed"])
    ds = tf.data.Dataset.from_tensor_slices((feats, label)).batch(spec["batch"])
    return ds.skip(first_batch).take(batches)


def build(spec):
    cases = spec["tables"]
    model = Ranker(cases)
    model.compile(RULES[cases[0]["rule"]](),
                  loss=tf_keras.losses.BinaryCrossentropy(from_logits=True))
    feats, _ = data(spec, 8, spec["seed"] + 1)
    model(feats)  # build: tables exist before a restore
    return model


def callbacks(spec):
    out = []
    for i, case in enumerate(spec["tables"]):
        ttl = case["ttl_steps"] if "ttl" in case["options"] else 0
        decay = "decay" in case["options"]
        if ttl or decay:
            out.append(tn.callbacks.TableMaintenance(
                every_n_steps=case["every"], tables=[f"t{i}"],
                show_decay_rate=case["decay_rate"] if decay else 1.0,
                show_threshold=case["threshold"] if decay else 0.0,
                ttl_steps=ttl))
    return out


def dump(model, spec, path):
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
        out[f"{name}/counters"] = p["counters"]  # [shards, 5]
    for prefix, variables in (("dense", model.head.weights),
                              ("opt", model.optimizer.variables())):
        for v in variables:
            key = f"{prefix}/{v.name}"
            while key in out:
                key += "'"
            out[key] = v.numpy()
    probe, _ = data(spec, 200, spec["seed"] + 9)
    out["predictions"] = model.predict(probe, verbose=0)
    np.savez(path, **out)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=("whole", "first", "second"))
    p.add_argument("--cases")
    p.add_argument("--ckpt")
    p.add_argument("--out")
    args = p.parse_args()
    with open(args.cases) as f:
        spec = json.load(f)
    tf_keras.utils.set_random_seed(spec["seed"])
    model = build(spec)
    k, m = spec["k"], spec["m"]
    if args.mode == "whole":
        model.fit(dataset(spec, 0, k + m), callbacks=callbacks(spec),
                  verbose=0)
    if args.mode == "first":
        model.fit(dataset(spec, 0, k), callbacks=callbacks(spec), verbose=0)
        tn.saving.save(model, args.ckpt, progress=lambda _: None)
        print("SAVED", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)  # no clean shutdown
    if args.mode == "second":
        tn.saving.restore(model, args.ckpt, progress=lambda _: None)
        model.fit(dataset(spec, k, m), callbacks=callbacks(spec), verbose=0)
    dump(model, spec, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
