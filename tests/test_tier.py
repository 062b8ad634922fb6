"""The disk tier (SparseTable(memory_budget_bytes=..., storage_dir=...)):
a tiered table is the same table as an in-memory one, operation by
operation, for every rule and lifecycle option; checkpoints move between
the two; a kill -9 leaves nothing on disk and loses nothing checkpointed;
the table and optimizer tests pass with every table tiered."""
from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import tnet as tn

ROOT = pathlib.Path(__file__).resolve().parents[1]
RULES = ["sgd", "adagrad", "rowwise_adagrad", "adam", "ftrl"]
LIFECYCLES = {
    "plain": {},
    "min_count": {"min_count": 2},
    "max_rows": {"max_rows": 3000},
    "decay_ttl": {},  # evict() with decay and TTL every few steps
}
DIM = 8


def _export(table):
    keys, weights, slots, meta = (t.numpy() for t in table.export())
    order = np.argsort(keys)
    return keys[order], weights[order], slots[order], meta[order]


def _assert_same(a, b, what):
    for name, x, y in zip(("keys", "weights", "slots", "meta"),
                          _export(a), _export(b)):
        np.testing.assert_array_equal(x, y, err_msg=f"{what}: {name}")


def _zipf_batches(steps, batch, ids, seed):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        yield (rng.zipf(1.2, batch) % ids).astype(np.int64) * 7919 - 5


def _row_bytes(table):
    return 8 + 4 * (DIM + table.num_slots) + 16


@pytest.mark.parametrize("life", sorted(LIFECYCLES))
@pytest.mark.parametrize("rule", RULES)
def test_tiered_table_equals_the_in_memory_one(tmp_path, rule, life):
    """Same pushes, pulls, evictions, marks: every pull, the export (keys,
    weights, slots, meta), the counters, the pending admission state and
    the delta since a mark are identical, with ~1% of the rows in memory."""
    opts = LIFECYCLES[life]
    mem = tn.SparseTable(f"m_{rule}_{life}", DIM, rule, num_shards=2, **opts)
    probe = tn.SparseTable("probe", DIM, rule)
    budget = 2 * 64 * _row_bytes(probe)  # ~1 row per stripe, ~1% of rows
    tier = tn.SparseTable(f"t_{rule}_{life}", DIM, rule, num_shards=2,
                          memory_budget_bytes=budget,
                          storage_dir=str(tmp_path), **opts)
    rng = np.random.default_rng(1)
    for step, keys in enumerate(_zipf_batches(30, 600, 20_000, seed=7), 1):
        a = mem.pull(keys, training=True).numpy()
        b = tier.pull(keys, training=True).numpy()
        np.testing.assert_array_equal(a, b, err_msg=f"training pull {step}")
        grads = rng.normal(0, 0.1, (len(keys), DIM)).astype(np.float32)
        for t in (mem, tier):
            t.push(keys, grads, learning_rate=0.05, step=step)
        if step == 15:
            assert [m for _, m in mem.mark_changes()] == [
                m for _, m in tier.mark_changes()]
        if life == "decay_ttl" and step % 7 == 0:
            n = [int(t.evict(show_decay_rate=0.8, show_threshold=1.0,
                             ttl_steps=5, current_step=step))
                 for t in (mem, tier)]
            assert n[0] == n[1] and n[0] > 0, n
    unseen = np.arange(10**9, 10**9 + 50, dtype=np.int64)
    probe_keys = np.concatenate([keys, unseen])
    np.testing.assert_array_equal(mem.pull(probe_keys).numpy(),
                                  tier.pull(probe_keys).numpy())
    _assert_same(mem, tier, f"{rule}/{life}")
    sm, st = mem.stats(), tier.stats()
    for f in ("rows", "admitted", "rejected", "evicted", "pending",
              "pending_dropped", "cap_evicted"):
        assert sm[f] == st[f], (f, sm, st)
    assert st["tier_misses"] > 0 and st["tier_writebacks"] > 0, st
    # The hit rate since creation, from the shards' counters.
    shards = tier.shard_stats()
    lookups = sum(s["tier_lookups"] for s in shards)
    misses = sum(s["tier_misses"] for s in shards)
    assert 0 < misses < lookups
    assert st["tier_hit_rate"] == pytest.approx(1 - misses / lookups)
    assert sm["tier_hit_rate"] == 1.0 and sm["tier_lookups"] == 0
    assert st["tier_on_disk"] + st["tier_resident"] == st["rows"], st
    assert st["tier_resident"] <= 2 * 64, st  # one row per stripe
    assert st["tier_disk_bytes"] >= st["tier_on_disk"] * _row_bytes(probe)
    pm, pt = mem.export_pending(), tier.export_pending()
    for f in ("keys", "counts", "ages", "counters"):
        np.testing.assert_array_equal(np.asarray(pm[f]), np.asarray(pt[f]))
    for shard in range(2):
        cm, ct = mem.changes()[shard], tier.changes()[shard]
        assert cm["untracked"] == ct["untracked"]
        np.testing.assert_array_equal(np.sort(cm["deleted"]),
                                      np.sort(ct["deleted"]))
        mark = cm["mark"]
        da = [t.numpy() for t in mem.export_shard(shard, since_step=mark)[:4]]
        db = [t.numpy() for t in tier.export_shard(shard, since_step=mark)[:4]]
        oa, ob = np.argsort(da[0]), np.argsort(db[0])
        for x, y in zip(da, db):
            np.testing.assert_array_equal(x[oa], y[ob])


