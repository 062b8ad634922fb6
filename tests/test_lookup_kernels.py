"""The worker-side lookup kernels (TnetUnique, TnetEmbedCombine and its
gradient, the push that trusts unique keys) against stock TensorFlow and
numpy, and the layer's kernel path against its stock serving path."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tnet as tn
from tnet import _ops, scopes
from tnet.layers import lookup
from tests.support import forkrun

RNG = np.random.default_rng(7)


def _keys(n, kind):
    if kind == "zipf":
        return (RNG.zipf(1.2, n) % 100_000).astype(np.int64) - 5_000
    if kind == "extremes":
        pool = np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max, 0,
                         -1, 1, 2**62], np.int64)
        return RNG.choice(pool, n)
    return RNG.integers(-2**63, 2**63 - 1, n, dtype=np.int64)  # all distinct


@pytest.mark.parametrize("n", [0, 1, 7, 16385, 200_000])
@pytest.mark.parametrize("kind", ["zipf", "extremes", "wide"])
def test_unique_equals_tf_unique_and_bincount(n, kind):
    _assert_unique_like_stock(_keys(n, kind))


def _assert_unique_like_stock(keys):
    """TnetUnique equals tf.unique (keys in first-occurrence order, idx)
    and bincount (counts)."""
    uniq, idx, counts = _ops.tnet_unique(keys, tf.zeros([0], tf.bool))
    want_u, want_i = tf.unique(keys, out_idx=tf.int32)
    np.testing.assert_array_equal(uniq.numpy(), want_u.numpy())
    np.testing.assert_array_equal(idx.numpy(), want_i.numpy())
    np.testing.assert_array_equal(
        counts.numpy(), np.bincount(want_i.numpy(), minlength=len(want_u)))


@pytest.mark.parametrize("n", [5, 40_000, 300_000])
def test_unique_skips_padding(n):
    keys = _keys(n, "zipf")
    valid = RNG.random(n) < 0.7
    valid[0] = False
    uniq, idx, counts = _ops.tnet_unique(keys, valid)
    want_u, want_i = tf.unique(keys[valid], out_idx=tf.int32)
    np.testing.assert_array_equal(uniq.numpy(), want_u.numpy())
    np.testing.assert_array_equal(idx.numpy()[valid], want_i.numpy())
    assert (idx.numpy()[~valid] == -1).all()
    np.testing.assert_array_equal(
        counts.numpy(), np.bincount(want_i.numpy(), minlength=len(want_u)))
    # The stock version (what a serving export runs) agrees.
    with scopes.serving_lookups({object(): None}):
        s_u, s_i, s_c = lookup.unique_keys(tf.constant(keys),
                                           tf.constant(valid))
    np.testing.assert_array_equal(s_u.numpy(), uniq.numpy())
    np.testing.assert_array_equal(s_i.numpy(), idx.numpy())
    np.testing.assert_array_equal(s_c.numpy(), counts.numpy())


_CHUNKED_UNIQUE = r"""
import sys
import tnet
import numpy as np
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(int(sys.argv[1]))
from tnet import _ops
rng = np.random.default_rng(int(sys.argv[1]))
n = 450_000
# Zipf keys (repeats across chunks), a block of keys first seen only in the
# last chunk, and padding around the chunk bounds.
keys = (rng.zipf(1.1, n) % 200_000).astype(np.int64)
keys[-5000:] = np.arange(10**9, 10**9 + 5000)
valid = rng.random(n) < 0.8
for b in (n // 5, n // 4, n // 3, n // 2):
    valid[b - 3:b + 3] = False
uniq, idx, counts = _ops.tnet_unique(keys, valid)
want_u, want_i = tf.unique(keys[valid], out_idx=tf.int32)
np.testing.assert_array_equal(uniq.numpy(), want_u.numpy())
np.testing.assert_array_equal(idx.numpy()[valid], want_i.numpy())
assert (idx.numpy()[~valid] == -1).all()
np.testing.assert_array_equal(
    counts.numpy(), np.bincount(want_i.numpy(), minlength=len(want_u)))
print("ok", tf.config.threading.get_intra_op_parallelism_threads())
"""


@pytest.mark.parametrize("threads", [3, 5])
def test_unique_on_more_threads_than_this_machine(threads, tmp_path):
    """TnetUnique cuts a batch into one chunk per worker thread and merges
    the chunks in order; with 3 or more chunks the middle ones take the
    merge path the last one skips. This machine has 2 cores, so a process
    with a larger intra-op pool checks that path against tf.unique."""
    script = tmp_path / "chunked_unique.py"
    script.write_text(_CHUNKED_UNIQUE)
    out = forkrun.run([sys.executable, str(script), str(threads)],
                      capture_output=True, text=True, timeout=300,
                      script_imports_tnet=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"ok {threads}" in out.stdout


_M64 = (1 << 64) - 1


def _unmix64(h):
    """The key whose Mix64 (murmur3's fmix64, tnet_ops/table/hash.h) is h."""
    for mult in (0xc4ceb9fe1a85ec53, 0xff51afd7ed558ccd):
        h ^= h >> 33
        h = h * pow(mult, -1, 1 << 64) & _M64
    return h ^ (h >> 33)


def test_unique_tells_apart_keys_whose_hashes_share_tag_and_slot():
    """TnetUnique's map keeps a 32-bit tag of each key's hash in its slots
    and reads the key itself only when the tags agree: keys whose hashes
    agree on the tag and on every bit that picks a slot (up to 2^20 slots)
    must stay distinct groups, in any order and on either chunk."""
    base = 0x9E3779B97F4A7C15
    keys = [_unmix64(base ^ (bit << 20)) for bit in (0, 1, 2, 4)]
    keys = [k - (1 << 64) if k >= 1 << 63 else k for k in keys]
    batch = np.array(keys * 3 + keys[::-1], np.int64)
    batch = np.concatenate([batch, np.arange(200_000, dtype=np.int64), batch])
    _assert_unique_like_stock(tf.constant(batch))


def test_unique_rejects_bad_shapes():
    with pytest.raises(tf.errors.InvalidArgumentError, match="valid must"):
        _ops.tnet_unique(tf.constant([1, 2, 3], tf.int64),
                         tf.constant([True, False]))
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError),
                       match="1-D|rank"):
        _ops.tnet_unique(tf.constant([[1, 2]], tf.int64),
                         tf.zeros([0], tf.bool))


