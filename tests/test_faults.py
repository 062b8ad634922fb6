"""Fault injection: SIGKILL of cluster tasks during fit and during a
checkpoint save, and a full disk during a save.

Every scenario ends the same way: the newest complete checkpoint restores
bit-exactly (table rows, dense and optimizer variables compared byte for
byte with a dump taken right after it was saved) and training resumes from
it to the planned step. Programs: tests/programs/fault_train.py (the model
and dumps of tests/programs/ckpt_train.py, plus a pause inside a save and
exit 138 on a lost ps), driven through tools/launch_local.py.

Disk full uses a real size-limited file system: a 4 MiB tmpfs mounted for
the test (needs root, as in this project's containers). Without the
permission to mount, it falls back to a part-file writer that writes some
bytes and then raises OSError(ENOSPC), and says so in the test output.

(tests/test_distributed.py and tests/test_checkpoint.py already cover a
worker kill with tnet.train, a ps kill's exit 138, SIGKILL of the whole
cluster after a save, and an injected write error.)
"""
from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import tnet as tn
from tests.conftest import ROOT
from tests.support.ckpt import (assert_dumps_equal, assert_same_tables, build,
                                dataset, dense_state, fit, quiet, snapshot,
                                tiny)
from tests.support.cluster import assert_all_stopped
from tests.support.cluster import cluster as start_cluster
from tests.support import forkrun
from tnet.saving import checkpoint as ckpt_mod
from tnet.saving import CheckpointError

PROGRAM = [sys.executable, str(ROOT / "tests" / "programs" / "fault_train.py")]


def _args(tmp_path, *extra):
    return PROGRAM + ["--dir", str(tmp_path / "ckpt"), "--dump_dir",
                      str(tmp_path / "dump"), "--rows", "640", *extra]


def _steps(ckpt_dir):
    return [s for s, _ in tn.saving.list_checkpoints(ckpt_dir)]


def _resume_and_check(tmp_path, step, epochs, extra=(), cluster=True):
    """A new cluster restores ckpt-<step> bit-exactly and trains on to
    epochs x 10 steps: 2 ps (the tables' rows go back to their shards) and
    one worker (what is checked is the restore and the step count, which
    a second worker does not change; the first runs had two, and lost
    one). cluster=False: one process restores the 2-ps checkpoint (its
    rows gathered from both shards' parts) and trains on."""
    args = _args(tmp_path, "--epochs", str(epochs), *extra)
    if cluster:
        again = start_cluster(2, 1, args, timeout=400)
        code = again.wait(400)
        out = again.output
    else:
        env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
        env.pop("TF_CONFIG", None)
        run = forkrun.run(args, cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=400, script_imports_tnet=True)
        code, out = run.returncode, run.stdout + run.stderr
    assert code == 0, out[-3000:]
    assert f"CKPT_RESTORED step={step}" in out, out[-3000:]
    assert_dumps_equal(tmp_path / "dump" / f"saved-{step}.npz",
                        tmp_path / "dump" / f"restored-{step}.npz")
    restored = np.load(tmp_path / "dump" / f"restored-{step}.npz")
    assert int(restored["iterations"]) == step
    assert sum(k.startswith("dense/") for k in restored.files) > 10
    assert f"CKPT_DONE iterations={10 * epochs}" in out, out[-3000:]
    assert _steps(tmp_path / "ckpt")[-1] == 10 * epochs
    return out


