"""tnet's TwoTower against the stock two-tower from the same start.

Builds both models of tests/programs/two_tower.py, gives tnet's tables the
stock model's initial embedding rows (every id of the data, Adagrad
accumulators at 0.1 like Keras') and its towers the stock towers' weights,
trains both on the same batches and prints, per step, the two losses and
the largest difference of the tower weights; then, with --epochs, whole
epochs and the hold-out recall of each (issue 25's two-tower gap).

    python tools/two_tower_agreement.py --steps 20
    python tools/two_tower_agreement.py --steps 0 --epochs 2 --seed 1 \
        --source tnet --jsonl bench/results/two-tower-gap-2026-11-25.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tnet as tn  # noqa: E402,F401
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

from tests.programs import two_tower as tt  # noqa: E402
from tnet import feature_column as fc  # noqa: E402
from tools import _bench_common as bc  # noqa: E402


def _import(table, keys, weights, accumulator):
    keys = tf.constant(keys, tf.int64)
    n = int(keys.shape[0])
    table.import_rows(keys, weights,
                      np.full((n, table.num_slots), accumulator, np.float32),
                      np.zeros((n, 3), np.float64))


def _string_keys(strings, column):
    return fc.keys_of(tf.constant(strings), fc.column_salt(column)).numpy()


def _id_keys(data):
    """{table: [(stock Embedding attribute, ids into it, tnet keys)]}."""
    users = np.arange(tt.NUM_USERS, dtype=np.int64)
    items = np.arange(tt.NUM_ITEMS, dtype=np.int64)
    segs = np.unique(data["train"]["segment"])
    genres = np.unique(data["items"]["genres"])
    genres = genres[genres != b""]
    bucket = lambda s: tf.strings.to_hash_bucket_fast(  # noqa: E731
        s, tt.STRING_BINS).numpy()
    return {
        "user": [("user_emb", users % tt.USER_BINS,
                  users ^ fc.column_salt("user_id")),
                 ("segment_emb", bucket(segs), _string_keys(segs, "segment"))],
        "history_item": [("history_emb", items % tt.ITEM_BINS, items)],
        "item": [("item_emb", items % tt.ITEM_BINS,
                  items ^ fc.column_salt("item_id")),
                 ("genre_emb", bucket(genres),
                  _string_keys(genres, "genres"))],
    }


def aligned_pair(data, seed=0, accumulator=0.1, source="stock"):
    """(stock, tnet) with the same initial weights: the stock model's
    (source "stock": its Embedding rows imported into tnet's tables) or
    tnet's (source "tnet": the rows tnet's initializer gives every id,
    written into the stock Embeddings). Towers: the stock model's."""
    tf_keras.utils.set_random_seed(seed)
    stock = tt.stock_model(accumulator)
    tnet_model = tt.tnet_model(accumulator)
    first = {k: tf.constant(v[:tt.BATCH]) for k, v in data["train"].items()}
    for m in (stock, tnet_model):
        m.query_embedding(first)
        m.candidate_embedding(first)
    for src, dst in ((stock.query_tower, tnet_model.query_tower),
                     (stock.candidate_tower, tnet_model.candidate_tower)):
        dst.set_weights(src.get_weights())
    tables = tnet_model.tables()
    for name, parts in _id_keys(data).items():
        table = tables[name]
        if source == "stock":
            _import(table, np.concatenate([k for _, _, k in parts]),
                    np.concatenate([getattr(stock, a).embeddings.numpy()[i]
                                    for a, i, _ in parts]), accumulator)
            continue
        for attr, index, keys in parts:
            # a training pull inserts each key's row as its initializer
            # draws it; then the accumulators are set to `accumulator`
            rows = table.pull(tf.constant(keys), training=True).numpy()
            _import(table, keys, rows, accumulator)
            var = getattr(stock, attr).embeddings
            var.scatter_update(tf.IndexedSlices(tf.constant(rows),
                                                tf.constant(index)))
    return stock, tnet_model


def tower_diff(a, b):
    return max(float(np.max(np.abs(x - y))) for x, y in
               zip(a.query_tower.get_weights() + a.candidate_tower.get_weights(),
                   b.query_tower.get_weights() + b.candidate_tower.get_weights()))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--accumulator", type=float, default=0.1)
    p.add_argument("--source", choices=("stock", "tnet"), default="stock",
                   help="whose initial embedding rows both models start from")
    p.add_argument("--epochs", type=int, default=0,
                   help="then train this many whole epochs and score both")
    p.add_argument("--jsonl", default="",
                   help="append the final scores of both models here")
    args = p.parse_args()
    data = tt.generate()
    stock, tnet_model = aligned_pair(data, args.seed, args.accumulator,
                                     args.source)
    feats = {k: tf.constant(v[:tt.BATCH]) for k, v in data["train"].items()}
    print("start: loss stock %.6f tnet %.6f, query emb max diff %.2e" % (
        float(stock.compute_loss(feats)), float(tnet_model.compute_loss(feats)),
        float(tf.reduce_max(tf.abs(stock.query_embedding(feats)
                                   - tnet_model.query_embedding(feats))))))
    ds = tt.batches(data["train"], args.seed * 1000)
    for step, batch in enumerate(ds.take(args.steps)):
        one = tf.data.Dataset.from_tensors(batch)
        ls = stock.fit(one, verbose=0).history["loss"][0]
        lt = tnet_model.fit(one, verbose=0).history["loss"][0]
        print(f"step {step + 1}: loss stock {ls:.6f} tnet {lt:.6f} "
              f"towers max diff {tower_diff(stock, tnet_model):.2e}")
    scores = {}
    for epoch in range(args.epochs):
        for m in (stock, tnet_model):
            m.fit(tt.batches(data["train"], args.seed * 1000 + epoch),
                  epochs=1, verbose=0)
        scores = {"stock": tt.recall(stock, data),
                  "tnet": tt.recall(tnet_model, data)}
        print(f"epoch {epoch + 1}: {scores}")
    if args.jsonl and scores:
        row = {"case": "two_tower_aligned", "source": args.source,
               "accumulator": args.accumulator, "seed": args.seed,
               "epochs": args.epochs, **scores,
               "commit": bc.run_info()["git_commit"],
               "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        with open(args.jsonl, "a") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
