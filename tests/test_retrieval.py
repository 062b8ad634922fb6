"""Two-tower retrieval on MovieLens 100k (ua split): data without leakage,
the Retrieval loss against numpy, recall above popularity, the top-K export
in a process without tnet, cold start, and a PS-cluster run of the config.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tnet as tn
from tests.conftest import ROOT, data_file
from tests.support.cluster import cluster as start_cluster
from tnet.data import movielens
from tnet.models import TwoTower

HISTORY = 20
EPOCHS = 1
BATCH = 1024


@pytest.fixture(scope="module")
def data():
    data_file("movielens/ml-100k_ua.base")
    path = str(data_file("movielens/ml-100k_ua.base").parent)
    return movielens.load_movielens(path, HISTORY)


@pytest.fixture(scope="module")
def trained(data):
    tf.keras.utils.set_random_seed(0)
    model = TwoTower(user_features=movielens.USER_FEATURES,
                     history_max_length=HISTORY, pooling="attention",
                     sampling_probability_key="item_prob")
    model.compile(tn.optimizer.Adagrad(0.1))
    model.fit(movielens.movielens_dataset(data.train, BATCH,
                                          shuffle_buffer=100_000, seed=0),
              epochs=EPOCHS, verbose=0)
    return model


# ----------------------------------------------------------------- data
def _reference_history(by_user, user, time, max_len, strictly_before_row=None):
    """Python model of the history rule for one query."""
    rows = sorted(by_user[user])  # (time, file row, item)
    if strictly_before_row is not None:
        pos = [r[1] for r in rows].index(strictly_before_row)
        kept = [r[2] for r in rows[:pos]]
    else:
        kept = [r[2] for r in rows if r[0] <= time]
    kept = kept[-max_len:]
    return kept + [-1] * (max_len - len(kept))


def test_histories_follow_time_and_never_see_test(data):
    folder = data_file("movielens/ml-100k_ua.base").parent
    base = np.loadtxt(folder / "ml-100k_ua.base", dtype=np.int64)
    test = np.loadtxt(folder / "ml-100k_ua.test", dtype=np.int64)
    by_user = {}
    for i, (u, item, _, t) in enumerate(base.tolist()):
        by_user.setdefault(u, []).append((t, i, item))
    rng = np.random.default_rng(1)
    for i in rng.choice(base.shape[0], 200, replace=False):
        want = _reference_history(by_user, base[i, 0], base[i, 3], HISTORY,
                                  strictly_before_row=i)
        np.testing.assert_array_equal(data.train["history"][i], want)
    for i in rng.choice(test.shape[0], 200, replace=False):
        want = _reference_history(by_user, test[i, 0], test[i, 3], HISTORY)
        np.testing.assert_array_equal(data.test["history"][i], want)
    # no test interaction in any history
    test_pairs = {(int(u), int(m)) for u, m in test[:, :2]}
    for split in (data.train, data.test):
        users = np.repeat(split["user_id"], HISTORY)
        items = split["history"].reshape(-1)
        pairs = {(int(u), int(m)) for u, m in zip(users, items) if m != -1}
        assert not pairs & test_pairs
    assert data.items["item_id"].size == 1682
    np.testing.assert_allclose(data.items["item_prob"].sum(), 1.0, rtol=1e-5)


# ----------------------------------------------------------------- loss
def test_retrieval_loss_matches_numpy(data):
    """In-batch softmax with temperature, log-frequency correction and
    accidental-hit removal, against numpy."""
    tf.keras.utils.set_random_seed(1)
    model = TwoTower(user_features=movielens.USER_FEATURES,
                     history_max_length=HISTORY, pooling="mean",
                     temperature=0.2, sampling_probability_key="item_prob")
    batch = {k: v[:64] for k, v in data.train.items()}
    batch["item_id"][5] = batch["item_id"][3]  # an accidental hit
    batch["genres"][5] = batch["genres"][3]
    batch["item_prob"][5] = batch["item_prob"][3]
    loss = float(model.compute_loss(batch, training=False))
    q = model.query_embedding(batch).numpy()
    c = model.candidate_embedding(batch).numpy()
    prob = np.clip(batch["item_prob"], 1e-6, 1.0)
    logits = q @ c.T / 0.2 - np.log(prob)[np.newaxis, :]
    same = batch["item_id"][:, None] == batch["item_id"][None, :]
    logits = np.where(same & ~np.eye(64, dtype=bool), -1e30, logits)
    shifted = logits - logits.max(1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
    want = -np.trace(log_softmax)  # Retrieval's default: a summed loss
    np.testing.assert_allclose(loss, want, rtol=1e-4)


# -------------------------------------------------------------- quality
def test_recall_beats_popularity(data, trained):
    got = trained.evaluate_exact(movielens.movielens_dataset(data.test, 4096),
                                 data.items)
    pop = movielens.popularity_recall(data.item_counts, data.test["item_id"])
    print(f"\nua.test recall, two-tower (tnet, attention history, "
          f"{EPOCHS} epochs): " + ", ".join(
              f"@{k}={got[f'recall_at_{k}']:.4f}" for k in (10, 50, 100))
          + "\nua.test recall, popularity baseline: " + ", ".join(
              f"@{k}={pop[f'recall_at_{k}']:.4f}" for k in (10, 50, 100)))
    assert got["examples"] == 9430
    for k in (10, 50, 100):
        assert got[f"recall_at_{k}"] > pop[f"recall_at_{k}"], (got, pop)


def test_evaluate_exact_matches_numpy_ranking(data, trained):
    """FactorizedTopK over the BruteForce index == ranking by numpy."""
    sub = {k: v[:2000] for k, v in data.test.items()}
    got = trained.evaluate_exact(movielens.movielens_dataset(sub, 512),
                                 data.items)
    ids, cand = trained.embed_candidates(data.items)
    q = trained.query_embedding(sub).numpy()
    scores = q @ cand.T
    true = scores[np.arange(len(q)), np.searchsorted(ids, sub["item_id"])]
    rank = (scores > true[:, None]).sum(1)  # 0 = best
    for k in (10, 50, 100):
        np.testing.assert_allclose(got[f"recall_at_{k}"], (rank < k).mean(),
                                   atol=1.5 / len(q))  # a tie at most


# --------------------------------------------------------------- export
def _query_sample(data, n=64):
    rng = np.random.default_rng(2)
    rows = rng.choice(data.test["item_id"].size, n, replace=False)
    sample = {k: data.test[k][rows].copy() for k in
              ("user_id", "history", *movielens.USER_FEATURES)}
    sample["user_id"][:4] = 10_000 + np.arange(4)  # users never seen
    sample["history"][4:8] = -1                    # users with no history
    return sample


def test_export_top_k_equals_in_process_without_tnet(data, trained, tmp_path):
    k = 100
    path = tn.serving.export_for_serving(trained, str(tmp_path / "1"),
                                        candidates=data.items, k=k)
    info = json.loads((tmp_path / "1" / "export_info.json").read_text())
    assert info["outputs"] == ["ids", "scores"]
    assert info["retrieval"] == {"k": k, "candidates": 1682}
    # the candidate side is precomputed: its tables are not exported
    assert set(info["tables"]) == {"user", "history_item"}
    assert tn.serving.export.tnet_ops_in(path) == {}
    sample = _query_sample(data)
    scores, ids = trained.candidate_index(data.items)(
        trained.query_embedding(sample), k=k)
    # the in-process top-K is the numpy ranking of the candidate matrix
    cand_ids, cand = trained.embed_candidates(data.items)
    ref = np.argsort(-(trained.query_embedding(sample).numpy() @ cand.T),
                     axis=1, kind="stable")[:, :k]
    np.testing.assert_array_equal(ids.numpy()[:, :10], cand_ids[ref][:, :10])
    npz = tmp_path / "sample.npz"
    np.savez(npz, __ids__=ids.numpy(), __scores__=scores.numpy(),
             **{n: (v.astype("S") if v.dtype == object else v)
                for n, v in sample.items()})
    out = tmp_path / "served.json"
    env = {n: v for n, v in os.environ.items()
           if n not in ("PYTHONPATH", "TF_USE_LEGACY_KERAS")}
    res = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "check_retrieval_export.py"),
         "--export_dir", path, "--sample", str(npz), "--out", str(out)],
        env=env, cwd="/", capture_output=True, text=True, timeout=300)
    print(res.stdout)
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    served = json.loads(out.read_text())
    assert served["tnet_imported"] is False
    np.testing.assert_array_equal(served["ids"], ids.numpy())
    np.testing.assert_allclose(served["scores"], scores.numpy(), atol=1e-5)


def test_export_rejects_a_ranking_model_and_bad_k(data, trained, tmp_path):
    with pytest.raises(ValueError, match="exceeds the 1682 candidates"):
        tn.serving.export_for_serving(trained, str(tmp_path / "a"),
                                     candidates=data.items, k=5000)
    assert not (tmp_path / "a").exists()
    ranking = tn.models.WideDeep(["a"], embedding_dim=4, hidden_units=(4,))
    with pytest.raises(TypeError, match="retrieval model"):
        tn.serving.export_for_serving(ranking, str(tmp_path / "b"),
                                     candidates=data.items)


# ----------------------------------------------------------- cold start
def test_cold_start_falls_back_to_features_and_history(data, trained):
    known = {k: data.test[k][:8].copy() for k in
             ("user_id", "history", *movielens.USER_FEATURES)}
    cold = dict(known, user_id=np.arange(8, dtype=np.int64) + 50_000)
    rows_before = int(trained.tables()["user"].size())
    inputs_known = trained.query_inputs(known).numpy()
    inputs_cold = trained.query_inputs(cold).numpy()
    dim = trained.embedding_dim
    user_dim = dim * (1 + len(movielens.USER_FEATURES))
    # the id slice reads the zero row; the user features are kept
    np.testing.assert_array_equal(inputs_cold[:, :dim], 0.0)
    np.testing.assert_allclose(inputs_cold[:, dim:user_dim],
                               inputs_known[:, dim:user_dim], rtol=1e-6,
                               atol=1e-7)
    # the history is pooled with attention whose query is [0, features]
    user_part = np.concatenate([np.zeros_like(inputs_known[:, :dim]),
                                inputs_known[:, dim:user_dim]], axis=1)
    history = trained.history_embeddings(known, query=user_part).numpy()
    np.testing.assert_allclose(inputs_cold[:, user_dim:], history,
                               rtol=1e-5, atol=1e-6)
    # so the cold query is the tower applied to [0, features, history]
    manual = tf.math.l2_normalize(trained.query_tower(
        np.concatenate([user_part, history], axis=1)), axis=1).numpy()
    np.testing.assert_allclose(trained.query_embedding(cold).numpy(), manual,
                               rtol=1e-5, atol=1e-6)
    assert np.isfinite(manual).all() and np.abs(manual).sum() > 0
    # users differing only in features / history get different queries
    assert np.abs(manual[0] - manual[1]).max() > 1e-3
    # inference never inserts a row for the unknown ids
    assert int(trained.tables()["user"].size()) == rows_before
    # a cold user with no history still gets a usable (non-NaN) ranking
    empty = dict(cold, history=np.full_like(known["history"], -1))
    q = trained.query_embedding(empty).numpy()
    assert np.isfinite(q).all() and np.allclose(np.linalg.norm(q, axis=1), 1)


# ------------------------------------------------------------- cluster
@pytest.mark.long  # make test-long; the PSS tests of test_distributed stay
def test_config_trains_on_a_ps_cluster(tmp_path):
    data_file("movielens/ml-100k_ua.base")
    run = start_cluster(2, 1, [
        sys.executable, "-m", "tnet.train",
        f"--flagfile={ROOT / 'configs' / 'two_tower_movielens.cfg'}",
        "--epochs=1", "--batch_size=1024",
        f"--model_dir={tmp_path / 'run'}",
        f"--export_dir={tmp_path / 'export'}",
        f"--data_cache_dir={tmp_path / 'cache'}"], timeout=500)
    assert run.wait(600) == 0, run.output[-6000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["cluster"] == {"ps": 2, "workers": 1}
    assert summary["eval"]["examples"] == 9430
    print(f"\ncluster run (1 epoch): {summary['eval']}, popularity "
          f"{summary['popularity_baseline']}")
    assert (summary["eval"]["recall_at_100"]
            > summary["popularity_baseline"]["recall_at_100"])
    assert summary["export"]["checked_without_tnet"] is True
    for name, table in summary["tables"].items():
        assert len(table["rows_per_shard"]) == 2, name
        assert min(table["rows_per_shard"]) > 0, name
