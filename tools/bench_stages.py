"""Per-id cost of every stage of tnet's sparse step on a SPARSE-HEAVY batch
(issue 29): the map of what is left between today's kernels and the
memory-bound limit of this machine.

One process, one table shard (the layer's one-process path). The batch is
SPARSE-HEAVY's (docs/BENCHMARK_PROTOCOL.md, tools/_sparse_heavy.py): 4096
examples of the 26 single-valued synthetic Criteo columns plus M1..M4
(1-50 ids each, mean ~20), all in one shared dim-16 table, fed as one
[B, 226] block padded with -1 (the layer's fused block path). Before
timing, --warm_batches earlier batches are pulled with training=True so the
table holds as many rows as a short SPARSE-HEAVY run leaves (random reads
then miss the caches as in training).

Stages, each its own `tf.function`, timed in turn within every repeat
(A, B, C ... per repeat, the protocol's alternation), with what they read:

  keys_flat  TnetFlattenKeys, what the layer runs: the 26 [B] columns and
           M1..M4 ragged (bench_train's input) -> salted keys without
           padding and each key's combine segment (asserted equal to the
           layer's merged order below)
  keys     ids [B, W] -> salted int64 keys + padding mask (fc.keys_of on
           the padded block; the per-column ops' core, before
           TnetFlattenKeys; not in the sum)
  dedup    TnetUnique: unique keys, idx per id, shows per key, on the
           valid ids only (the layer compacts padded and ragged ids first;
           the unique keys and shows equal the masked call's)
  dedup_masked  the same on the whole [B, W] block with its padding mask
           (the layer's input before TnetCompactIds)
  route    what a worker does around the RPCs of a 2-shard table, as the
           layer does it: group the dedup's keys by shard (TnetShardOrder,
           idx and shows renumbered), the pulled rows one part after the
           other (a concat), dE [U, 16] and the shows cut into slices
           (the table's own code; 0 in one process)
  route_partition  the table's route for keys in any order: floormod,
           dynamic_partition of keys and positions, the rows back in key
           order through the inverse permutation, dE and shows gathered
           per shard (what the layer did before TnetShardOrder)
  route_dynpart  the same with dynamic_stitch / dynamic_partition for the
           rows, as the table did before (2-D DynamicPartition copies row
           by row)
  pull     SparseTablePull of the unique keys (training: all present)
  combine  TnetEmbedCombine: every column's mean into [B, 30 * 16]
  grad     TnetEmbedCombineGrad: dE [U, 16] summed per key
  combine_seg, grad_seg: the same with M1..M4 ragged, as bench_train feeds
           them: TnetSegmentCombine over the 26 single columns (row-major)
           and each multi-valued column's ids in example order (the
           layer's merged order), and its gradient
  push     SparseTablePush (Adagrad, unique_keys=True)

  wide_pull, wide_combine, wide_grad, wide_push: the same for the wide
           part of SPARSE-HEAVY's Wide&Deep (LinearFeatures: a dim-1 table
           with in-table FTRL, lr 0.2, its default; the same unique keys,
           which the layers share with the deep part's dedup; each column's
           sum in the merged order, and its gradient)
  dnn_only the SPARSE-HEAVY DNN (128-64-1 on a [B, 493] input, Adagrad,
           cross-entropy) trained one step on a constant input by its
           Keras train function: the protocol's DNN-only, as bench_train
           times it
  dnn_dx   the same with the gradient of its input too (a trainable
           per-feature scale in front of the DNN), which a step that
           trains embeddings must also compute
  tnet_step  the whole tnet step: SPARSE-HEAVY's tn.models.WideDeep
           (trained first on the --warm_batches batches) trained on this
           batch (M1..M4 ragged) by its Keras train function, as
           bench_train times it (no row is new after the first call)
  tnet_step_fresh  the same model's step on the batches after it, one new
           batch per call (as in bench_train's epoch)
  pull_fresh  the pull of the next batch's unique keys, one new batch per
           call (training: its new keys are inserted)

  call     a tf.function that runs one trivial op (x + 1 on a scalar):
           the call from Python that every stage's time includes

  pull_ps0, pull_ps1, push_ps0, push_ps1: what each of 2 ps runs for the
           same batch under ParameterServerStrategy: a second table of 2
           shards (in this process), warmed with the same batches, and the
           pull / push kernel of one shard on its part of the unique keys
           (the RPC and its serialization are not in it: bench_pss_bytes)

The memory-bound references: tools/membound.cc (compiled here with
g++ -O2 -march=native, all cores, software prefetch) does only the memory
traffic of a stage, on the same sizes and the batch's own indices, once per
repeat beside the stages (no hashing, no TensorFlow, no checks):

  ref_gather_u   copy 64 bytes from each of U random rows of an array of
                 the table's R rows, each as far apart as the table's
                 memory per row (memory_bytes() / size(): rows, index and
                 bookkeeping), so the working set is the table's (pull's
                 traffic)
  ref_gather_seg sum the rows of the batch's N ids from E [U, 16] into
                 their output rows (the layer's merged order: the single
                 columns row-major, then each multi-valued column's ids in
                 example order) and write those rows: the combine's
                 traffic (TnetEmbedCombine's batch order moves the same)
  ref_scatter_seg zero dE [U, 16], then add each id's output-row gradient
                 into its row of dE (the combine gradient's traffic)
  ref_rmw_u      Adagrad on U random rows of the same array (weights and
                 accumulator side by side: 128 bytes read and written per
                 key, the push's traffic without the 16 bytes of meta)
  ref_probe_n    per id: read its 8-byte key in order, one random 16-byte
                 read from a [2U] array of pairs, write a 4-byte index (a
                 dedup's traffic: its hash table of U keys is that size)

Reported per stage: ms per batch, ns per id (N valid ids) and ns per unique
key (U), and the ratio to its reference (stage / reference; the issue's
target is <= 2x for dedup, combine, grad and push). The wide stages'
references are the same kernels at DIM 1 over the wide table's memory per
row (ref_w_*: a second membound run).

Every stage above runs on the same batch call after call: its rows stay
in cache and none is new. A training run sees each batch once, and its
pulls insert the batch's new keys (a third of U in its first batches,
~14% after 64): the fresh stages take a batch not seen before per call.

  .venv/bin/python tools/bench_stages.py            # ~1 min on 2 cores
  .venv/bin/python tools/bench_stages.py --quick    # smaller table, ~40 s
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import tnet as tn  # noqa: F401  (before tensorflow: selects Keras 2)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tnet import _ops  # noqa: E402
from tnet import feature_column as fc  # noqa: E402
from tnet import table as tn_table  # noqa: E402
from tnet.data.synthetic import SyntheticCriteo  # noqa: E402
from tnet.layers import lookup  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tools import _bench_common as bc  # noqa: E402
from tools import _sparse_heavy as sh  # noqa: E402

DIM = sh.EMBEDDING_DIM
LR = 0.05

# Stage -> the reference whose traffic bounds it.
REFERENCE = {"pull": "ref_gather_u", "pull_fresh": "ref_gather_u",
             "combine": "ref_gather_seg",
             "grad": "ref_scatter_seg", "push": "ref_rmw_u",
             "dedup": "ref_probe_n", "dedup_masked": "ref_probe_n",
             "combine_seg": "ref_gather_seg",
             "grad_seg": "ref_scatter_seg"}
STAGES = ("keys_flat", "dedup", "route", "pull", "combine", "grad", "push")
# A pull of a batch not seen before (its new keys inserted), one batch per
# call: the regime of a training run, where pull, combine and push above
# see the same batch call after call (its rows in cache, none new).
FRESH_STAGES = ("pull_fresh",)
# Not in the sum (other forms of work the sum has): with M1..M4 ragged
# (bench_train's SPARSE-HEAVY input), the layer's one segment combine over
# the block and the pieces, and its gradient; the dedup of the masked
# block; the routes before TnetShardOrder.
SEG_STAGES = ("combine_seg", "grad_seg", "keys", "dedup_masked",
              "route_partition", "route_dynpart")
PS_STAGES = ("pull_ps0", "pull_ps1", "push_ps0", "push_ps1")
REFS = ("ref_gather_u", "ref_gather_seg", "ref_scatter_seg", "ref_rmw_u",
        "ref_probe_n")
# The wide part (dim 1) and its references (membound at DIM 1).
WIDE_STAGES = ("wide_pull", "wide_combine", "wide_grad", "wide_push")
WIDE_REFS = tuple("ref_w_" + r[len("ref_"):] for r in REFS
                  if r != "ref_probe_n")
REFERENCE.update({"wide_pull": "ref_w_gather_u",
                  "wide_combine": "ref_w_gather_seg",
                  "wide_grad": "ref_w_scatter_seg",
                  "wide_push": "ref_w_rmw_u"})
DNN_STAGES = ("dnn_only", "dnn_dx", "tnet_step", "tnet_step_fresh")
CALL_STAGES = ("call",)
WIDE_LR = 0.2  # LinearFeatures' default in-table FTRL


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="4 warm batches, 3 repeats (a script check)")
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--warm_batches", type=int, default=None,
                   help="batches pulled before timing (default 64, quick 4)")
    p.add_argument("--repeats", type=int, default=None,
                   help="repeats (default 5, quick 3)")
    p.add_argument("--calls", type=int, default=10,
                   help="calls of a stage per repeat")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.warm_batches is None:
        args.warm_batches = 4 if args.quick else 64
    if args.repeats is None:
        args.repeats = 3 if args.quick else 5
    return args


def build_membound() -> str:
    """Compiles tools/membound.cc (g++ -O2 -march=native, once per source
    change) and returns the binary's path."""
    here = os.path.dirname(os.path.abspath(__file__))
    src = os.path.join(here, "membound.cc")
    out = os.path.join(bc.REPO_ROOT, "build", "membound")
    if (not os.path.exists(out)
            or os.path.getmtime(out) < os.path.getmtime(src)):
        os.makedirs(os.path.dirname(out), exist_ok=True)
        subprocess.run(["g++", "-std=c++17", "-O2", "-march=native",
                        "-pthread", src, "-o", out], check=True)
    return out