def test_chief_killed_during_save_then_resume(tmp_path):
    """SIGKILL of the chief inside the 3rd save (ckpt-30, a delta: one part
    file written into the temp directory): the launcher stops the cluster;
    ckpt-20 stays the newest checkpoint, the partial temp directory is never
    listed, and a new cluster restores ckpt-20 and trains on, writing deltas
    again (the restore rebuilt the row index) and removing the leftover.
    One worker: the save is the chief's, and both ps write their parts."""
    first = start_cluster(2, 1, _args(tmp_path, "--epochs", "5", "--incremental",
                                 "--pause_at_save", "3"), timeout=400)
    try:
        line = first.read_until(r"FAULT_IN_SAVE tmp=", 300)
        assert line, first.output[-3000:]
        tmp = line.split("tmp=", 1)[1].strip()
        assert os.path.basename(tmp).startswith(".ckpt-30.tmp-")
        os.kill(first.pids["chief"], signal.SIGKILL)
        code = first.wait(60)
    finally:
        assert not first.kill_all(), "still running after SIGKILL"
    assert_all_stopped(first)
    assert code == 256 - signal.SIGKILL, first.output[-2000:]  # the launcher exits with the chief's -9
    assert "[launch] done, exit -9" in first.output
    assert os.path.isdir(tmp) and any(
        f.endswith(".h5") for _, _, files in os.walk(tmp) for f in files)
    assert _steps(tmp_path / "ckpt") == [10, 20]
    assert tn.saving.latest_checkpoint(tmp_path / "ckpt").endswith("ckpt-20")

    _resume_and_check(tmp_path, 20, 5, ("--incremental",))
    assert not os.path.exists(tmp)
    final = tn.saving.read_manifest(tn.saving.latest_checkpoint(tmp_path / "ckpt"))
    assert final["kind"] == "delta" and final["step"] == 50


def test_worker_then_ps_killed_exit_138_then_resume(tmp_path):
    """SIGKILL of worker:1 after ckpt-10: ClusterCoordinator goes on with
    worker:0 alone and the next saves (20, 30) still come, with the step
    count exact. Then SIGKILL of ps:1: the chief exits 138 naming ps:1. A new
    cluster restores the newest checkpoint bit-exactly and finishes."""
    first = start_cluster(2, 2, _args(tmp_path, "--epochs", "6", "--sleep", "0.5"), timeout=400)
    try:
        assert first.read_until(r"CKPT_SAVED step=10\b", 300), first.output[-3000:]
        os.kill(first.pids["worker:1"], signal.SIGKILL)
        assert first.read_until(r"CKPT_SAVED step=30\b", 300), first.output[-3000:]
        os.kill(first.pids["ps:1"], signal.SIGKILL)
        code = first.wait(180)
    finally:
        assert not first.kill_all(), "still running after SIGKILL"
    assert_all_stopped(first)
    out = first.output
    assert code == tn.distribute.EXIT_RESTART == 138, out[-3000:]
    lost = re.search(r"FAULT_LOST_PS lost parameter server task\(s\) (.*)", out)
    assert lost and lost.group(1).startswith("ps:1 "), out[-3000:]
    assert "[launch] worker:1 exited with -9" in out
    assert "[launch] ps:1 exited with -9" in out
    # Saves after the worker died came at the planned steps: no step was
    # lost or run twice when its worker vanished.
    saved = [int(s) for s in re.findall(r"CKPT_SAVED step=(\d+)", out)]
    assert saved[:3] == [10, 20, 30], saved
    step = _steps(tmp_path / "ckpt")[-1]
    assert step in (30, 40), step  # 40 if that save finished before the ps died
    assert (tmp_path / "dump" / f"saved-{step}.npz").exists()

    # One process resumes (3 fewer Python + TensorFlow starts than a
    # cluster); a cluster resume is test_chief_killed_during_save_then_resume's.
    _resume_and_check(tmp_path, step, 6, cluster=False)


# ---------------------------------------------------------------- disk full
@pytest.fixture
def small_fs(tmp_path, monkeypatch):
    """(directory, how): a 4 MiB tmpfs, or an ENOSPC-injecting writer."""
    mnt = tmp_path / "fs"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)],
                         capture_output=True, text=True)
    if res.returncode == 0:
        try:
            yield mnt, "tmpfs"
        finally:  # lazy: a file left open by a failed save must not keep it mounted
            subprocess.run(["umount", "-l", str(mnt)], check=False)
        return
    print(f"cannot mount a tmpfs ({res.stderr.strip()}); injecting ENOSPC instead")
    real = ckpt_mod._write_part

    def full_after_some_bytes(path, table, *args, **kwargs):
        if table.size().numpy() > 10_000:
            with open(path, "wb") as f:
                f.write(b"\0" * 4096)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return real(path, table, *args, **kwargs)

    monkeypatch.setattr(ckpt_mod, "_write_part", full_after_some_bytes)
    yield mnt, "injected"


