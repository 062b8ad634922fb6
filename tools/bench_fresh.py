"""Fresh models in serving: a delta against a full export + load.

    python tools/bench_fresh.py --rows 10000000 --changed 0.01 [--out FILE]

One table of `--rows` rows (dim 16, filled with import_rows: no training),
one tiny model over it. Measures, side by side in one run:

* full: export_for_serving(updatable=True) seconds + tf.saved_model.load
  seconds, and the export's bytes;
* delta: `--changed` of the rows rewritten (last_step above the base),
  publish_delta seconds, follower apply seconds (in-process target), and
  the delta's bytes; ratio (publish + apply) / (export + load);
* serving p50/p99 of serving_default at batch 1/64/512 on the plain export
  and on the updatable one with the overlay at 0%, 1% and 10% of the base
  (10% = ten 1% deltas of distinct rows).

Writes JSON to bench/results/bench_fresh-<date>.json (or --out) with the
command, machine and versions. Targets (issue 27): publish + apply of a
1% delta <= 0.05x a full export + load; p99 with a 10% overlay <= 1.3x the
plain export's.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))

import numpy as np  # noqa: E402

import tnet as tn  # noqa: E402
import tensorflow as tf  # noqa: E402

from tnet import feature_column as fc  # noqa: E402
from tnet.serving import follow  # noqa: E402
from tools import _bench_common as common  # noqa: E402

DIM = 16


class One(tn.Model):
    def __init__(self):
        super().__init__()
        self.embed = tn.layers.EmbeddingFeatures(
            [fc.embedding_column(fc.category_column("id"), DIM)])
        self.out = tf.keras.layers.Dense(1)

    def call(self, features, training=False):
        return self.out(self.embed(features, training=training))


def _dir_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f))
               for d, _, fs in os.walk(path) for f in fs)


def _fill(table, keys, step, rng):
    n = len(keys)
    meta = np.zeros((n, 3), np.float64)
    meta[:, 2] = step
    for s in range(0, n, 1 << 20):
        e = min(n, s + (1 << 20))
        table.import_rows(keys[s:e], rng.normal(size=(e - s, DIM)).astype(
            np.float32), np.zeros((e - s, table.num_slots), np.float32),
            meta[s:e])


def _latency(loaded, rows, rng, calls):
    fn = loaded.signatures["serving_default"]
    out = {}
    for batch in (1, 64, 512):
        ids = tf.constant(rng.integers(0, rows, (calls, batch)), tf.int64)
        fn(id=ids[0])
        times = []
        for i in range(calls):
            t = time.perf_counter()
            fn(id=ids[i])
            times.append(time.perf_counter() - t)
        out[str(batch)] = {"p50_ms": 1e3 * float(np.percentile(times, 50)),
                           "p99_ms": 1e3 * float(np.percentile(times, 99))}
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--changed", type=float, default=0.01)
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    model = One()
    model.compile(tn.optimizer.Adagrad(0.1))
    model({"id": tf.constant([0], tf.int64)})
    table = model.tables()["id"]
    _fill(table, np.arange(args.rows, dtype=np.int64), 0, rng)
    model.optimizer.iterations.assign(1)
    work = tempfile.mkdtemp(prefix="bench_fresh-", dir=os.environ.get(
        "BENCH_TMP", tempfile.gettempdir()))
    res = {"rows": args.rows, "dim": DIM, "changed": args.changed}
    plain = os.path.join(work, "plain", "1")
    tn.saving.export_for_serving(model, plain)
    t = time.perf_counter()
    export = os.path.join(work, "fresh", "1")
    tn.saving.export_for_serving(model, export, updatable=True)
    res["export_s"] = time.perf_counter() - t
    res["export_bytes"] = _dir_bytes(export)
    t = time.perf_counter()
    loaded = tf.saved_model.load(export)
    res["load_s"] = time.perf_counter() - t
    target = follow.InProcessTarget(loaded)
    follower = follow.Follower(export, [target], say=lambda m: None)
    res["latency"] = {"plain": _latency(tf.saved_model.load(plain),
                                        args.rows, rng, args.calls),
                      "overlay_0": _latency(loaded, args.rows, rng,
                                            args.calls)}
    per = int(args.rows * args.changed)
    order = rng.permutation(args.rows)
    deltas = []
    for i in range(10):
        step = int(model.optimizer.iterations.numpy())
        _fill(table, order[i * per:(i + 1) * per].astype(np.int64), step, rng)
        model.optimizer.iterations.assign(step + 1)
        t = time.perf_counter()
        path = tn.saving.publish_delta(model, export, compact_at=None)
        publish = time.perf_counter() - t
        t = time.perf_counter()
        follower.step()
        apply = time.perf_counter() - t
        deltas.append({"publish_s": publish, "apply_s": apply,
                       "bytes": _dir_bytes(path)})
        if i == 0:
            res["latency"]["overlay_1pct"] = _latency(loaded, args.rows, rng,
                                                      args.calls)
    res["latency"]["overlay_10pct"] = _latency(loaded, args.rows, rng,
                                               args.calls)
    res["deltas"] = deltas
    first = deltas[0]
    res["ratio_publish_apply_vs_export_load"] = (
        (first["publish_s"] + first["apply_s"])
        / (res["export_s"] + res["load_s"]))
    res["p99_ratio_overlay10_vs_plain_b512"] = (
        res["latency"]["overlay_10pct"]["512"]["p99_ms"]
        / res["latency"]["plain"]["512"]["p99_ms"])
    res["run"] = common.run_info()
    res["command"] = " ".join(sys.argv)
    out = args.out or common.default_out_path("bench_fresh")
    with open(out, "w") as f:
        json.dump(res, f, indent=2)
    print(json.dumps({k: v for k, v in res.items() if k != "run"}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
