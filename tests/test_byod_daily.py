"""The daily loop of `python -m tnet.train --feature_spec ... --days`:
killed with SIGKILL in the middle of a day and run again with the same
command, it trains every day exactly once and keeps every checkpoint and
export (tnet/cli/daily.py)."""
from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from support import byod_data as bd

ROOT = pathlib.Path(__file__).resolve().parents[1]
DAYS = ["2026-11-01", "2026-11-02", "2026-11-03"]
ROWS, BATCH = 8000, 128  # a day long enough (63 steps) to be killed in


def _command(work: pathlib.Path) -> list[str]:
    return [sys.executable, "-m", "tnet.train", f"--feature_spec={work / 'spec.json'}",
            "--format=tfrecord", f"--days={DAYS[0]}..{DAYS[-1]}",
            f"--day_pattern={work}/data/{{day}}/*", f"--checkpoint_dir={work / 'ckpt'}",
            f"--export_dir={work / 'export'}", f"--model_dir={work / 'run'}",
            "--hidden_units=16", f"--batch_size={BATCH}", "--checkpoint_incremental",
            "--shuffle_buffer=0"]


# make test-long: test_exact_resume's daily-loop kill, which compares every state, stays.
@pytest.mark.long
def test_daily_loop_resumes_after_kill(tmp_path):
    bd.write_spec(tmp_path / "spec.json")
    for i, day in enumerate(DAYS):
        bd.write_tfrecord(tmp_path / "data" / day / "part-0.tfrecord", bd.rows(ROWS, i))
    env = dict(os.environ, PYTHONPATH=str(ROOT), CI="true", TF_CPP_MIN_LOG_LEVEL="2")
    log1 = open(tmp_path / "run1.log", "w+")
    proc = subprocess.Popen(_command(tmp_path), cwd=tmp_path, env=env,
                            stdout=log1, stderr=subprocess.STDOUT)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if f"training day {DAYS[1]}" in (tmp_path / "run1.log").read_text():
            break
        time.sleep(0.05)
    # Killed at once: day 2's fit has started (or is about to), not ended.
    assert proc.poll() is None, (tmp_path / "run1.log").read_text()[-3000:]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    first = (tmp_path / "run1.log").read_text()
    assert f"day {DAYS[0]} trained" in first and f"day {DAYS[1]} trained" not in first
    rerun = subprocess.run(_command(tmp_path), cwd=tmp_path, env=env, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=400)
    assert rerun.returncode == 0, rerun.stdout[-4000:]
    second = rerun.stdout
    both = first + second
    for day in DAYS:  # each day finished exactly once over the two runs
        assert both.count(f"day {day} trained, checkpoint") == 1, day
    assert f"day {DAYS[0]} already trained, skipped" in second
    state = json.loads((tmp_path / "ckpt" / "days.json").read_text())["days"]
    assert sorted(state) == DAYS
    # The optimizer's step count says no batch of a finished day ran twice
    # (the days are the same size; a retrained day 2 would add a day).
    steps_per_day = state[DAYS[0]]["train_step"]
    assert steps_per_day >= -(-ROWS // BATCH)
    assert [state[d]["train_step"] for d in DAYS] == [
        steps_per_day * (i + 1) for i in range(len(DAYS))]
    for i, day in enumerate(DAYS):
        assert (tmp_path / "ckpt" / f"ckpt-{day.replace('-', '')}" / "manifest.json").exists()
        version = tmp_path / "export" / day.replace("-", "")
        assert (version / "saved_model.pb").exists(), version
        if i:
            before = state[day]["eval_before_training"]
            assert 0.5 < before["auc"] <= 1.0 and before["gauc_groups"] > 0
            assert before["calibration"] > 0


def test_a_failed_export_check_is_moved_aside_and_redone(tmp_path, monkeypatch):
    """A day's export that fails its no-tnet check must not stay as that
    day's version (a rerun would skip it): it is moved to a hidden name."""
    from tnet.cli import daily  # noqa: PLC0415
    from tnet.cli.config import JobConfig  # noqa: PLC0415
    bd.write_spec(tmp_path / "spec.json")
    bd.write_tfrecord(tmp_path / "data" / DAYS[0] / "part-0.tfrecord",
                      bd.rows(64, 0))
    export_dir = tmp_path / "export"
    cfg = JobConfig(export_dir=str(export_dir),
                    day_pattern=f"{tmp_path}/data/{{day}}/*")
    version = export_dir / DAYS[0].replace("-", "")

    def failing_check(cfg, model, job, version, sample_data):
        path = export_dir / str(version)
        os.makedirs(path)  # the export was published, then...
        (path / "saved_model.pb").write_bytes(b"x")
        raise RuntimeError("export check: predictions differ")

    monkeypatch.setattr(daily, "export_and_check", failing_check)

    state = {"days": {}}
    spec = tn_spec(tmp_path / "spec.json")
    import pytest  # noqa: PLC0415
    with pytest.raises(RuntimeError, match="predictions differ"):
        daily._ensure_export(cfg, None, spec, DAYS[0], state, str(tmp_path))
    assert not version.exists()
    assert [n for n in os.listdir(export_dir)
            if n.startswith(f".{version.name}.failed-")]
    assert "export" not in state["days"].get(DAYS[0], {})


def tn_spec(path):
    import tnet as tn  # noqa: PLC0415
    return tn.data.spec.load(str(path))


def test_daily_steps_do_not_drift_when_a_step_counts_twice(monkeypatch):
    """A retried step that counted twice in optimizer.iterations during a
    day's fit on a cluster (simulated: one extra increment in each day) is
    taken off after the fit, as tn.callbacks.Checkpoint does at an epoch
    end: every day adds exactly its steps, so days.json's train_step stays
    steps x days (tnet/cli/daily.py `_fit_day`, the cluster path, run
    here in one process)."""
    import tf_keras  # noqa: PLC0415
    from tnet.cli import daily  # noqa: PLC0415
    from tnet.cli.config import JobConfig  # noqa: PLC0415
    from tests.support.ckpt import dataset, tiny  # noqa: PLC0415
    cfg = JobConfig(batch_size=64)

    class Day:  # what _fit_day reads of a day's SpecJobData
        train_rows = 640  # 10 steps of 64

        def train(self, input_context=None, repeat=False):
            return dataset(640, batch=64).repeat() if repeat else dataset(640)

    class CountTwice(tf_keras.callbacks.Callback):
        fired = 0

        def on_train_batch_end(self, batch, logs=None):
            if batch == 4:
                self.model.optimizer.iterations.assign_add(1)
                CountTwice.fired += 1

    model = tiny(2)
    for day in range(3):
        daily._fit_day(cfg, model, Day(), True, [CountTwice()])
        assert int(model.optimizer.iterations.numpy()) == 10 * (day + 1)
    assert CountTwice.fired == 3


def test_a_days_checkpoint_cut_off_after_it_was_published_is_kept(
        tmp_path, monkeypatch, capfd):
    """A ps that stops answering after the day's checkpoint was renamed into
    place (its change marks not yet set): tn.distribute.through_ps_cut runs
    the save again, which takes the published checkpoint as it is instead
    of failing on "already exists" (tnet/cli/daily.py `_save_day`). A
    second day's save at a step whose directory already exists still
    refuses, as before."""
    import tensorflow as tf  # noqa: PLC0415
    from tensorflow.python.distribute.coordinator import (  # noqa: PLC0415
        cluster_coordinator as cc)
    import tnet as tn  # noqa: PLC0415
    from tnet.cli import daily  # noqa: PLC0415
    from tnet.cli.config import JobConfig  # noqa: PLC0415
    from tests.support.ckpt import tiny  # noqa: PLC0415
    cfg = JobConfig()
    monkeypatch.setattr(cc.Cluster, "_tnet_policy", True, raising=False)
    monkeypatch.setattr("time.sleep", lambda s: None)
    monkeypatch.setenv("TF_CONFIG", json.dumps(
        {"cluster": {"chief": ["10.0.0.1:2222"], "worker": ["10.0.0.2:2222"],
                     "ps": ["10.0.0.3:2222", "10.0.0.4:2222"]},
         "task": {"type": "chief", "index": 0}}))
    save = tn.saving.save
    calls = []

    def cut_after_publish(model, directory, **kwargs):
        calls.append(kwargs["step"])
        path = save(model, directory, **kwargs)
        if len(calls) == 1:
            raise tf.errors.UnavailableError(
                None, None, "recvmsg:Connection timed out Additional GRPC "
                "error information from remote target /job:ps/replica:0/"
                "task:1 while calling /tensorflow.eager.EagerService/Enqueue")
        return path

    monkeypatch.setattr(tn.saving, "save", cut_after_publish)
    model = tiny(2)
    ckpt_dir = str(tmp_path / "ckpt")
    path = daily._save_day(cfg, model, ckpt_dir, 7, "day 1's checkpoint")
    assert calls == [7]  # the retry took the published checkpoint
    assert path == os.path.join(ckpt_dir, "ckpt-7")
    assert tn.saving.latest_checkpoint(ckpt_dir) == path
    err = capfd.readouterr().err
    assert "tnet: day 1's checkpoint: ps:1 does not answer" in err
    assert "tnet: day 1's checkpoint: done" in err
    # A first call never takes an existing directory for its own.
    with pytest.raises(tn.saving.CheckpointError, match="already exists"):
        daily._save_day(cfg, model, ckpt_dir, 7, "day 1's checkpoint")