def _grow(model, rows, seed=0):
    """Adds `rows` random rows to every table (as training on new ids would)."""
    rng = np.random.default_rng(seed)
    for table in model.tables().values():
        keys = rng.integers(1 << 40, 1 << 41, rows, dtype=np.int64)
        table.import_rows(keys, rng.random((rows, table.dim), np.float32),
                          rng.random((rows, table.num_slots), np.float32),
                          np.zeros((rows, 3)))


def test_disk_full_during_save(small_fs):
    directory, how = small_fs
    model = tiny(2)
    fit(model)
    first = tn.saving.save(model, directory, progress=quiet)
    saved, saved_dense = snapshot(model), dense_state(model)
    # ~120k rows x 2 tables: tens of MB, more than the 4 MiB file system.
    _grow(model, 120_000)
    fit(model, seed=1)
    with pytest.raises(CheckpointError) as err:
        tn.saving.save(model, directory, keep=1, progress=quiet)
    message = str(err.value)
    assert str(directory) in message and "ckpt-" in message
    assert "is full" in message and "free space or save to another directory" in message
    assert f"complete checkpoint is {first}" in message or \
        f"newest complete one is {first}" in message
    assert isinstance(err.value, OSError) and err.value.errno == errno.ENOSPC
    # Nothing partial is left, the previous checkpoint is intact and newest.
    assert os.listdir(directory) == [os.path.basename(first)]
    assert tn.saving.latest_checkpoint(directory) == first
    fresh = tiny(3)
    build(fresh)  # dense and optimizer variables exist: restored right away
    tn.saving.restore(fresh, directory, progress=quiet)
    assert_same_tables(saved, snapshot(fresh))
    for a, b in zip(saved_dense, dense_state(fresh)):
        assert a.tobytes() == b.tobytes()
    if how == "tmpfs":  # nothing of the failed save holds space
        assert shutil.disk_usage(directory).used < 1 << 20

    # The callback in fit: the same error ends fit; nothing partial either.
    cb = tn.callbacks.Checkpoint(directory, every_n_epochs=1, restore=False, verbose=0)
    with pytest.raises(CheckpointError, match="is full"):
        model.fit(dataset(640, seed=2), epochs=1, callbacks=[cb], verbose=0)
    assert tn.saving.latest_checkpoint(directory) == first
    assert os.listdir(directory) == [os.path.basename(first)]


@pytest.mark.skipif(os.environ.get("TNET_SLOW_FAULTS") != "1",
                    reason="slow variant: set TNET_SLOW_FAULTS=1")
def test_worker_killed_mid_epoch_step_may_run_twice(tmp_path):
    """SIGKILL of worker:1 in the middle of an epoch (100 steps per epoch).
    What happens (measured): ClusterCoordinator re-runs the step that was in
    flight on the dead worker on worker:0, and fit completes. The lost
    worker's step may already have applied its update on the ps, so it can
    count twice (at-least-once): the optimizer ends at 300 or 301, not
    exactly 300, and later checkpoints are numbered accordingly."""
    first = start_cluster(2, 2, _args(tmp_path, "--epochs", "3", "--rows", "6400"), timeout=400)
    try:
        assert first.read_until(r"CKPT_SAVED step=100\b", 300), first.output[-3000:]
        time.sleep(1.5)  # into epoch 2
        os.kill(first.pids["worker:1"], signal.SIGKILL)
        code = first.wait(300)
    finally:
        assert not first.kill_all(), "still running after SIGKILL"
    out = first.output
    assert code == 1 and "[launch] worker:1 exited with -9" in out, out[-3000:]
    done = int(re.search(r"CKPT_DONE iterations=(\d+)", out).group(1))
    assert 300 <= done <= 301, done
    saved = [int(s) for s in re.findall(r"CKPT_SAVED step=(\d+)", out)]
    assert saved[0] == 100 and saved[-1] == done and len(saved) == 3, saved
    step = saved[-1]
    fresh_dump = np.load(tmp_path / "dump" / f"saved-{step}.npz")
    assert int(fresh_dump["iterations"]) == step