def _reference(rows, idx, widths, combiners):
    """numpy: per example and column, the combiner over valid ids."""
    b, dim = idx.shape[0], rows.shape[1]
    starts = np.concatenate([[0], np.cumsum(widths)])
    out = np.zeros((b, len(widths) * dim), np.float64)
    for e in range(b):
        for c, comb in enumerate(combiners):
            ids = [r for r in idx[e, starts[c]:starts[c + 1]] if r >= 0]
            if not ids:
                continue
            v = rows[ids].astype(np.float64).sum(0)
            if comb == "mean":
                v /= len(ids)
            elif comb == "sqrtn":
                v /= np.sqrt(len(ids))
            out[e, c * dim:(c + 1) * dim] = v
    return out


@pytest.mark.parametrize("batch", [0, 3, 300, 8192])  # 8192: two parts
@pytest.mark.parametrize("dim", [1, 5, 16])  # 1, 16: the unrolled kernels
def test_embed_combine_and_gradient_match_stock(batch, dim):
    widths, combiners = [1, 4, 2, 1], ["sum", "mean", "sqrtn", "mean"]
    u = 13
    rows = RNG.standard_normal((u, dim)).astype(np.float32)
    idx = RNG.integers(-1, u, (batch, sum(widths))).astype(np.int32)
    if batch:
        idx[0, 1:5] = -1  # an all-padding span: zeros
    rows_v = tf.Variable(rows)
    upstream = RNG.standard_normal((batch, len(widths) * dim)).astype(
        np.float32)
    with tf.GradientTape(persistent=True) as tape:
        got = lookup.embed_combine(rows_v, idx, widths, combiners)
        loss = tf.reduce_sum(got * upstream)
        with scopes.serving_lookups({object(): None}):
            stock = lookup.embed_combine(rows_v, idx, widths, combiners)
        stock_loss = tf.reduce_sum(stock * upstream)
    np.testing.assert_allclose(got.numpy(),
                               _reference(rows, idx, widths, combiners),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(stock.numpy(), got.numpy(), rtol=1e-5,
                               atol=1e-6)
    grad = tape.gradient(loss, rows_v)
    assert isinstance(grad, tf.Tensor)  # dense dE, summed per row
    want = tf.convert_to_tensor(tape.gradient(stock_loss, rows_v))
    np.testing.assert_allclose(grad.numpy(), want.numpy(), rtol=1e-5,
                               atol=1e-5)


def test_embed_combine_rejects_bad_input():
    rows = tf.zeros([4, 2])
    with pytest.raises(tf.errors.InvalidArgumentError, match="not in"):
        _ops.tnet_embed_combine(rows, [[0, 4]], [2], [0])
    # A batch whose check is split over the threads: the first bad entry
    # is named wherever it sits, forward and gradient.
    good = np.zeros((4096, 130), np.int32)
    for at, value in ((0, 4), (good.size - 1, -2), (good.size // 2 + 7, 9)):
        bad = good.copy().reshape(-1)
        bad[at] = value
        bad[at + 1:at + 3] = 99  # later bad entries are not the one named
        bad = bad.reshape(good.shape)
        for call in (lambda: _ops.tnet_embed_combine(rows, bad, [130], [1]),
                     lambda: _ops.tnet_embed_combine_grad(
                         tf.zeros([4096, 2]), bad, [130], [1], 4)):
            with pytest.raises(tf.errors.InvalidArgumentError,
                               match=rf"idx \(flat\) \[{at}\] = {value} "
                                     "is not in"):
                call()
    np.testing.assert_array_equal(
        _ops.tnet_embed_combine(rows, good, [130], [1]).numpy(),
        np.zeros((4096, 2)))
    with pytest.raises(tf.errors.InvalidArgumentError, match="widths sum"):
        _ops.tnet_embed_combine(rows, [[0, 1]], [1], [0])
    with pytest.raises(tf.errors.InvalidArgumentError, match="combiners"):
        _ops.tnet_embed_combine(rows, [[0, 1]], [2], [7])
    with pytest.raises(tf.errors.InvalidArgumentError, match="grad must"):
        _ops.tnet_embed_combine_grad(tf.zeros([1, 3]), [[0, 1]], [1, 1],
                                     [0, 0], 4)


@pytest.mark.parametrize("rule", ["adagrad", "adam", "ftrl"])
def test_push_of_unique_keys_equals_the_summing_push(rule):
    keys = np.unique(_keys(3000, "zipf"))
    RNG.shuffle(keys)
    grads = RNG.standard_normal((len(keys), 4)).astype(np.float32)
    shows = RNG.integers(1, 5, len(keys)).astype(np.float32)
    tables = [tn.SparseTable(f"uk_{rule}_{i}", 4, rule, num_shards=2)
              for i in range(2)]
    for t, unique in zip(tables, (False, True)):
        t.pull(keys, training=True)
        for step in (1, 2):
            t.push(keys, grads * step, learning_rate=0.1, step=step,
                   shows=shows, unique_keys=unique)
    np.testing.assert_array_equal(tables[0].pull(keys).numpy(),
                                  tables[1].pull(keys).numpy())


@pytest.mark.parametrize("ids_kind", ["padded", "B", "B1", "mixed",
                                      "ragged", "sparse", "ragged+dense"])
def test_layer_kernel_path_equals_its_serving_path(ids_kind):
    """The layer's training / eval path (tnet kernels) and the stock ops a
    serving export traces give the same output for every dense id form."""
    cols = [tn.feature_column.embedding_column(
        tn.feature_column.category_column(n), 4, combiner=c, table="t")
        for n, c in (("a", "mean"), ("b", "sum"), ("c", "sqrtn"))]
    layer = tn.layers.EmbeddingFeatures(cols)
    b = 50
    ids = {n: RNG.integers(0, 40, (b, 3)) for n in "abc"}
    for n in "abc":
        ids[n][RNG.random((b, 3)) < 0.4] = -1
    if ids_kind == "B":
        ids = {n: v[:, 0] for n, v in ids.items()}
    elif ids_kind == "B1":
        ids = {n: v[:, :1] for n, v in ids.items()}
    elif ids_kind == "mixed":
        ids["b"] = ids["b"][:, 0]
    elif ids_kind in ("ragged", "sparse", "ragged+dense"):
        names = "abc" if ids_kind != "ragged+dense" else "ac"
        for n in names:
            ids[n] = tf.RaggedTensor.from_tensor(ids[n], padding=-1)
            if ids_kind == "sparse":
                ids[n] = ids[n].to_sparse()
    layer(ids, training=True)  # creates rows
    got = layer(ids, training=False).numpy()
    table = layer.tables["t"]
    with scopes.serving_lookups({table: lambda k: table.pull(k)}):
        stock = layer(ids, training=False).numpy()
    np.testing.assert_allclose(got, stock, rtol=1e-6, atol=1e-7)
    assert got.shape == (b, 12)
    assert np.abs(got).sum() > 0


@pytest.mark.parametrize("columns", [1, 3])
def test_segment_combine_and_gradient_match_stock(columns):
    combiners = ["mean", "sum", "sqrtn"][:columns]
    u, dim, batch, k = 11, 3, 40, 300
    rows = tf.Variable(RNG.standard_normal((u, dim)).astype(np.float32))
    idx = RNG.integers(0, u, k).astype(np.int32)
    segments = RNG.integers(0, batch * columns, k)  # any order, some empty
    upstream = RNG.standard_normal((batch * columns, dim)).astype(np.float32)
    with tf.GradientTape(persistent=True) as tape:
        got = lookup.segment_combine(rows, idx, segments, batch * columns,
                                     combiners)
        loss = tf.reduce_sum(got * upstream)
        with scopes.serving_lookups({object(): None}):
            stock = lookup.segment_combine(rows, idx, segments,
                                           batch * columns, combiners)
        stock_loss = tf.reduce_sum(stock * upstream)
    want = np.zeros((batch * columns, dim))
    for s in range(batch * columns):
        sel = idx[segments == s]
        if len(sel):
            v = rows.numpy()[sel].sum(0)
            c = combiners[s % columns]
            want[s] = v / (len(sel) if c == "mean" else
                           np.sqrt(len(sel)) if c == "sqrtn" else 1)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(stock.numpy(), want, rtol=1e-5, atol=1e-6)
    g = tape.gradient(loss, rows)
    assert isinstance(g, tf.Tensor)
    np.testing.assert_allclose(
        g.numpy(), tf.convert_to_tensor(tape.gradient(stock_loss, rows)).numpy(),
        rtol=1e-5, atol=1e-5)
    with pytest.raises(tf.errors.InvalidArgumentError, match="segments"):
        _ops.tnet_segment_combine(rows, idx, segments + batch * columns,
                                  batch * columns, [0] * columns)




@pytest.mark.parametrize("dim", [1, 3, 16])
@pytest.mark.parametrize("where", ["first", "last"])
def test_segment_combine_names_a_bad_entry_in_any_part(dim, where):
    """Where each path checks its entries: the forward at dim 16 (sorted
    segments: one range of entries per thread) each run before its rows are
    read; narrow rows (one part, dims 1 and 3) just before
    each row is read or written when every combiner is a sum, else in a
    pass first, as the gradient does at dim 16. A bad idx or segment
    anywhere, in any thread's range, is one InvalidArgument naming it, for
    every combiner, forward and gradient; good calls still equal the numpy
    sums (mean factors counted the same way)."""
    batch, columns, u, k = 300, 3, 50, 40000
    rows = RNG.standard_normal((u, dim)).astype(np.float32)
    idx = RNG.integers(-1, u, k).astype(np.int32)
    seg = np.sort(RNG.integers(0, batch * columns, k))
    for combiner in (0, 1, 2):
        got = _ops.tnet_segment_combine(rows, idx, seg, batch * columns,
                                        [combiner] * columns).numpy()
        keep = idx >= 0
        total = np.zeros((batch * columns, dim))
        np.add.at(total, seg[keep], rows[idx[keep]].astype(np.float64))
        n = np.bincount(seg[keep], minlength=batch * columns)[:, None]
        want = total / {0: 1, 1: np.maximum(n, 1),
                        2: np.sqrt(np.maximum(n, 1))}[combiner]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        at = 0 if where == "first" else k - 1
        bad_idx, bad_seg = idx.copy(), seg.copy()
        bad_idx[at] = u
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=rf"idx\[{at}\] = {u} is not in"):
            _ops.tnet_segment_combine(rows, bad_idx, seg, batch * columns,
                                      [combiner] * columns)
        bad_seg[at] = -3
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=rf"segments\[{at}\] = -3 is not in"):
            _ops.tnet_segment_combine(rows, idx, bad_seg, batch * columns,
                                      [combiner] * columns)
        grad = RNG.standard_normal((batch * columns, dim)).astype(np.float32)
        got = _ops.tnet_segment_combine_grad(
            grad, idx, seg, batch * columns, [combiner] * columns, u).numpy()
        factor = {0: np.ones_like(n, np.float64), 1: 1 / np.maximum(n, 1),
                  2: 1 / np.sqrt(np.maximum(n, 1))}[combiner]
        want = np.zeros((u, dim))
        np.add.at(want, idx[keep], (grad * factor)[seg[keep]])
        # ~800 float32 terms per row: sums near 0 keep ~1e-4 absolute error
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-4)
        for bad_i, bad_s, name, value in ((bad_idx, seg, "idx", u),
                                          (idx, bad_seg, "segments", -3)):
            with pytest.raises(tf.errors.InvalidArgumentError,
                               match=rf"{name}\[{at}\] = {value} is not in"):
                _ops.tnet_segment_combine_grad(grad, bad_i, bad_s,
                                               batch * columns,
                                               [combiner] * columns, u)

