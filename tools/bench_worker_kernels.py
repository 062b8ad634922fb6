"""Isolated timings of two worker-side kernels of the sparse step on
SPARSE-HEAVY batches (issue 29), for before/after comparisons:

  dedup     TnetUnique over the layer's fused [B, 226] block (26 single
            ids + M1..M4 padded to 50 with -1), 4 batches in turn
  row_ids   the example rows of M1..M4 as RaggedTensor: tnet's TnetRowIds
            against the stock RaggedTensor.value_rowids(), one
            tf.function per step of 4 columns

Prints the median CPU and wall ms per call over --repeats repeats of
--calls calls. To compare two commits, run it with PYTHONPATH at each
checkout in turn, alternating (the figures of one run alone say little on
a machine whose speed moves 2-3x from day to day):

    PYTHONPATH=. python tools/bench_worker_kernels.py
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import tnet as tn  # noqa: F401  (before tensorflow: selects Keras 2)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tnet import _ops  # noqa: E402
from tnet import feature_column as fc  # noqa: E402
from tnet.data.synthetic import SyntheticCriteo  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tools import _sparse_heavy as sh  # noqa: E402
from tools.bench_stages import block_ids  # noqa: E402


def timed(fn, args, calls):
    c, w = time.process_time(), time.perf_counter()
    for i in range(calls):
        fn(*args[i % len(args)])
    return ((time.process_time() - c) / calls * 1e3,
            (time.perf_counter() - w) / calls * 1e3)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--calls", type=int, default=20)
    args = p.parse_args(argv)
    cats, multi, _ = sh.columns()
    names = list(cats) + list(multi)
    gen = SyntheticCriteo(seed=0, multi_valued=sh.MULTI_VALUED)
    salts = tf.constant(np.concatenate([
        np.full(1 if n in cats else 50, fc.column_salt(n), np.int64)
        for n in names])[None, :])
    dedup_args, ragged_args = [], []
    for b in range(4):
        f, _, _ = gen.batch(4096, "train", start=(200 + b) * 4096)
        ids = tf.constant(block_ids(f, names))
        dedup_args.append((tf.reshape(fc.keys_of(ids, salts), [-1]),
                           tf.reshape(fc.not_padding(ids), [-1])))
        ragged_args.append((tuple(
            tf.RaggedTensor.from_tensor(tf.constant(f[m]), padding=-1)
            for m in multi),))
    keys, valid = dedup_args[0]
    print(f"batch: N = {int(tf.reduce_sum(tf.cast(valid, tf.int32)))} ids "
          f"of {keys.shape[0]} positions; ragged values per step: "
          f"{sum(int(r.flat_values.shape[0]) for r in ragged_args[0][0])}")

    dedup = tf.function(lambda k, v: _ops.tnet_unique(k, v))
    tnet_rows = tf.function(
        lambda cols: [_ops.tnet_row_ids(c.row_splits) for c in cols])
    stock_rows = tf.function(lambda cols: [c.value_rowids() for c in cols])
    for cols, in ragged_args:  # same rows both ways
        for a, b in zip(tnet_rows(cols), stock_rows(cols)):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    cases = {"dedup": (dedup, dedup_args),
             "row_ids tnet": (tnet_rows, ragged_args),
             "row_ids stock": (stock_rows, ragged_args)}
    for fn, fa in cases.values():
        timed(fn, fa, 4)  # trace, warm
    got = {name: [] for name in cases}
    for r in range(args.repeats):
        for name, (fn, fa) in cases.items():
            got[name].append(timed(fn, fa, args.calls))
        print(f"  repeat {r + 1}/{args.repeats}: " + ", ".join(
            f"{k}={v[-1][0]:.2f}/{v[-1][1]:.2f}" for k, v in got.items()))
    print("| kernel | CPU ms per call (median) | wall ms per call (median) |")
    print("|---|---:|---:|")
    for name, v in got.items():
        print(f"| {name} | {statistics.median(x[0] for x in v):.2f} | "
              f"{statistics.median(x[1] for x in v):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
