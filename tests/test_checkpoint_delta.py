"""Incremental (delta) checkpoints against the live table: a delta holds
exactly the rows changed since its parent (pushes above the change mark,
rows inserted by training pulls) and the keys freed since, and full + delta
restores bit for bit; what the change marks cannot track (pushes at or
below the mark, more frees than the deletion log holds) makes the save
fall back to a full checkpoint that says why."""
from __future__ import annotations

import os

import h5py
import numpy as np

import tnet as tn  # noqa: I001  (before tensorflow: selects tf_keras)
from tests.support.ckpt import assert_same_tables, fit, quiet, snapshot, tiny


def _save(model, path, step):
    return tn.saving.save(model, path, step=step, incremental=True,
                          progress=quiet)


def _delta_rows(path, table):
    """{key: (weights, slots, meta)} of one table's part files, and the
    keys of its deleted.h5, read straight from the HDF5 files."""
    info = tn.saving.read_manifest(path)["tables"][table]
    rows = {}
    for part in info["parts"]:
        with h5py.File(os.path.join(path, part["file"]), "r") as f:
            keys, w, s, m = (f[c][()] for c in ("keys", "weights", "slots",
                                                 "meta"))
        assert len(keys) == part["rows"]
        for i, k in enumerate(keys.tolist()):
            assert k not in rows, f"key {k} written twice"
            rows[k] = (w[i], s[i], m[i])
    assert len(rows) == info["rows_written"]
    deleted = np.zeros(0, np.int64)
    if info["deleted_file"]:
        with h5py.File(os.path.join(path, info["deleted_file"]), "r") as f:
            deleted = f["keys"][()]
    assert len(deleted) == info["deleted"]
    return rows, deleted


def _live(model, table):
    """{key: (weights, slots, meta)} of the live table."""
    keys, w, s, m = snapshot(model)[table]
    return {k: (w[i], s[i], m[i]) for i, k in enumerate(keys.tolist())}


def _restored(path, shards=2):
    fresh = tiny(shards)
    tn.saving.restore(fresh, path, progress=quiet)
    return fresh


def _trained(tmp_path, shards=2):
    """A trained tiny model with a full incremental-capable checkpoint."""
    model = tiny(shards)
    fit(model)
    step = int(model.optimizer.iterations.numpy())
    full = _save(model, tmp_path, step)
    assert tn.saving.read_manifest(full)["kind"] == "full"
    return model, step


def _grads(n, dim, seed):
    return np.random.default_rng(seed).normal(0, 0.1, (n, dim)).astype(
        np.float32)