def block_ids(features, names) -> np.ndarray:
    """The batch's id columns side by side as one [B, W] int64 block."""
    return np.concatenate([features[n].reshape(len(features[n]), -1)
                           for n in names], axis=1)


def main(argv=None) -> int:
    args = parse_args(argv)
    info = bc.run_info()
    cats, multi, _ = sh.columns()
    names = list(cats) + list(multi)
    gen = SyntheticCriteo(seed=0, multi_valued=sh.MULTI_VALUED)
    salts = tf.constant(np.concatenate([
        np.full(1 if n in cats else 50, fc.column_salt(n), np.int64)
        for n in names])[None, :])
    widths = tf.constant([1] * len(cats) + [50] * len(multi), tf.int32)
    codes = tf.constant([lookup.COMBINERS["mean"]] * len(names), tf.int32)
    table = tn.SparseTable("stages", DIM, optimizer=tn.optimizer.Adagrad(LR))
    table2 = tn.SparseTable("stages_2ps", DIM, optimizer=tn.optimizer.Adagrad(LR),
                            num_shards=2)
    wide = tn.SparseTable("stages_wide", 1,
                          optimizer=tn.optimizer.Ftrl(WIDE_LR),
                          initializer="zeros")

    @tf.function(reduce_retracing=True)
    def keys_fn(ids):
        return (tf.reshape(fc.keys_of(ids, salts), [-1]),
                tf.reshape(fc.not_padding(ids), [-1]))

    @tf.function(reduce_retracing=True)
    def dedup_fn(keys, valid):
        return _ops.tnet_unique(keys, valid)

    @tf.function(reduce_retracing=True)
    def warm_fn(ids):
        keys, valid = keys_fn(ids)
        uniq, _, _ = dedup_fn(keys, valid)
        return (tf.shape(table.pull(uniq, training=True))[0]
                + tf.shape(table2.pull(uniq, training=True))[0]
                + tf.shape(wide.pull(uniq, training=True))[0])

    t0 = time.perf_counter()
    seen = []  # the warm batches' (features, labels), for the model
    for b in range(args.warm_batches + 1):
        f, labels, _ = gen.batch(args.batch, "train", start=b * args.batch)
        ids = tf.constant(block_ids(f, names))
        if b < args.warm_batches:
            warm_fn(ids)
            seen.append((f, labels))
    # The batches after the timed one, one per call of the fresh stages
    # (each case runs twice untimed, then --calls times per repeat).
    fresh = [gen.batch(args.batch, "train",
                       start=(args.warm_batches + 1 + b) * args.batch)[:2]
             for b in range(2 + args.calls * args.repeats)]
    rows = int(table.size())
    print(f"table warmed: {rows} rows after {args.warm_batches} batches "
          f"({time.perf_counter() - t0:.1f}s)", flush=True)

    # The timed batch (the next one: most of its keys are already rows).
    keys, valid = keys_fn(ids)
    uniq, idx, shows = dedup_fn(keys, valid)
    valid_keys = tf.boolean_mask(keys, valid)
    no_mask = tf.zeros([0], tf.bool)
    u2, _, s2 = dedup_fn(valid_keys, no_mask)
    np.testing.assert_array_equal(u2.numpy(), uniq.numpy())
    np.testing.assert_array_equal(s2.numpy(), shows.numpy())
    table.pull(uniq, training=True)
    n_ids = int(tf.reduce_sum(tf.cast(valid, tf.int32)))
    n_uniq = int(tf.shape(uniq)[0])
    print(f"batch: {args.batch} examples, W={ids.shape[1]}, N={n_ids} ids, "
          f"U={n_uniq} unique keys", flush=True)
    idx2 = tf.reshape(idx, tf.shape(ids))

    @tf.function
    def route_fn(u, rows_per_shard, de, shows):
        route, i, c = table2.shard_order(u, idx, shows)
        return (route.parts,
                tn_table._stitch_rows(route, rows_per_shard, DIM),
                tn_table._partition_rows(de, route),
                tn_table._partition_rows(c, route), i)

    @tf.function
    def route_partition_fn(u, rows_per_shard, de, shows):
        route = table2.route(u)
        return (route.parts,
                tn_table._stitch_rows(route, rows_per_shard, DIM),
                tn_table._partition_rows(de, route),
                tn_table._partition_rows(shows, route))

    @tf.function
    def route_dynpart_fn(u, rows_per_shard, de, shows):
        shard = tf.cast(tf.math.floormod(u, 2), tf.int32)
        where = tf.dynamic_partition(tf.range(tf.size(u)), shard, 2)
        return (tf.dynamic_partition(u, shard, 2),
                tf.dynamic_stitch(where, rows_per_shard),
                tf.dynamic_partition(de, shard, 2),
                tf.dynamic_partition(shows, shard, 2))

    @tf.function
    def pull_fn(u):
        return table.pull(u, training=True)

    e = pull_fn(uniq)

    @tf.function
    def combine_fn(e):
        return lookup.embed_combine(e, idx2, widths,
                                    ["mean"] * len(names))

    out = combine_fn(e)
    dout = tf.random.stateless_normal(tf.shape(out), [1, 2]) * 1e-3

    @tf.function
    def grad_fn(dout):
        return _ops.tnet_embed_combine_grad(dout, idx2, widths, codes,
                                            tf.cast(n_uniq, tf.int64))

    de = grad_fn(dout)

    # The layer's merged order when M1..M4 come ragged: the single columns
    # row-major (segment b * C + j), then each multi-valued column's valid
    # ids in example order.
    idx_np = idx2.numpy()
    n_cols, n_single = len(names), len(cats)
    b_of = np.arange(args.batch)
    seg_idx = [idx_np[:, :n_single].reshape(-1)]
    seg_seg = [(b_of[:, None] * n_cols + np.arange(n_single)).reshape(-1)]
    for m in range(len(multi)):
        block = idx_np[:, n_single + 50 * m:n_single + 50 * (m + 1)]
        keep = block >= 0
        seg_idx.append(block[keep])
        seg_seg.append(np.repeat(b_of * n_cols + n_single + m,
                                 keep.sum(axis=1)))
    seg_idx = tf.constant(np.concatenate(seg_idx).astype(np.int32))
    seg_seg = tf.constant(np.concatenate(seg_seg).astype(np.int64))
    n_seg = args.batch * n_cols

    # The same batch as the layer gets it: single columns [B], M1..M4
    # ragged; one TnetFlattenKeys for all (compact: no padding).
    ids_np = ids.numpy()
    singles = [tf.constant(ids_np[:, j]) for j in range(n_single)]
    ragged = []
    for m in range(len(multi)):
        block = ids_np[:, n_single + 50 * m:n_single + 50 * (m + 1)]
        keep = block >= 0
        ragged.append(tf.RaggedTensor.from_row_lengths(
            tf.constant(block[keep]), tf.constant(keep.sum(axis=1))))
    flat_salts = [fc.column_salt(n) for n in names]

    @tf.function
    def keys_flat_fn():
        return _ops.tnet_flatten_keys(
            singles, [r.values for r in ragged],
            [r.row_splits for r in ragged], salts=flat_salts,
            slots=list(range(n_cols)), num_slots=n_cols, compact=True)

    flat_keys, _, flat_seg = keys_flat_fn()
    np.testing.assert_array_equal(flat_seg.numpy(), seg_seg.numpy())
    np.testing.assert_array_equal(np.sort(flat_keys.numpy()),
                                  np.sort(valid_keys.numpy()))

    @tf.function
    def combine_seg_fn(e):
        return _ops.tnet_segment_combine(e, seg_idx, seg_seg, n_seg, codes)

    dout_seg = tf.reshape(dout, [n_seg, DIM])

    @tf.function
    def grad_seg_fn(g):
        return _ops.tnet_segment_combine_grad(
            g, seg_idx, seg_seg, n_seg, codes, tf.cast(n_uniq, tf.int64))

    np.testing.assert_allclose(
        tf.reshape(combine_seg_fn(e), tf.shape(out)).numpy(), out.numpy(),
        rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad_seg_fn(dout_seg).numpy(), de.numpy(),
                               rtol=1e-4, atol=1e-6)
    step = tf.Variable(1, dtype=tf.int64)
    # The wide part: LinearFeatures' table (dim 1, FTRL), each column's sum
    # in the same merged order (its layer then sums the columns).
    sums = tf.constant([lookup.COMBINERS["sum"]] * len(names), tf.int32)

    @tf.function
    def wide_pull_fn(u):
        return wide.pull(u, training=True)

    e_w = wide_pull_fn(uniq)

    @tf.function
    def wide_combine_fn(e_w):
        return _ops.tnet_segment_combine(e_w, seg_idx, seg_seg, n_seg, sums)

    dout_w = tf.random.stateless_normal([n_seg, 1], [3, 4]) * 1e-3

    @tf.function
    def wide_grad_fn(g):
        return _ops.tnet_segment_combine_grad(
            g, seg_idx, seg_seg, n_seg, sums, tf.cast(n_uniq, tf.int64))

    de_w = wide_grad_fn(dout_w)

    @tf.function
    def wide_push_fn(de_w):
        wide.push(uniq, de_w, learning_rate=WIDE_LR, step=step, shows=shows,
                  unique_keys=True)

    # The DNN of SPARSE-HEAVY, one training step on a constant input, as
    # bench_train's DNN-only (a tf_keras model and its train function); and
    # the same with the gradient of its input (bench_train's build_dnn_only
    # puts a trainable per-feature scale in front of it).
    width = sh.deep_width()
    dnn_data = tf.data.Dataset.from_tensors(
        (tf.zeros([args.batch, width]), tf.zeros([args.batch, 1]))).repeat()

    from tools.bench_train import (  # noqa: PLC0415
        build_dnn_only, sparse_heavy_dataset)

    def dnn_step(with_dx):
        # bench_train's DNN-only and DNN with its input's gradient.
        m = build_dnn_only(LR, width, sh.HIDDEN, input_grad=with_dx)
        fn, it = m.make_train_function(), iter(dnn_data)
        return lambda: fn(it)

    # The whole tnet step, as bench_train runs it: tn.models.WideDeep
    # (tools/_sparse_heavy.py), first trained on the warm batches (its
    # tables then hold what the bench tables hold), then by its Keras train
    # function on this batch again (tnet_step: no row new after the first
    # call) or on the batches after it (tnet_step_fresh).
    def batches_dataset(pairs):
        feats = {k: np.concatenate([p[0][k] for p in pairs])
                 for k in pairs[0][0]}
        return sparse_heavy_dataset(
            feats, np.concatenate([p[1] for p in pairs]), args.batch, multi)

    model = sh.build_tnet(LR)
    model_fn = model.make_train_function()
    warm_it = iter(batches_dataset(seen))
    for _ in seen:  # the model's tables as the bench table's
        model_fn(warm_it)
    model_it = iter(sparse_heavy_dataset(f, labels, args.batch,
                                         multi).repeat())
    fresh_it = iter(batches_dataset(fresh))
    del seen

    # pull_fresh: the unique keys of the fresh batches, one batch per call.
    fresh_uniq = [dedup_fn(*keys_fn(tf.constant(block_ids(p[0], names))))[0]
                  for p in fresh]
    fresh_next = iter(fresh_uniq)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def pull_fresh_fn(u):  # one trace for every batch's U
        return table.pull(u, training=True)

    rows_before_fresh = int(table.size())

    # Per ps: each shard's kernels on its part of the batch's unique keys.
    route = table2.route(uniq)
    table2.pull(uniq, training=True)
    ps_keys = [tf.identity(k) for k in route.parts]
    ps_grads = tf.dynamic_partition(de, route.shard, 2)
    ps_shows = tf.dynamic_partition(shows, route.shard, 2)
    e_per_shard = [tf.gather(e, w) for w in route.where]
    route_args = (uniq, e_per_shard, de, shows)
    for a, b in zip(tf.nest.flatten(route_partition_fn(*route_args)),
                    tf.nest.flatten(route_dynpart_fn(*route_args))):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    # Grouped by shard: the same parts; the rows, dE and shows in the
    # grouped order (what the layer's step holds) cut into the same parts.
    grouped = tf.concat(route.where, 0)
    grouped_args = (uniq, e_per_shard, tf.gather(de, grouped), shows)
    new = route_fn(*grouped_args)
    old = route_partition_fn(*route_args)
    for a, b in zip(tf.nest.flatten(new[:3]), tf.nest.flatten(
            (old[0], tf.gather(old[1], grouped), old[2]))):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    for a, b in zip(new[3], old[3]):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    lr_t = tf.constant(LR, tf.float32)
    no_clicks = tf.zeros([0], tf.float32)

    def ps_pull(i):
        @tf.function
        def fn():
            return _ops.sparse_table_pull(table2.shards[i].resource_handle,
                                          ps_keys[i], True, dim=DIM)
        return fn

    def ps_push(i):
        @tf.function
        def fn():
            _ops.sparse_table_push(
                table2.shards[i].resource_handle, ps_keys[i], ps_grads[i],
                lr_t, step, ps_shows[i], no_clicks, dim=DIM, unique_keys=True)
        return fn

    # What every stage's time carries besides its kernel: a tf.function
    # call from Python that runs one trivial op.
    one = tf.constant(1.0)

    @tf.function
    def call_fn(x):
        return x + 1.0

    @tf.function
    def push_fn(de):
        table.push(uniq, de, learning_rate=LR, step=step, shows=shows,
                   unique_keys=True)

    # The memory-bound references: tools/membound.cc on the same sizes and
    # the batch's own index order, run once per repeat beside the stages.
    membound = build_membound()
    ref_dir = tempfile.mkdtemp(prefix="tnet-stages-")
    idx_file = os.path.join(ref_dir, "idx")
    seg_file = os.path.join(ref_dir, "seg")
    seg_idx.numpy().astype(np.int32).tofile(idx_file)
    seg_seg.numpy().astype(np.int32).tofile(seg_file)
    refs: dict[str, list[float]] = {r: [] for r in REFS + WIDE_REFS}

    row_bytes_seen: dict[str, list[int]] = {"deep": [], "wide": []}

    def membound_ms(dim, t):
        row_bytes = int(t.memory_bytes()) // max(int(t.size()), 1)
        row_bytes_seen["wide" if t is wide else "deep"].append(row_bytes)
        out = subprocess.run(
            [membound, str(rows), str(n_uniq), str(n_ids), str(dim),
             str(os.cpu_count() or 1), str(args.calls), idx_file, seg_file,
             str(n_seg), str(row_bytes)],
            check=True, capture_output=True, text=True).stdout
        return dict(line.split() for line in out.strip().splitlines())

    def run_membound():
        for wanted, prefix, dim, t in ((REFS, "ref_", DIM, table),
                                        (WIDE_REFS, "ref_w_", 1, wide)):
            got = membound_ms(dim, t)
            for r in wanted:
                refs[r].append(float(got[r[len(prefix):]]))
        return refs["ref_gather_u"][-1]

    cases = {
        "call": lambda: call_fn(one),
        "keys_flat": keys_flat_fn,
        "keys": lambda: keys_fn(ids),
        "dedup": lambda: dedup_fn(valid_keys, no_mask),
        "dedup_masked": lambda: dedup_fn(keys, valid),
        "route": lambda: route_fn(*grouped_args),
        "route_partition": lambda: route_partition_fn(*route_args),
        "route_dynpart": lambda: route_dynpart_fn(*route_args),
        "pull": lambda: pull_fn(uniq),
        "combine": lambda: combine_fn(e),
        "grad": lambda: grad_fn(dout),
        "combine_seg": lambda: combine_seg_fn(e),
        "grad_seg": lambda: grad_seg_fn(dout_seg),
        "push": lambda: push_fn(de),
        "pull_ps0": ps_pull(0), "pull_ps1": ps_pull(1),
        "push_ps0": ps_push(0), "push_ps1": ps_push(1),
        "wide_pull": lambda: wide_pull_fn(uniq),
        "wide_combine": lambda: wide_combine_fn(e_w),
        "wide_grad": lambda: wide_grad_fn(dout_w),
        "wide_push": lambda: wide_push_fn(de_w),
        "dnn_only": dnn_step(False), "dnn_dx": dnn_step(True),
        "tnet_step": lambda: model_fn(model_it),
        "tnet_step_fresh": lambda: model_fn(fresh_it),
        "pull_fresh": lambda: pull_fresh_fn(next(fresh_next)),
        "membound": run_membound,
    }
    for name, fn in cases.items():  # trace and warm
        if name != "membound":
            fn(), fn()

    def timed(fn):
        def run():
            t = time.perf_counter()
            for _ in range(args.calls):
                fn()
            return (time.perf_counter() - t) / args.calls * 1e3
        return run

    try:
        values = bc.alternate({k: v if k == "membound" else timed(v)
                               for k, v in cases.items()}, args.repeats)
    finally:
        shutil.rmtree(ref_dir, ignore_errors=True)
    del values["membound"]
    new_per_fresh = ((int(table.size()) - rows_before_fresh)
                     / len(fresh_uniq))
    values.update(refs)
    ms = {k: statistics.median(v) for k, v in values.items()}
    measurements = []
    for name in (STAGES + FRESH_STAGES + SEG_STAGES + WIDE_STAGES
                 + DNN_STAGES + PS_STAGES + CALL_STAGES + REFS + WIDE_REFS):
        ref = REFERENCE.get(name)
        ratios = (bc.paired_ratios(values[name], values[ref]) if ref
                  else None)
        measurements.append(bc.Measurement(
            "stages", name, "ms/batch", values[name], baseline=ref,
            ratios=ratios, target=(2.0 if ref and name in STAGES + SEG_STAGES
                    and name != "pull" else None),
            higher_is_better=False,
            extra={"ns_per_id": ms[name] * 1e6 / n_ids,
                   "ns_per_unique": ms[name] * 1e6 / n_uniq}))
    sparse_ms = sum(ms[s] for s in STAGES if s != "route")
    lines = [bc.header_markdown(info, "Sparse step per stage, SPARSE-HEAVY "
                                "batch, one process"),
             f"Table {rows} rows (dim {DIM}, Adagrad); batch {args.batch} "
             f"examples, N = {n_ids} ids, U = {n_uniq} unique keys; "
             f"{args.repeats} repeats x {args.calls} calls, medians.", "",
             "| stage | ms/batch | ns/id | ns/unique key | reference | "
             "ms/batch | stage / reference |",
             "|---|---|---|---|---|---|---|"]
    for m in measurements:
        if (m.name.startswith("ref_")
                or m.name in PS_STAGES + DNN_STAGES + CALL_STAGES):
            continue
        ref = REFERENCE.get(m.name)
        cells = [m.name, f"{ms[m.name]:.2f}", f"{m.extra['ns_per_id']:.1f}",
                 f"{m.extra['ns_per_unique']:.1f}", ref or "",
                 f"{ms[ref]:.2f}" if ref else "",
                 f"{m.ratio:.2f}x" if ref else ""]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Sum of the one-process stages (keys_flat, dedup, pull, "
              f"combine, grad, push): {sparse_ms:.1f} ms per batch, "
              f"{sparse_ms * 1e6 / n_ids:.0f} ns per id.", "",
              "The pull and push references stride the tables' memory per "
              f"row: deep {min(row_bytes_seen['deep'])}-"
              f"{max(row_bytes_seen['deep'])} B, wide "
              f"{min(row_bytes_seen['wide'])}-{max(row_bytes_seen['wide'])} B"
              " (memory_bytes() / size() when each reference ran). Each "
              "stage's time includes one call from Python (a tf.function "
              f"running one trivial op: {ms['call'] * 1e3:.0f} us); the "
              "references' do not.", "",
              "Per ps (2 shards; each shard's kernel on its part of the "
              "unique keys, no RPC):", "",
              "| ps stage | keys | ms/batch | ns/key on that ps |", "|---|---|---|---|"]
    for name in PS_STAGES:
        k = int(tf.size(ps_keys[int(name[-1])]))
        lines.append(f"| {name} | {k} | {ms[name]:.2f} | "
                     f"{ms[name] * 1e6 / max(k, 1):.1f} |")
    lines += ["", "One training step of the batch (Keras train functions):",
              "",
              "| | ms/batch |", "|---|---|",
              f"| dnn_only (the protocol's DNN-only) | {ms['dnn_only']:.2f} |",
              f"| dnn_dx (with the input's gradient) | {ms['dnn_dx']:.2f} |",
              f"| tnet_step (the whole SPARSE-HEAVY step, this batch again) | "
              f"{ms['tnet_step']:.2f} |",
              f"| tnet_step_fresh (the same, a batch not seen before) | "
              f"{ms['tnet_step_fresh']:.2f} |",
              "", f"DNN-only / tnet step: "
              f"{ms['dnn_only'] / ms['tnet_step']:.2f}x (this batch again), "
              f"{ms['dnn_only'] / ms['tnet_step_fresh']:.2f}x (fresh batches)."
              f" A fresh pull inserted {new_per_fresh:.0f} rows on average "
              f"({100 * new_per_fresh / n_uniq:.0f}% of U): pull "
              f"{ms['pull']:.2f} ms (this batch again) against pull_fresh "
              f"{ms['pull_fresh']:.2f} ms."]
    md = "\n".join(lines)
    out = args.out or bc.default_out_path(
        "bench_stages" + ("-quick" if args.quick else ""))
    bc.write_results(out, info, measurements, md,
                     extra={"rows": rows, "n_ids": n_ids, "n_unique": n_uniq,
                            "batch": args.batch})
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