@pytest.mark.parametrize("dim", [4, 16])
def test_segment_combine_in_runs_equals_the_listing_path(dim):
    """The layer's order (a dense block row-major, then ragged pieces in
    example order: each segment's entries one run) takes the path that cuts
    the entries into one range per thread. Its output equals, bit for bit,
    the listing path's on the same entries (forced by one extra padding
    entry of an already-written segment, which adds nothing) and numpy's
    sums; a segment met again, in the same thread's range or another's, is
    never overwritten by its second run."""
    batch, columns, block, u = 3000, 5, 3, 20000
    rows = RNG.standard_normal((u, dim)).astype(np.float32)
    idx, seg = [], []
    for b in range(batch):  # the block: columns 0..2, one id each
        for j in range(block):
            idx.append(RNG.integers(-1, u)); seg.append(b * columns + j)
    for j in range(block, columns):  # ragged pieces, 0-5 ids per example
        for b in range(batch):
            for _ in range(RNG.integers(0, 6)):
                idx.append(RNG.integers(0, u)); seg.append(b * columns + j)
    idx, seg = np.array(idx, np.int32), np.array(seg, np.int64)
    assert len(idx) * dim >= 2 * 32768  # two threads' worth
    combiners = [1, 0, 2, 1, 1]
    ns = batch * columns

    def numpy_combine(i, s):
        keep = i >= 0
        total = np.zeros((ns, dim))
        np.add.at(total, s[keep], rows[i[keep]].astype(np.float64))
        n = np.bincount(s[keep], minlength=ns)
        c = np.array(combiners)[np.arange(ns) % columns]
        div = np.where(c == 1, np.maximum(n, 1),
                       np.where(c == 2, np.sqrt(np.maximum(n, 1)), 1))
        return total / div[:, None]

    def combine(i, s):
        return _ops.tnet_segment_combine(rows, i, s, ns, combiners).numpy()

    runs = combine(idx, seg)
    np.testing.assert_allclose(runs, numpy_combine(idx, seg),
                               rtol=1e-5, atol=1e-5)
    # An extra padding entry of segment 0 at the end (another thread's
    # range) or of segment 1 after segment 2 (the same range).
    assert list(seg[:4]) == [0, 1, 2, 5]
    for at, s in ((len(idx), 0), (3, 1)):
        i2 = np.insert(idx, at, -1).astype(np.int32)
        s2 = np.insert(seg, at, s)
        listed = combine(i2, s2)
        assert listed.tobytes() == runs.tobytes(), (at, s)
    # A real id of a segment met again, in the same range: added, not
    # overwritten.
    i3 = np.insert(idx, 3, 7).astype(np.int32)
    s3 = np.insert(seg, 3, 1)
    np.testing.assert_allclose(combine(i3, s3), numpy_combine(i3, s3),
                               rtol=1e-5, atol=1e-5)
    # Segments no entry reaches (example 0's ragged columns emptied) are 0.
    empty = (seg % columns >= block) & (seg // columns == 0)
    out = combine(idx[~empty], seg[~empty])
    assert not out[block:columns].any()
    np.testing.assert_allclose(out, numpy_combine(idx[~empty], seg[~empty]),
                               rtol=1e-5, atol=1e-5)


_HUGE_SEGMENTS = r"""
import tnet
import numpy as np
import tensorflow as tf
from tnet import _ops
huge = 1 << 40
idx = tf.constant([3], tf.int32)
seg = tf.constant([5], tf.int64)
for combiner in (0, 1, 2):  # sum, mean, sqrtn
    # Rows 0 wide: the output [2^40, 0] holds nothing; no count is needed.
    out = _ops.tnet_segment_combine(tf.zeros([300, 0]), idx, seg, huge,
                                    [combiner])
    assert out.shape == (huge, 0), out.shape
    grad = _ops.tnet_segment_combine_grad(tf.zeros([huge, 0]), idx, seg,
                                          huge, [combiner], 300)
    assert grad.shape == (300, 0), grad.shape
    # A gradient whose rows do not match num_segments is rejected before
    # anything is sized by num_segments.
    try:
        _ops.tnet_segment_combine_grad(tf.zeros([1, 4]), idx, seg, huge,
                                       [combiner], 300)
        raise SystemExit("a [1, 4] gradient for 2^40 segments was accepted")
    except tf.errors.InvalidArgumentError as e:
        assert "grad must be" in str(e), e
print("OK")
"""


def test_segment_combines_survive_huge_num_segments(tmp_path):
    """Found by the fuzzer: num_segments = 2^40 with 0-wide rows is a valid
    call (the output holds nothing), and a gradient of the wrong shape is
    bad input; neither may size a count array by num_segments (it aborted
    the process with std::bad_alloc). In a subprocess: a crash fails the
    test, not the run."""
    script = tmp_path / "huge.py"
    script.write_text(_HUGE_SEGMENTS)
    out = forkrun.run([sys.executable, str(script)], capture_output=True,
                      text=True, timeout=300, script_imports_tnet=True)
    assert out.returncode == 0 and out.stdout.strip().endswith("OK"), (
        out.returncode, out.stdout[-500:], out.stderr[-2000:])

_SPLIT_COMBINES = r"""
import sys
import tnet
import numpy as np
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(int(sys.argv[1]))
from tnet import _ops
rng = np.random.default_rng(7)
batch, cols, u = 3000, 3, 20_000
lengths = rng.integers(0, 40, (cols, batch))
# The layer's order (column by column, examples in order: runs of one
# segment) and any order (a segment's entries scattered).
seg = np.concatenate([np.repeat(np.arange(batch), lengths[j]) * cols + j
                      for j in range(cols)])
orders = {"layer": seg, "any": rng.permutation(seg)}
out = {}
for name, segs in orders.items():
    idx = rng.integers(-1, u, segs.size).astype(np.int32)  # -1: padding
    for dim in (1, 5, 16):
        rows = rng.standard_normal((u, dim)).astype(np.float32)
        grad = rng.standard_normal((batch * cols, dim)).astype(np.float32)
        for comb in ([0, 0, 0], [1, 0, 2]):
            key = f"{name}-{dim}-{comb[0]}"
            out[key + "-fwd"] = _ops.tnet_segment_combine(
                rows, idx, segs, batch * cols, comb).numpy()
            out[key + "-grad"] = _ops.tnet_segment_combine_grad(
                grad, idx, segs, batch * cols, comb, u).numpy()
            # float64 reference
            keep = idx >= 0
            n = np.bincount(segs[keep], minlength=batch * cols)
            f = np.ones(batch * cols)
            kind = np.array(comb)[np.arange(batch * cols) % cols]
            f[(kind == 1) & (n > 0)] = 1 / n[(kind == 1) & (n > 0)]
            f[(kind == 2) & (n > 0)] = 1 / np.sqrt(n[(kind == 2) & (n > 0)])
            want = np.zeros((batch * cols, dim))
            np.add.at(want, segs[keep], rows[idx[keep]].astype(np.float64))
            np.testing.assert_allclose(out[key + "-fwd"], want * f[:, None],
                                       rtol=1e-4, atol=1e-5)
            want_g = np.zeros((u, dim))
            np.add.at(want_g, idx[keep],
                      grad[segs[keep]].astype(np.float64) * f[segs[keep], None])
            np.testing.assert_allclose(out[key + "-grad"], want_g,
                                       rtol=1e-4, atol=1e-4)
# A dense block: columns of widths 1, 3, 1, 5 side by side, -1 padding.
widths = [1, 3, 1, 5]
starts = np.cumsum([0] + widths)
idx = rng.integers(-1, u, (20_000, sum(widths))).astype(np.int32)
for dim in (1, 16):
    rows = rng.standard_normal((u, dim)).astype(np.float32)
    grad = rng.standard_normal((len(idx), len(widths) * dim)).astype(np.float32)
    for comb in ([0, 0, 0, 0], [1, 2, 0, 1]):
        key = f"block-{dim}-{comb[0]}"
        out[key + "-fwd"] = _ops.tnet_embed_combine(rows, idx, widths,
                                                    comb).numpy()
        out[key + "-grad"] = _ops.tnet_embed_combine_grad(
            grad, idx, widths, comb, u).numpy()
        want = np.zeros((len(idx), len(widths) * dim))
        want_g = np.zeros((u, dim))
        for c, kind in enumerate(comb):
            part = idx[:, starts[c]:starts[c + 1]]
            n = (part >= 0).sum(1)
            f = np.ones(len(idx))
            if kind:
                f[n > 0] = 1 / (n[n > 0] if kind == 1 else np.sqrt(n[n > 0]))
            g = grad[:, c * dim:(c + 1) * dim].astype(np.float64) * f[:, None]
            for j in range(part.shape[1]):
                keep = part[:, j] >= 0
                want[keep, c * dim:(c + 1) * dim] += rows[part[keep, j]]
                np.add.at(want_g, part[keep, j], g[keep])
            want[:, c * dim:(c + 1) * dim] *= f[:, None]
        np.testing.assert_allclose(out[key + "-fwd"], want, rtol=1e-4,
                                   atol=1e-5)
        np.testing.assert_allclose(out[key + "-grad"], want_g, rtol=1e-4,
                                   atol=1e-4)
np.savez(sys.argv[2], **out)
print("ok", tf.config.threading.get_intra_op_parallelism_threads())
"""


def test_combines_are_the_same_on_any_number_of_threads(tmp_path):
    """The combine kernels split a large batch into parts (one per thread,
    each owning a range of output rows, its entries listed and fetched
    ahead). On 1 and on 3 threads, for ragged segments in the layer's order
    and in any order and for a dense block of mixed widths, every output
    equals a float64 reference and the two runs are bit-identical (each
    row's sum is taken in entry order)."""
    script = tmp_path / "split_combines.py"
    script.write_text(_SPLIT_COMBINES)
    got = []
    for threads in (1, 3):
        path = tmp_path / f"out{threads}.npz"
        out = forkrun.run([sys.executable, str(script), str(threads),
                           str(path)], capture_output=True, text=True,
                          timeout=300, script_imports_tnet=True)
        assert out.returncode == 0, out.stderr[-3000:]
        assert f"ok {threads}" in out.stdout
        got.append(np.load(path))
    assert len(got[0].files) == 32
    for key in got[0].files:
        np.testing.assert_array_equal(got[0][key], got[1][key], err_msg=key)


@pytest.mark.parametrize("dtype", [tf.int64, tf.int32])
@pytest.mark.parametrize("lengths", [[], [0], [0, 0, 3], [5, 0, 0, 1, 0],
                                     "random"])
def test_row_ids_equal_value_rowids(dtype, lengths):
    if lengths == "random":
        lengths = RNG.integers(0, 51, 4096)
        lengths[RNG.random(4096) < 0.1] = 0
    lengths = np.asarray(lengths, np.int64)
    ragged = tf.RaggedTensor.from_row_lengths(
        tf.range(int(lengths.sum()), dtype=tf.int64), tf.cast(lengths, dtype))
    got = _ops.tnet_row_ids(ragged.row_splits)
    assert got.dtype == tf.int64
    np.testing.assert_array_equal(got.numpy(), ragged.value_rowids().numpy())


@pytest.mark.parametrize("dtype", ["int64", "int32", "string"])
@pytest.mark.parametrize("shape", [(0, 5), (4, 0), (1, 1), (7, 4),
                                   (4096, 50)])
def test_compact_ids_equal_ragged_boolean_mask(dtype, shape):
    """TnetCompactIds drops exactly the padding (-1 / "") of a [B, L]
    block: the flat values and row ids of tf.ragged.boolean_mask."""
    ids = RNG.integers(-1, 9, shape)
    ids[RNG.random(shape) < 0.4] = -1
    if shape[0] > 2:
        ids[1] = -1  # an all-padding row
    if dtype == "string":
        t = tf.constant(np.where(ids < 0, "", ids.astype(str)).astype(object),
                        tf.string) if ids.size else tf.zeros(shape, tf.string)
    else:
        t = tf.constant(ids, dtype)
    values, rows = _ops.tnet_compact_ids(t)
    want = tf.ragged.boolean_mask(t, tn.feature_column.not_padding(t))
    assert values.dtype == t.dtype and rows.dtype == tf.int64
    np.testing.assert_array_equal(values.numpy(), want.flat_values.numpy())
    np.testing.assert_array_equal(rows.numpy(), want.value_rowids().numpy())


def test_compact_ids_rejects_a_non_matrix():
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError),
                       match="matrix|rank"):
        _ops.tnet_compact_ids(tf.constant([1, -1, 2], tf.int64))