class _Holder(tf.Module):
    def __init__(self, table):
        super().__init__()
        self.table = table


@pytest.mark.parametrize("direction", ["tier_to_memory", "memory_to_tier"])
def test_checkpoints_move_between_tiered_and_in_memory_tables(tmp_path,
                                                              direction):
    tier_opts = {"memory_budget_bytes": 4096, "storage_dir": str(tmp_path)}
    src_opts, dst_opts = ((tier_opts, {}) if direction == "tier_to_memory"
                          else ({}, tier_opts))
    src = tn.SparseTable("ck", DIM, "adagrad", num_shards=2, **src_opts)
    rng = np.random.default_rng(3)
    for step, keys in enumerate(_zipf_batches(10, 500, 5000, seed=3), 1):
        src.pull(keys, training=True)
        src.push(keys, rng.normal(0, 1, (len(keys), DIM)).astype(np.float32),
                 learning_rate=0.1, step=step)
    path = tf.train.Checkpoint(m=_Holder(src)).write(str(tmp_path / "ck"))
    dst = tn.SparseTable("ck", DIM, "adagrad", num_shards=2, **dst_opts)
    dst.pull(np.arange(100, dtype=np.int64), training=True)  # stale rows
    tf.train.Checkpoint(m=_Holder(dst)).read(path).assert_consumed()
    _assert_same(src, dst, direction)


def test_bad_storage_dir_is_named(tmp_path):
    with pytest.raises(ValueError, match="needs storage_dir"):
        tn.SparseTable("t", 4, memory_budget_bytes=1 << 20)
    with pytest.raises(ValueError, match="memory_budget_bytes must be"):
        tn.SparseTable("t", 4, memory_budget_bytes=-5, storage_dir="/tmp")
    missing = tmp_path / "no" / "such"
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=f"storage_dir '{missing}'.*No such file"):
        tn.SparseTable("t", 4, memory_budget_bytes=1 << 20,
                       storage_dir=str(missing))



