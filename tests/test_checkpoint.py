"""tn.saving checkpoints: round trip, deltas, resharding, corruption,
crashes, memory while saving (resuming: test_checkpoint_resume.py)."""
from __future__ import annotations

import os
import re
import shutil
import sys

import numpy as np
import pytest

import tnet as tn  # noqa: I001  (before tensorflow: selects tf_keras)
import tensorflow as tf

from tests.conftest import ROOT
from tests.programs.ckpt_train import CATS
from tests.support.ckpt import (assert_same_tables, build, dense_state, fit,
                                quiet, snapshot, tiny, wide_deep)
from tnet.saving import checkpoint as ckpt_mod
from tnet.saving import CheckpointError

PROGRAM = [sys.executable, str(ROOT / "tests" / "programs" / "ckpt_train.py")]


# -------------------------------------------------------------- round trip
def test_round_trip_bit_exact_dense_optimizer_and_step(tmp_path):
    model = wide_deep()
    fit(model, epochs=2)
    saved = snapshot(model)
    saved_dense = dense_state(model)
    path = tn.saving.save(model, tmp_path, progress=quiet)
    assert path == str(tmp_path / "ckpt-20")
    assert tn.saving.latest_checkpoint(tmp_path) == path

    manifest = tn.saving.read_manifest(path)
    assert manifest["step"] == manifest["train_step"] == 20
    assert manifest["kind"] == "full" and manifest["chain"] == []
    emb = manifest["tables"]["embedding"]
    assert (emb["dim"], emb["num_slots"], emb["shard_function"],
            emb["num_shards"]) == (4, 4, "mod", 1)
    assert emb["optimizer"]["name"] == "adagrad"
    assert manifest["tables"]["wide"]["optimizer"]["name"] == "ftrl"
    assert emb["rows"] == emb["rows_written"] == len(saved["embedding"][0])
    for rel, info in manifest["files"].items():
        full = os.path.join(path, rel)
        assert os.path.getsize(full) == info["bytes"]
        assert ckpt_mod._sha256(full) == info["sha256"]
    import h5py
    with h5py.File(os.path.join(path, emb["parts"][0]["file"]), "r") as f:
        assert {k: f[k].dtype.name for k in f} == {
            "keys": "int64", "weights": "float32", "slots": "float32",
            "meta": "float64"}

    # A fresh model that was never called: tables are created, dense
    # variables restore when Keras builds them.
    fresh = wide_deep()
    assert tn.saving.restore(fresh, tmp_path, progress=quiet) == 20
    assert int(fresh.optimizer.iterations.numpy()) == 20
    assert_same_tables(saved, snapshot(fresh))
    build(fresh)
    for a, b in zip(saved_dense, dense_state(fresh)):
        assert a.tobytes() == b.tobytes()
    assert len(saved_dense) == len(dense_state(fresh))

    # The dense checkpoint holds no table: no variable path mentions one.
    names = [n for n, _ in tf.train.list_variables(
        os.path.join(path, "dense", "ckpt"))]
    assert not any("tables" in n or "shards" in n for n in names), names

    # An already built model restores immediately, and the trained model
    # restores over its own newer state (tables cleared first).
    fit(model, seed=5)
    assert tn.saving.restore(model, path, progress=quiet) == 20
    assert_same_tables(saved, snapshot(model))
    for a, b in zip(saved_dense, dense_state(model)):
        assert a.tobytes() == b.tobytes()

    # Another architecture (built) is refused before any table changes.
    other = tn.models.WideDeep(CATS, ["d0"], embedding_dim=4,
                               hidden_units=[16])
    other.compile(tn.optimizer.Adagrad(0.05))
    fit(other, rows=64)
    before = snapshot(other)
    with pytest.raises(CheckpointError, match=r"dense/ckpt: dense state does "
                       r"not restore into this model: .*incompatible"):
        tn.saving.restore(other, path, progress=quiet)
    assert_same_tables(before, snapshot(other))


