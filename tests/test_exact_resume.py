"""A resumed run is the same model: train k steps, save, SIGKILL, restore
in a fresh process, train m more; every key, row, slot, meta, pending
admission entry, lifecycle counter, the optimizer step, every dense and
optimizer variable and the predictions equal an uninterrupted run of k + m
steps. For each table lifecycle option (admission min_count, row cap
max_rows, TTL eviction, show decay with threshold eviction) and each sparse
rule.

A property test: each run draws its cases (k, m, the data seed, and per
table its rule, option(s), shard count and the options' parameters) from
FUZZ_SEED (conftest.py prints it; set it to replay a run). One model holds
one table per case, so one killed-and-resumed run (three processes)
covers many cases: in `make test` one run covers every rule and every
option (10 of the 20 pairs); the long tests run every pair, pairs of
options on one table and up to 3 shards a table, in 4 more draws."""
from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys

import numpy as np
import pytest

import tnet as tn  # noqa: F401
from tests.support import forkrun
import tensorflow as tf

from tests.conftest import fuzz_seed

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROGRAM = ROOT / "tests" / "programs" / "resume_lifecycle.py"

RULES = ("sgd", "adagrad", "rowwise_adagrad", "adam", "ftrl")
OPTIONS = ("min_count", "max_rows", "ttl", "decay")


def test_the_matrix_names_every_sparse_rule():
    """A new rule in tnet/optimizer/sparse.py joins the resume matrix."""
    from tnet.optimizer import sparse  # noqa: PLC0415
    assert sorted(RULES) == sorted(sparse._BY_NAME)  # noqa: SLF001


def draw(rng, pairs, max_shards=2):
    """A run's spec (see tests/programs/resume_lifecycle.py): one table per
    (rule, options) pair, every parameter drawn from rng. Parameters are
    drawn so each option acts within k + m steps: min_count leaves keys
    pending, the cap frees rows, TTL and decay evict."""
    k, m = int(rng.integers(3, 13)), int(rng.integers(3, 13))
    tables = []
    for rule, options in pairs:
        every = int(rng.integers(1, 4))
        small_cap = int(rng.integers(8, 21))
        tables.append({
            "rule": rule, "options": sorted(options),
            "num_shards": int(rng.integers(1, max_shards + 1)),
            "min_count": int(rng.integers(2, 5)),
            "max_rows": int(rng.integers(20, 60)),
            # a row one step old outlives ttl only if maintenance runs
            # after it: keep ttl + every below k + m
            "ttl_steps": int(rng.integers(1, max(2, min(6, k + m - every)))),
            "decay_rate": float(rng.uniform(0.3, 0.9)),
            "threshold": float(rng.uniform(1.0, 2.5)),
            "every": every,
            "users": int(rng.integers(200, 2000)),
            "zipf": float(rng.uniform(1.2, 1.6))})
        case = tables[-1]
        if len(options) > 1:
            # Two options on one table: admission and eviction keep rows
            # few, so the cap must be small to act, and decay must take
            # an admitted row (show >= min_count) below its threshold.
            case["max_rows"] = small_cap
            if "min_count" in options:
                case["threshold"] *= case["min_count"]
    return {"k": k, "m": m, "seed": int(rng.integers(1 << 30)),
            "batch": int(rng.choice([32, 64])), "tables": tables}


def _run(tmp, *args, expect_kill=False):
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}"
               f"{os.environ.get('PYTHONPATH', '')}", TF_CPP_MIN_LOG_LEVEL="2",
               CUDA_VISIBLE_DEVICES="")
    out = forkrun.run([sys.executable, str(PROGRAM), *args], cwd=tmp,
                      env=env, capture_output=True, text=True, timeout=600,
                      script_imports_tnet=True)
    if expect_kill:
        assert out.returncode == -signal.SIGKILL, out.stderr[-3000:]
        assert "SAVED" in out.stdout
    else:
        assert out.returncode == 0, out.stderr[-3000:]


