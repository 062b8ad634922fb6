"""SparseTable behaviour: initialization, inference pulls, export/import,
eviction and memory, checkpoints and SavedModels, concurrency."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import tensorflow as tf

import tnet as tn
from tnet import _ops


def _sorted_export(table):
    keys, weights, slots, meta = (t.numpy() for t in table.export())
    order = np.argsort(keys)
    return keys[order], weights[order], slots[order], meta[order]


def _assert_same_rows(a, b):
    for x, y in zip(_sorted_export(a), _sorted_export(b)):
        np.testing.assert_array_equal(x, y)


# ------------------------------------------------------------ initialization
def test_initial_values_independent_of_order_and_shards():
    keys = np.random.default_rng(0).integers(-2**62, 2**62, 500)
    a = tn.SparseTable("a", 8, num_shards=1, seed=3)
    b = tn.SparseTable("b", 8, num_shards=3, seed=3)
    first = a.pull(keys, training=True).numpy()
    # Other order, other batch split, other shard count: same values.
    rev = keys[::-1]
    second = np.concatenate([b.pull(rev[:123], training=True).numpy(),
                             b.pull(rev[123:], training=True).numpy()])[::-1]
    np.testing.assert_array_equal(first, second)
    c = tn.SparseTable("c", 8, seed=4)
    assert not np.allclose(first, c.pull(keys, training=True).numpy())


@pytest.mark.parametrize("init,check", [
    ("zeros", lambda w: np.all(w == 0)),
    ({"name": "constant", "value": 0.25}, lambda w: np.all(w == 0.25)),
    (tf.keras.initializers.RandomUniform(-0.1, 0.3),
     lambda w: w.min() >= -0.1 and w.max() < 0.3 and abs(w.mean() - 0.1) < 0.01),
    (tf.keras.initializers.TruncatedNormal(0.0, 0.1),
     lambda w: np.abs(w).max() <= 0.2 + 1e-6 and abs(w.std() - 0.088) < 0.005),
    (tf.keras.initializers.RandomNormal(1.0, 0.5),
     lambda w: abs(w.mean() - 1.0) < 0.02 and abs(w.std() - 0.5) < 0.02),
])
def test_initializer_kinds(init, check):
    table = tn.SparseTable("init", 16, initializer=init)
    w = table.pull(np.arange(5000), training=True).numpy()
    assert check(w), (w.min(), w.max(), w.mean(), w.std())


def _normal_cdf(z):
    z = tf.constant(np.asarray(z, np.float64) / np.sqrt(2.0))
    return 0.5 * (1.0 + tf.math.erf(z).numpy())


@pytest.mark.parametrize("kind", ["normal", "truncated_normal"])
def test_normal_initializers_follow_their_distribution(kind):
    """The keyed ziggurat draws are the normal (or the normal truncated at
    two standard deviations, as Keras's TruncatedNormal): Kolmogorov-Smirnov
    and a binned chi-square over 6.4M weights against the exact CDF, the
    mass beyond the ziggurat's base strip (|z| > 3.44, drawn by its own
    tail method) and how it spreads (beyond 4), and no correlation between
    the weights of a row."""
    mean, stddev = 0.5, 2.0
    init = (tf.keras.initializers.RandomNormal(mean, stddev)
            if kind == "normal"
            else tf.keras.initializers.TruncatedNormal(mean, stddev))
    table = tn.SparseTable("dist", 16, initializer=init, seed=11)
    w = table.pull(np.arange(400_000) * 7919 - 3, training=True).numpy()
    z = (w.astype(np.float64) - mean) / stddev
    flat = np.sort(z.ravel())
    n = flat.size
    lo = -2.0 if kind == "truncated_normal" else -np.inf
    if kind == "truncated_normal":
        assert flat[0] >= -2.0 - 1e-6 and flat[-1] <= 2.0 + 1e-6
        mass = _normal_cdf(2.0) - _normal_cdf(-2.0)
        cdf = lambda x: (_normal_cdf(x) - _normal_cdf(-2.0)) / mass  # noqa: E731
    else:
        cdf = _normal_cdf
    expected = cdf(flat)
    ks = max(np.max(np.arange(1, n + 1) / n - expected),
             np.max(expected - np.arange(n) / n))
    assert ks < 1.95 / np.sqrt(n), ks  # alpha 0.001
    edges = np.linspace(max(lo, -4.0), -max(lo, -4.0), 201)
    counts = np.histogram(flat, edges)[0]
    want = n * np.diff(cdf(edges))
    chi2 = np.sum((counts - want) ** 2 / want)
    assert chi2 < 200 + 5 * np.sqrt(2 * 200), chi2  # 200 bins
    if kind == "normal":
        r = 3.442619855896652
        tail = 2 * n * (1 - _normal_cdf(r))
        seen = np.sum(np.abs(flat) > r)
        assert abs(seen - tail) < 5 * np.sqrt(tail), (seen, tail)
        # Within the tail: the share beyond 4 (0.11; 0.15 were the tail's
        # exponential proposal kept without its test).
        share = (1 - _normal_cdf(4.0)) / (1 - _normal_cdf(r))
        got = np.sum(np.abs(flat) > 4.0) / seen
        assert abs(got - share) < 5 * np.sqrt(share * (1 - share) / seen), (
            got, share)
    corr = np.corrcoef(z, rowvar=False)
    off = corr[~np.eye(16, dtype=bool)]
    assert np.max(np.abs(off)) < 5 / np.sqrt(z.shape[0]), np.max(np.abs(off))


def test_default_initializer_zeros_for_dim_1_small_normal_otherwise():
    """The measured default (BENCHMARKS.md "Defaults"): a dim-1 row is a
    linear weight and starts at 0; wider rows start normal, stddev 0.01."""
    keys = np.arange(20_000)
    w1 = tn.SparseTable("d1", 1).pull(keys, training=True).numpy()
    assert np.all(w1 == 0)
    w8 = tn.SparseTable("d8", 8).pull(keys, training=True).numpy()
    assert abs(w8.mean()) < 0.0005 and abs(w8.std() - 0.01) < 0.0005
    assert not np.any(w8 == 0)


def test_a_columns_own_initializer_is_kept():
    col = tn.feature_column.embedding_column(
        tn.feature_column.category_column("c"), 1,
        initializer={"name": "constant", "value": 0.5})
    layer = tn.layers.EmbeddingFeatures([col])
    out = layer({"c": tf.constant([3, 4], tf.int64)}, training=True).numpy()
    np.testing.assert_array_equal(out, [[0.5], [0.5]])


def test_bad_initializer_is_a_clear_error():
    with pytest.raises(ValueError, match="unsupported initializer"):
        tn.SparseTable("x", 4, initializer="glorot_uniform")


# ------------------------------------------------------------ pull semantics
def test_inference_pull_inserts_nothing_and_reads_zeros():
    table = tn.SparseTable("inf", 4, num_shards=2)
    known = table.pull([1, 2, 3], training=True).numpy()
    assert int(table.size()) == 3
    got = table.pull([3, 99, 1, -5], training=False).numpy()
    assert int(table.size()) == 3
    np.testing.assert_array_equal(got[0], known[2])
    np.testing.assert_array_equal(got[2], known[0])
    np.testing.assert_array_equal(got[[1, 3]], np.zeros((2, 4)))


def test_pull_keeps_key_shape_and_works_in_tf_function():
    table = tn.SparseTable("shape", 3, num_shards=2)

    @tf.function
    def f(k):
        return table.pull(k, training=True)

    out = f(tf.constant([[1, 2], [3, 1]], tf.int64))
    assert out.shape == (2, 2, 3)
    np.testing.assert_array_equal(out[0, 0], out[1, 1])
    assert int(table.size()) == 3


# ------------------------------------------------------------ export/import
def _trained_table(name, num_shards=2, optimizer="adagrad", n=3000):
    table = tn.SparseTable(name, 6, optimizer, num_shards=num_shards)
    rng = np.random.default_rng(1)
    for step in range(1, 6):
        keys = rng.integers(0, n, 700)
        table.pull(keys, training=True)
        table.push(keys, rng.normal(size=(700, 6)).astype(np.float32),
                   learning_rate=0.1, step=step,
                   clicks=(rng.random(700) < 0.3).astype(np.float32))
    return table


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "adam", "ftrl",
                                       "rowwise_adagrad"])
def test_export_import_round_trip_is_bit_exact(optimizer):
    src = _trained_table("src", optimizer=optimizer)
    dst = tn.SparseTable("dst", 6, optimizer, num_shards=3)
    dst.import_rows(*src.export())
    _assert_same_rows(src, dst)
    keys = np.arange(3000)
    np.testing.assert_array_equal(src.pull(keys).numpy(), dst.pull(keys).numpy())


def test_export_cursor_returns_each_row_once_in_chunks():
    table = _trained_table("cur", num_shards=1)
    seen, cursor, calls = [], 0, 0
    while cursor != -1:
        keys, w, s, m, cursor = table.export_shard(0, cursor, max_rows=97)
        assert len(keys) <= 97
        seen.extend(keys.numpy().tolist())
        cursor = int(cursor)
        calls += 1
    assert len(seen) == len(set(seen)) == int(table.size())
    assert calls >= int(table.size()) // 97


@pytest.mark.parametrize("since", [None, 3])
def test_weights_only_export_is_the_full_export_without_slots_and_meta(since):
    """export_shard(weights_only=True): the same keys and weights, chunk by
    chunk and cursor for cursor, as the full export; slots and meta come
    back with no columns (in a traced function too)."""
    table = _trained_table("wonly", num_shards=1, optimizer="adam")
    cursor = cursor_w = 0
    while cursor != -1:
        k, w, s, m, cursor = table.export_shard(0, cursor, 97, since_step=since)
        kw, ww, sw, mw, cursor_w = table.export_shard(
            0, cursor_w, 97, since_step=since, weights_only=True)
        cursor, cursor_w = int(cursor), int(cursor_w)
        assert cursor == cursor_w
        np.testing.assert_array_equal(k.numpy(), kw.numpy())
        np.testing.assert_array_equal(w.numpy(), ww.numpy())
        assert s.shape[1] == table.num_slots > 0 and m.shape[1] == 3
        assert sw.shape == (len(k), 0) and mw.shape == (len(k), 0)
        if since is not None:
            assert (m.numpy()[:, 2] > since).all()

    @tf.function
    def chunk():
        return table.export_shard(0, 0, 50, weights_only=True)

    k, w, s, m, _ = chunk()
    assert s.shape == (50, 0) and m.shape == (50, 0) and w.shape == (50, 6)
    assert chunk.get_concrete_function().structured_outputs[3].shape[1] == 0


def test_export_meta_counts_shows_clicks_and_last_step():
    table = tn.SparseTable("meta", 2)
    table.push([5, 5, 6], np.zeros((3, 2), np.float32), step=7,
               clicks=[1.0, 0.0, 1.0])
    table.push([6], np.zeros((1, 2), np.float32), step=9, shows=[3.0])
    keys, _, _, meta = _sorted_export(table)
    np.testing.assert_array_equal(keys, [5, 6])
    np.testing.assert_array_equal(meta, [[2, 1, 7], [4, 1, 9]])


# ------------------------------------------------------------ eviction
def test_eviction_rules_match_a_python_model():
    table = tn.SparseTable("ev", 2, num_shards=2)
    rng = np.random.default_rng(2)
    model = {}  # key -> [show, last_step]
    for step in range(1, 30):
        keys = np.unique(rng.integers(0, 400, 60))
        shows = rng.integers(1, 4, len(keys)).astype(np.float32)
        table.push(keys, np.zeros((len(keys), 2), np.float32), step=step,
                   shows=shows)
        for k, s in zip(keys, shows):
            row = model.setdefault(int(k), [0.0, 0])
            row[0] += float(s)
            row[1] = step
    decay, threshold, ttl, now = 0.5, 1.2, 10, 30
    expected = set()
    for k, (show, last) in model.items():
        show = np.float32(np.float32(show) * np.float32(decay))
        if show < np.float32(threshold) or now - last > ttl:
            expected.add(k)
    before = set(_sorted_export(table)[0].tolist())
    evicted = int(table.evict(decay, threshold, ttl_steps=ttl, current_step=now))
    after = set(_sorted_export(table)[0].tolist())
    assert before - after == expected
    assert evicted == len(expected) > 0
    assert int(table.size()) == len(model) - len(expected)


def test_ttl_evicts_exactly_rows_not_updated_for_n_steps():
    table = tn.SparseTable("ttl", 2, initializer="zeros")
    for step in range(10):
        table.push([step], [[0.0, 0.0]], step=step)
    table.evict(ttl_steps=3, current_step=9)  # keeps steps 6..9
    assert sorted(_sorted_export(table)[0].tolist()) == [6, 7, 8, 9]


def test_eviction_frees_memory_and_rows_are_reused():
    table = tn.SparseTable("mem", 8, "adagrad", num_stripes=8)
    keys = np.arange(200_000)
    for chunk in np.array_split(keys, 4):
        table.pull(chunk, training=True)
    full = int(table.memory_bytes())
    # Keep one key in 64: most rows, whole arena chunks and index go away.
    keep = keys[::64]
    table.push(keep, np.zeros((len(keep), 8), np.float32), shows=np.full(len(keep), 5.0))
    assert int(table.evict(1.0, 2.0)) == len(keys) - len(keep)
    assert int(table.size()) == len(keep)
    after = int(table.memory_bytes())
    assert after < 0.6 * full, (full, after)
    # New keys reuse freed rows: memory comes back no higher than before.
    fresh = np.arange(10**9, 10**9 + len(keys) - len(keep))
    table.pull(fresh, training=True)
    assert int(table.size()) == len(keys)
    assert int(table.memory_bytes()) <= full * 1.02


def test_evicted_key_starts_again_from_initializer():
    table = tn.SparseTable("again", 4, "sgd", seed=9)
    initial = table.pull([42], training=True).numpy()
    table.push([42], np.ones((1, 4), np.float32), learning_rate=1.0)
    assert not np.array_equal(table.pull([42]).numpy(), initial)
    table.evict(0.0, 1.0)  # clears everything
    assert int(table.size()) == 0
    np.testing.assert_array_equal(table.pull([42]).numpy(), np.zeros((1, 4)))
    np.testing.assert_array_equal(table.pull([42], training=True).numpy(), initial)


# ------------------------------------------------------------ index tags
_M64 = (1 << 64) - 1
_C1, _C2 = 0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53


def _unmix64(h: int) -> int:
    """Inverse of the table's Mix64 (murmur3 fmix64): the int64 key whose
    hash is h. x ^= x >> 33 is its own inverse on 64 bits."""
    x = h ^ (h >> 33)
    x = (x * pow(_C2, -1, 1 << 64)) & _M64
    x ^= x >> 33
    x = (x * pow(_C1, -1, 1 << 64)) & _M64
    x ^= x >> 33
    return x - (1 << 64) if x >> 63 else x


@pytest.mark.parametrize("compact", [False, True])
def test_keys_with_equal_index_tags_stay_distinct(compact):
    """The index stores a 32-bit hash tag per key, not the key: keys whose
    hashes share the low 32 bits (same tag and home slot) and the top bits
    (same stripe) are told apart by the key in the row, through inserts,
    pulls, pushes, eviction with backward shifts and compaction."""
    tag = 0x9E3779B9
    colliding = np.array([_unmix64((1 << 62) | (j << 32) | tag)
                          for j in range(1, 13)], np.int64)
    other = np.arange(-300, 300, dtype=np.int64)
    keys = np.concatenate([colliding, other])
    ref = tn.SparseTable("tags_ref", 4, "sgd", seed=5, num_stripes=4)
    alone = np.concatenate([ref.pull([k], training=True).numpy() for k in keys])
    table = tn.SparseTable("tags", 4, "sgd", seed=5, num_stripes=4)
    np.testing.assert_array_equal(
        table.pull(keys[::-1], training=True).numpy()[::-1], alone)
    assert int(table.size()) == len(keys)
    # Distinct updates per key, duplicates in the batch included.
    grads = np.arange(len(keys) * 4, dtype=np.float32).reshape(-1, 4)
    shows = np.where(np.arange(len(keys)) % 3 == 0, 0.0, 5.0).astype(np.float32)
    table.push(np.concatenate([keys, colliding]),
               np.concatenate([grads, grads[:len(colliding)]]),
               learning_rate=1.0,
               shows=np.concatenate([shows, shows[:len(colliding)]]))
    summed = grads.copy()
    summed[:len(colliding)] *= 2  # the table sums duplicates first
    want = alone - summed
    np.testing.assert_array_equal(table.pull(keys).numpy(), want)
    # Evict every third key (shows 0; duplicates doubled the others).
    evicted = int(table.evict(1.0, 1.0, compact=compact))
    gone = shows == 0
    assert evicted == int(gone.sum())
    got = table.pull(keys).numpy()
    np.testing.assert_array_equal(got[~gone], want[~gone])
    assert not got[gone].any()
    assert set(_sorted_export(table)[0].tolist()) == set(keys[~gone].tolist())
    # Evicted colliding keys come back from the initializer.
    np.testing.assert_array_equal(
        table.pull(keys[gone], training=True).numpy(), alone[gone])
    assert int(table.size()) == len(keys)


# ------------------------------------------------------------ saving
class _Holder(tf.Module):
    def __init__(self, table):
        super().__init__()
        self.table = table

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def lookup(self, keys):
        return self.table.pull(keys, training=False)


def test_tf_checkpoint_round_trip(tmp_path):
    src = _trained_table("ckpt", num_shards=2)
    path = tf.train.Checkpoint(m=_Holder(src)).write(str(tmp_path / "ck"))
    dst = tn.SparseTable("ckpt", 6, "adagrad", num_shards=2)
    dst.pull([123456789], training=True)  # a row the checkpoint must remove
    tf.train.Checkpoint(m=_Holder(dst)).read(path).assert_consumed()
    _assert_same_rows(src, dst)


def test_saved_model_round_trip(tmp_path):
    src = _trained_table("sm", num_shards=2)
    keys = np.arange(-5, 3005)
    want = src.pull(keys).numpy()
    tf.saved_model.save(_Holder(src), str(tmp_path / "sm"))
    loaded = tf.saved_model.load(str(tmp_path / "sm"))
    np.testing.assert_array_equal(loaded.lookup(keys).numpy(), want)


# ------------------------------------------------------------ concurrency
def test_concurrent_pushes_lose_no_update():
    """8 threads push exact powers of two to overlapping keys: the final
    weights are exactly minus the sum of everything pushed."""
    table = tn.SparseTable("conc", 4, "sgd", initializer="zeros",
                           num_stripes=4)
    keyspace = np.arange(64, dtype=np.int64)
    table.pull(keyspace, training=True)
    totals = np.zeros((8, 64, 4), np.float64)

    def worker(t):
        rng = np.random.default_rng(100 + t)
        for _ in range(150):
            keys = rng.choice(keyspace, 48, replace=True)
            grads = (2.0 ** rng.integers(-3, 3, (48, 4))).astype(np.float32)
            table.push(keys, grads, learning_rate=1.0)
            np.add.at(totals[t], keys, grads)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    np.testing.assert_array_equal(table.pull(keyspace).numpy(),
                                  -totals.sum(axis=0).astype(np.float32))


def test_destroyed_table_handle_is_an_error():
    table = tn.SparseTable("gone", 2)
    handle = table.shards[0].resource_handle
    tf.raw_ops.DestroyResourceOp(resource=handle)
    with pytest.raises(tf.errors.InvalidArgumentError, match="live tnet"):
        _ops.sparse_table_pull(handle, [1], True, dim=2)


@pytest.mark.parametrize("num_shards", [1, 3])
def test_push_over_the_pulls_route_equals_a_push_of_the_keys(num_shards):
    """pull_rows routes the keys once; push_rows sends the gradients back
    over that route (what a training step does). The rows after it equal
    a twin table's after an ordinary pull + push of the same keys."""
    rng = np.random.default_rng(5)
    keys = tf.constant(np.unique(rng.integers(-10**6, 10**6, 500)))
    grads = tf.constant(rng.normal(0, 0.1, (len(keys), 4)), tf.float32)
    shows = tf.constant(rng.integers(1, 4, len(keys)), tf.float32)
    a = tn.SparseTable("route_a", 4, num_shards=num_shards, seed=1,
                       optimizer=tn.optimizer.Adagrad(0.1))
    b = tn.SparseTable("route_b", 4, num_shards=num_shards, seed=1,
                       optimizer=tn.optimizer.Adagrad(0.1))
    batch = a.pull_rows(keys, training=True)
    np.testing.assert_array_equal(batch.rows.numpy(),
                                  b.pull(keys, training=True).numpy())
    np.testing.assert_array_equal(batch.keys.numpy(), keys.numpy())
    a.push_rows(batch, grads, step=1, shows=shows, unique_keys=True)
    b.push(keys, grads, step=1, shows=shows, unique_keys=True)
    np.testing.assert_array_equal(a.pull(keys).numpy(), b.pull(keys).numpy())
    assert not np.array_equal(a.pull(keys).numpy(), batch.rows.numpy())


