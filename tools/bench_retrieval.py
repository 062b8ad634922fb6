"""Two-tower retrieval on MovieLens 100k: tnet vs stock tf_keras vocabularies.

    python tools/bench_retrieval.py            # full: 3 repeats, 5 epochs
    python tools/bench_retrieval.py --quick    # checks the script works

One process, the ua split (90,570 train / 9,430 test interactions), the
same two-tower in both cases (tnet.models.TwoTower's architecture): user
id + 4 user string features + the 20 most recent watched items pooled with
`tn.layers.SequencePooling` (attention by default) in the query tower, item
id + genres in the candidate tower, 64-unit MLP, 32-wide L2-normalized
outputs, tfrs Retrieval (temperature 0.1, sampling-bias correction,
accidental hits removed), Adagrad 0.1 everywhere.

- tnet: tn.models.TwoTower, ids through tnet tables (no vocabulary).
- stock: tf_keras `IntegerLookup` / `StringLookup` layers with vocabularies
  adapted on the training set + `Embedding` (the usual tfrs recipe; unseen
  ids share one OOV row), tf_keras Adagrad (sparse row updates).

Throughput: training examples/s of the Keras train function over --steps
steps after a warm-up, alternating tnet, stock, tnet, ... (--repeats),
from in-memory whole batches. Quality: fresh models trained --epochs
epochs on the same shuffled batches, then recall@10/50/100 of every
ua.test interaction among all 1,682 items (tfrs FactorizedTopK over a
BruteForce index), beside the popularity baseline.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tnet as tn  # noqa: E402  (first: selects tf_keras)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_recommenders as tfrs  # noqa: E402
import tf_keras  # noqa: E402

from tnet.data import movielens  # noqa: E402
from tnet.layers import SequencePooling  # noqa: E402
from tnet.models import TwoTower  # noqa: E402
from tools import _bench_common as bc  # noqa: E402

DATA_DIR = os.path.join(bc.REPO_ROOT, "..", "shared", "data", "movielens")
KS = (10, 50, 100)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--data_dir", default=DATA_DIR)
    p.add_argument("--pooling", default="attention",
                   choices=["mean", "attention"])
    p.add_argument("--history", type=int, default=20)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    if args.quick:
        args.steps, args.repeats, args.epochs = 10, 2, 1
    return args


class StockTwoTower(tfrs.models.Model):
    """The same two-tower with tf_keras vocabulary lookups + Embedding."""

    def __init__(self, data: movielens.MovieLens, dim: int, history: int,
                 pooling: str):
        super().__init__()
        train = data.train

        def int_lookup(values, mask=None):
            vocab = np.unique(values[values != -1]) if mask is not None \
                else np.unique(values)
            return tf_keras.layers.IntegerLookup(
                vocabulary=vocab.astype(np.int64), mask_token=mask)

        def embedding(lookup):
            return tf_keras.layers.Embedding(lookup.vocabulary_size(), dim)

        self.user_lookup = int_lookup(train["user_id"])
        self.user_emb = embedding(self.user_lookup)
        self.feature_lookups, self.feature_embs = [], []
        for name in movielens.USER_FEATURES:
            lk = tf_keras.layers.StringLookup(
                vocabulary=np.unique(train[name]).astype(str).tolist())
            self.feature_lookups.append((name, lk))
            self.feature_embs.append(embedding(lk))
        self.history_lookup = int_lookup(train["history"], mask=-1)
        self.history_emb = embedding(self.history_lookup)
        self.pool = SequencePooling(pooling, dim, history)
        self.item_lookup = int_lookup(train["item_id"])
        self.item_emb = embedding(self.item_lookup)
        genres = train["genres"].reshape(-1)
        self.genre_lookup = tf_keras.layers.StringLookup(
            vocabulary=np.unique(genres[genres != b""]).astype(str).tolist(),
            mask_token="")
        self.genre_emb = embedding(self.genre_lookup)
        self.query_tower = _mlp(dim, "query_tower")
        self.candidate_tower = _mlp(dim, "candidate_tower")
        self.task = tfrs.tasks.Retrieval(temperature=0.1,
                                         remove_accidental_hits=True)

    def query_embedding(self, f, training=False):
        user = [self.user_emb(self.user_lookup(f["user_id"]))]
        user += [emb(lk(f[name])) for (name, lk), emb
                 in zip(self.feature_lookups, self.feature_embs)]
        user = tf.concat(user, axis=1)
        seq = self.history_emb(self.history_lookup(f["history"]))
        valid = tf.not_equal(f["history"], -1)
        seq *= tf.cast(valid, seq.dtype)[:, :, tf.newaxis]
        lengths = tf.reduce_sum(tf.cast(valid, tf.int64), axis=1)
        query = user if self.pool.pooling == "attention" else None
        x = tf.concat([user, self.pool(seq, lengths, query=query)], axis=1)
        return tf.math.l2_normalize(self.query_tower(x), axis=1)

    def candidate_embedding(self, f, training=False):
        item = self.item_emb(self.item_lookup(f["item_id"]))
        g = self.genre_lookup(f["genres"])
        valid = tf.cast(tf.not_equal(g, 0), tf.float32)[:, :, tf.newaxis]
        genres = tf.math.divide_no_nan(
            tf.reduce_sum(self.genre_emb(g) * valid, axis=1),
            tf.reduce_sum(valid, axis=1))
        x = tf.concat([item, genres], axis=1)
        return tf.math.l2_normalize(self.candidate_tower(x), axis=1)

    def compute_loss(self, f, training=False):
        return self.task(self.query_embedding(f), self.candidate_embedding(f),
                         candidate_sampling_probability=f["item_prob"],
                         candidate_ids=f["item_id"], compute_metrics=False)


def _mlp(dim, name):
    return tf_keras.Sequential([tf_keras.layers.Dense(64, activation="relu"),
                                tf_keras.layers.Dense(dim)], name=name)


def build(name, data, args, seed=0, row_kwargs=None):
    """The tnet or stock model, compiled; `row_kwargs`: tnet Adagrad's
    row-only arguments (e.g. row_initial_accumulator_value), for
    tools/measure_defaults.py."""
    tf_keras.utils.set_random_seed(seed)
    if name == "tnet":
        model = TwoTower(user_features=movielens.USER_FEATURES,
                         history_max_length=args.history,
                         pooling=args.pooling, embedding_dim=args.dim,
                         output_dim=args.dim, hidden_units=(64,),
                         temperature=0.1, sampling_probability_key="item_prob")
        model.compile(tn.optimizer.Adagrad(args.lr, **(row_kwargs or {})))
    else:
        model = StockTwoTower(data, args.dim, args.history, args.pooling)
        model.compile(tf_keras.optimizers.Adagrad(args.lr))
    return model


def batches(examples, batch, seed, repeat):
    """Whole in-memory batches in a seeded shuffled order (the same for
    both models)."""
    n = examples["item_id"].shape[0]
    order = np.random.default_rng(seed).permutation(n)
    n = (n // batch) * batch
    ds = tf.data.Dataset.from_tensor_slices(
        {k: v[order[:n]].reshape((-1, batch) + v.shape[1:])
         for k, v in examples.items()})
    return (ds.repeat() if repeat else ds).prefetch(4)


def recall(model, data) -> dict:
    """FactorizedTopK (id-based) over a BruteForce index of all items."""
    cand = model.candidate_embedding(
        {k: tf.constant(v) for k, v in data.items.items()
         if k in ("item_id", "genres")})
    index = tfrs.layers.factorized_top_k.BruteForce(k=max(KS))
    index.index(cand, tf.constant(data.items["item_id"]))
    metric = tfrs.metrics.FactorizedTopK(candidates=index, ks=KS)
    test = data.test
    for i in range(0, test["item_id"].size, 4096):
        f = {k: tf.constant(v[i:i + 4096]) for k, v in test.items()}
        metric.update_state(model.query_embedding(f),
                            model.candidate_embedding(f),
                            true_candidate_ids=f["item_id"])
    return {f"recall_at_{k}": float(v) for k, v in zip(KS, metric.result())}



def study_run(side: str, seed: int, data_dir: str, early: bool = False,
              row_kwargs: dict | None = None, max_epochs: int = 10,
              val_share: float = 0.1) -> dict:
    """tools/measure_defaults.py's movielens_two_tower case: this file's
    models (tnet TwoTower, attention-pooled history, or the stock
    tf_keras vocabularies + Embedding), its defaults (batch 512, dim 32,
    Adagrad 0.1), one pass over the ua training interactions in a seeded
    order (early: up to `max_epochs` epochs over all but a fixed random
    `val_share` of them, EarlyStopping on their recall@50, patience 1,
    best weights restored); the ua.test recall@k. `row_kwargs`: tnet
    Adagrad's row-only arguments."""
    import dataclasses  # noqa: PLC0415

    br = sys.modules[__name__]
    args = argparse.Namespace(pooling="attention", history=20, batch=512, dim=32,
                        lr=0.1)
    data = movielens.load_movielens(
        os.path.join(data_dir, "movielens"), args.history)
    callbacks, epochs, val_recall = [], 1, []
    if early:
        n = data.train["item_id"].shape[0]
        order = np.random.default_rng(0).permutation(n)
        cut = int(n * val_share)
        val = {k: v[order[:cut]] for k, v in data.train.items()}
        # The stock side's vocabularies are adapted on what it trains on.
        data = dataclasses.replace(
            data, train={k: v[np.sort(order[cut:])]
                         for k, v in data.train.items()})
        val_data = dataclasses.replace(data, test=val)

        class ValRecall(tf_keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                r = br.recall(self.model, val_data)["recall_at_50"]
                val_recall.append(round(r, 5))
                logs["val_recall_at_50"] = r

        callbacks = [ValRecall(), tf_keras.callbacks.EarlyStopping(
            monitor="val_recall_at_50", mode="max", patience=1,
            restore_best_weights=True)]
        epochs = max_epochs
    model = br.build(side, data, args, seed=seed, row_kwargs=row_kwargs)
    hist = model.fit(br.batches(data.train, args.batch, 100 + seed, False),
                     epochs=epochs, verbose=0, callbacks=callbacks)
    out = br.recall(model, data)
    out = {"auc": out["recall_at_50"], "metric": "recall@50",
           **out, "epochs": len(hist.epoch)}
    if early:
        out["val_auc"] = val_recall       # validation recall@50 per epoch
        out["best_epoch"] = int(np.argmax(val_recall)) + 1
    return out


def main() -> int:
    args = parse_args()
    info = bc.run_info()
    data = movielens.load_movielens(args.data_dir, args.history)
    models = {n: build(n, data, args) for n in ("tnet", "stock")}
    iters = {n: iter(batches(data.train, args.batch, 0, True)) for n in models}

    def fit_steps(name, steps):
        fn = models[name].make_train_function()
        start = time.perf_counter()
        for _ in range(steps):
            logs = fn(iters[name])
        tf.nest.map_structure(lambda t: t.numpy(), logs)
        return args.batch * steps / (time.perf_counter() - start)

    for name in models:  # warm-up: trace, create rows
        fit_steps(name, 5)
    print("throughput (training examples/s), alternating:", flush=True)
    values = bc.alternate({n: (lambda n=n: fit_steps(n, args.steps))
                           for n in models}, args.repeats)
    section = f"two-tower MovieLens 100k ({args.pooling} history)"
    measurements = [
        bc.Measurement(section, "stock tf_keras lookups + Embedding",
                       "examples/s", values["stock"]),
        bc.Measurement(section, "tnet TwoTower", "examples/s",
                       values["tnet"], "stock",
                       bc.paired_ratios(values["tnet"], values["stock"])),
    ]
    quality = {"popularity": movielens.popularity_recall(
        data.item_counts, data.test["item_id"], KS)}
    for name in models:
        model = build(name, data, args)
        start = time.perf_counter()
        for epoch in range(args.epochs):
            model.fit(batches(data.train, args.batch, 100 + epoch, False),
                      epochs=1, verbose=0)
        seconds = time.perf_counter() - start
        quality[name] = {**recall(model, data), "train_seconds": seconds}
        print(f"quality {name}: {quality[name]}", flush=True)
    for k in KS:
        key = f"recall_at_{k}"
        measurements.append(bc.Measurement(
            "quality (ua.test, all 1682 items)", f"recall@{k}, tnet - stock",
            "recall", [quality["tnet"][key] - quality["stock"][key]],
            note=f"tnet {quality['tnet'][key]:.4f}, stock "
                 f"{quality['stock'][key]:.4f}, popularity "
                 f"{quality['popularity'][key]:.4f}"))
    title = "bench_retrieval: two-tower, MovieLens 100k ua split, one process" \
        + (" (quick)" if args.quick else "")
    md = bc.header_markdown(info, title) + "\n\n" + bc.markdown_table(measurements)
    rows = ["| model | recall@10 | recall@50 | recall@100 |", "|---|---:|---:|---:|"]
    for name in ("tnet", "stock", "popularity"):
        q = quality[name]
        rows.append(f"| {name} | " + " | ".join(
            f"{q[f'recall_at_{k}']:.4f}" for k in KS) + " |")
    md += (f"\n\nRecall after {args.epochs} epochs (batch {args.batch}, "
           f"Adagrad {args.lr}), every ua.test interaction ranked among all "
           "items:\n\n" + "\n".join(rows))
    out = args.out or bc.default_out_path(
        "bench_retrieval" + ("-quick" if args.quick else ""))
    bc.write_results(out, info, measurements, md,
                     extra={"config": vars(args), "quality": quality})
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