# ------------------------------------------------------------- incremental
def test_incremental_chain_full_plus_three_deltas(tmp_path):
    model = tiny(shards=2)
    fit(model, seed=0)
    emb, lin = model.tables()["emb"], model.tables()["lin"]
    paths, snaps = [tn.saving.save(model, tmp_path, incremental=True,
                                   progress=quiet)], [snapshot(model)]
    # 1: inserts (new seed: new ids) and updates.
    fit(model, rows=320, seed=1)
    paths.append(tn.saving.save(model, tmp_path, incremental=True,
                                progress=quiet))
    snaps.append(snapshot(model))
    # 2: evict rows seen fewer than 2 times (no decay), then train.
    assert int(emb.evict(1.0, 2.0)) > 0 and int(lin.evict(1.0, 2.0)) > 0
    fit(model, rows=192, seed=2)
    paths.append(tn.saving.save(model, tmp_path, incremental=True,
                                progress=quiet))
    snaps.append(snapshot(model))
    # 3: TTL eviction of rows not pushed in the last 12 steps, then train.
    step = int(model.optimizer.iterations.numpy())
    assert int(emb.evict(1.0, 0.0, ttl_steps=12, current_step=step)) > 0
    lin.evict(1.0, 0.0, ttl_steps=12, current_step=step)
    fit(model, rows=128, seed=3)
    paths.append(tn.saving.save(model, tmp_path, incremental=True,
                                progress=quiet))
    snaps.append(snapshot(model))

    manifests = [tn.saving.read_manifest(p) for p in paths]
    assert [m["kind"] for m in manifests] == ["full", "delta", "delta", "delta"]
    assert [m["depth"] for m in manifests] == [0, 1, 2, 3]
    names = [os.path.basename(p) for p in paths]
    assert [c["name"] for c in manifests[3]["chain"]] == names[:3]
    assert manifests[3]["base"] == names[0] and manifests[3]["parent"] == names[2]
    for m in manifests[1:]:
        t = m["tables"]["emb"]
        assert 0 < t["rows_written"] < t["rows"]  # only changed rows
    assert manifests[1]["tables"]["emb"]["deleted"] == 0
    assert manifests[2]["tables"]["emb"]["deleted"] > 0
    assert manifests[3]["tables"]["emb"]["deleted"] > 0
    assert manifests[2]["tables"]["lin"]["deleted"] > 0

    # Every point of the chain restores bit-exactly (fresh models, and
    # the same live model going back in time).
    for p, snap, shards in zip(paths, snaps, (1, 2, 3, 2)):
        fresh = tiny(shards)
        assert tn.saving.restore(fresh, p, progress=quiet) == \
            tn.saving.read_manifest(p)["step"]
        assert_same_tables(snap, snapshot(fresh))
    assert tn.saving.restore(model, paths[1], progress=quiet)
    assert_same_tables(snaps[1], snapshot(model))

    # A new process continues the chain after restore(track_changes=True)...
    cont = tiny(2)
    tn.saving.restore(cont, tmp_path, track_changes=True, progress=quiet)
    fit(cont, rows=128, seed=4)
    p5 = tn.saving.save(cont, tmp_path, incremental=True, progress=quiet)
    m5 = tn.saving.read_manifest(p5)
    assert m5["kind"] == "delta" and m5["parent"] == names[3]
    fresh = tiny(1)
    tn.saving.restore(fresh, p5, progress=quiet)
    assert_same_tables(snapshot(cont), snapshot(fresh))
    # ...without the marks it writes a full checkpoint and says why.
    other = tiny(2)
    tn.saving.restore(other, p5, progress=quiet)
    fit(other, rows=64, seed=6)
    m6 = tn.saving.read_manifest(tn.saving.save(other, tmp_path,
                                                incremental=True,
                                                progress=quiet))
    assert m6["kind"] == "full" and "no change marks" in m6["full_reason"]


def test_show_decay_forces_a_full_checkpoint(tmp_path):
    model = tiny(2)
    fit(model)
    tn.saving.save(model, tmp_path, incremental=True, progress=quiet)
    fit(model, rows=128, seed=1)
    for table in model.tables().values():
        table.evict(show_decay_rate=0.5, show_threshold=0.0)
    lines = []
    path = tn.saving.save(model, tmp_path, incremental=True,
                          progress=lines.append)
    manifest = tn.saving.read_manifest(path)
    assert manifest["kind"] == "full"
    assert "without a training push" in manifest["full_reason"]
    assert any("writing a full checkpoint instead" in l for l in lines)
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]
    fresh = tiny(2)
    tn.saving.restore(fresh, path, progress=quiet)
    assert_same_tables(snapshot(model), snapshot(fresh))