def test_a_full_disk_is_a_named_error_and_the_table_goes_on(tmp_path):
    """The tier's file cannot grow (a small filesystem, filled): the push
    that needs more disk fails with an error naming storage_dir, the process
    lives, no row is lost (the export holds every pushed key, the failed
    push's too), and once space is freed the table goes on."""
    if os.geteuid() != 0 or not _can_mount_tmpfs(tmp_path / "probe"):
        if os.environ.get("CI") == "true":
            pytest.fail("CI runs as root: a tmpfs must mount")
        pytest.skip("needs root to mount a small tmpfs")
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=80m", "tmpfs",
                    str(small)], check=True)
    try:
        filler = small / "filler"
        filler.write_bytes(b"\0" * (30 << 20))
        t = tn.SparseTable("full", 16, "adagrad", num_shards=1,
                           memory_budget_bytes=64 * 1024,
                           storage_dir=str(small))
        rng = np.random.default_rng(0)
        pushed = []

        def push(i):
            keys = np.arange(i * 1000, (i + 1) * 1000, dtype=np.int64)
            pushed.append(keys)
            t.push(keys, rng.normal(size=(1000, 16)).astype(np.float32),
                   step=i + 1)

        with pytest.raises(tf.errors.UnavailableError,
                           match=f"storage_dir '{small}'.*free disk space"):
            for i in range(400):
                push(i)
        assert len(pushed) > 100  # a first segment of the file was written
        want = np.concatenate(pushed)
        keys, weights, _, _ = (x.numpy() for x in t.export())
        assert set(keys.tolist()) == set(want.tolist())
        assert np.isfinite(weights).all()
        filler.unlink()
        for i in range(len(pushed), len(pushed) + 20):
            push(i)
        assert int(t.size()) == len(np.concatenate(pushed))
        assert t.stats()["tier_on_disk"] > 256 * 1024
        del t
    finally:
        if subprocess.run(["umount", str(small)]).returncode != 0:
            subprocess.run(["umount", "-l", str(small)], check=False)


def _can_mount_tmpfs(path):
    path.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs",
                        str(path)], capture_output=True)
    if r.returncode == 0:
        subprocess.run(["umount", str(path)], check=False)
    return r.returncode == 0


_CHILD = textwrap.dedent("""
    import os, sys, time
    import numpy as np, tensorflow as tf
    import tnet as tn
    out, store = sys.argv[1], sys.argv[2]
    class H(tf.Module):
        def __init__(self, t):
            super().__init__(); self.table = t
    t = tn.SparseTable("k", 8, "adagrad", num_shards=2,
                       memory_budget_bytes=8192, storage_dir=store)
    rng = np.random.default_rng(0)
    def train(steps, first):
        for step in range(first, first + steps):
            keys = (rng.zipf(1.2, 800) % 30000).astype(np.int64)
            t.pull(keys, training=True)
            t.push(keys, rng.normal(0, 1, (800, 8)).astype(np.float32),
                   learning_rate=0.1, step=step)
    train(20, 1)
    tf.train.Checkpoint(m=H(t)).write(os.path.join(out, "ck"))
    k, w, s, m = (x.numpy() for x in t.export())
    np.savez(os.path.join(out, "at_ckpt.npz"), k=k, w=w, s=s, m=m)
    print("TIER", t.stats()["tier_on_disk"], sorted(os.listdir(store)),
          flush=True)
    print("SAVED", flush=True)
    while True:  # keeps training until killed
        train(5, 100)
""")


def test_kill9_of_a_tiered_table_leaves_nothing_and_loses_nothing(tmp_path):
    """A process with a tiered table is SIGKILLed while training after a
    checkpoint: its storage_dir holds no file (the tier's file is unlinked
    at creation), and a fresh process restores exactly the checkpoint into
    a tiered table on the same directory."""
    store = tmp_path / "store"
    store.mkdir()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("TNET_TEST_TIER_BYTES", None)
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(tmp_path),
                             str(store)], stdout=subprocess.PIPE, text=True,
                            env=env)
    try:
        tier_line = None
        for line in proc.stdout:
            if line.startswith("TIER"):
                tier_line = line
            if line.startswith("SAVED"):
                break
        assert tier_line is not None, "child died before its checkpoint"
        assert int(tier_line.split()[1]) > 1000, tier_line
        assert tier_line.split(None, 2)[2].strip() == "[]", tier_line
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert os.listdir(store) == []
    t = tn.SparseTable("k", 8, "adagrad", num_shards=2,
                       memory_budget_bytes=8192, storage_dir=str(store))
    tf.train.Checkpoint(m=_Holder(t)).read(
        str(tmp_path / "ck")).assert_consumed()
    want = np.load(tmp_path / "at_ckpt.npz")
    got = _export(t)
    order = np.argsort(want["k"])
    for name, x in zip("kwsm", got):
        np.testing.assert_array_equal(x, want[name][order], err_msg=name)


