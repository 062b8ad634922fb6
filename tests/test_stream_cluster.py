"""Streaming under ParameterServerStrategy (`python -m tnet.train --stream`
as the chief of a local cluster, tn.data.fit_stream): files landing while
it runs are each trained once, a damaged file is named and skipped, and
a chief killed with SIGKILL (or a lost ps) then restarted trains every
landed file exactly once. Checked against an uninterrupted one-process
fit over the same files: with one worker the tables and dense state are
bit-identical; with two, the per-key show and click counts are equal."""
from __future__ import annotations

import json
import os
import pathlib
import random
import re
import signal
import sys

import numpy as np
import pytest

import tnet as tn
import tensorflow as tf
import tf_keras

from tests.conftest import ROOT, fuzz_seed
from tests.support.cluster import assert_all_stopped
from tests.support.cluster import cluster as start_cluster
from support import byod_data as bd
from test_stream import BATCH, _final_state, _land

DAMAGED_AT = 12  # the damaged file's bad record (1-based in its message)


def _cli(work: pathlib.Path, *extra) -> list[str]:
    return [sys.executable, "-m", "tnet.train",
            f"--feature_spec={work / 'spec.json'}", "--format=tfrecord",
            f"--stream={work / 'in'}", f"--checkpoint_dir={work / 'ckpt'}",
            f"--model_dir={work / 'run'}", "--hidden_units=8",
            f"--batch_size={BATCH}", "--shuffle_buffer=0",
            "--stream_poll_secs=0.1", "--checkpoint_every_n_files=1",
            "--checkpoint_keep=2", *extra]


class _Landing:
    """Lands numbered files of random sizes (and damaged ones) into
    work/in, remembering what each holds."""

    def __init__(self, work: pathlib.Path, seed: int):
        self.dir = work / "in"
        self.rng = random.Random(seed)
        self.sizes: list[int] = []
        self.damaged: set[int] = set()

    def name(self, i: int) -> str:
        return f"clicks-{i:04d}.tfrecord"

    def land(self, damaged: bool = False) -> None:
        i = len(self.sizes)
        if damaged:
            self.damaged.add(i)
            self.sizes.append(40)
            _land(self.dir, self.name(i), bd.rows(40, seed=99),
                  damaged={DAMAGED_AT - 1: b"\x07junk"})
        else:
            self.sizes.append(self.rng.randint(60, 300))
            _land(self.dir, self.name(i), bd.rows(self.sizes[-1], seed=i))

    def good(self) -> list[str]:
        return [str(self.dir / self.name(i)) for i in range(len(self.sizes))
                if i not in self.damaged]


def _reference(work: pathlib.Path, files: list[str]):
    """The uninterrupted run: the CLI's model (its seed, its flags) fit
    once over the good files in name order in this process, saved as a
    checkpoint; returns _final_state of it."""
    from tnet.cli import model as cli_model  # noqa: PLC0415
    from tnet.cli.config import JobConfig  # noqa: PLC0415
    from tnet.data import spec as spec_lib  # noqa: PLC0415
    cfg = JobConfig(hidden_units=("8",), batch_size=BATCH)
    tf_keras.utils.set_random_seed(cfg.seed)
    spec = spec_lib.load(str(work / "spec.json"))
    model = cli_model.compiled_model(
        cfg, tf.distribute.get_strategy(),
        spec.embedding_columns(cfg.embedding_dim), spec.dense,
        spec.string_ids)
    data = spec.dataset(files[0], "tfrecord", BATCH)
    for path in files[1:]:
        data = data.concatenate(spec.dataset(path, "tfrecord", BATCH))
    model.fit(data, verbose=0)
    tn.saving.save(model, str(work / "reference"), step=1)
    return _final_state(work / "reference")