# ------------------------------------------------------ faults in an export
def _serves_without_tnet(export_dir, sample):
    """Loads export_dir in a process that never imports tnet and compares
    its predictions with the sample's."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("TF_USE_LEGACY_KERAS", "LD_PRELOAD")}
    run = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "check_export.py"),
         "--export_dir", str(export_dir), "--sample", str(sample)],
        env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "tnet imported: False" in run.stdout


def test_export_killed_mid_write_leaves_previous_version_servable(tmp_path):
    base = tmp_path / "model"
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "programs" / "export_kill.py"),
         str(base)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("EXPORT_WRITING"):
                proc.send_signal(signal.SIGKILL)
                break
    finally:
        proc.kill()
        proc.wait(60)
    assert any(line.startswith("EXPORT_WRITING") for line in lines), \
        "".join(lines)[-3000:]
    # Version 2 was never published: only a hidden temp dir holds its files
    # (TF Serving loads numeric version directories only).
    names = sorted(os.listdir(base))
    assert "2" not in names and "1" in names, names
    temps = [n for n in names if n.startswith(".2.tmp-")]
    assert len(temps) == 1 and os.path.exists(
        base / temps[0] / "saved_model.pb"), names
    _serves_without_tnet(base / "1", base / "sample.npz")
    # The next export of version 2 clears the killed one's leftovers.
    model = tiny(2)
    fit(model)
    tn.serving.export_for_serving(model, base / "2")
    assert sorted(os.listdir(base)) == ["1", "2", "sample.npz"]


def test_disk_full_during_export(small_fs, monkeypatch):
    from tnet.serving import export as export_lib  # noqa: PLC0415
    directory, how = small_fs
    base = directory / "model"
    model = tiny(2)
    fit(model)
    first = tn.serving.export_for_serving(model, base / "1")
    feats, _ = next(iter(dataset(64, seed=5)))
    np.savez(directory.parent / "sample.npz",
             __expected__=model.predict(feats, verbose=0),
             **{k: v.numpy() for k, v in feats.items()})
    # ~120k rows x 2 tables: several MB, more than the 4 MiB file system.
    _grow(model, 120_000)
    # Refused before writing: the estimate does not fit.
    with pytest.raises(tn.serving.ExportWriteError) as err:
        tn.serving.export_for_serving(model, base / "2")
    message = str(err.value)
    assert str(base / "2") in message and str(base) in message
    assert "free space or export to another directory" in message
    assert err.value.errno == errno.ENOSPC and isinstance(err.value, OSError)
    assert sorted(os.listdir(base)) == ["1"]
    # The disk fills during the write (the estimate is bypassed).
    monkeypatch.setattr(export_lib, "_check_free_space", lambda *a: None)
    if how != "tmpfs":
        def full(*args, **kwargs):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(base))
        monkeypatch.setattr(export_lib.tf.saved_model, "save", full)
    with pytest.raises(tn.serving.ExportWriteError) as err:
        tn.serving.export_for_serving(model, base / "2")
    message = str(err.value)
    assert str(base / "2") in message and "is full" in message, message
    assert "Nothing was left at the export directory" in message
    assert sorted(os.listdir(base)) == ["1"]  # no partial version, no temp
    if how == "tmpfs":
        assert shutil.disk_usage(directory).used < 2 << 20
    _serves_without_tnet(first, directory.parent / "sample.npz")
