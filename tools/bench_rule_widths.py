"""Push per sparse rule and row width: the rules' row loops at the widths
ForRowWidth compiles (1, 4, 16) and one it does not (7, the generic loop).

One table shard per (rule, dim) of --rows rows; each call pushes --batch
unique keys drawn at random from them (all present: no inserts), through
the SparseTablePush op in a tf.function. Cases alternate within every
repeat (rule by rule, width by width); medians over --repeats repeats of
--calls calls, in ns per pushed key. Run it before and after a change to
the rules, alternating the two builds (docs/BENCHMARK_PROTOCOL.md).

  .venv/bin/python tools/bench_rule_widths.py            # ~1 min on 2 cores
  .venv/bin/python tools/bench_rule_widths.py --out x.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import tnet as tn  # noqa: F401  (before tensorflow: selects Keras 2)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tnet import _ops  # noqa: E402

RULES = ("sgd", "adagrad", "rowwise_adagrad", "adam", "ftrl")
DIMS = (1, 4, 7, 16)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--batch", type=int, default=50_000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    keys = tf.constant(rng.permutation(args.rows * 8)[:args.rows]
                       .astype(np.int64) * 7919)
    cases = {}
    for dim in DIMS:
        for rule in RULES:
            handle = _ops.sparse_table_handle(
                shared_name=f"widths_{rule}_{dim}", dim=dim, optimizer=rule,
                num_stripes=64)
            _ops.sparse_table_pull(handle, keys, True, dim=dim)
            batch = tf.gather(keys, rng.choice(args.rows, args.batch,
                                               replace=False))
            grads = tf.constant(rng.normal(
                scale=0.01, size=(args.batch, dim)).astype(np.float32))
            empty = tf.zeros([0], tf.float32)

            @tf.function
            def push(handle=handle, batch=batch, grads=grads, dim=dim):
                for step in tf.range(args.calls, dtype=tf.int64):
                    _ops.sparse_table_push(handle, batch, grads, 0.01,
                                           step + 1, empty, empty, dim=dim,
                                           unique_keys=True)
            push()  # trace and warm
            cases[(rule, dim)] = push
    times = {c: [] for c in cases}
    for _ in range(args.repeats):
        for c, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            times[c].append((time.perf_counter() - t0) / args.calls)
    result = {f"{rule}/dim{dim}": round(
        statistics.median(times[(rule, dim)]) / args.batch * 1e9, 2)
        for rule, dim in cases}
    print("ns per pushed key (median of %d repeats x %d calls, %d keys)"
          % (args.repeats, args.calls, args.batch))
    print("| rule | " + " | ".join(f"dim {d}" for d in DIMS) + " |")
    print("|---" * (len(DIMS) + 1) + "|")
    for rule in RULES:
        print(f"| {rule} | " + " | ".join(
            f"{result[f'{rule}/dim{d}']:.1f}" for d in DIMS) + " |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"ns_per_key": result, "args": vars(args)}, f,
                      indent=1)
    return result


if __name__ == "__main__":
    main()