def test_full_every_and_keep_never_drop_a_needed_base(tmp_path):
    model = tiny(1)
    kinds = []
    for i in range(5):
        fit(model, rows=128, seed=i)
        path = tn.saving.save(model, tmp_path, incremental=True, keep=1,
                              full_every=3, progress=quiet)
        kinds.append(tn.saving.read_manifest(path)["kind"])
        # Everything the newest checkpoint needs is still there.
        fresh = tiny(1)
        tn.saving.restore(fresh, path, progress=quiet)
        assert_same_tables(snapshot(model), snapshot(fresh))
    assert kinds == ["full", "delta", "delta", "full", "delta"]
    left = sorted(int(n.split("-")[1]) for n in os.listdir(tmp_path))
    assert left == [8, 10]  # the last full checkpoint and its delta


# --------------------------------------------------------------- resharding
def test_reshard_2_to_3_to_1_to_2_bit_exact(tmp_path):
    model = tiny(shards=2)
    fit(model, epochs=2)
    want = snapshot(model)
    path = tn.saving.save(model, tmp_path / "a", progress=quiet)
    assert tn.saving.read_manifest(path)["tables"]["emb"]["num_shards"] == 2
    for shards, where in ((3, "b"), (1, "c"), (2, "d")):
        target = tiny(shards)
        tn.saving.restore(target, path, progress=quiet)
        assert_same_tables(want, snapshot(target))
        for table in target.tables().values():
            assert table.num_shards == shards
            for i in range(shards):  # every row sits on its key's shard
                keys = table.export_shard(i, 0, 1 << 30)[0].numpy()
                assert np.all(np.mod(keys, shards) == i)
        path = tn.saving.save(target, tmp_path / where, progress=quiet)
        assert tn.saving.read_manifest(path)["tables"]["emb"]["num_shards"] \
            == shards


# --------------------------------------------------------------- corruption
@pytest.fixture(scope="module")
def chain_dir(tmp_path_factory):
    """ckpt A (full), B (delta), C (delta) and the tables at each."""
    root = tmp_path_factory.mktemp("chain")
    model = tiny(2)
    snaps = {}
    for seed in range(3):
        fit(model, rows=256, seed=seed)
        path = tn.saving.save(model, root, incremental=True, progress=quiet)
        snaps[os.path.basename(path)] = snapshot(model)
    return root, snaps


def _flip_byte(path):
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x5A]))


def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


@pytest.mark.parametrize("damage,target,match", [
    ("flip", "sparse/emb/part-0.h5", r"corrupted: .*ckpt-\d+/sparse/emb/part-0\.h5"),
    ("truncate", "sparse/lin/part-1.h5",
     r"truncated or changed: .*ckpt-\d+/sparse/lin/part-1\.h5"),
    ("delete", "sparse/emb/part-1.h5", r"missing: .*ckpt-\d+/sparse/emb/part-1\.h5"),
    ("flip", "sparse/emb/deleted.h5", r"corrupted: .*sparse/emb/deleted\.h5"),
    ("flip", "dense/ckpt.data-00000-of-00001",
     r"corrupted: .*ckpt-\d+/dense/ckpt\.data-00000-of-00001"),
    ("garble", "manifest.json", r"manifest .*ckpt-\d+/manifest\.json .*corrupted"),
    ("delete", "manifest.json", r"manifest missing: .*ckpt-\d+/manifest\.json"),
    ("edit_manifest", "manifest.json",
     r"manifest .*ckpt-\d+/manifest\.json is corrupted \(its checksum"),
    ("delete_parent", "", r"delta on ckpt-\d+, which is missing"),
    ("wrong_dim", "", r"ckpt-\d+/manifest\.json: table 'emb' does not fit the "
                      r"model: dim 4 != model's 8"),
])
def test_damaged_checkpoint_is_a_clear_error_and_previous_restores(
        chain_dir, tmp_path, damage, target, match):
    src, snaps = chain_dir
    root = tmp_path / "ckpts"
    shutil.copytree(src, root)
    names = sorted(snaps, key=lambda n: int(n.split("-")[1]))
    newest, previous = root / names[-1], root / names[-2]
    if damage == "flip":
        _flip_byte(newest / target)
    elif damage == "truncate":
        _truncate(newest / target)
    elif damage == "delete":
        os.remove(newest / target)
    elif damage == "garble":
        (newest / target).write_text('{"format": "tnet-checkpoint", "step": 3')
    elif damage == "edit_manifest":  # still valid JSON, one count changed
        text = (newest / target).read_text()
        edited = re.sub(r'"rows": (\d+)', lambda m: f'"rows": {int(m[1]) + 1}',
                        text, count=1)
        assert edited != text
        (newest / target).write_text(edited)
    elif damage == "delete_parent":
        shutil.rmtree(previous)
    model = tiny(2, dim=8 if damage == "wrong_dim" else 4)
    fit(model, rows=64, seed=9)
    before = snapshot(model)
    with pytest.raises(CheckpointError, match=match):
        tn.saving.restore(model, newest, progress=quiet)
    # Nothing changed in the model.
    assert_same_tables(before, snapshot(model))
    if damage == "wrong_dim":
        return
    if damage == "delete_parent":
        previous = root / names[0]
    fresh = tiny(3)
    tn.saving.restore(fresh, previous, progress=quiet)
    assert_same_tables(snaps[previous.name], snapshot(fresh))


