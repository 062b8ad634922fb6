"""Resuming from checkpoints: tn.callbacks.Checkpoint in one process, and
SIGKILL of a one-process run or of a whole cluster, then resume."""
from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
import types

import numpy as np
import pytest

import tnet as tn  # noqa: I001  (before tensorflow: selects tf_keras)
from tests.support import forkrun
import tensorflow as tf
import tf_keras

from tests.conftest import ROOT
from tests.support.cluster import cluster as start_cluster
from tests.support.cluster import env as _env
from tests.support.ckpt import (assert_dumps_equal, assert_same_tables,
                                dataset, snapshot, wide_deep)

PROGRAM = [sys.executable, str(ROOT / "tests" / "programs" / "ckpt_train.py")]


# ---------------------------------------------------------------- callback
def test_callback_resumes_in_process(tmp_path):
    cb = tn.callbacks.Checkpoint(tmp_path, every_n_steps=7, keep=2,
                                 incremental=True, verbose=0)
    model = wide_deep()
    model.fit(dataset(640), epochs=2, callbacks=[cb], verbose=0)
    assert cb.restored_step is None
    assert [s for s, _ in tn.saving.list_checkpoints(tmp_path)][-1] == 20
    assert cb.last_saved_step == 20
    saved = snapshot(model)

    cb2 = tn.callbacks.Checkpoint(tmp_path, every_n_steps=7, keep=2,
                                  incremental=True, verbose=0)

    class Probe(tf_keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.restored = snapshot(self.model)
            self.iterations = int(self.model.optimizer.iterations.numpy())

        def on_epoch_begin(self, epoch, logs=None):
            self.epochs = getattr(self, "epochs", []) + [epoch]

    probe = Probe()
    again = wide_deep()
    history = again.fit(dataset(640), epochs=3, callbacks=[cb2, probe],
                        verbose=0)
    assert cb2.restored_step == 20 and cb2.resumed_at == (2, 0)
    assert probe.iterations == 20
    assert_same_tables(saved, probe.restored)
    assert probe.epochs == [2] and len(history.epoch) == 1
    assert int(again.optimizer.iterations.numpy()) == 30
    assert cb2.last_saved_step == 30
    assert tn.saving.read_manifest(cb2.last_saved_path)["kind"] == "delta"
    assert getattr(again, "_training_state", None) is None


def test_every_n_steps_is_refused_under_pss(tmp_path):
    pss = tf.distribute.ParameterServerStrategy.__new__(
        tf.distribute.ParameterServerStrategy)
    fake_model = types.SimpleNamespace(distribute_strategy=pss)
    with pytest.raises(ValueError, match="Keras does not call batch-level "
                       "callbacks there. Use every_n_epochs"):
        tn.callbacks.Checkpoint(tmp_path, every_n_steps=5).set_model(fake_model)
    epochs_only = tn.callbacks.Checkpoint(tmp_path)
    epochs_only.set_model(fake_model)
    # Keras refuses callbacks that implement batch hooks under PSS.
    assert not epochs_only._implements_train_batch_hooks()
    assert tn.callbacks.Checkpoint(tmp_path, every_n_steps=3
                                   )._implements_train_batch_hooks()


def _readline_until(proc, pattern, timeout, lines):
    deadline = time.monotonic() + timeout
    regex = re.compile(pattern)
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            if proc.poll() is not None:
                return None
            continue
        lines.append(line)
        if regex.search(line):
            return line
    return None


def test_sigkill_after_checkpoint_then_resume_one_process(tmp_path):
    cmd = PROGRAM + ["--dir", str(tmp_path / "ckpt"), "--dump_dir",
                     str(tmp_path / "dump"), "--epochs", "4",
                     "--every_n_steps", "5", "--incremental", "--sleep", "0.05",
                     "--build_first"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env=_env())
    lines = []
    try:
        assert _readline_until(proc, r"CKPT_SAVED step=15", 180, lines), \
            "".join(lines)[-3000:]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    latest = tn.saving.latest_checkpoint(tmp_path / "ckpt")
    step = tn.saving.read_manifest(latest)["step"]
    assert step >= 15
    saved_dump = tmp_path / "dump" / f"saved-{step}.npz"
    assert saved_dump.exists(), "killed between the save and its dump"

    res = forkrun.run(cmd, capture_output=True, text=True, cwd=ROOT,
                      env=_env(), timeout=300, script_imports_tnet=True)
    out = res.stdout
    assert res.returncode == 0, (out + res.stderr)[-3000:]
    assert f"CKPT_RESTORED step={step}" in out, out[-3000:]
    assert_dumps_equal(saved_dump, tmp_path / "dump" / f"restored-{step}.npz")
    restored = np.load(tmp_path / "dump" / f"restored-{step}.npz")
    assert int(restored["iterations"]) == step
    assert sum(k.startswith("dense/") for k in restored.files) > 10
    # It went on from step N (next save at the next multiple of 5) to the
    # end of epoch 4 (20 steps per epoch), not from 0.
    saves = [int(s) for s in re.findall(r"CKPT_SAVED step=(\d+)", out)]
    assert saves[0] == (step // 5 + 1) * 5 and saves[-1] == 80, saves
    assert "CKPT_DONE iterations=80" in out


# make test-long: test_checkpoint's bit-exact resharding and test_faults' cluster kills stay.
@pytest.mark.long
def test_sigkill_cluster_then_resume_on_more_ps(tmp_path):
    """PSS: epoch-end checkpoints on the chief; SIGKILL every process after
    the checkpoint at step N; a new cluster with 3 ps (was 2) resumes at
    step N with the same rows (resharded 2 -> 3)."""
    cmd = PROGRAM + ["--dir", str(tmp_path / "ckpt"), "--dump_dir",
                     str(tmp_path / "dump"), "--epochs", "5", "--rows", "640",
                     "--incremental", "--sleep", "1.0"]
    first = start_cluster(2, 2, cmd, timeout=400)
    try:
        assert first.read_until(r"CKPT_SAVED step=20", 300), \
            first.output[-3000:]
    finally:
        assert not first.kill_all(), "still running after SIGKILL"
    assert "pss=True" in first.output
    latest = tn.saving.latest_checkpoint(tmp_path / "ckpt")
    step = tn.saving.read_manifest(latest)["step"]
    assert step >= 20 and step % 10 == 0
    manifest = tn.saving.read_manifest(latest)
    assert manifest["tables"]["embedding"]["num_shards"] == 2

    second = start_cluster(3, 2, cmd, timeout=400)
    code = second.wait(400)
    out = second.output
    assert code == 0, out[-3000:]
    assert f"CKPT_RESTORED step={step}" in out, out[-3000:]
    assert_dumps_equal(tmp_path / "dump" / f"saved-{step}.npz",
                        tmp_path / "dump" / f"restored-{step}.npz")
    assert "CKPT_DONE iterations=50" in out
    final = tn.saving.read_manifest(tn.saving.latest_checkpoint(
        tmp_path / "ckpt"))
    assert final["step"] == 50
    assert final["tables"]["embedding"]["num_shards"] == 3