def check_resume(tmp_path, spec):
    """Runs whole / first (killed) / second on spec; every array of the
    resumed run equals the uninterrupted run's, and each table's options
    did something the resume had to carry."""
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps(spec, indent=1))
    replay = (f"FUZZ_SEED={fuzz_seed()}; cases: {cases}; k={spec['k']} "
              f"m={spec['m']}")
    whole, resumed = tmp_path / "whole.npz", tmp_path / "resumed.npz"
    ckpt = str(tmp_path / "ckpt")
    common = ["--cases", str(cases)]
    _run(tmp_path, "--mode", "whole", "--out", str(whole), *common)
    _run(tmp_path, "--mode", "first", "--ckpt", ckpt, *common,
         expect_kill=True)
    _run(tmp_path, "--mode", "second", "--ckpt", ckpt, "--out", str(resumed),
         *common)
    a, b = np.load(whole), np.load(resumed)
    assert sorted(a.files) == sorted(b.files), replay
    differ = [k for k in a.files if not np.array_equal(a[k], b[k])]
    if differ:
        named = {f"t{i}": f"{c['rule']}+{'+'.join(c['options'])}"
                 for i, c in enumerate(spec["tables"])}
        pytest.fail(f"differs after the resume: "
                    f"{[(k, named.get(k.split('/')[0], '')) for k in differ]}"
                    f" ({replay})")
    assert int(a["iterations"]) == spec["k"] + spec["m"]
    # Each option did something the resume had to carry over (counters
    # per shard: admitted, rejected, evicted, pending_dropped, cap_evicted).
    idle = []
    for i, case in enumerate(spec["tables"]):
        counters = a[f"t{i}/counters"].sum(axis=0)
        acted = {"min_count": len(a[f"t{i}/pending_keys"]) > 0
                 and counters[1] > 0,
                 "max_rows": counters[4] > 0,
                 "ttl": counters[2] > 0, "decay": counters[2] > 0}
        idle += [(f"t{i}", case["rule"], o) for o in case["options"]
                 if not acted[o]]
    assert not idle, f"options that never acted: {idle} ({replay})"


def test_killed_and_resumed_run_equals_the_uninterrupted_one(tmp_path):
    """`make test`: one model of 10 tables, each rule with two of the four
    options (one table each) and each option on two or three rules, which
    rule meets which option drawn anew each run; the long test below runs
    the whole matrix."""
    rng = np.random.default_rng([fuzz_seed(), 0])
    rules, options = rng.permutation(RULES), rng.permutation(OPTIONS)
    pairs = [(str(r), (str(options[(2 * i + j) % 4]),))
             for i, r in enumerate(rules) for j in (0, 1)]
    check_resume(tmp_path, draw(rng, pairs))


@pytest.mark.long
@pytest.mark.parametrize("draw_index", range(1, 5))
def test_resume_matrix_long(tmp_path, draw_index):
    """The matrix again with other draws: every rule x option pair, every
    rule x pair of options, up to 3 shards a table."""
    rng = np.random.default_rng([fuzz_seed(), draw_index])
    pairs = [(r, (o,)) for r in RULES for o in OPTIONS]
    pairs += [(r, tuple(rng.choice(OPTIONS, 2, replace=False)))
              for r in RULES]
    check_resume(tmp_path, draw(rng, pairs, max_shards=3))


def test_pending_state_moves_to_another_shard_count_and_back():
    """export_pending / import_pending: a table restored with another
    number of shards holds the same pending keys and counts (ages are
    per stripe, so only their order within a stripe is kept there), and
    keys that have a row are not pending."""
    a = tn.SparseTable("pend_a", 4, num_shards=2, min_count=4,
                       optimizer=tn.optimizer.Adagrad(0.1))
    rng = np.random.default_rng(0)
    for step in range(1, 6):
        keys = np.unique(rng.zipf(1.4, 400) % 3000).astype(np.int64)
        a.push(keys, np.zeros((len(keys), 4), np.float32), step=step,
               unique_keys=True)
    state = a.export_pending()
    assert len(state["keys"]) > 0 and state["counts"].max() < 4
    b = tn.SparseTable("pend_b", 4, num_shards=3, min_count=4,
                       optimizer=tn.optimizer.Adagrad(0.1))
    b.import_pending(state["keys"], state["counts"], state["ages"],
                     state["counters"])
    got = b.export_pending()
    order_a, order_b = np.argsort(state["keys"]), np.argsort(got["keys"])
    np.testing.assert_array_equal(state["keys"][order_a], got["keys"][order_b])
    np.testing.assert_array_equal(state["counts"][order_a],
                                  got["counts"][order_b])
    assert b.stats()["rejected"] == a.stats()["rejected"]
    assert b.stats()["pending"] == a.stats()["pending"]
    # The next pushes admit the same keys in both tables.
    keys = state["keys"][:50]
    before = {t.table_name: int(t.size()) for t in (a, b)}
    for t in (a, b):
        t.push(keys, np.zeros((50, 4), np.float32), step=9,
               shows=np.full(50, 2.0, np.float32), unique_keys=True)
    admitted = [int(t.size()) - before[t.table_name] for t in (a, b)]
    assert admitted[0] == admitted[1] > 0
    # A key with a row is never pending after an import.
    rows = a.export()[0].numpy()
    b.import_pending(rows[:5], np.ones(5, np.float32), np.zeros(5, np.int64))
    c = b.export_pending()
    assert not np.isin(rows[:5], c["keys"]).any() or int(b.size()) == 0


