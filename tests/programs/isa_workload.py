"""Runs tnet's hot kernels on fixed inputs and saves every output (for
tests/test_isa_variants.py, which runs it once per op library and compares
the files bit for bit).

    TNET_OPS_ISA=baseline python isa_workload.py OUT.npz

Covers what the AVX-512 library recompiles (setup.py VARIANT_SOURCES):
tables of every rule and several widths (pulls that insert, with every
initializer; pushes of unique and repeated keys; the rows, slots and meta
exported), the dedup, the shard order, the keys of int columns, the block
and segment combines and their gradients (every combiner, compiled and
generic widths), and the row sums.
"""
import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))

import numpy as np  # noqa: E402

import tnet as tn  # noqa: E402
from tnet import _ops  # noqa: E402
import tensorflow as tf  # noqa: E402

out = {"isa": np.array(_ops.isa)}
rng = np.random.default_rng(7)

RULES = {
    "sgd": lambda: tn.optimizer.SGD(0.3),
    "adagrad": lambda: tn.optimizer.Adagrad(0.1, initial_accumulator_value=0.1),
    "rowwise": lambda: tn.optimizer.RowwiseAdagrad(0.1),
    "adam": lambda: tn.optimizer.Adam(0.01),
    "ftrl": lambda: tn.optimizer.Ftrl(
        0.2, l1_regularization_strength=0.01, l2_regularization_strength=0.02,
        l2_shrinkage_regularization_strength=0.03, beta=0.5),
    "ftrl_pow": lambda: tn.optimizer.Ftrl(0.2, learning_rate_power=-0.3),
}
INITS = ["truncated_normal", "normal", "uniform", "zeros"]
for r, (rule, make) in enumerate(RULES.items()):
    for d, dim in enumerate((1, 3, 8, 16, 64)):
        init = INITS[(r + d) % len(INITS)]
        name = f"{rule}_{dim}_{init}"
        table = tn.SparseTable(name, dim, make(), initializer=init,
                               num_stripes=4)
        keys = rng.integers(-2**40, 2**40, 3000)
        out[name + "/pull0"] = table.pull(keys, training=True).numpy()
        for step in range(1, 4):
            batch = np.concatenate([keys[rng.integers(0, 3000, 1500)],
                                    rng.integers(-2**40, 2**40, 200)])
            grads = rng.normal(size=(len(batch), dim)).astype(np.float32)
            uniq = np.unique(batch)
            table.push(uniq, rng.normal(size=(len(uniq), dim)).astype(
                np.float32), step=step, unique_keys=True)
            table.push(batch, grads, step=step,
                       shows=np.ones(len(batch), np.float32))
        k, w, s, m = (t.numpy() for t in table.export())
        order = np.argsort(k)
        for col, arr in zip("kwsm", (k, w, s, m)):
            out[f"{name}/{col}"] = arr[order]

# The dedup (with a padding mask) and the shard order.
ids = rng.integers(0, 5000, 200000)
mask = rng.random(len(ids)) < 0.9
for tag, valid in (("all", tf.zeros([0], tf.bool)), ("masked", mask)):
    uniq, idx, counts = _ops.tnet_unique(tf.constant(ids), valid)
    out[f"unique_{tag}"] = np.concatenate(
        [uniq.numpy(), idx.numpy(), counts.numpy().view(np.int32)])
    if tag == "all":
        for shards in (1, 3, 4):
            got = _ops.tnet_shard_order(uniq, idx, counts, num_shards=shards)
            for j, t in enumerate(got):
                out[f"shard_order_{shards}/{j}"] = t.numpy()

# The keys of int columns: [B] and ragged, compact and with padding.
B = 512
singles = [tf.constant(rng.integers(0, 10**6, B)) for _ in range(3)]
lens = rng.integers(0, 9, (2, B))
values = [tf.constant(rng.integers(-10**9, 10**9, int(n.sum()))) for n in lens]
splits = [tf.constant(np.concatenate([[0], np.cumsum(n)]).astype(np.int64))
          for n in lens]
for compact in (True, False):
    got = _ops.tnet_flatten_keys(singles, values, splits,
                                 salts=[11, 0, 13, 17, 0], slots=[0, 1, 2, 3, 4],
                                 num_slots=5, compact=compact)
    for j, t in enumerate(got):
        out[f"flatten_{compact}/{j}"] = t.numpy()

# Combines and their gradients: block ([B, W] idx, -1 padding) and
# segments (runs, and a shuffled order), every combiner.
for dim in (1, 3, 8, 16, 32, 64):
    U = 700
    rows = tf.constant(rng.normal(size=(U, dim)).astype(np.float32))
    widths = [1, 4, 2, 1]
    idx = rng.integers(-1, U, (B, sum(widths))).astype(np.int32)
    for combiners in ([0, 1, 2, 0], [1, 1, 1, 1]):
        tag = f"{dim}_{combiners[0]}{combiners[1]}"
        emb = _ops.tnet_embed_combine(rows, idx, widths, combiners)
        out[f"embed/{tag}"] = emb.numpy()
        dy = tf.constant(rng.normal(size=emb.shape).astype(np.float32))
        out[f"embed_grad/{tag}"] = _ops.tnet_embed_combine_grad(
            dy, idx, widths, combiners, U).numpy()
        n_seg = B * 4
        lengths = rng.integers(0, 7, n_seg)
        seg = np.repeat(np.arange(n_seg), lengths).astype(np.int64)
        sidx = rng.integers(-1, U, len(seg)).astype(np.int32)
        for order in ("runs", "shuffled"):
            if order == "shuffled":
                p = rng.permutation(len(seg))
                seg, sidx = seg[p], sidx[p]
            sc = _ops.tnet_segment_combine(rows, sidx, seg, n_seg, combiners)
            out[f"segment/{tag}/{order}"] = sc.numpy()
            dy = tf.constant(rng.normal(size=sc.shape).astype(np.float32))
            out[f"segment_grad/{tag}/{order}"] = \
                _ops.tnet_segment_combine_grad(dy, sidx, seg, n_seg,
                                               combiners, U).numpy()
    vals = tf.constant(rng.normal(size=(5000, dim)).astype(np.float32))
    at = tf.constant(rng.integers(0, 300, 5000).astype(np.int32))
    out[f"sum_rows/{dim}"] = _ops.tnet_sum_rows(
        vals, at, tf.constant(300, tf.int64)).numpy()

np.savez(sys.argv[1], **out)
print("saved", len(out), "arrays", flush=True)