def test_a_model_trains_the_same_with_its_tables_on_disk(tmp_path):
    """A README-style functional model (EmbeddingFeatures over [B, 1] and
    ragged ids) fit with a tier holding ~1% of its rows predicts what the
    in-memory model predicts."""
    import tf_keras  # noqa: PLC0415

    rng = np.random.default_rng(5)
    n = 4096
    user = (rng.zipf(1.3, (n, 1)) % 50_000).astype(np.int64)
    lengths = rng.integers(0, 6, n)
    items = tf.RaggedTensor.from_row_lengths(
        (rng.zipf(1.2, lengths.sum()) % 80_000).astype(np.int64), lengths)
    y = ((user[:, 0] % 7) < 3).astype(np.float32)

    def build(**tier):
        tf_keras.utils.set_random_seed(0)
        cols = [tn.feature_column.embedding_column(
                    tn.feature_column.category_column("user"), 8),
                tn.feature_column.embedding_column(
                    tn.feature_column.category_column("items"), 8)]
        inputs = {"user": tf_keras.Input((1,), dtype=tf.int64, name="user"),
                  "items": tf_keras.Input((None,), dtype=tf.int64,
                                          ragged=True, name="items")}
        emb = tn.layers.EmbeddingFeatures(cols, **tier)(inputs)
        out = tf_keras.layers.Dense(1, activation="sigmoid")(
            tf_keras.layers.Dense(16, activation="relu")(emb))
        model = tn.Model(inputs, out)
        model.compile(optimizer=tf_keras.optimizers.Adagrad(0.05),
                      loss="binary_crossentropy")
        return model

    preds = []
    for tier in ({}, {"memory_budget_bytes": 64 * 1024,
                      "storage_dir": str(tmp_path)}):
        model = build(**tier)
        data = tf.data.Dataset.from_tensor_slices(
            ({"user": user, "items": items}, y)).batch(256)
        maint = tn.callbacks.TableMaintenance(
            log_dir=str(tmp_path / "tb") if tier else None)
        hist = model.fit(data, epochs=2, verbose=0, callbacks=[maint])
        preds.append(model.predict(data, verbose=0))
        if tier:
            stats = {n: t.stats() for n, t in model.tables().items()}
            assert all(s["tier_writebacks"] > 0 for s in stats.values())
            # The tier's counters reach the epoch logs (and TensorBoard).
            for name, s in stats.items():
                rate = hist.history[f"table/{name}/tier_hit_rate"]
                assert len(rate) == 2 and all(0.0 <= r < 1.0 for r in rate)
                assert (hist.history[f"table/{name}/tier_on_disk"][-1]
                        == s["tier_on_disk"] > 0)
            assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
        else:
            assert not any("tier" in k for k in hist.history)
    np.testing.assert_allclose(preds[0], preds[1], rtol=0, atol=1e-6)


# Tests that compare the table's memory bytes (the in-memory arena's own
# accounting: with a tier, memory is the cache plus the row locations).
_MEMORY_TESTS = ("test_eviction_frees_memory_and_rows_are_reused",
                 "test_cap_is_never_exceeded_and_memory_stays_flat",
                 "test_memory_bytes_falls_after_eviction",
                 "test_dev_head10k_min_count_2_drops_exactly_the_singletons",
                 # Peak RSS (VmHWM) of a save: with a tier it also counts
                 # the pages of the tier's mapped file that the save reads
                 # (page cache, reclaimable; 40-90 MB here for 2M rows),
                 # which VmHWM cannot tell from heap. The tier's save
                 # memory is measured in BENCHMARKS.md (500M rows: anonymous
                 # memory flat through the save).
                 "test_save_memory_stays_bounded_for_2m_rows")