def test_row_cap_frees_the_same_rows_after_a_restore():
    """The row cap picks its victims from what rows hold, not from where
    they sit in memory: a restore packs the rows in the checkpoint's order,
    while in the saving process a new key fills the hole a freed row left.
    Here a new key (200) and an old one (8) tie on show and last_step, and
    the next cap eviction frees exactly one of them: the same one in the
    table and in its restored copy (a restore is an import of the export)."""
    def table(name):
        return tn.SparseTable(name, 4, max_rows=10,
                              optimizer=tn.optimizer.Adagrad(0.1))

    def push(t, keys, step, show=1.0):
        keys = np.asarray(keys, np.int64)
        t.push(keys, np.full((len(keys), 4), 0.5, np.float32), step=step,
               shows=np.full(len(keys), show, np.float32), unique_keys=True)

    def rows(t):
        keys, weights, slots, meta = (x.numpy() for x in t.export())
        order = np.argsort(keys)
        return keys[order], weights[order], slots[order], meta[order]

    saved = table("cap_saved")
    push(saved, range(10), step=1)               # at the cap
    push(saved, [0, 1, 2, 3, 4, 7, 8, 9], step=2)  # all but 5, 6 hotter
    push(saved, [100], step=3, show=2.0)  # over the cap: frees 5 and 6
    assert rows(saved)[0].tolist() == [0, 1, 2, 3, 4, 7, 8, 9, 100]
    restored = table("cap_restored")
    restored.import_rows(*saved.export())
    for t in (saved, restored):
        push(t, [8], step=4)
        push(t, [200], step=4, show=3.0)  # the tie: show 3, last_step 4
        push(t, range(1000, 1008), step=5, show=4.0)  # frees 9 rows
    a, b = rows(saved), rows(restored)
    assert np.isin([8, 200], a[0]).sum() == 1, a[0]  # the tie was split
    for field, x, y in zip(("keys", "weights", "slots", "meta"), a, b):
        np.testing.assert_array_equal(x, y, err_msg=field)
    assert saved.stats()["cap_evicted"] == 2 + 9