@pytest.mark.parametrize("dim", [1, 8, 16])
def test_sharded_pull_push_import_equal_one_shard(dim):
    """A 3-shard table splits rows by the route's positions and puts the
    pulled rows back in the keys' order (dynamic_stitch up to dim 8, a
    gather through the inverse permutation above): pulls with repeated
    keys, pushes with shows and clicks, and import_rows give exactly what
    a one-shard table gives. A gradient with a row per key too many is
    an error, not a silent partial push."""
    rng = np.random.default_rng(dim)
    keys = rng.integers(-10**6, 10**6, 3000)
    uniq = np.unique(keys)
    rng.shuffle(uniq)
    grads = rng.normal(0, 0.1, (len(uniq), dim)).astype(np.float32)
    shows = rng.integers(1, 4, len(uniq)).astype(np.float32)
    clicks = rng.integers(0, 2, len(uniq)).astype(np.float32)
    one, three = (tn.SparseTable(f"shards{n}_{dim}", dim, "adagrad",
                                 num_shards=n, seed=2) for n in (1, 3))
    np.testing.assert_array_equal(three.pull(keys, training=True).numpy(),
                                  one.pull(keys, training=True).numpy())
    for t in (one, three):
        t.push(uniq, grads, learning_rate=0.1, step=3, shows=shows,
               clicks=clicks, unique_keys=True)
    np.testing.assert_array_equal(three.pull(keys).numpy(),
                                  one.pull(keys).numpy())
    _assert_same_rows(one, three)
    copy = tn.SparseTable(f"shards_copy_{dim}", dim, "adagrad", num_shards=3)
    copy.import_rows(*one.export())
    _assert_same_rows(one, copy)
    with pytest.raises(ValueError, match="one row per key"):
        three.push(uniq, np.zeros((len(uniq) + 1, dim), np.float32),
                   learning_rate=0.1)
    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64),
                                  tf.TensorSpec([None, dim], tf.float32)])
    def push(k, g):
        three.push(k, g, learning_rate=0.1)
    with pytest.raises(tf.errors.InvalidArgumentError, match="one row per key"):
        push(uniq, np.zeros((len(uniq) + 1, dim), np.float32))


