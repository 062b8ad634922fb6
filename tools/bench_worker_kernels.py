"""Isolated timings of the kernels of the sparse step on SPARSE-HEAVY
batches (issue 29), for before/after comparisons:

  dedup     TnetUnique over the layer's fused [B, 226] block (26 single
            ids + M1..M4 padded to 50 with -1), 4 batches in turn
  row_ids   the example rows of M1..M4 as RaggedTensor: tnet's TnetRowIds
            against the stock RaggedTensor.value_rowids(), one
            tf.function per step of 4 columns
  combine   what the layer runs per step for the batch's dedup: the 26
            single ids through TnetEmbedCombine and M1..M4 through
            TnetSegmentCombine (segments example * 4 + column), forward and
            gradient, as the deep table (dim 16, mean) and as the wide
            table (dim 1, sum)
  pull_push a training pull and the push of its unique keys, for a dim-16
            Adagrad table and a dim-1 FTRL table (the two tables of
            SPARSE-HEAVY), warmed with the 4 batches first

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

import tnet as tn  # before tensorflow: selects Keras 2

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tnet import _ops  # noqa: E402
from tnet import feature_column as fc  # noqa: E402
from tnet.data.synthetic import SyntheticCriteo  # noqa: E402
from tnet.layers.lookup import COMBINERS  # noqa: E402

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
    combine_args = []
    for keys_b, valid_b in dedup_args:
        uniq, idx, _ = dedup(keys_b, valid_b)
        idx = tf.reshape(idx, [4096, -1])
        single = idx[:, :len(cats)]
        seg_idx, segs = [], []
        for j in range(len(multi)):
            col = idx[:, len(cats) + 50 * j:len(cats) + 50 * (j + 1)]
            keep = col >= 0
            seg_idx.append(tf.boolean_mask(col, keep))
            segs.append(tf.cast(tf.where(keep)[:, 0], tf.int64) * len(multi) + j)
        combine_args.append((single, tf.concat(seg_idx, 0), tf.concat(segs, 0),
                             tf.shape(uniq, out_type=tf.int64)[0]))
    ones = tf.ones([len(cats)], tf.int32)
    rng = np.random.default_rng(0)

    def combine_case(dim, combiner):
        codes_single = tf.fill([len(cats)], COMBINERS[combiner])
        codes_multi = tf.fill([len(multi)], COMBINERS[combiner])

        @tf.function
        def step(rows, single, seg_idx, segs, u):
            a = _ops.tnet_embed_combine(rows, single, ones, codes_single)
            b = _ops.tnet_segment_combine(rows, seg_idx, segs,
                                          4096 * len(multi), codes_multi)
            ga = _ops.tnet_embed_combine_grad(a, single, ones, codes_single,
                                              u)
            gb = _ops.tnet_segment_combine_grad(b, seg_idx, segs,
                                                4096 * len(multi),
                                                codes_multi, u)
            return ga + gb
        args = [(tf.constant(rng.standard_normal((int(a[3]), dim)).astype(
                    np.float32)), *a) for a in combine_args]
        return step, args

    tables = {"deep": tn.SparseTable("bench_deep", 16,
                                     optimizer=tn.optimizer.Adagrad(0.05)),
              "wide": tn.SparseTable("bench_wide", 1,
                                     optimizer=tn.optimizer.Ftrl(0.2))}
    pp_step = tf.Variable(1, dtype=tf.int64)

    @tf.function
    def pull_push(keys_b, valid_b):
        uniq, _, shows = _ops.tnet_unique(keys_b, valid_b)
        for t in tables.values():
            e = t.pull(uniq, training=True)
            t.push(uniq, e * 1e-3 + 1e-3, learning_rate=0.05, step=pp_step,
                   shows=shows, unique_keys=True)
        return tf.shape(uniq)[0]

    for a in dedup_args:
        pull_push(*a)  # the rows exist, as in training
    tnet_rows = tf.function(
        lambda cols: [_ops.tnet_row_ids(c.row_splits) for c in cols])
    stock_rows = tf.function(lambda cols: [c.value_rowids() for c in cols])
    for cols, in ragged_args:  # same rows both ways
        for a, b in zip(tnet_rows(cols), stock_rows(cols)):
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    cases = {"dedup": (dedup, dedup_args),
             "row_ids tnet": (tnet_rows, ragged_args),
             "row_ids stock": (stock_rows, ragged_args),
             "combine deep (dim 16, mean), fwd+grad": combine_case(16, "mean"),
             "combine wide (dim 1, sum), fwd+grad": combine_case(1, "sum"),
             "pull_push (deep + wide tables)": (pull_push, dedup_args)}
    for fn, fa in cases.values():
        timed(fn, fa, 4)  # trace, warm
    got = {name: [] for name in cases}
    for r in range(args.repeats):
        for name, (fn, fa) in cases.items():
            got[name].append(timed(fn, fa, args.calls))
        print(f"  repeat {r + 1}/{args.repeats}: " + ", ".join(
            f"{k.split(' (')[0]}={v[-1][0]:.2f}/{v[-1][1]:.2f}"
            for k, v in got.items()), flush=True)
    print("| kernel | CPU ms per call (median) | wall ms per call (median) |")
    print("|---|---:|---:|")
    for name, v in got.items():
        print(f"| {name} | {statistics.median(x[0] for x in v):.2f} | "
              f"{statistics.median(x[1] for x in v):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
