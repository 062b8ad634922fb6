"""Feature lifecycle: admission (min_count), the row cap (max_rows), eviction
by show decay / threshold / TTL, TableMaintenance, live-row checkpoints and
exports, and per-shard enforcement under ParameterServerStrategy."""
from __future__ import annotations

import collections
import glob
import json
import sys
import os

import h5py
import numpy as np
import pytest

import tnet as tn  # noqa: I001  (before tensorflow: selects tf_keras)
import tensorflow as tf
import tf_keras

from tests.conftest import ROOT, data_file
from tests.programs.ckpt_train import CATS, make_data
from tnet import _ops
from tnet import data as tn_data
from tnet import feature_column as fc
from tnet.models import WideDeep


def _live(table) -> dict:
    """{key: (weights, slots, meta)} of every live row."""
    keys, weights, slots, meta = (t.numpy() for t in table.export())
    return {int(k): (w, s, m) for k, w, s, m in zip(keys, weights, slots, meta)}


# ---------------------------------------------------------------- admission
def test_admission_matches_a_python_model():
    """Rows appear exactly when pushed shows reach min_count; the admitting
    push applies no gradient, later pushes do; unadmitted keys read zeros."""
    rng = np.random.default_rng(0)
    dim, lr, min_count = 4, 0.5, 3
    table = tn.SparseTable("adm", dim, optimizer="sgd", min_count=min_count,
                           num_shards=2, seed=1)
    fresh = tn.SparseTable("ref", dim, optimizer="sgd", seed=1)
    counts = collections.Counter()
    expected_w = {}
    rejected = admitted = 0
    for step in range(12):
        keys = rng.choice(60, size=20, replace=False).astype(np.int64)
        shows = rng.integers(0, 3, size=20).astype(np.float32)
        grads = rng.normal(size=(20, dim)).astype(np.float32)
        pulled = table.pull(keys, training=True).numpy()
        for i, k in enumerate(keys):
            k = int(k)
            if k in expected_w:
                np.testing.assert_array_equal(pulled[i], expected_w[k])
            else:
                np.testing.assert_array_equal(pulled[i], np.zeros(dim))
        table.push(keys, grads, learning_rate=lr, step=step, shows=shows)
        for i, k in enumerate(keys):
            k = int(k)
            if k in expected_w:
                expected_w[k] = expected_w[k] - np.float32(lr) * grads[i]
                continue
            counts[k] += shows[i]
            if counts[k] >= min_count:
                admitted += 1
                expected_w[k] = fresh.pull([k], training=True).numpy()[0]
            else:
                rejected += 1
    live = _live(table)
    assert set(live) == set(expected_w)
    for k, w in expected_w.items():
        np.testing.assert_allclose(live[k][0], w, rtol=1e-6, atol=1e-6)
    stats = table.stats()
    assert stats["rows"] == len(expected_w) == stats["admitted"] == admitted
    assert stats["rejected"] == rejected
    assert stats["pending"] == sum(1 for k in counts if k not in expected_w)


def test_full_pending_map_delays_but_never_admits_early():
    """admission_capacity bounds the pending map; overflow drops counts, so
    keys are admitted late, never before min_count shows."""
    table = tn.SparseTable("cap", 2, min_count=2, admission_capacity=32,
                           num_stripes=1)
    rng = np.random.default_rng(1)
    hot = np.arange(5, dtype=np.int64)
    truth = collections.Counter()
    for step in range(40):
        cold = rng.choice(np.arange(10, 400), 20, replace=False)
        keys = np.concatenate([hot, cold]).astype(np.int64)
        table.push(keys, np.zeros((len(keys), 2), np.float32), step=step)
        truth.update(keys.tolist())
        assert table.stats()["pending"] <= 32
    stats = table.stats()
    assert stats["pending_dropped"] > 0
    live = set(_live(table))
    assert all(truth[k] >= 2 for k in live)
    assert set(hot.tolist()) <= live
    late = [k for k, c in truth.items() if c >= 2 and k not in live]
    print(f"{len(late)} keys with >= 2 shows are still waiting (dropped)")
    assert stats["bytes"] > 0