# ----------------------------------------------------------------- crashes
def test_crash_mid_save_leaves_previous_checkpoint(tmp_path, monkeypatch):
    model = tiny(2)
    fit(model)
    first = tn.saving.save(model, tmp_path, progress=quiet)
    saved = snapshot(model)
    fit(model, seed=1)
    real = ckpt_mod._write_part
    calls = []

    def failing(*args, **kwargs):
        if calls:
            raise OSError("disk full (injected after the first part file)")
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(ckpt_mod, "_write_part", failing)
    with pytest.raises(OSError, match="injected"):
        tn.saving.save(model, tmp_path, keep=1, progress=quiet)
    assert os.path.exists(calls[0]) is False  # the temp dir is gone
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(first)]
    assert tn.saving.latest_checkpoint(tmp_path) == first
    monkeypatch.setattr(ckpt_mod, "_write_part", real)

    # What a SIGKILL mid-save leaves: a temp directory without manifest.
    stale = tmp_path / ".ckpt-999.tmp-dead"
    (stale / "sparse" / "emb").mkdir(parents=True)
    (stale / "sparse" / "emb" / "part-0.h5").write_bytes(b"partial")
    assert tn.saving.latest_checkpoint(tmp_path) == first
    fresh = tiny(2)
    tn.saving.restore(fresh, tmp_path, progress=quiet)
    assert_same_tables(saved, snapshot(fresh))
    # The next save removes it.
    second = tn.saving.save(model, tmp_path, progress=quiet)
    assert sorted(os.listdir(tmp_path)) == sorted(
        os.path.basename(p) for p in (first, second))


# ------------------------------------------------------------------ memory
def test_save_memory_stays_bounded_for_2m_rows(tmp_path):
    """A 2M-row table (320 MB of payload) saves holding one 10 MB chunk at
    a time: the peak RSS grows by far less than the payload. Measured in a
    fresh process (tests/programs/save_memory.py says why: malloc's state
    in the pytest process depended on the tests before it)."""
    import json
    import subprocess
    from tests.support.cluster import env
    res = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "programs" / "save_memory.py"),
         str(tmp_path)], cwd=ROOT, env=env(), capture_output=True, text=True,
        timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    line = next(l for l in res.stdout.splitlines() if l.startswith("SAVE_MEMORY "))
    got = json.loads(line.split(" ", 1)[1])
    if "skip" in got:
        pytest.skip(got["skip"])
    rows, dim = 2_000_000, 16
    payload = rows * (8 + 4 * dim * 2 + 24)
    print(f"saved {got['rows']:,} rows, {got['bytes'] / 1e6:.0f} MB in "
          f"{got['seconds']:.1f}s; peak RSS growth {got['plain'] / 1e6:.1f} MB"
          f", incremental {got['incremental'] / 1e6:.1f} MB")
    assert got["rows"] == got["manifest_rows"] == rows
    assert got["bytes"] >= payload
    # Holding the table would grow it by the payload (320 MB); the save
    # holds one 10 MB chunk at a time, and its freed buffers are reused.
    assert got["plain"] < 0.3 * payload, \
        f"peak RSS grew {got['plain'] / 1e6:.0f} MB (payload {payload / 1e6:.0f} MB)"
    # incremental=True (a full save here) only marks the shards' change
    # state: no per-row index on the chief, so the same budget.
    assert got["incremental"] < 64e6, \
        f"peak RSS grew {got['incremental'] / 1e6:.0f} MB"