@pytest.mark.parametrize("dim", [1, 16])
def test_shard_ordered_route_equals_one_shard(dim):
    """`shard_order` groups a dedup's keys by shard; a pull and push over
    that route (slices, no partition or stitch) leave a 3-shard table
    exactly as a one-shard table fed the original order, and the rows
    and counts come back aligned with the renumbered idx; each slice holds
    only keys its shard owns (floormod, as `route`)."""
    rng = np.random.default_rng(dim + 7)
    ids = rng.integers(-10**6, 10**6, 4000)
    uniq, idx, counts = (t.numpy() for t in _ops.tnet_unique(
        ids, tf.zeros([0], tf.bool)))
    grads = rng.normal(0, 0.1, (len(uniq), dim)).astype(np.float32)
    one, three = (tn.SparseTable(f"ordered{n}_{dim}", dim, "adagrad",
                                 num_shards=n, seed=4) for n in (1, 3))
    want = one.pull_rows(uniq, training=True).rows.numpy()
    route, gidx, gcounts = three.shard_order(uniq, idx, counts)
    assert route.sizes is not None and route.where is None
    got = three.pull_rows(route, training=True).rows.numpy()
    # per id, the same row and count through either numbering
    np.testing.assert_array_equal(got[gidx.numpy()], want[idx])
    np.testing.assert_array_equal(gcounts.numpy()[gidx.numpy()], counts[idx])
    order = np.argsort(np.mod(uniq, 3), kind="stable")
    one.push(uniq, grads, learning_rate=0.1, step=2, shows=counts,
             unique_keys=True)
    three.push_rows(route, grads[order], learning_rate=0.1, step=2,
                    shows=gcounts, unique_keys=True)
    _assert_same_rows(one, three)
    for i, part in enumerate(route.parts):  # each slice on its own shard
        assert np.all(np.mod(part.numpy(), 3) == i)