def test_import_pending_rejects_bad_input():
    t = tn.SparseTable("pend_bad", 4, min_count=3)
    with pytest.raises(ValueError, match="one length"):
        t.import_pending(np.arange(3), np.ones(2, np.float32),
                         np.zeros(3, np.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match="finite count"):
        t.import_pending(np.arange(2), np.array([1, np.nan], np.float32),
                         np.zeros(2, np.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match="2\\^32"):
        t.import_pending(np.arange(2), np.ones(2, np.float32),
                         np.array([0, -1], np.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match="one length"):
        from tnet import _ops
        _ops.sparse_table_import_pending(
            t.shards[0].resource_handle, [1, 2], [1.0], [0, 0],
            tf.zeros([0], tf.int64))


DAYS = ["2026-11-01", "2026-11-02", "2026-11-03"]


def _daily(work: pathlib.Path, ckpt: str) -> list:
    """The CLI's daily loop on the feature spec with admission (min_count)
    and per-day maintenance (decay + threshold eviction) on, incremental
    checkpoints: the deltas of days 2 and 3 carry the pending state too."""
    return [sys.executable, "-m", "tnet.train",
            f"--feature_spec={work / 'spec.json'}", "--format=tfrecord",
            f"--days={DAYS[0]}..{DAYS[-1]}", f"--day_pattern={work}/data/{{day}}/*",
            f"--checkpoint_dir={ckpt}", f"--model_dir={ckpt}-run",
            "--hidden_units=16", "--batch_size=64", "--shuffle_buffer=0",
            "--checkpoint_incremental", "--min_count=2",
            "--show_decay_rate=0.5", "--show_threshold=0.6"]


def _checkpoint_arrays(ckpt: pathlib.Path) -> dict:
    """Every array of every day's checkpoint, table rows sorted by key (a
    restored table lists its rows in another order), dense variables by
    name."""
    import h5py  # noqa: PLC0415
    out = {}
    for day in DAYS:
        d = ckpt / f"ckpt-{day.replace('-', '')}"
        for h5 in sorted((d / "sparse").glob("*/*.h5")):
            with h5py.File(h5) as f:
                order = np.argsort(f["keys"][:], kind="stable")
                for name, data in f.items():
                    values = data[:]
                    if len(values) == len(order):
                        values = values[order]
                    out[f"{h5.relative_to(ckpt)}/{name}"] = values
        reader = tf.train.load_checkpoint(str(d / "dense" / "ckpt"))
        for name in reader.get_variable_to_shape_map():
            if "save_counter" not in name and "OBJECT_GRAPH" not in name:
                out[f"{d.name}/dense/{name}"] = reader.get_tensor(name)
    return out


def test_daily_loop_killed_mid_day_equals_the_uninterrupted_one(tmp_path):
    """`python -m tnet.train --days ...` killed with SIGKILL while it trains
    day 2, run again: every day's checkpoint (rows, slots, meta, pending
    admission entries, counters, dense variables and optimizer state) and
    the evaluation before each day equal an uninterrupted run's. Ids are
    drawn from 20,000 users, so most wait for a second show across days."""
    import json  # noqa: PLC0415
    import time  # noqa: PLC0415
    sys.path.insert(0, str(ROOT / "tests"))
    from support import byod_data as bd  # noqa: PLC0415
    bd.write_spec(tmp_path / "spec.json")
    for i, day in enumerate(DAYS):
        bd.write_tfrecord(tmp_path / "data" / day / "part-0.tfrecord",
                          bd.rows(6000, i, users=20_000))
    env = dict(os.environ, PYTHONPATH=str(ROOT), CI="true",
               TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    run = forkrun.run(_daily(tmp_path, str(whole)), cwd=tmp_path, env=env,
                      capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stderr[-3000:]
    day_seconds = json.loads((whole / "days.json").read_text())[
        "days"][DAYS[1]]["train_seconds"]
    log = tmp_path / "cut.log"
    with open(log, "w") as out:
        proc = forkrun.Popen(_daily(tmp_path, str(cut)), cwd=tmp_path,
                             env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            if f"training day {DAYS[1]}" in log.read_text():
                time.sleep(day_seconds / 2)  # into day 2's fit
                break
            time.sleep(0.05)
        assert proc.poll() is None, log.read_text()[-3000:]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    first = log.read_text()
    assert f"day {DAYS[0]} trained" in first, first[-3000:]
    assert f"day {DAYS[1]} trained" not in first, "killed too late"
    rerun = forkrun.run(_daily(tmp_path, str(cut)), cwd=tmp_path, env=env,
                        capture_output=True, text=True, timeout=400)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"day {DAYS[0]} already trained, skipped" in rerun.stdout
    a, b = _checkpoint_arrays(whole), _checkpoint_arrays(cut)
    assert sorted(a) == sorted(b)
    differ = [k for k in a if not np.array_equal(a[k], b[k])]
    assert not differ, f"differs after the kill and rerun: {differ}"
    # The options did something the resume had to carry: ids waiting for
    # a second show at the end of day 1, admissions refused, rows evicted.
    pending = a["ckpt-20261101/sparse/embedding/pending.h5/keys"]
    counters = a["ckpt-20261103/sparse/embedding/pending.h5/counters"][0]
    assert len(pending) > 1000 and counters[1] > 0 and counters[2] > 0
    days_a, days_b = (json.loads((p / "days.json").read_text())["days"]
                      for p in (whole, cut))
    for day in DAYS[1:]:
        assert (days_a[day]["eval_before_training"]
                == days_b[day]["eval_before_training"]), day
        assert days_a[day]["train_step"] == days_b[day]["train_step"]