def test_bad_lifecycle_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="min_count"):
        tn.SparseTable("x", 2, min_count=-1)
    with pytest.raises(ValueError, match="max_rows"):
        tn.SparseTable("x", 2, max_rows=1, num_shards=2)
    with pytest.raises(ValueError, match="admission_capacity"):
        tn.SparseTable("x", 2, admission_capacity=0)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="max_rows must be 0 .* lower num_stripes"):
        _ops.sparse_table_handle(dim=2, optimizer="sgd", max_rows=10,
                                 num_stripes=64)
    with pytest.raises(ValueError, match="different min_count"):
        c = [fc.embedding_column(fc.category_column(n), 4, table="t",
                                 min_count=m) for n, m in (("a", 2), ("b", 3))]
        tn.layers.EmbeddingFeatures(c)


# ------------------------------------------------------------------- the cap
def test_cap_frees_the_lowest_show_rows_first():
    """One stripe (max_rows 300): exceeding the cap frees down to 90%,
    lowest show first, older last_step first among equal shows."""
    table = tn.SparseTable("low", 2, max_rows=300)
    assert table.shards[0]._attrs["num_stripes"] == 1
    keys = np.arange(400, dtype=np.int64)
    shows = np.random.default_rng(2).permutation(400).astype(np.float32) + 1
    table.push(keys[:200], np.zeros((200, 2), np.float32), step=1,
               shows=shows[:200])
    table.push(keys[200:], np.zeros((200, 2), np.float32), step=2,
               shows=shows[200:])
    target = 300 - 30
    assert int(table.size()) == target
    order = np.lexsort((np.where(keys < 200, 1, 2), shows))  # show, step
    survivors = set(keys[order[400 - target:]].tolist())
    assert set(_live(table)) == survivors
    assert table.stats()["cap_evicted"] == 400 - target


def test_cap_is_never_exceeded_and_memory_stays_flat():
    cap = 20_000
    capped = tn.SparseTable("capped", 8, optimizer="adagrad", max_rows=cap,
                            num_shards=2)
    free = tn.SparseTable("free", 8, optimizer="adagrad", num_shards=2)
    rng = np.random.default_rng(3)
    grads = np.ones((4096, 8), np.float32)
    bytes_at_cap, peak = None, 0
    for step in range(150):
        keys = np.unique(rng.zipf(1.2, 4096)).astype(np.int64)
        g = grads[:len(keys)]
        capped.push(keys, g, step=step)
        free.push(keys, g, step=step)
        sizes = [int(s) for s in capped.shard_sizes()]
        assert sum(sizes) <= cap
        assert all(n <= capped.shard_max_rows(i) for i, n in enumerate(sizes))
        mem = int(capped.memory_bytes())
        if bytes_at_cap is None and capped.stats()["cap_evicted"]:
            bytes_at_cap = mem
        elif bytes_at_cap is not None:
            peak = max(peak, mem)
    assert bytes_at_cap is not None
    # Freed rows are reused: memory stays near its size when the cap was
    # first hit, while the unbounded table keeps growing.
    assert peak <= 1.15 * bytes_at_cap, (peak, bytes_at_cap)
    assert int(free.size()) > 3 * cap
    assert int(free.memory_bytes()) > 2.5 * peak


def test_memory_bytes_falls_after_eviction():
    table = tn.SparseTable("mem", 16, optimizer="adagrad")
    keys = np.arange(100_000, dtype=np.int64)
    shows = np.where(keys % 10 == 0, 5.0, 1.0).astype(np.float32)
    table.push(keys, np.zeros((len(keys), 16), np.float32), shows=shows)
    before = int(table.memory_bytes())
    assert int(table.evict(1.0, 2.0)) == 90_000
    after = int(table.memory_bytes())
    assert after < 0.2 * before, (before, after)
    assert table.stats()["evicted"] == 90_000