@pytest.mark.parametrize("between", ["permuted", "other_keys", "none"])
def test_push_after_a_pull_of_other_keys_updates_the_right_rows(between):
    """A shard keeps its last training pull's grouping of the keys by
    stripe for the push of the same keys. A push whose keys are the same
    length but not the same (another worker's pull came between, the same
    keys in another order, other keys) must group its own keys: the rows
    after it equal those of a twin table whose push groups from scratch."""
    rng = np.random.default_rng(11)
    keys = np.unique(rng.integers(-10**6, 10**6, 3000))
    rng.shuffle(keys)
    other = {"permuted": rng.permutation(keys),
             "other_keys": np.unique(rng.integers(2 * 10**6, 3 * 10**6,
                                                  len(keys) * 2))[:len(keys)],
             "none": None}[between]
    grads = rng.normal(0, 0.1, (len(keys), 8)).astype(np.float32)
    shows = rng.integers(1, 4, len(keys)).astype(np.float32)
    tables = [tn.SparseTable(f"kept_{between}_{i}", 8, seed=3,
                             optimizer=tn.optimizer.Adagrad(0.1))
              for i in range(2)]
    for t in tables:
        t.pull(keys, training=True)
        if other is not None:
            t.pull(other, training=True)
    before = tables[0].pull(keys).numpy()
    # Table 1 pushes the keys in reverse order: no kept grouping matches, it
    # groups from scratch every time.
    for step in (1, 2):
        tables[0].push(keys, grads * step, learning_rate=0.1, step=step,
                       shows=shows, unique_keys=True)
        tables[1].push(keys[::-1].copy(), (grads * step)[::-1].copy(),
                       learning_rate=0.1, step=step, shows=shows[::-1].copy(),
                       unique_keys=True)
        tables[0].pull(keys, training=True)  # keep a grouping again
        tables[1].pull(keys, training=True)
    after = tables[0].pull(keys).numpy()
    np.testing.assert_array_equal(after, tables[1].pull(keys).numpy())
    assert not np.array_equal(after, before)