def _check(work: pathlib.Path, landing: _Landing, output: str,
           bit_identical: bool) -> None:
    manifest, tables, dense, ledger = _final_state(work / "ckpt")
    names = [str(landing.dir / landing.name(i))
             for i in range(len(landing.sizes))]
    # Every landed file in the ledger once, with its example count; the
    # damaged one recorded as bad, named file:record.
    assert sorted(ledger["files"]) == names
    for i, path in enumerate(names):
        entry = ledger["files"][path]
        if i in landing.damaged:
            assert entry["status"] == "bad" and entry["examples"] == 0
            assert f"{path}:{DAMAGED_AT}: not a serialized tf.Example" in \
                entry["where"], entry
            assert f"bad file, recorded and skipped: {path}:{DAMAGED_AT}:" \
                in output
        else:
            assert entry["status"] == "ok"
            assert entry["examples"] == landing.sizes[i], (path, entry)
    # A batch trained twice (or skipped) would change the step count.
    steps = sum(-(-n // BATCH) for i, n in enumerate(landing.sizes)
                if i not in landing.damaged)
    assert manifest["train_step"] == steps
    _, r_tables, r_dense, _ = _reference(work, landing.good())
    assert sorted(tables) == sorted(r_tables)
    for name in tables:
        assert tables[name]["keys"].tobytes() == r_tables[name]["keys"].tobytes()
        # The tables count each key's shows and clicks as trained: every
        # example once, whatever order the workers ran the steps in.
        for column in (0, 1):
            assert np.array_equal(tables[name]["meta"][:, column],
                                  r_tables[name]["meta"][:, column]), name
        if bit_identical:
            for k in ("weights", "slots", "meta"):
                assert tables[name][k].tobytes() == r_tables[name][k].tobytes(), \
                    (name, k)
    if bit_identical:
        for n in dense:
            if "loss_trackers" in n or "metrics" in n or "iterations" in n:
                continue  # running means and the reference's own count
            assert np.asarray(dense[n]).tobytes() == \
                np.asarray(r_dense[n]).tobytes(), n


def _trained_line(landing: _Landing, i: int) -> str:
    return r"\[chief\] tnet\.train: trained " + re.escape(
        str(landing.dir / landing.name(i)))


def _run(work: pathlib.Path, workers: int, landing: _Landing, ends: str,
         rng: random.Random, during=(), extra=(),
         kill_worker: bool = False) -> str:
    """One cluster (1 ps) streaming work/in: once it has trained the
    newest file landed so far, lands `during` (False: a good file, True: a
    damaged one), then ends it: "sigterm" once the newest file is trained
    (exit 0), "chief" or "ps" a SIGKILL of that task at a random point
    (a lost ps ends the chief with 138, naming it). `kill_worker`: worker:1
    is killed with SIGKILL before `during` lands (no step is running: the
    chief has joined them all at the newest file's end), so steps
    scheduled to it run on the other worker. Returns the output."""
    import time  # noqa: PLC0415
    cluster = start_cluster(1, workers, _cli(work, *extra), timeout=900)
    try:
        assert cluster.read_until(
            _trained_line(landing, len(landing.sizes) - 1), 600), \
            cluster.output[-3000:]
        if kill_worker:
            os.kill(cluster.pids["worker:1"], signal.SIGKILL)
        for damaged in during:
            landing.land(damaged=damaged)
        if ends == "sigterm":
            if during:
                assert cluster.read_until(
                    _trained_line(landing, len(landing.sizes) - 1), 600), \
                    cluster.output[-3000:]
            os.kill(cluster.pids["chief"], signal.SIGTERM)
            # The launcher's status is 1 when a worker died during the run.
            assert cluster.wait(300) == (1 if kill_worker else 0), \
                cluster.output[-3000:]
            assert "[launch] chief exited with 0" in cluster.output
            assert "stream stopped (SIGTERM)" in cluster.output
            if kill_worker:
                assert "[launch] worker:1 exited with -9 during the run" in \
                    cluster.output
        else:
            time.sleep(rng.uniform(0.0, 1.0))
            os.kill(cluster.pids["chief" if ends == "chief" else "ps:0"],
                    signal.SIGKILL)
            if ends == "ps":
                # A chief that waits for files calls no ps: the next file's
                # first step finds the ps gone.
                landing.land()
            assert cluster.wait(300) != 0
            if ends == "chief":
                assert "[launch] chief exited with -9" in cluster.output, \
                    cluster.output[-3000:]
            else:
                assert "[launch] chief exited with 138" in cluster.output, \
                    cluster.output[-3000:]
                assert cluster.read_until(r"lost parameter server task.*ps:0",
                                          1), cluster.output[-3000:]
        assert_all_stopped(cluster)
    finally:
        if cluster.proc.poll() is None:
            cluster.kill_all()
    return cluster.output


def test_files_landing_while_a_cluster_streams_are_each_trained_once(tmp_path):
    """1 ps x 1 worker: files land before and while the chief streams, a
    damaged one among them (named file:record, recorded as bad, skipped);
    a SIGTERM after the newest ends it at a file boundary. The tables and
    dense state are bit-identical to one uninterrupted fit over the good
    files. (A chief killed with SIGKILL and restarted:
    test_chief_killed_mid_stream_then_restarted_trains_each_file_once,
    make test-long.)"""
    bd.write_spec(tmp_path / "spec.json")
    landing = _Landing(tmp_path, fuzz_seed())
    landing.land()
    output = _run(tmp_path, 1, landing, "sigterm", random.Random(0),
                  during=(False, True, False))
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["cluster"] == {"ps": 1, "workers": 1}
    assert summary["streamed"]["files"] == len(landing.good())
    _check(tmp_path, landing, output, bit_identical=True)


@pytest.mark.long
def test_chief_killed_mid_stream_then_restarted_trains_each_file_once(tmp_path):
    """1 ps x 1 worker: the chief is killed with SIGKILL at a random point
    while files land (a damaged one among them), the cluster is started
    again (as `tnet.launch --restarts` does) after another file landed
    while it was down, and the new chief resumes from the newest
    checkpoint until a SIGTERM after the newest file. Tables and dense
    state bit-identical to one uninterrupted fit."""
    bd.write_spec(tmp_path / "spec.json")
    rng = random.Random(fuzz_seed())
    landing = _Landing(tmp_path, fuzz_seed())
    landing.land()
    outputs = [_run(tmp_path, 1, landing, "chief", rng,
                    during=(False, True, False))]
    landing.land()  # while the cluster is down
    outputs.append(_run(tmp_path, 1, landing, "sigterm", rng))
    _check(tmp_path, landing, "".join(outputs), bit_identical=True)


@pytest.mark.long
def test_two_workers_chief_and_ps_killed_publishing(tmp_path):
    """1 ps x 2 workers, publishing deltas and serving metrics: the chief
    killed with SIGKILL at a random point, then the ps (the chief ends
    with 138 naming it), then a last run that loses a worker between two
    files and goes on with the other until a SIGTERM; files land during
    each run and while the cluster is down. Every file in the ledger
    once; the step count and each key's show and click counts as one
    uninterrupted fit's (two workers apply steps in an order of their
    own, so the weights are not compared)."""
    bd.write_spec(tmp_path / "spec.json")
    rng = random.Random(fuzz_seed() + 1)
    landing = _Landing(tmp_path, fuzz_seed() + 1)
    landing.land()
    publish = (f"--export_dir={tmp_path / 'export'}",
               "--publish_every_seconds=2", "--metrics_port=0")
    outputs = []
    for ends, during in (("chief", (False, True)), ("ps", (False, False)),
                         ("sigterm", (False, False))):
        outputs.append(_run(tmp_path, 2, landing, ends, rng, during=during,
                            extra=publish, kill_worker=ends == "sigterm"))
        if ends != "sigterm":
            landing.land()  # while the cluster is down
    for output in outputs:
        assert "tnet.train: publishing deltas to" in output
        assert "tnet.train: metrics on http://" in output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["cluster"] == {"ps": 1, "workers": 2}
    assert summary["published"] and all(os.path.isdir(p)
                                        for p in summary["published"])
    _check(tmp_path, landing, "".join(outputs), bit_identical=False)