# ------------------------------------------------------------ eviction rules
def test_decay_threshold_and_ttl_match_a_python_model():
    """Several rounds of pushes and evictions; the live set and every show
    match a float32 model of show *= decay; free if show < threshold or
    now - last_step > ttl."""
    rng = np.random.default_rng(4)
    table = tn.SparseTable("rule", 2, num_shards=3)
    model = {}  # key -> [show float32, last_step]
    decay, threshold, ttl = np.float32(0.7), np.float32(1.5), 15
    for r in range(8):
        step = 10 * r
        keys = rng.choice(3000, 500, replace=False).astype(np.int64)
        shows = rng.integers(0, 4, 500).astype(np.float32)
        table.push(keys, np.zeros((500, 2), np.float32), step=step,
                   shows=shows)
        for k, s in zip(keys.tolist(), shows):
            show = model.get(k, [np.float32(0), 0])[0]
            model[k] = [np.float32(show + s), step]
        now = step + 5
        evicted = int(table.evict(decay, threshold, ttl_steps=ttl,
                                  current_step=now))
        gone = []
        for k, (show, last) in model.items():
            show = np.float32(show * decay)
            model[k][0] = show
            if show < threshold or now - last > ttl:
                gone.append(k)
        for k in gone:
            del model[k]
        assert evicted == len(gone)
        live = _live(table)
        assert set(live) == set(model)
        for k, (show, last) in model.items():
            assert live[k][2][0] == show and live[k][2][2] == last
    assert table.stats()["evicted"] > 0


def _tiny_model(**layer_options):
    model = WideDeep(CATS, ["d0"], embedding_dim=4, hidden_units=[8])
    for layer in model.tnet_layers():
        layer.set_table_options(**layer_options)
    model.compile(tn.optimizer.Adagrad(0.05))
    return model


def _dataset(rows=640, seed=0, batch=64):
    feats, labels = make_data(rows, seed)
    return tf.data.Dataset.from_tensor_slices((feats, labels)).batch(batch)


def test_table_maintenance_callback_runs_and_reports(tmp_path):
    tf_keras.utils.set_random_seed(0)
    model = _tiny_model()
    maint = tn.callbacks.TableMaintenance(
        every_n_steps=3, show_decay_rate=0.9, show_threshold=0.5,
        ttl_steps=4, log_dir=str(tmp_path / "tb"))
    history = model.fit(_dataset(640), epochs=2, callbacks=[maint], verbose=0)
    steps = int(model.optimizer.iterations.numpy())
    assert steps == 20 and maint.runs == steps // 3
    for name, table in model.tables().items():
        for key in ("rows", "admitted", "rejected", "evicted", "bytes"):
            assert f"table/{name}/{key}" in history.history
        assert history.history[f"table/{name}/rows"][-1] == int(table.size())
        assert table.stats()["evicted"] > 0
    assert glob.glob(str(tmp_path / "tb" / "events.out.tfevents.*"))

    # One more run: exactly the rows the rule names go.
    now = steps + 3
    expected = {}
    for name, table in model.tables().items():
        keys, _, _, meta = (t.numpy() for t in table.export())
        show = meta[:, 0].astype(np.float32) * np.float32(0.9)
        keep = (show >= np.float32(0.5)) & (now - meta[:, 2] <= 4)
        expected[name] = set(keys[keep].tolist())
    evicted = maint.run(model, now)
    for name, table in model.tables().items():
        assert set(_live(table)) == expected[name]
        assert evicted[name] > 0
    # A second run at the same step (epoch end + a Checkpoint's pre-save
    # run) does not decay shows twice.
    before = {n: t.export()[3].numpy() for n, t in model.tables().items()}
    assert set(maint.run(model, now).values()) == {0}
    for name, table in model.tables().items():
        np.testing.assert_array_equal(table.export()[3].numpy(), before[name])