@pytest.mark.parametrize("between", ["evicted", "evicted_then_reused",
                                     "compacted", "compacted_then_reused"])
def test_push_after_its_pull_finds_rows_freed_or_moved_between(between):
    """A training pull keeps the row id of every key it found for the push
    of the same keys, which then skips the index. Rows freed, reused by
    other keys or moved between that pull and its push must not take the
    gradient of a key they no longer hold: the table after the push equals
    a twin's whose push looks every key up (its keys in another order, so
    nothing kept matches)."""
    rng = np.random.default_rng(12)
    keys = np.unique(rng.integers(-10**6, 10**6, 4000))
    rng.shuffle(keys)
    old, new = keys[:1500], keys[1500:]
    extra = np.unique(rng.integers(2 * 10**6, 3 * 10**6, 1200))
    grads = rng.normal(0, 0.1, (len(keys), 8)).astype(np.float32)
    tables = [tn.SparseTable(f"hint_{between}_{i}", 8, seed=5,
                             optimizer=tn.optimizer.Adagrad(0.1))
              for i in range(2)]
    for t in tables:
        t.pull(old, training=True)
        t.push(old, grads[:1500], learning_rate=0.1, step=1, unique_keys=True)
        t.pull(new, training=True)
        t.push(new, grads[1500:], learning_rate=0.1, step=5, unique_keys=True)
        t.pull(keys, training=True)  # the pull whose row ids are kept
        # Frees the rows of `old` (last step 1) but none of `new` (5).
        assert int(t.evict(ttl_steps=2, current_step=6,
                           compact=between.startswith("compacted"))) == 1500
        if between.endswith("reused"):  # other keys take the freed ids
            t.import_rows(extra, np.full((len(extra), 8), 0.5, np.float32),
                          np.full((len(extra), 8), 0.25, np.float32),
                          np.tile([[2.0, 1.0, 6.0]], (len(extra), 1)))
    tables[0].push(keys, grads, learning_rate=0.1, step=7, unique_keys=True)
    tables[1].push(keys[::-1].copy(), grads[::-1].copy(), learning_rate=0.1,
                   step=7, unique_keys=True)
    every = np.concatenate([keys, extra])
    assert int(tables[0].size()) == int(tables[1].size())
    for a, b in zip(tables[0].export(), tables[1].export()):
        a, b = a.numpy(), b.numpy()
        assert a.shape == b.shape
    got, want = (t.pull(every).numpy() for t in tables)
    np.testing.assert_array_equal(got, want)
    ka, _, sa, ma = tables[0].export()
    kb, _, sb, mb = tables[1].export()
    oa, ob = np.argsort(ka.numpy()), np.argsort(kb.numpy())
    np.testing.assert_array_equal(ka.numpy()[oa], kb.numpy()[ob])
    np.testing.assert_array_equal(sa.numpy()[oa], sb.numpy()[ob])
    np.testing.assert_array_equal(ma.numpy()[oa], mb.numpy()[ob])
