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
import tensorflow as tf  # noqa: E402

from tests.programs import two_tower as tt  # noqa: E402
from tools import _bench_common as bc  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--accumulator", type=float, default=0.1)
    p.add_argument("--source", choices=("stock", "tnet", "tnet_lazy"), default="stock",
                   help="whose initial embedding rows both models start from")
    p.add_argument("--epochs", type=int, default=0,
                   help="then train this many whole epochs and score both")
    p.add_argument("--jsonl", default="",
                   help="append the final scores of both models here")
    args = p.parse_args()
    data = tt.generate()
    stock, tnet_model = tt.aligned_pair(data, args.seed, args.accumulator,
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
              f"towers max diff {tt.tower_difference(stock, tnet_model):.2e}")
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
