"""Op benchmark of the tnet sparse table (issue 2): pull, push, insert, memory.

Everything is measured in one process and one run, cases alternated A, B,
A, B ... for --repeats repeats; the tables report medians and the median of
the per-repeat ratios (docs/BENCHMARK_PROTOCOL.md). Sections:

1. pull: a tnet table of --rows rows (dim 16, Adagrad) against the same rows
   in a dense `tf.Variable` read by `tf.gather`, in a
   `tf.lookup.experimental.DenseHashTable` and in a `MutableHashTable`
   (both int64 key -> float32[16] value: they support vector values, so no
   key -> index -> gather detour). Batches of --batch unique keys drawn at
   random from the table's keys; the dense baseline gathers the same rows.
   Inside `tf.function` (as training runs it) and eagerly.
2. push (Adagrad, lr 0.01): tnet push against the fused stock Adagrad
   (`ResourceSparseApplyAdagradV2` on a dense variable + accumulator) and
   against gather + `ResourceScatterSub` (SGD-style read and write of the
   same rows). Insert: tnet pull(training=True) of new keys against
   DenseHashTable / MutableHashTable `insert` of new keys with precomputed
   values, each into a fresh empty table per repeat.
3. insert rate: --big_rows new keys into a tnet table (dim 8, Adagrad) by
   pull(training=True) in batches of --big_batch.
4. bytes per row at --big_rows rows (dim 8 and 16 Adagrad, dim 8 row-wise
   Adagrad): `memory_bytes() / rows` against the payload
   8 (key) + 4*dim + 4*slots + 16 (show, click float32, last_step int64),
   and the process RSS growth per row.

Targets (issue 2): pull >= 0.8x tf.gather, push >= 0.8x gather + scatter,
lookup >= 2x DenseHashTable, memory <= 1.3x payload.

  .venv/bin/python tools/bench_ops.py            # full run, ~5 min on 2 cores
  .venv/bin/python tools/bench_ops.py --quick    # small sizes, ~1 min

Sections 1+2 are here; 3+4 (big tables) in tools/_ops_scale.py.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time

import tnet as tn  # before tensorflow: selects Keras 2

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tnet import _ops  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _bench_common as bc  # noqa: E402

from _ops_common import (EPSILON, INITIAL_ACCUMULATOR, LR,  # noqa: E402
                         distinct_keys, log, rows_per_sec)
from _ops_scale import bench_big  # noqa: E402


# --------------------------------------------------------------- section 1+2
# Anonymous tables: a named (default) eager tf.lookup table is never freed
# when its Python object goes away (measured here: each deleted 1M-row
# DenseHashTable kept ~150 MB), which would pile up over the insert repeats.
def _dense_hash_table(default_value):
    return tf.lookup.experimental.DenseHashTable(
        tf.int64, tf.float32, default_value=default_value, empty_key=-1,
        deleted_key=-2, experimental_is_anonymous=True)


def _mutable_hash_table(default_value):
    return tf.lookup.experimental.MutableHashTable(
        tf.int64, tf.float32, default_value=default_value,
        experimental_is_anonymous=True)


class Fixture:
    """The same --rows rows in a tnet table, a dense variable and two hash
    tables, plus random batches (keys for the tables, row indices for the
    dense variable)."""

    def __init__(self, args):
        self.dim = 16
        n = args.rows
        self.keys = distinct_keys(0, n)
        rng = np.random.default_rng(args.seed)
        pos = [rng.choice(n, args.batch, replace=False)
               for _ in range(args.num_batches)]
        self.idx = [tf.constant(p, tf.int64) for p in pos]
        self.bkeys = [tf.constant(self.keys[p]) for p in pos]
        self.grads = [tf.constant(rng.normal(0, 0.1, (args.batch, self.dim)),
                                  tf.float32) for _ in range(2)]

        log(f"filling the tnet table with {n:,} rows")
        self.table = tn.SparseTable(
            "bench_pull", dim=self.dim,
            optimizer=tn.optimizer.Adagrad(
                learning_rate=LR,
                initial_accumulator_value=INITIAL_ACCUMULATOR,
                epsilon=EPSILON))
        insert = tf.function(lambda k: self.table.pull(k, training=True))
        chunks = []
        for s in range(0, n, args.big_batch):
            chunks.append(insert(tf.constant(self.keys[s:s + args.big_batch]))
                          .numpy())
        values = np.concatenate(chunks)
        del chunks
        assert int(self.table.size()) == n

        log("filling the dense variable and the hash tables with the same "
            "rows")
        self.var = tf.Variable(values, name="dense")
        self.accum = tf.Variable(np.full_like(values, INITIAL_ACCUMULATOR),
                                 name="accum")
        zero = tf.zeros([self.dim], tf.float32)
        self.dht = _dense_hash_table(zero)
        self.mht = _mutable_hash_table(zero)
        for s in range(0, n, args.big_batch):
            k = tf.constant(self.keys[s:s + args.big_batch])
            v = tf.constant(values[s:s + args.big_batch])
            self.dht.insert(k, v)
            self.mht.insert(k, v)
        del values


def check_fixture(fx: Fixture) -> dict:
    """Same values everywhere; inference pull inserts nothing."""
    t = fx.table
    size0 = int(t.size())
    k, i = fx.bkeys[0], fx.idx[0]
    train = t.pull(k, training=True).numpy()
    infer = t.pull(k, training=False).numpy()
    dense = tf.gather(fx.var, i).numpy()
    unknown = distinct_keys(1 << 50, 1000)
    zeros = t.pull(tf.constant(unknown), training=False).numpy()
    out = {
        "pull_training_equals_inference": bool(np.array_equal(train, infer)),
        "pull_equals_dense_gather": bool(np.array_equal(train, dense)),
        "pull_equals_dense_hash_table": bool(
            np.array_equal(train, fx.dht.lookup(k).numpy())),
        "pull_equals_mutable_hash_table": bool(
            np.array_equal(train, fx.mht.lookup(k).numpy())),
        "inference_pull_of_unknown_keys_is_zero": bool(not zeros.any()),
        "inference_pull_inserted_nothing": int(t.size()) == size0,
    }
    return out


def check_adagrad(steps: int = 3, n: int = 1000, dim: int = 16) -> dict:
    """tnet Adagrad push against ResourceSparseApplyAdagradV2, row for row."""
    t = tn.SparseTable("bench_check", dim=dim, optimizer=tn.optimizer.Adagrad(
        learning_rate=LR, initial_accumulator_value=INITIAL_ACCUMULATOR,
        epsilon=EPSILON))
    keys = tf.constant(distinct_keys(1 << 51, n))
    var = tf.Variable(t.pull(keys, training=True))
    acc = tf.Variable(tf.fill([n, dim], INITIAL_ACCUMULATOR))
    rng = np.random.default_rng(7)
    for step in range(steps):
        g = tf.constant(rng.normal(0, 1, (n, dim)), tf.float32)
        t.push(keys, g, step=step)
        tf.raw_ops.ResourceSparseApplyAdagradV2(
            var=var.handle, accum=acc.handle, lr=LR, epsilon=EPSILON, grad=g,
            indices=tf.range(n, dtype=tf.int64))
    a = t.pull(keys, training=False).numpy()
    b = var.numpy()
    rel = float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-30)))
    return {"adagrad_push_vs_ResourceSparseApplyAdagradV2_max_rel_diff": rel,
            "adagrad_push_matches_stock_1e-6": rel <= 1e-6}


def bench_pull(fx: Fixture, args) -> list[bc.Measurement]:
    t, var, dht, mht = fx.table, fx.var, fx.dht, fx.mht
    spec = tf.TensorSpec([None], tf.int64)
    fns = {
        "tnet pull (training)": tf.function(
            lambda k: t.pull(k, training=True), input_signature=[spec]),
        "tnet pull (inference)": tf.function(
            lambda k: t.pull(k, training=False), input_signature=[spec]),
        "tf.gather": tf.function(lambda i: tf.gather(var, i),
                                 input_signature=[spec]),
        "DenseHashTable.lookup": tf.function(dht.lookup,
                                             input_signature=[spec]),
        "MutableHashTable.lookup": tf.function(mht.lookup,
                                               input_signature=[spec]),
    }
    eager = {
        "tnet pull (training)": lambda k: t.pull(k, training=True),
        "tf.gather": lambda i: tf.gather(var, i),
        "DenseHashTable.lookup": dht.lookup,
        "MutableHashTable.lookup": mht.lookup,
    }
    out = []
    for mode, group in (("tf.function", fns), ("eager", eager)):
        log(f"pull, {mode}: {len(group)} cases x {args.repeats} repeats x "
            f"{args.calls} calls of {args.batch:,} keys")
        cases = {}
        for name, fn in group.items():
            batches = [(i,) for i in fx.idx] if name == "tf.gather" else [
                (k,) for k in fx.bkeys]
            bc.time_calls(fn, batches, args.warmup)  # trace + warm up
            cases[name] = (lambda fn=fn, b=batches: rows_per_sec(
                fn, b, args.calls, args.batch))
        vals = bc.alternate(cases, args.repeats, log=log)
        sec = f"pull ({mode})"
        for name in group:
            if not name.startswith("tnet"):
                out.append(bc.Measurement(sec, name, "rows/s", vals[name]))
        for name in [n for n in group if n.startswith("tnet")]:
            for base, target in (("tf.gather", 0.8),
                                 ("DenseHashTable.lookup", 2.0),
                                 ("MutableHashTable.lookup", None)):
                out.append(bc.Measurement(
                    sec, name, "rows/s", vals[name], baseline=base,
                    ratios=bc.paired_ratios(vals[name], vals[base]),
                    target=target if mode == "tf.function" else None))
    return out


def bench_push(fx: Fixture, args) -> list[bc.Measurement]:
    t, var, accum = fx.table, fx.var, fx.accum
    kspec = tf.TensorSpec([None], tf.int64)
    gspec = tf.TensorSpec([None, fx.dim], tf.float32)

    @tf.function(input_signature=[kspec, gspec])
    def tnet_push(k, g):
        t.push(k, g, learning_rate=LR)

    @tf.function(input_signature=[kspec, gspec])
    def adagrad_v2(i, g):
        tf.raw_ops.ResourceSparseApplyAdagradV2(
            var=var.handle, accum=accum.handle, lr=LR, epsilon=EPSILON,
            grad=g, indices=i, use_locking=False)

    @tf.function(input_signature=[kspec, gspec])
    def gather_scatter(i, g):
        rows = tf.gather(var, i)  # read the rows, as a push must
        tf.raw_ops.ResourceScatterSub(resource=var.handle, indices=i,
                                      updates=LR * g)
        return rows  # returned so the read is not pruned

    group = {"tnet push (Adagrad)": (tnet_push, fx.bkeys),
             "ResourceSparseApplyAdagradV2": (adagrad_v2, fx.idx),
             "gather + ResourceScatterSub": (gather_scatter, fx.idx)}
    log(f"push: {len(group)} cases x {args.repeats} repeats x {args.calls} "
        f"calls of {args.batch:,} keys")
    cases = {}
    for name, (fn, batches) in group.items():
        b = [(batches[j], fx.grads[j % len(fx.grads)])
             for j in range(len(batches))]
        bc.time_calls(fn, b, args.warmup)
        cases[name] = (lambda fn=fn, b=b: rows_per_sec(
            fn, b, args.calls, args.batch))
    vals = bc.alternate(cases, args.repeats, log=log)
    tn_name = "tnet push (Adagrad)"
    return [
        bc.Measurement("push (tf.function)", "ResourceSparseApplyAdagradV2",
                       "rows/s", vals["ResourceSparseApplyAdagradV2"],
                       note="fused stock Adagrad on a dense variable"),
        bc.Measurement("push (tf.function)", "gather + ResourceScatterSub",
                       "rows/s", vals["gather + ResourceScatterSub"]),
        bc.Measurement("push (tf.function)", tn_name, "rows/s", vals[tn_name],
                       baseline="gather + ResourceScatterSub",
                       ratios=bc.paired_ratios(
                           vals[tn_name], vals["gather + ResourceScatterSub"]),
                       target=0.8),
        bc.Measurement("push (tf.function)", tn_name, "rows/s", vals[tn_name],
                       baseline="ResourceSparseApplyAdagradV2",
                       ratios=bc.paired_ratios(
                           vals[tn_name],
                           vals["ResourceSparseApplyAdagradV2"])),
    ]


def _insert_fn(table, spec, vspec):
    """A traced tf.function inserting into a tf.lookup table."""
    @tf.function(input_signature=[spec, vspec])
    def insert(k, v):
        table.insert(k, v)  # returns an Operation: tf.function must not
    return insert.get_concrete_function()


def bench_insert(args, dim: int = 16) -> list[bc.Measurement]:
    """New keys into fresh, empty structures: args.insert_calls batches."""
    keys = distinct_keys(1 << 40, args.insert_calls * args.batch)
    kb = [(tf.constant(keys[s:s + args.batch]),)
          for s in range(0, len(keys), args.batch)]
    rng = np.random.default_rng(args.seed + 1)
    values = tf.constant(rng.normal(0, 0.25, (args.batch, dim)), tf.float32)
    kvb = [(k, values) for (k,) in kb]
    spec = tf.TensorSpec([None], tf.int64)
    vspec = tf.TensorSpec([None, dim], tf.float32)
    zero = tf.zeros([dim], tf.float32)
    n_rows = args.insert_calls * args.batch
    counter = iter(range(10**9))

    def run(make, fn_of, batches, size_of):
        obj = make()
        fn = fn_of(obj)
        rate = rows_per_sec(fn, batches, len(batches), args.batch)
        assert int(size_of(obj)) == n_rows, "insert lost rows"
        del fn, obj
        gc.collect()
        return rate

    def tnet_case():
        return run(
            lambda: tn.SparseTable(
                f"bench_insert{next(counter)}", dim=dim,
                optimizer=tn.optimizer.Adagrad(learning_rate=LR)),
            lambda t: tf.function(lambda k: t.pull(k, training=True),
                                  input_signature=[spec]
                                  ).get_concrete_function(),
            kb, lambda t: t.size())

    def tnet_zeros_case():
        return run(
            lambda: tn.SparseTable(
                f"bench_insert{next(counter)}", dim=dim,
                optimizer=tn.optimizer.Adagrad(learning_rate=LR),
                initializer="zeros"),
            lambda t: tf.function(lambda k: t.pull(k, training=True),
                                  input_signature=[spec]
                                  ).get_concrete_function(),
            kb, lambda t: t.size())

    def dht_case():
        return run(
            lambda: _dense_hash_table(zero),
            lambda h: _insert_fn(h, spec, vspec),
            kvb, lambda h: h.size())

    def mht_case():
        return run(
            lambda: _mutable_hash_table(zero),
            lambda h: _insert_fn(h, spec, vspec),
            kvb, lambda h: h.size())

    cases = {"tnet pull(training=True), new keys": tnet_case,
             "tnet pull(training=True), new keys, zeros init":
                 tnet_zeros_case,
             "DenseHashTable.insert": dht_case,
             "MutableHashTable.insert": mht_case}
    log(f"insert: {len(cases)} cases x {args.repeats} repeats, "
        f"{args.insert_calls} calls of {args.batch:,} new keys into an empty "
        "table")
    for c in cases.values():  # warm up the code paths (not the functions)
        c()
    vals = bc.alternate(cases, args.repeats, log=log)
    tn_name = "tnet pull(training=True), new keys"
    sec = f"insert {n_rows:,} keys into empty (tf.function)"
    out = [bc.Measurement(sec, n, "rows/s", vals[n]) for n in
           ("DenseHashTable.insert", "MutableHashTable.insert")]
    for name in (tn_name, tn_name + ", zeros init"):
        for base in ("DenseHashTable.insert", "MutableHashTable.insert"):
            out.append(bc.Measurement(
                sec, name, "rows/s", vals[name], baseline=base,
                ratios=bc.paired_ratios(vals[name], vals[base]),
                note="hash tables insert precomputed values; tnet "
                     "initializes each row (its default initializer, seeded by key, "
                     "or zeros) and its slots"))
    return out


# ----------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="small sizes (100k rows, 10k batch, 1M inserts) to "
                        "check the script works")
    p.add_argument("--repeats", type=int, default=5,
                   help="alternated repeats per case (>= 3)")
    p.add_argument("--calls", type=int, default=20,
                   help="timed calls per case per repeat")
    p.add_argument("--warmup", type=int, default=3,
                   help="untimed calls per case before timing")
    p.add_argument("--rows", type=int, default=None,
                   help="rows of the pull/push table (default 1M, quick 100k)")
    p.add_argument("--batch", type=int, default=None,
                   help="unique keys per pull/push/insert call (default "
                        "100k, quick 10k)")
    p.add_argument("--num_batches", type=int, default=8,
                   help="distinct random batches cycled over")
    p.add_argument("--insert_calls", type=int, default=10,
                   help="calls per repeat of the insert comparison")
    p.add_argument("--big_rows", type=int, default=None,
                   help="rows for the insert-rate and memory section "
                        "(default 10M, quick 1M)")
    p.add_argument("--big_batch", type=int, default=100_000,
                   help="keys per call when filling tables")
    p.add_argument("--big_repeats", type=int, default=3,
                   help="repeats of the --big_rows insert (dim 8 Adagrad)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None,
                   help="JSON path (default bench/results/bench_ops-<date>"
                        ".json); the markdown goes beside it as .md")
    args = p.parse_args(argv)
    full = {"rows": 1_000_000, "batch": 100_000, "big_rows": 10_000_000}
    quick = {"rows": 100_000, "batch": 10_000, "big_rows": 1_000_000}
    for k, v in (quick if args.quick else full).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.repeats < 3:
        p.error("--repeats must be >= 3 (docs/BENCHMARK_PROTOCOL.md)")
    if args.batch > args.rows:
        p.error("--batch must be <= --rows (batches are unique keys)")
    if args.out is None:
        args.out = bc.default_out_path("bench_ops")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    info = bc.run_info()
    start = time.perf_counter()
    log(f"bench_ops: rows={args.rows:,} batch={args.batch:,} "
        f"big_rows={args.big_rows:,} repeats={args.repeats} "
        f"calls={args.calls}")
    checks = {}
    measurements: list[bc.Measurement] = []

    rss_stages = {"start": bc.rss_bytes()}
    fx = Fixture(args)
    rss_stages["fixture_filled"] = bc.rss_bytes()
    checks.update(check_fixture(fx))
    checks.update(check_adagrad())
    log(f"checks: {checks}")
    measurements += bench_pull(fx, args)
    measurements += bench_push(fx, args)
    rss_stages["after_pull_push"] = bc.rss_bytes()
    del fx
    bc.release_free_memory()
    rss_stages["fixture_deleted"] = bc.rss_bytes()
    measurements += bench_insert(args)
    bc.release_free_memory()
    rss_stages["after_insert"] = bc.rss_bytes()
    big, big_raw = bench_big(args)
    rss_stages["end"] = bc.rss_bytes()
    log("RSS by stage (MiB): " + ", ".join(
        f"{k}={v / 2**20:.0f}" for k, v in rss_stages.items()))
    measurements += big

    elapsed = time.perf_counter() - start
    peak = bc.peak_rss_bytes()
    ok_checks = all(v for k, v in checks.items() if isinstance(v, bool))
    md = "\n".join([
        bc.header_markdown(info, "tnet ops (tools/bench_ops.py)"),
        f"- sizes: pull/push table {args.rows:,} rows dim 16 Adagrad, "
        f"batches of {args.batch:,} unique random keys, {args.calls} calls "
        f"per repeat, {args.repeats} alternated repeats; inserts of "
        f"{args.big_rows:,} keys in batches of {args.big_batch:,}",
        f"- peak RSS {peak / 2**30:.2f} GiB; run time {elapsed:.0f}s; "
        f"correctness checks {'passed' if ok_checks else 'FAILED'}",
        "- baselines: dense tf.Variable [rows, 16] read by tf.gather at the "
        "same (random) rows; DenseHashTable / MutableHashTable map int64 -> "
        "float32[16] directly (both support vector values); push: fused "
        "ResourceSparseApplyAdagradV2 (use_locking=False) and SGD-style "
        "tf.gather + ResourceScatterSub on the dense variable; all timed "
        "inside tf.function unless marked eager",
        "- ratio: median over repeats of (value / baseline in the same "
        "repeat); bytes: memory_bytes() or RSS growth per row / payload "
        "(key 8 + 4*dim + 4*slots + meta 16)",
        "",
        bc.markdown_table(measurements),
    ])
    config = {k: v for k, v in vars(args).items()}
    config.update({
        "dim": 16, "learning_rate": LR, "epsilon": EPSILON,
        "initial_accumulator_value": INITIAL_ACCUMULATOR,
        # 0 = TensorFlow's default (one thread per core).
        "intra_op_threads":
            tf.config.threading.get_intra_op_parallelism_threads(),
        "inter_op_threads":
            tf.config.threading.get_inter_op_parallelism_threads(),
    })
    md_path = bc.write_results(args.out, info, measurements, md, extra={
        "config": config, "checks": checks, "big_tables": big_raw,
        "rss_by_stage_bytes": rss_stages, "elapsed_seconds": elapsed})
    print()
    print(md)
    print()
    log(f"wrote {args.out} and {md_path}")
    return 0 if ok_checks else 1


if __name__ == "__main__":
    sys.exit(main())