def test_delta_holds_exactly_the_pushed_rows_and_restores_bit_exact(
        tmp_path):
    model, step = _trained(tmp_path)
    changed = {}
    for name, table in model.tables().items():
        keys = snapshot(model)[name][0]
        n = max(1, len(keys) // 100)  # ~1% of the rows
        pick = np.sort(np.random.default_rng(1).choice(keys, n, replace=False))
        # At the saved train_step: the first step Keras trains after the
        # save, just above the mark (the largest last_step so far).
        assert max(c["mark"] for c in table.changes()) == step - 1
        table.push(pick, _grads(n, table.dim, 2), step=step)
        changed[name] = set(pick.tolist())
        assert 0 < n < len(keys)
    before = {name: _live(model, name) for name in changed}
    path = _save(model, tmp_path, step + 2)
    manifest = tn.saving.read_manifest(path)
    assert manifest["kind"] == "delta", manifest.get("full_reason")
    assert manifest["full_reason"] is None
    for name in changed:
        rows, deleted = _delta_rows(path, name)
        assert set(rows) == changed[name], name
        assert len(deleted) == 0
        live = _live(model, name)
        assert live.keys() == before[name].keys()  # the save changed nothing
        for k, (w, s, m) in rows.items():
            lw, ls, lm = live[k]
            assert (w.tobytes(), s.tobytes(), m.tobytes()) == (
                lw.tobytes(), ls.tobytes(), lm.tobytes()), (name, k)
            assert m[2] == step
        assert manifest["tables"][name]["rows"] == len(live)
    assert_same_tables(snapshot(model), snapshot(_restored(path)))
    # Resharded (the delta's parts come from 2 shards) too.
    assert_same_tables(snapshot(model), snapshot(_restored(path, shards=3)))


def test_row_inserted_by_a_training_pull_is_in_the_delta(tmp_path):
    model, step = _trained(tmp_path)
    emb = model.tables()["emb"]
    old = set(snapshot(model)["emb"][0].tolist())
    new = np.array([10**12 + i for i in range(7)] + [-5, 2**62], np.int64)
    assert not old & set(new.tolist())
    emb.pull(new, training=True)  # never pushed
    emb.pull(np.array([10**13], np.int64), training=False)  # inserts nothing
    path = _save(model, tmp_path, step + 1)
    manifest = tn.saving.read_manifest(path)
    assert manifest["kind"] == "delta", manifest.get("full_reason")
    rows, deleted = _delta_rows(path, "emb")
    assert set(rows) == set(new.tolist())
    assert len(deleted) == 0
    lin_rows, _ = _delta_rows(path, "lin")
    assert not lin_rows
    restored = _restored(path)
    assert_same_tables(snapshot(model), snapshot(restored))
    # The restored rows read as the live ones (not re-initialized).
    want = emb.pull(new, training=False).numpy()
    got = restored.tables()["emb"].pull(new, training=False).numpy()
    assert want.tobytes() == got.tobytes()


def test_evicted_keys_are_deleted_and_stay_gone(tmp_path):
    model, step = _trained(tmp_path)
    emb, lin = model.tables()["emb"], model.tables()["lin"]
    before = {n: set(snapshot(model)[n][0].tolist()) for n in ("emb", "lin")}
    assert int(emb.evict(1.0, 2.0)) > 0  # rows shown fewer than 2 times
    assert int(lin.evict(1.0, 2.0)) > 0
    after = {n: set(snapshot(model)[n][0].tolist()) for n in ("emb", "lin")}
    freed = {n: before[n] - after[n] for n in before}
    # One freed key comes back through a training pull: a row, not deleted.
    back = min(freed["emb"])
    emb.pull(np.array([back], np.int64), training=True)
    path = _save(model, tmp_path, step + 1)
    manifest = tn.saving.read_manifest(path)
    assert manifest["kind"] == "delta", manifest.get("full_reason")
    for name in ("emb", "lin"):
        rows, deleted = _delta_rows(path, name)
        gone = freed[name] - ({back} if name == "emb" else set())
        assert set(deleted.tolist()) == gone, name
        assert np.all(np.diff(deleted) > 0)  # sorted, unique
        assert set(rows) == ({back} if name == "emb" else set()), name
    restored = _restored(path)
    assert_same_tables(snapshot(model), snapshot(restored))
    for name in ("emb", "lin"):
        keys = set(snapshot(restored)[name][0].tolist())
        assert not keys & (freed[name] - {back}), name


def test_more_frees_than_the_deletion_log_holds_save_full(tmp_path):
    """The log holds max(65536, rows / 2) keys per shard (a constant in
    tnet_ops/table/table_shard.cc, not configurable): free 70,000 rows of
    one shard to overflow it."""
    model = tiny(shards=1)
    fit(model, rows=128)
    emb = model.tables()["emb"]
    bulk = np.arange(5 * 10**12, 5 * 10**12 + 70_000, dtype=np.int64)
    emb.pull(bulk, training=True)  # rows with show 0
    step = int(model.optimizer.iterations.numpy())
    assert tn.saving.read_manifest(_save(model, tmp_path, step))["kind"] == \
        "full"
    assert int(emb.evict(1.0, 1.0)) >= len(bulk)  # frees every show-0 row
    c = emb.changes()[0]
    assert c["dropped"] > 0 and len(c["deleted"]) == 65536, (
        c["dropped"], len(c["deleted"]))
    lines = []
    path = tn.saving.save(model, tmp_path, step=step + 1, incremental=True,
                          progress=lines.append)
    manifest = tn.saving.read_manifest(path)
    assert manifest["kind"] == "full"
    assert "more rows were freed" in manifest["full_reason"]
    assert "deletion log" in manifest["full_reason"]
    assert any("writing a full checkpoint instead" in l for l in lines)
    restored = _restored(path, shards=1)
    assert_same_tables(snapshot(model), snapshot(restored))
    assert not set(bulk.tolist()) & set(snapshot(restored)["emb"][0].tolist())
    # After the full save the marks are fresh: the next save is a delta.
    emb.push(snapshot(model)["emb"][0][:1], _grads(1, emb.dim, 3),
             step=step + 2)
    nxt = _save(model, tmp_path, step + 3)
    assert tn.saving.read_manifest(nxt)["kind"] == "delta"
    assert_same_tables(snapshot(model), snapshot(_restored(nxt, shards=1)))


def test_push_at_or_below_the_mark_makes_the_next_save_full(tmp_path):
    model, step = _trained(tmp_path)
    emb = model.tables()["emb"]
    mark = max(c["mark"] for c in emb.changes())
    assert 0 <= mark < step
    keys = snapshot(model)["emb"][0]
    for i, s in enumerate((0, mark)):  # below the mark, then at it
        emb.push(keys[i:i + 3], _grads(3, emb.dim, 4 + i), step=s)
        assert sum(c["untracked"] for c in emb.changes()) > 0
        path = _save(model, tmp_path, step + 1 + i)
        manifest = tn.saving.read_manifest(path)
        assert manifest["kind"] == "full", s
        reason = manifest["full_reason"]
        assert "'emb'" in reason and "row changes" in reason, reason
        assert "without a training push above step" in reason, reason
        assert_same_tables(snapshot(model), snapshot(_restored(path)))
    # The full save re-marked the table: a push above the mark is a delta.
    emb.push(keys[:2], _grads(2, emb.dim, 9), step=step + 5)
    path = _save(model, tmp_path, step + 6)
    assert tn.saving.read_manifest(path)["kind"] == "delta"
    assert set(_delta_rows(path, "emb")[0]) == set(keys[:2].tolist())
    assert_same_tables(snapshot(model), snapshot(_restored(path)))


def test_rows_freed_by_the_row_cap_are_deleted(tmp_path):
    def capped():
        model = tiny(2)
        model.emb.set_table_options(max_rows=1200)  # 600 rows a shard
        return model

    model = capped()
    fit(model)
    emb = model.tables()["emb"]
    step = int(model.optimizer.iterations.numpy())
    assert tn.saving.read_manifest(_save(model, tmp_path, step))["kind"] == \
        "full"
    saved = set(snapshot(model)["emb"][0].tolist())
    assert len(saved) <= 1200
    new = np.arange(7 * 10**12, 7 * 10**12 + 600, dtype=np.int64)
    emb.pull(new, training=True)  # over the cap: the lowest-show rows go
    live = set(snapshot(model)["emb"][0].tolist())
    assert len(live) <= 1200 and saved - live
    path = _save(model, tmp_path, step + 1)
    manifest = tn.saving.read_manifest(path)
    assert manifest["kind"] == "delta", manifest.get("full_reason")
    rows, deleted = _delta_rows(path, "emb")
    deleted = set(deleted.tolist())
    # Every saved row the cap freed is deleted; a key may also be one
    # inserted and freed since (documented); none is live.
    assert saved - live <= deleted <= saved | set(new.tolist())
    assert not deleted & live
    assert set(rows) == live - saved
    for fresh in (tiny(2), capped()):  # uncapped and capped alike
        tn.saving.restore(fresh, path, progress=quiet)
        assert_same_tables(snapshot(model), snapshot(fresh))