def test_evicted_then_reseen_keys_restart_from_the_initializer():
    fresh = tn.SparseTable("f", 4, optimizer="adagrad", seed=5)
    # Through the cap (one stripe of 256 rows).
    table = tn.SparseTable("c", 4, optimizer="adagrad", seed=5, max_rows=256)
    hot = np.arange(100, dtype=np.int64)
    table.push(hot, np.ones((100, 4), np.float32), step=0,
               shows=np.full(100, 9.0, np.float32))
    cold = np.arange(1000, 1200, dtype=np.int64)
    table.push(cold, np.ones((200, 4), np.float32), step=1)
    assert set(hot.tolist()) <= set(_live(table))
    gone = [k for k in cold.tolist() if k not in _live(table)]
    assert len(gone) == 300 - 256 + 25
    again = table.pull(gone, training=True).numpy()
    np.testing.assert_array_equal(again,
                                  fresh.pull(gone, training=True).numpy())
    # A zero-gradient push leaves weights and Adagrad slots as initialized.
    back = gone[:10]
    table.push(back, np.zeros((10, 4), np.float32), step=2,
               shows=np.full(10, 20.0, np.float32))
    live, ref = _live(table), _live(fresh)
    for k in back:
        np.testing.assert_array_equal(live[k][0], ref[k][0])
        np.testing.assert_array_equal(live[k][1], ref[k][1])  # slots reset
        assert live[k][2][0] == 20.0  # show counts from zero again

    # Through TTL with admission: the key must be admitted again.
    adm = tn.SparseTable("a", 4, optimizer="adagrad", seed=5, min_count=2)
    adm.push([7], np.ones((1, 4), np.float32), step=0, shows=[2.0])
    adm.push([7], np.ones((1, 4), np.float32), step=1)
    assert int(adm.evict(ttl_steps=5, current_step=10)) == 1
    np.testing.assert_array_equal(adm.pull([7], training=True).numpy(),
                                  np.zeros((1, 4)))
    adm.push([7], np.ones((1, 4), np.float32), step=11)
    assert int(adm.size()) == 0
    adm.push([7], np.ones((1, 4), np.float32), step=12)
    np.testing.assert_array_equal(adm.pull([7], training=True).numpy(),
                                  fresh.pull([7], training=True).numpy())


# ------------------------------------------------- checkpoints and exports
def test_checkpoint_and_export_hold_only_live_rows(tmp_path):
    tf_keras.utils.set_random_seed(0)
    model = _tiny_model(min_count=2)
    maint = tn.callbacks.TableMaintenance(show_threshold=3.0)
    saver = tn.callbacks.Checkpoint(str(tmp_path / "ck"), every_n_epochs=1,
                                    maintenance=maint, verbose=0)
    model.fit(_dataset(640), epochs=1, callbacks=[saver], verbose=0)
    assert maint.runs == 1 and all(n > 0 for n in maint.last_evicted.values())
    manifest = tn.saving.read_manifest(saver.last_saved_path)
    for name, table in model.tables().items():
        live = set(_live(table))
        assert manifest["tables"][name]["rows"] == len(live)
        saved = set()
        for part in manifest["tables"][name]["parts"]:
            with h5py.File(os.path.join(saver.last_saved_path, part["file"]),
                           "r") as f:
                saved.update(f["keys"][:].tolist())
        assert saved == live
        meta = table.export()[3].numpy()
        assert meta[:, 0].min() >= 3.0
    path = tn.serving.export_for_serving(model, str(tmp_path / "export"))
    with open(os.path.join(path, "export_info.json")) as f:
        info = json.load(f)
    for name, table in model.tables().items():
        assert info["tables"][name]["rows"] == int(table.size())