@pytest.mark.long  # make test-long; the tier's own tests stay in make test
@pytest.mark.timeout(900)
def test_table_optimizer_and_checkpoint_tests_pass_with_every_table_tiered():
    """The table, optimizer, lifecycle, kernel and checkpoint tests again,
    with every SparseTable given a tier of one row per stripe in memory
    (and reading ahead on every batch, as it does when misses hit the
    disk)."""
    env = dict(os.environ, TNET_TEST_TIER_BYTES="1",
               TNET_TEST_TIER_READAHEAD="1")
    files = ["tests/test_table.py", "tests/test_optimizers.py",
             "tests/test_lifecycle.py", "tests/test_lookup_kernels.py",
             "tests/test_checkpoint.py", "tests/test_checkpoint_delta.py"]
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         *files, "-k", " and ".join(f"not {t}" for t in _MEMORY_TESTS)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=880)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    passed = int(r.stdout.split(" passed")[0].split()[-1])
    assert passed >= 100, r.stdout[-2000:]


# make test-long: test_a_model_trains_the_same_with_its_tables_on_disk stays.
@pytest.mark.long
@pytest.mark.timeout(600)
def test_feature_spec_and_cli_train_the_same_with_a_tier(tmp_path):
    """A user's feature spec (generated click log, int and string ids,
    multi-valued and sequence features) with memory_budget_bytes and
    storage_dir in its defaults, through `python -m tnet.train`: the same
    hold-out metrics as the spec without them, and the export loads and
    scores the same without tnet; the CLI flags alone do the same."""
    sys.path.insert(0, str(ROOT / "tests"))
    from support import byod_data as bd  # noqa: PLC0415

    rs = bd.rows(3000, seed=11, users=2000)
    train = bd.write_csv(tmp_path / "train.csv", rs[:2500], ",")
    held = bd.write_csv(tmp_path / "eval.csv", rs[2500:], ",")
    store = tmp_path / "store"
    store.mkdir()
    tiered = dict(bd.SPEC, defaults={**bd.SPEC["defaults"],
                                     "memory_budget_bytes": 2048,
                                     "storage_dir": str(store)})
    runs = {}
    for name, spec, flags in (
            ("memory", bd.SPEC, []),
            ("spec", tiered, []),
            ("flags", bd.SPEC, ["--memory_budget_bytes=2048",
                                f"--storage_dir={store}"])):
        spec_path = bd.write_spec(tmp_path / f"{name}.json", spec)
        out = tmp_path / name
        proc = subprocess.run(
            [sys.executable, "-m", "tnet.train", f"--feature_spec={spec_path}",
             "--format=csv", f"--train_files={train}",
             f"--eval_files={held}", f"--model_dir={out}",
             "--hidden_units=8", "--batch_size=64", "--shuffle_buffer=0",
             "--epochs=2", f"--export_dir={out / 'export'}", *flags],
            cwd=ROOT, capture_output=True, text=True, timeout=500)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[name] = json.loads((out / "summary.json").read_text())
    for name in ("spec", "flags"):
        for key, value in runs["memory"]["eval"].items():
            assert runs[name]["eval"][key] == pytest.approx(
                value, abs=1e-6), (name, key)
    assert runs["memory"]["eval"]["auc"] > 0.6
    assert not list(store.iterdir())  # the tier's files die with the job


_SAVE_CHILD = textwrap.dedent("""
    import os, sys, time
    import numpy as np, tensorflow as tf
    import tf_keras
    import tnet as tn
    from tnet.saving import checkpoint as ck
    out, store = sys.argv[1], sys.argv[2]
    sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[3])))
    from test_tier import _save_kill_model, _save_kill_data
    model = _save_kill_model(memory_budget_bytes=16384, storage_dir=store)
    data = _save_kill_data()
    model.fit(data, epochs=1, verbose=0)
    def dump(n):
        tables = {name: [x.numpy() for x in t.export()]
                  for name, t in model.tables().items()}
        np.savez(os.path.join(out, f"state-{n}.npz"),
                 **{f"{name}:{i}": x for name, xs in tables.items()
                    for i, x in enumerate(xs)},
                 **{f"dense:{i}": w for i, w in enumerate(model.get_weights())})
    dump(1)
    tn.saving.save(model, os.path.join(out, "ck"), step=1)
    print("SAVED 1", flush=True)
    model.fit(data, epochs=1, verbose=0)
    write_part = ck._write_part
    calls = []
    def slow_write_part(*a, **k):
        n = write_part(*a, **k)
        calls.append(1)
        if len(calls) == 2:   # one shard's part written, more to come
            print("MID", flush=True)
            time.sleep(60)
        return n
    ck._write_part = slow_write_part
    dump(2)
    tn.saving.save(model, os.path.join(out, "ck"), step=2)
    print("SAVED 2", flush=True)
""")