@pytest.mark.parametrize("shards", [1, 2, 3, 7])
@pytest.mark.parametrize("n", [0, 5, 431_000])
def test_shard_order_groups_keys_by_shard_stably(shards, n):
    """TnetShardOrder: numpy's stable sort by floormod(key, shards) of a
    dedup's result; idx renumbered (padding -1 kept), counts moved with
    their keys, sizes per shard."""
    keys = RNG.integers(-2**62, 2**62, max(n // 4, 1) if n else 0)
    keys[: len(keys) // 3] = RNG.integers(-50, 50, len(keys) // 3)
    uniq, first = np.unique(keys, return_index=True)
    uniq = keys[np.sort(first)]  # first-occurrence order, as TnetUnique
    idx = RNG.integers(-1, len(uniq), n).astype(np.int32) if len(uniq) \
        else np.full(n, -1, np.int32)
    counts = RNG.random(len(uniq)).astype(np.float32)
    got = _ops.tnet_shard_order(uniq, idx, counts, num_shards=shards)
    shard = np.mod(uniq, shards)
    order = np.argsort(shard, kind="stable")
    pos = np.empty(len(uniq), np.int64)
    pos[order] = np.arange(len(uniq))
    np.testing.assert_array_equal(got.grouped_keys.numpy(), uniq[order])
    np.testing.assert_array_equal(got.grouped_counts.numpy(), counts[order])
    np.testing.assert_array_equal(
        got.grouped_idx.numpy(), np.where(idx < 0, -1, pos[np.maximum(idx, 0)]))
    np.testing.assert_array_equal(got.sizes.numpy(),
                                  np.bincount(shard, minlength=shards))
    np.testing.assert_array_equal(  # what the table's route would give
        np.mod(got.grouped_keys.numpy(), shards),
        tf.math.floormod(got.grouped_keys, shards).numpy())


@pytest.mark.parametrize("idx, counts, message", [
    ([0, 3], [1.0, 1.0], r"idx\[1\] = 3 is not in \[-1, 2\)"),
    ([0, -2], [1.0, 1.0], r"idx\[1\] = -2"),
    ([0], [1.0], "one entry per key")])
def test_shard_order_rejects_bad_input(idx, counts, message):
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        _ops.tnet_shard_order(tf.constant([4, 9], tf.int64),
                              tf.constant(idx, tf.int32),
                              tf.constant(counts, tf.float32), num_shards=2)


@pytest.mark.parametrize("splits, message", [
    ([], "non-empty"), ([3, 4], r"row_splits\[0\] must be 0"),
    ([0, 4, 2], "must not decrease"), ([0, 2**40], "at most 2.31 - 1")])
def test_row_ids_reject_bad_splits(splits, message):
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        _ops.tnet_row_ids(tf.constant(splits, tf.int64))


def test_ragged_rows_use_the_kernel_in_training_and_stock_ops_in_serving():
    column = tn.feature_column.category_column("m", dtype=tf.int64)
    ids = tf.ragged.constant([[3, 4], [], [5, -1, 6]], dtype=tf.int64)

    def rows_and_ops():
        graph = tf.function(
            lambda: tn.feature_column.ids_to_masked_keys(column, ids)[1]
        ).get_concrete_function().graph
        return graph, {op.type for op in graph.get_operations()}

    graph, types = rows_and_ops()
    assert "TnetRowIds" in types
    with scopes.serving_lookups({object(): None}):  # any table: serving
        assert scopes.serving_active()
        _, serving_types = rows_and_ops()
    assert "TnetRowIds" not in serving_types
    np.testing.assert_array_equal(
        tn.feature_column.ids_to_masked_keys(column, ids)[1].numpy(),
        [0, 0, 2, 2, 2])