# ------------------------------------------------------- dev_head10k, AUC
def _criteo_keys(path, rows):
    """Counter of the table keys the first `rows` rows hold (the shared
    tables salt every column)."""
    counts = collections.Counter()
    cols = [fc.category_column(c) for c in tn_data.CRITEO_CAT_COLUMNS]
    for features, _ in tn_data.criteo_dataset(path, 2000, take=rows):
        for col in cols:
            k, _, _, _ = fc.ids_to_keys(col, features[col.key], salted=True)
            counts.update(k.numpy().tolist())
    return counts


def _train_criteo(path, min_count, rows=8000):
    tf_keras.utils.set_random_seed(0)
    model = WideDeep(tn_data.CRITEO_CAT_COLUMNS, tn_data.CRITEO_INT_COLUMNS,
                     hidden_units=(64, 64))
    for layer in model.tnet_layers():
        layer.set_table_options(min_count=min_count)
    model.compile(tn.optimizer.Adam(1e-3))
    train = tn_data.criteo_dataset(path, 256, take=rows,
                                   shuffle_buffer=10_000, seed=0)
    model.fit(train, epochs=1, verbose=0)
    evals = tn_data.criteo_dataset(path, 1024, skip=rows)
    return model, model.evaluate_exact(evals)


def test_dev_head10k_min_count_2_drops_exactly_the_singletons():
    path = data_file("criteo/dev_head10k.tsv")
    counts = _criteo_keys(path, 8000)
    singletons = sum(1 for c in counts.values() if c == 1)
    print(f"dev_head10k first 8000 rows: {len(counts)} distinct keys, "
          f"{singletons} seen once ({singletons / len(counts):.1%})")
    assert singletons > 0.3 * len(counts)
    one, auc1 = _train_criteo(path, 1)
    two, auc2 = _train_criteo(path, 2)
    for name in one.tables():
        a, b = one.tables()[name], two.tables()[name]
        assert int(a.size()) == len(counts)
        assert int(b.size()) == len(counts) - singletons
        stats = b.stats()
        assert stats["pending"] == singletons and stats["pending_dropped"] == 0
        assert stats["bytes"] < a.stats()["bytes"]
    print(f"AUC min_count=1 {auc1['auc']:.4f}, min_count=2 {auc2['auc']:.4f}")
    assert abs(auc1["auc"] - auc2["auc"]) <= 0.005, (auc1, auc2)
    assert auc2["auc"] > 0.65


# ------------------------------------------- ParameterServerStrategy cluster
def test_each_ps_enforces_its_shard_cap_and_eviction(tmp_path):
    from tests.support.cluster import (  # noqa: PLC0415
        assert_all_stopped, cluster as start_cluster)
    data_file("criteo/dev_head10k.tsv")
    cfg = str(ROOT / "configs" / "wide_deep_criteo.cfg")
    max_rows = 3000
    cluster = start_cluster(2, 1, [sys.executable, "-m", "tnet.train",
        f"--flagfile={cfg}", f"--model_dir={tmp_path / 'run'}",
        "--train_rows=2000", "--eval_rows=500", "--epochs=2",
        "--hidden_units=16", f"--max_rows={max_rows}", "--min_count=2",
        "--maintenance_every_n_steps=4", "--ttl_steps=3",
        "--show_decay_rate=0.9"])
    code = cluster.wait(600)
    assert_all_stopped(cluster)
    assert code == 0, cluster.output[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["cluster"]["ps"] == 2
    for name, table in summary["tables"].items():
        shards = table["rows_per_shard"]
        assert len(shards) == 2 and min(shards) > 0
        assert all(n <= max_rows // 2 for n in shards), (name, shards)
        life = summary["lifecycle"][name]
        assert life["rows"] == table["rows"]
        assert life["cap_evicted"] > 0, (name, life)
        # TTL/decay evictions ran too (at epoch ends: PSS has no batch hooks).
        assert life["evicted"] > life["cap_evicted"], (name, life)
        assert life["rejected"] > 0 and life["pending"] > 0
    assert glob.glob(str(tmp_path / "run" / "logs" / "tables" / "events.*"))