def _save_kill_data():
    rng = np.random.default_rng(11)
    n = 4096
    user = (rng.zipf(1.3, (n, 1)) % 20_000).astype(np.int64)
    lengths = rng.integers(0, 5, n)
    items = tf.RaggedTensor.from_row_lengths(
        (rng.zipf(1.2, lengths.sum()) % 30_000).astype(np.int64), lengths)
    y = ((user[:, 0] % 5) < 2).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices(
        ({"user": user, "items": items}, y)).batch(128)


def _save_kill_model(**tier):
    import tf_keras  # noqa: PLC0415
    tf_keras.utils.set_random_seed(3)
    cols = [tn.feature_column.embedding_column(
                tn.feature_column.category_column("user"), 8),
            tn.feature_column.embedding_column(
                tn.feature_column.category_column("items"), 8)]
    inputs = {"user": tf_keras.Input((1,), dtype=tf.int64, name="user"),
              "items": tf_keras.Input((None,), dtype=tf.int64, ragged=True,
                                      name="items")}
    emb = tn.layers.EmbeddingFeatures(cols, num_shards=2, **tier)(inputs)
    out = tf_keras.layers.Dense(1, activation="sigmoid")(
        tf_keras.layers.Dense(8, activation="relu")(emb))
    model = tn.Model(inputs, out)
    model.compile(optimizer=tn.optimizer.Adagrad(0.05),
                  loss="binary_crossentropy")
    return model


def test_kill9_during_a_save_of_a_tiered_model_keeps_the_last_checkpoint(
        tmp_path):
    """A process whose model's tables are tiered is SIGKILLed in the middle
    of writing its second checkpoint (one shard's part written): the tier
    leaves no file, the half-written checkpoint is never picked up, and a
    fresh process restores the first checkpoint exactly (every table's
    keys, rows, slots and meta, and the dense weights), into a tiered model
    on the same directory, and saves over the debris."""
    store = tmp_path / "store"
    store.mkdir()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("TNET_TEST_TIER_BYTES", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", _SAVE_CHILD, str(tmp_path), str(store),
         __file__], stdout=subprocess.PIPE, text=True, env=env)
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line.strip())
            if line.startswith("MID"):
                proc.send_signal(signal.SIGKILL)
                break
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert seen[-2:] == ["SAVED 1", "MID"], seen
    assert os.listdir(store) == []
    ckdir = tmp_path / "ck"
    assert not (ckdir / "ckpt-2").exists(), os.listdir(ckdir)

    model = _save_kill_model(memory_budget_bytes=16384,
                             storage_dir=str(store))
    assert tn.saving.restore(model, str(ckdir)) == 1
    want = np.load(tmp_path / "state-1.npz")
    tables = model.tables()
    assert len(tables) >= 1
    for name, table in tables.items():
        got = [x.numpy() for x in table.export()]
        order_got = np.argsort(got[0])
        order_want = np.argsort(want[f"{name}:0"])
        assert len(got[0]) > 400, (name, len(got[0]))
        for i in range(4):
            np.testing.assert_array_equal(
                got[i][order_got], want[f"{name}:{i}"][order_want],
                err_msg=f"{name}: part {i}")
        assert table.stats()["tier_on_disk"] > 0
    for i, w in enumerate(model.get_weights()):
        np.testing.assert_array_equal(w, want[f"dense:{i}"])
    # A new save in the same directory goes past the killed one's debris.
    model.fit(_save_kill_data(), epochs=1, verbose=0)
    tn.saving.save(model, str(ckdir), step=2)
    assert tn.saving.restore(_save_kill_model(), str(ckdir)) == 2
