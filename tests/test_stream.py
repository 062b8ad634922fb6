"""Training on files as they land (tnet/data/stream.py, StreamCheckpoint,
`python -m tnet.train --stream`): name order, landing conventions, late
files, damaged files, a writer faster than training, and exactly once
across kill -9 (the tables bit-identical to an uninterrupted run)."""
from __future__ import annotations

import glob
import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import threading
import time

import h5py
import numpy as np
import pytest

import tnet as tn
import tensorflow as tf
import tf_keras

from tests.conftest import fuzz_seed
from tests.support import forkrun
from support import byod_data as bd
from tests.support.ckpt import assert_same_model, spec_wide_deep as _model
from tnet.data import spec as spec_lib
from tnet.data.stream import FileStream, Ledger

ROOT = pathlib.Path(__file__).resolve().parents[1]
BATCH = 32


def _land(directory: pathlib.Path, name: str, rows, gzip_it=False,
          damaged=None) -> pathlib.Path:
    """Writes under a hidden temp name, then renames into place."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{name}.tmp"
    bd.write_tfrecord(tmp, rows, gzip_it=gzip_it, damaged=damaged)
    final = directory / name
    os.rename(tmp, final)
    return final


@pytest.fixture()
def spec(tmp_path):
    return spec_lib.load(bd.write_spec(tmp_path / "spec.json"))


def test_stream_trains_landed_files_in_name_order_like_a_plain_fit(tmp_path, spec):
    data = tmp_path / "in"
    sizes = {"b-002.tfrecord": 70, "a-001.tfrecord": 45, "c-003.tfrecord": 64}
    for i, (name, n) in enumerate(sizes.items()):
        _land(data, name, bd.rows(n, seed=i))
    # Never read: a file still being written, and a hidden one.
    (data / "d-004.tfrecord.tmp").write_bytes(b"half a record")
    (data / "_e-005.tfrecord").write_bytes(b"not landed")
    stream = FileStream(str(data), poll_seconds=0.05, idle_seconds=0.5)
    model = _model(spec)
    ckpt = tn.callbacks.StreamCheckpoint(tmp_path / "ckpt", stream, verbose=0)
    model.fit(tn.data.stream_dataset(spec, stream, "tfrecord", BATCH),
              callbacks=[ckpt], verbose=0)
    names = sorted(sizes)
    assert sorted(os.path.basename(p) for p in stream.ledger.entries) == names
    assert stream.examples_consumed == sum(sizes.values())
    steps = sum(-(-n // BATCH) for n in sizes.values())  # no batch spans files
    assert int(model.optimizer.iterations.numpy()) == steps
    ledger = tn.saving.read_state(ckpt.last_saved_path, "stream")
    for name in names:
        entry = ledger["files"][str(data / name)]
        assert entry["status"] == "ok" and entry["examples"] == sizes[name]
        assert entry["size"] == (data / name).stat().st_size
        assert len(entry["sha256"]) == 64
    # The same batches through the stock reader, file after file.
    reference = _model(spec)
    files = [spec.dataset(str(data / n), "tfrecord", BATCH) for n in names]
    plain = files[0]
    for f in files[1:]:
        plain = plain.concatenate(f)
    reference.fit(plain, verbose=0)
    assert_same_model(model, reference)


def test_landing_conventions(tmp_path):
    data = tmp_path / "in"
    data.mkdir()
    for name in ("x-1.csv", "x-2.csv", "x-3.csv", "x-3.csv.tmp", ".x-4.csv",
                 "x-5.csv._COPYING_"):
        (data / name).write_text("h\n")
    (data / "x-2.csv.done").write_text("")
    renamed = FileStream(str(data / "x-*.csv"))
    assert [os.path.basename(p) for p in renamed.poll()] == [
        "x-1.csv", "x-2.csv", "x-3.csv"]
    done = FileStream(str(data), landed="done")
    assert [os.path.basename(p) for p in done.poll()] == ["x-2.csv"]
    # _SUCCESS: per partition directory.
    for part in ("dt=1", "dt=2"):
        (tmp_path / "parts" / part).mkdir(parents=True)
        (tmp_path / "parts" / part / "part-0").write_text("h\n")
    (tmp_path / "parts" / "dt=2" / "_SUCCESS").write_text("")
    success = FileStream(str(tmp_path / "parts" / "*" / "part-*"),
                         landed="success")
    assert success.poll() == [str(tmp_path / "parts" / "dt=2" / "part-0")]
    assert success.listings == 1
    with pytest.raises(ValueError, match="landed"):
        FileStream(str(data), landed="marker")


def test_ledger_compaction_bounds_it_and_old_files_stay_done(tmp_path):
    data = tmp_path / "in"
    data.mkdir()
    old, new = data / "a-old", data / "b-new"
    old.write_text("x")
    new.write_text("y")
    hour_ago = time.time() - 3600
    os.utime(old, (hour_ago, hour_ago))
    stream = FileStream(str(data), max_file_age_seconds=600)
    for path in (old, new):
        stream._consume({"path": str(path), "status": "ok", "examples": 1,
                         "size": 1, "sha256": "0" * 64,
                         "mtime": path.stat().st_mtime})
    state = stream.ledger_state()
    assert sorted(state["files"]) == [str(new)]  # the old entry compacted
    assert state["horizon"] > hour_ago
    restored = FileStream(str(data), max_file_age_seconds=600)
    restored.start(Ledger.from_json(json.loads(json.dumps(state))))
    assert restored.poll() == []  # the old file is taken as done
    late = data / "a-late"
    late.write_text("z")
    assert restored.poll() == [str(late)]


def test_a_late_file_and_a_damaged_file(tmp_path, spec):
    data = tmp_path / "in"
    _land(data, "f-002.tfrecord", bd.rows(40, seed=2))
    _land(data, "f-003.tfrecord", bd.rows(40, seed=3), damaged={17: b"\x07junk"})
    stream = FileStream(str(data), poll_seconds=0.05, idle_seconds=1.5)
    model = _model(spec)
    ckpt = tn.callbacks.StreamCheckpoint(tmp_path / "ckpt", stream,
                                         every_n_files=1, verbose=0)

    def late():  # once f-002 is trained and f-003 found bad
        while len(stream.ledger) < 1 or stream.bad_files_found < 1:
            time.sleep(0.02)
        _land(data, "f-001.tfrecord", bd.rows(30, seed=1))  # before both

    writer = threading.Thread(target=late)
    writer.start()
    model.fit(tn.data.stream_dataset(spec, stream, "tfrecord", BATCH),
              callbacks=[ckpt], verbose=0)
    writer.join()
    entries = {os.path.basename(p): e for p, e in stream.ledger.entries.items()}
    assert sorted(entries) == ["f-001.tfrecord", "f-002.tfrecord", "f-003.tfrecord"]
    assert entries["f-001.tfrecord"]["examples"] == 30
    bad = entries["f-003.tfrecord"]
    assert bad["status"] == "bad" and bad["examples"] == 0
    assert f"{data / 'f-003.tfrecord'}:18:" in bad["where"], bad["where"]
    # The damaged file trained nothing: 2 + 1 steps.
    assert int(model.optimizer.iterations.numpy()) == 2 + 1
    assert stream.failure is None
    # bad_files="fail": the files before it are trained and saved, then stop.
    stream = FileStream(str(data), poll_seconds=0.05, idle_seconds=5,
                        bad_files="fail")
    ckpt = tn.callbacks.StreamCheckpoint(tmp_path / "ckpt2", stream, verbose=0)
    model = _model(spec)
    model.fit(tn.data.stream_dataset(spec, stream, "tfrecord", BATCH),
              callbacks=[ckpt], verbose=0)
    assert "f-003.tfrecord:18:" in stream.failure
    saved = tn.saving.read_state(ckpt.last_saved_path, "stream")
    assert sorted(os.path.basename(p) for p in saved["files"]) == [
        "f-001.tfrecord", "f-002.tfrecord"]


def test_files_landing_faster_than_training_are_all_trained(tmp_path, spec,
                                                            caplog):
    """Nothing dropped; the lag metric grows while training is behind and
    the log says so."""
    from prometheus_client.parser import (  # noqa: PLC0415
        text_string_to_metric_families)
    data = tmp_path / "in"
    data.mkdir()
    n_files, rows = 24, 50
    stream = FileStream(str(data), poll_seconds=0.05, idle_seconds=1.5)
    stream.behind_log_seconds = 0.2
    metrics = tn.monitoring.TrainerMetrics(stream)
    lags = []

    def scrape(path, entry):  # as each file is trained
        for family in text_string_to_metric_families(metrics.exposition()):
            if family.name == "tnet_stream_lag_seconds":
                lags.append(family.samples[0].value)

    counted = stream.on_consume  # the metrics' hook
    stream.on_consume = lambda p, e: (counted(p, e), scrape(p, e))

    def writer():
        for i in range(n_files):
            _land(data, f"e-{i:04d}.tfrecord.gz", bd.rows(rows, seed=i),
                  gzip_it=True)

    class Slow(tf_keras.callbacks.Callback):  # training slower than landing
        def on_train_batch_end(self, batch, logs=None):
            time.sleep(0.05)

    thread = threading.Thread(target=writer)
    thread.start()
    model = _model(spec)
    ckpt = tn.callbacks.StreamCheckpoint(tmp_path / "ckpt", stream,
                                         every_n_files=5, verbose=0)
    with caplog.at_level("WARNING"):
        model.fit(tn.data.stream_dataset(spec, stream, "tfrecord", BATCH,
                                         queue_batches=4),
                  callbacks=[ckpt, Slow()], verbose=0)
    thread.join()
    assert stream.files_consumed == n_files
    assert stream.examples_consumed == n_files * rows
    assert int(model.optimizer.iterations.numpy()) == n_files * -(-rows // BATCH)
    # 2 steps of >= 50 ms per file, landed within a fraction of that.
    assert len(lags) == n_files
    assert lags[-1] > lags[0] + 1.0, lags
    assert "training is behind: " in caplog.text
    assert "Nothing is dropped" in caplog.text


def test_read_state_checks_the_file(tmp_path, spec):
    model = _model(spec)
    model.fit(spec.dataset(str(_land(tmp_path / "in", "a", bd.rows(20, 0))),
                           "tfrecord", BATCH), verbose=0)
    path = tn.saving.save(model, tmp_path / "ckpt", state={"stream": {"x": 1}})
    assert tn.saving.read_state(path, "stream") == {"x": 1}
    assert tn.saving.read_state(path, "other") is None
    with open(os.path.join(path, "state", "stream.json"), "w") as f:
        f.write('{"x": 2}')
    with pytest.raises(tn.saving.CheckpointError, match="stream.json"):
        tn.saving.read_state(path, "stream")


# --------------------------------------------- the CLI's checkpoint set-up
def test_the_cli_jobs_build_their_checkpoint_callbacks_from_the_flags(tmp_path):
    """The one-pass job and the stream job get their checkpoint and
    maintenance callbacks from one function: the flags reach them."""
    from tnet.cli import model as cli_model  # noqa: PLC0415
    from tnet.cli.config import JobConfig  # noqa: PLC0415
    assert cli_model.checkpoint_callbacks(JobConfig()) == (None, [])
    only_maintenance = JobConfig(maintenance_every_n_steps=2,
                                 model_dir=str(tmp_path / "run"))
    ckpt, callbacks = cli_model.checkpoint_callbacks(only_maintenance)
    assert ckpt is None and len(callbacks) == 1
    assert isinstance(callbacks[0], tn.callbacks.TableMaintenance)
    cfg = JobConfig(
        checkpoint_dir=str(tmp_path / "ck"), checkpoint_every_n_steps=7,
        checkpoint_every_n_epochs=0, checkpoint_keep=5,
        checkpoint_incremental=True, checkpoint_full_every=4,
        checkpoint_every_n_files=3, checkpoint_every_seconds=2.5,
        maintenance_every_n_steps=9, model_dir=str(tmp_path / "run"))
    stream = FileStream(str(tmp_path / "in"))
    for source in (None, stream):
        ckpt, callbacks = cli_model.checkpoint_callbacks(cfg, source)
        # The checkpoint first (its restore precedes the other callbacks),
        # then the maintenance it also runs right before each save.
        assert callbacks[0] is ckpt and len(callbacks) == 2
        maintenance = callbacks[1]
        assert isinstance(maintenance, tn.callbacks.TableMaintenance)
        assert maintenance.every_n_steps == 9 and ckpt.maintenance is maintenance
        assert ckpt.directory == str(tmp_path / "ck")
        assert (ckpt.keep, ckpt.incremental, ckpt.full_every) == (5, True, 4)
    assert type(ckpt) is tn.callbacks.StreamCheckpoint and ckpt.stream is stream
    assert (ckpt.every_n_files, ckpt.every_seconds) == (3, 2.5)
    ckpt, _ = cli_model.checkpoint_callbacks(cfg)
    assert type(ckpt) is tn.callbacks.Checkpoint
    assert (ckpt.every_n_steps, ckpt.every_n_epochs) == (7, None)


# ----------------------------------------------------------- the CLI, kill -9
def _cli(work: pathlib.Path, ckpt: str, *extra) -> list[str]:
    return [sys.executable, "-m", "tnet.train",
            f"--feature_spec={work / 'spec.json'}", "--format=tfrecord",
            f"--stream={work / 'in'}", f"--checkpoint_dir={work / ckpt}",
            f"--model_dir={work / (ckpt + '-run')}", "--hidden_units=8",
            f"--batch_size={BATCH}", "--shuffle_buffer=0",
            "--stream_poll_secs=0.1", "--checkpoint_every_n_files=2",
            "--checkpoint_keep=2", *extra]


def _publish(work: pathlib.Path, name: str, on: bool) -> list[str]:
    """With `on`, every run of a kill test publishes deltas (each to its
    own export) and serves metrics: they read the tables and must not
    change what training computes. (The first run then builds the model
    for its base export before fit, in the killed and the uninterrupted
    run alike.)"""
    if not on:
        return []
    return [f"--export_dir={work / (name + '-export')}",
            "--publish_every_seconds=2", "--metrics_port=0"]


def _env():
    return dict(os.environ, PYTHONPATH=str(ROOT), CI="true",
                TF_CPP_MIN_LOG_LEVEL="2", OMP_NUM_THREADS="1")


def _final_state(ckpt_dir: pathlib.Path):
    """The newest checkpoint's tables (sorted by key), dense variables and
    ledger."""
    path = tn.saving.latest_checkpoint(str(ckpt_dir))
    manifest = tn.saving.read_manifest(path)
    assert manifest["kind"] == "full"
    tables = {}
    for name, info in manifest["tables"].items():
        parts = {k: [] for k in ("keys", "weights", "slots", "meta")}
        for part in info["parts"]:
            with h5py.File(os.path.join(path, part["file"]), "r") as f:
                for k in parts:
                    parts[k].append(f[k][...])
        cat = {k: np.concatenate(v) for k, v in parts.items()}
        order = np.argsort(cat["keys"])
        tables[name] = {k: v[order] for k, v in cat.items()}
    reader = tf.train.load_checkpoint(os.path.join(path, "dense", "ckpt"))
    dense = {n: reader.get_tensor(n) for n, _ in
             tf.train.list_variables(os.path.join(path, "dense", "ckpt"))
             if "OBJECT_GRAPH" not in n}
    return manifest, tables, dense, tn.saving.read_state(path, "stream")


def _wait_for(proc, log: pathlib.Path, text: str) -> None:
    deadline = time.time() + 300
    while text not in log.read_text():
        assert proc.poll() is None and time.time() < deadline, \
            log.read_text()[-3000:]
        time.sleep(0.02)


def _kill_and_resume(tmp_path: pathlib.Path, kills: int, seed: int,
                     publish: bool = False):
    """Lands files while the trainer runs and while it is down; kills it
    with SIGKILL at a random point after it has started training in each
    run (mid-file, mid-checkpoint or waiting); then a last run until a
    SIGTERM after the newest file.
    Returns the number of files some killed run had trained past its
    checkpoint (trained again by the next run)."""
    bd.write_spec(tmp_path / "spec.json")
    data = tmp_path / "in"
    data.mkdir()
    rng = random.Random(seed)
    sizes, damaged = [], set()

    def land():
        i = len(sizes)
        sizes.append(rng.randint(60, 500))
        _land(data, f"clicks-{i:04d}.tfrecord", bd.rows(sizes[-1], seed=i))

    logs = []
    land()
    for k in range(kills):
        land()  # lands while the trainer is down
        if k == 1:  # and a damaged one: recorded as bad (file:record)
            damaged.add(len(sizes))
            sizes.append(40)
            _land(data, f"clicks-{len(sizes) - 1:04d}.tfrecord",
                  bd.rows(40, seed=99), damaged={11: b"\x07junk"})
        log = tmp_path / f"run{k}.log"
        with open(log, "w") as out:
            proc = forkrun.Popen(_cli(tmp_path, "ckpt",
                                      *_publish(tmp_path, "ckpt", publish)),
                                 cwd=tmp_path, env=_env(), stdout=out,
                                 stderr=subprocess.STDOUT)
            _wait_for(proc, log, "tnet.train: trained")
            for _ in range(2):  # land while it trains
                land()
            time.sleep(rng.uniform(0.0, 1.0))  # a random point
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        logs.append(log.read_text())
    land()
    # The last run: SIGTERM once it has trained the newest file.
    log = tmp_path / "final.log"
    with open(log, "w") as out:
        proc = forkrun.Popen(_cli(tmp_path, "ckpt",
                                  *_publish(tmp_path, "ckpt", publish)),
                             cwd=tmp_path, env=_env(), stdout=out,
                             stderr=subprocess.STDOUT)
        _wait_for(proc, log, f"trained {data}/clicks-{len(sizes) - 1:04d}")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=300) == 0, log.read_text()[-4000:]
    logs.append(log.read_text())
    assert "stream stopped (SIGTERM)" in logs[-1]
    assert glob.glob(str(tmp_path / "ckpt" / ".ckpt-*")) == []
    n_files = len(sizes)
    reference = forkrun.run(_cli(tmp_path, "reference",
                                 "--stream_idle_secs=1",
                                 *_publish(tmp_path, "reference", publish)),
                            cwd=tmp_path, env=_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            timeout=400)
    assert reference.returncode == 0, reference.stdout[-4000:]
    if publish:
        assert "tnet.train: metrics on http://" in reference.stdout
        summary = json.loads((tmp_path / "reference-run" / "summary.json").read_text())
        assert summary["published"] and all(os.path.isdir(p)
                                            for p in summary["published"])
    manifest, tables, dense, ledger = _final_state(tmp_path / "ckpt")
    r_manifest, r_tables, r_dense, r_ledger = _final_state(tmp_path / "reference")
    # Every landed file trained exactly once: the ledger, the example
    # counts and the step count (a batch trained twice would add a step).
    names = [str(data / f"clicks-{i:04d}.tfrecord") for i in range(n_files)]
    assert sorted(ledger["files"]) == names
    for i, path in enumerate(names):
        entry = ledger["files"][path]
        if i in damaged:
            assert entry["status"] == "bad" and entry["examples"] == 0
            assert f"{path}:12: not a serialized tf.Example" in entry["where"]
        else:
            assert entry["status"] == "ok" and entry["examples"] == sizes[i]
    def content(led):
        return {p: {k: v for k, v in e.items() if k != "consumed_unix"}
                for p, e in led["files"].items()}
    assert content(ledger) == content(r_ledger)
    steps = sum(-(-n // BATCH) for i, n in enumerate(sizes) if i not in damaged)
    assert manifest["train_step"] == r_manifest["train_step"] == steps
    # ... and the model bit-identical to the uninterrupted run's.
    assert sorted(tables) == sorted(r_tables)
    for name in tables:
        for k in ("keys", "weights", "slots", "meta"):
            assert tables[name][k].tobytes() == r_tables[name][k].tobytes(), (name, k)
    assert sorted(dense) == sorted(r_dense)
    for n in dense:
        if "loss_trackers" in n or "metrics" in n:
            continue  # the progress bar's running means, not the model
        assert np.asarray(dense[n]).tobytes() == np.asarray(r_dense[n]).tobytes(), n
    # Files a killed run trained past its newest checkpoint: trained again.
    trained = [line.split()[2] for text in logs for line in text.splitlines()
               if line.startswith("tnet.train: trained ")]
    return len(trained) - len(set(trained))


def test_kill_9_at_random_points_trains_every_file_exactly_once(tmp_path):
    """Two kills (a resumed run killed again, the damaged file landing
    while the trainer is down between them); 20 random points, with
    publishing on, in test_kill_9_at_twenty_random_points
    (`make test-long`)."""
    _kill_and_resume(tmp_path, kills=2, seed=fuzz_seed())


@pytest.mark.long
def test_kill_9_at_twenty_random_points(tmp_path):
    retrained = _kill_and_resume(tmp_path, kills=20, seed=fuzz_seed() + 1,
                                 publish=True)
    # Some kill fell after a file was trained and before its checkpoint.
    assert retrained >= 1


def test_a_backlog_is_published_on_time_not_at_every_file_end(
        tmp_path, spec, monkeypatch):
    """Files already landed, a reader slower than training (its queue is
    empty at each file end): training has not caught up while landed files
    wait, so PublishDeltas publishes by its timer and once the backlog is
    trained, not after every file (each publish stops training)."""
    from tnet.data import stream as stream_lib  # noqa: PLC0415
    data = tmp_path / "in"
    for i in range(4):
        _land(data, f"b-{i:03d}.tfrecord", bd.rows(40, seed=i))
    slow_read = stream_lib._Reader.read

    def read(self, path):
        time.sleep(0.3)
        return slow_read(self, path)

    monkeypatch.setattr(stream_lib._Reader, "read", read)
    export = str(tmp_path / "export" / "1")
    model, _ = _updatable_export(spec, data / "b-000.tfrecord", export)
    stream = FileStream(str(data), poll_seconds=0.05, idle_seconds=1.0)
    ckpt = tn.callbacks.StreamCheckpoint(tmp_path / "ckpt", stream, verbose=0)
    publisher = tn.callbacks.PublishDeltas(export, every_seconds=3600,
                                           compact_at=None, stream=stream)
    model.fit(tn.data.stream_dataset(spec, stream, "tfrecord", BATCH),
              callbacks=[ckpt, publisher], verbose=0)
    assert stream.files_consumed == 4
    assert len(publisher.published) == 1, publisher.published


def test_cli_bad_file_fail_exits_4_naming_the_record(tmp_path):
    bd.write_spec(tmp_path / "spec.json")
    data = tmp_path / "in"
    _land(data, "a-1.tfrecord", bd.rows(40, seed=1))
    _land(data, "a-2.tfrecord", bd.rows(40, seed=2), damaged={5: b"\x01\x02"})
    res = forkrun.run(_cli(tmp_path, "ckpt", "--stream_idle_secs=1",
                              "--bad_files=fail",
                              *_publish(tmp_path, "ckpt", True)),
                         cwd=tmp_path, env=_env(), text=True,
                         capture_output=True, timeout=400)
    assert res.returncode == 4, res.stdout[-2000:] + res.stderr[-3000:]
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("tnet.train: bad input: ") and "a-2.tfrecord:6:" in last
    assert "Traceback" not in res.stderr
    ledger = tn.saving.read_state(
        tn.saving.latest_checkpoint(str(tmp_path / "ckpt")), "stream")
    assert sorted(ledger["files"]) == [str(data / "a-1.tfrecord")]
    # It published a-1's training before stopping, and served metrics.
    assert "tnet.train: metrics on http://" in res.stdout
    deltas = glob.glob(str(tmp_path / "ckpt-export" / "*" / "deltas" / "delta-*"))
    assert deltas, res.stdout[-3000:]


def _updatable_export(spec, first, export):
    """The stream's model, built on a batch of the landed file `first` and
    exported updatable to `export`; returns (model, that batch)."""
    probe, _ = next(iter(spec.dataset(str(first), "tfrecord", 50)))
    model = _model(spec)
    model(probe, training=False)
    tn.serving.export_for_serving(model, export, updatable=True)
    return model, probe


def _padded(features):
    out = {}
    for k, v in features.items():
        if isinstance(v, tf.RaggedTensor):
            v = v.to_tensor(default_value="" if v.dtype == tf.string else -1)
        out[k] = v
    return out


def test_publishing_while_streaming_serves_each_file_once_trained(tmp_path, spec):
    from tnet.serving import follow  # noqa: PLC0415
    data = tmp_path / "in"
    first = _land(data, "p-000.tfrecord", bd.rows(50, seed=0))
    export = str(tmp_path / "export" / "1")
    model, probe = _updatable_export(spec, first, export)
    # The writer stops the stream after the last file is trained (an idle
    # window could end it between two files on a loaded machine).
    stream = FileStream(str(data), poll_seconds=0.05, idle_seconds=300)
    n_files = 4

    def writer():  # each file lands once the one before is trained
        deadline = time.monotonic() + 240
        for i in range(1, n_files + 1):
            while stream.files_consumed < i and time.monotonic() < deadline:
                time.sleep(0.02)
            if i < n_files:
                time.sleep(0.3)
                _land(data, f"p-{i:03d}.tfrecord", bd.rows(40, seed=i))
        stream.stop()

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    ckpt = tn.callbacks.StreamCheckpoint(tmp_path / "ckpt", stream, verbose=0)
    publisher = tn.callbacks.PublishDeltas(export, every_seconds=3600,
                                           compact_at=None, stream=stream)
    model.fit(tn.data.stream_dataset(spec, stream, "tfrecord", BATCH),
              callbacks=[ckpt, publisher], verbose=0)
    thread.join(timeout=60)
    assert stream.files_consumed == n_files
    # Training caught up at the end of every file: one delta each, no timer.
    assert len(publisher.published) == n_files
    loaded = tf.saved_model.load(export)
    follow.Follower(export, [follow.InProcessTarget(loaded)],
                    say=lambda m: None).step()
    served = loaded.signatures["serving_default"](**_padded(probe))
    served = next(iter(served.values())).numpy().reshape(-1)
    trained = model(probe, training=False).numpy().reshape(-1)
    np.testing.assert_allclose(served, trained, atol=1e-5)


@pytest.mark.parametrize("fmt", ["csv", "tsv", "parquet", "tfrecord.gz"])
def test_every_format_streams_the_readers_batches(tmp_path, spec, fmt):
    """The stream yields exactly what spec_dataset yields for each file."""
    data = tmp_path / "in"
    data.mkdir()
    write = {"csv": lambda p, rs: bd.write_csv(p, rs),
             "tsv": lambda p, rs: bd.write_csv(p, rs, delim="\t"),
             "parquet": lambda p, rs: bd.write_parquet(p, rs),
             "tfrecord.gz": lambda p, rs: bd.write_tfrecord(p, rs, gzip_it=True)}
    reader = "tfrecord" if fmt.startswith("tfrecord") else fmt
    names = []
    for i, n in enumerate((45, 20)):
        tmp = tmp_path / f"tmp-{i}.{fmt}"
        write[fmt](tmp, bd.rows(n, seed=i))
        names.append(str(data / f"f-{i}.{fmt}"))
        os.rename(tmp, names[-1])
    stream = FileStream(str(data), poll_seconds=0.05, idle_seconds=0.3)
    got = list(tn.data.stream_dataset(spec, stream, reader, BATCH))
    want = [e for name in names for e in spec.dataset(name, reader, BATCH)]
    assert len(got) == len(want) == 3
    for a, b in zip(got, want):
        flat_a = tf.nest.flatten(a, expand_composites=True)
        flat_b = tf.nest.flatten(b, expand_composites=True)
        assert len(flat_a) == len(flat_b)
        for x, y in zip(flat_a, flat_b):
            assert x.dtype == y.dtype and x.numpy().tolist() == y.numpy().tolist()
    assert stream.examples_consumed == 65  # no callback: counted as yielded


def test_a_transient_read_error_is_retried_not_recorded_as_bad(
        tmp_path, spec, monkeypatch, caplog):
    """An I/O error while reading a landed file (at the checksum, then at
    the decode) is not a damaged file: it is named, read again later and
    trained once, with the files after it trained meanwhile."""
    from tnet.data import readers  # noqa: PLC0415
    from tnet.data import stream as stream_lib  # noqa: PLC0415
    data = tmp_path / "in"
    flaky = _land(data, "t-001.tfrecord", bd.rows(40, seed=1))
    _land(data, "t-002.tfrecord", bd.rows(30, seed=2))
    failures = {"checksum": 2, "decode": 1}
    real_checksum, real_dataset = stream_lib._checksum, readers.spec_dataset

    def checksum(path):
        if path == str(flaky) and failures["checksum"]:
            failures["checksum"] -= 1
            raise OSError(5, "Input/output error", path)
        return real_checksum(path)

    def dataset(spec_, files, *args, **kwargs):
        if files == [str(flaky)] and failures["decode"]:
            failures["decode"] -= 1
            raise tf.errors.UnavailableError(None, None, "store not answering")
        return real_dataset(spec_, files, *args, **kwargs)

    monkeypatch.setattr(stream_lib, "_checksum", checksum)
    monkeypatch.setattr(readers, "spec_dataset", dataset)
    stream = FileStream(str(data), poll_seconds=0.05, idle_seconds=1.5,
                        bad_files="fail")
    model = _model(spec)
    ckpt = tn.callbacks.StreamCheckpoint(tmp_path / "ckpt", stream, verbose=0)
    with caplog.at_level("WARNING"):
        model.fit(tn.data.stream_dataset(spec, stream, "tfrecord", BATCH),
                  callbacks=[ckpt], verbose=0)
    assert failures == {"checksum": 0, "decode": 0}
    assert stream.failure is None and stream.bad_files_found == 0
    assert stream.read_retries == 3
    saved = tn.saving.read_state(ckpt.last_saved_path, "stream")["files"]
    assert {os.path.basename(p): (e["status"], e["examples"])
            for p, e in saved.items()} == {"t-001.tfrecord": ("ok", 40),
                                           "t-002.tfrecord": ("ok", 30)}
    assert int(model.optimizer.iterations.numpy()) == 2 + 1
    text = caplog.text
    assert f"{flaky}: cannot read it now" in text and "Input/output error" in text
    assert "store not answering" in text and "not a damaged file" in text


def test_follower_killed_and_server_restarted_while_streaming(tmp_path, spec):
    """The follower dies (a new one starts from the records and the
    replica's own version) and later the server restarts from the base
    (the follower replays every delta): after the stream, what is served
    is what the trainer holds."""
    from tnet.serving import follow  # noqa: PLC0415
    data = tmp_path / "in"
    first = _land(data, "r-000.tfrecord", bd.rows(50, seed=0))
    export = str(tmp_path / "export" / "1")
    model, probe = _updatable_export(spec, first, export)
    stream = FileStream(str(data), poll_seconds=0.05)  # stopped below
    said = []
    server = {"loaded": tf.saved_model.load(export), "starts": 1}

    def new_follower():
        return follow.Follower(export, [follow.InProcessTarget(
            server["loaded"], name="replica")], say=said.append)

    follower = new_follower()
    versions = []

    def writer():  # a file once the one before is trained and published
        try:
            land_after_each(5)
        finally:
            stream.stop("the test's writer is done")

    def land_after_each(n):
        nonlocal follower
        deadline = time.monotonic() + 600
        for i in range(1, n + 1):
            while stream.files_consumed < i or len(publisher.published) < i:
                assert time.monotonic() < deadline and not stream.stopping
                time.sleep(0.02)
            if i == n:
                return
            versions.append(follower.step()["replica"])
            if i == 2:
                follower = new_follower()  # the old one is gone mid-stream
            if i == 3:  # the model server restarts: back at the base
                server["loaded"] = tf.saved_model.load(export)
                server["starts"] += 1
                follower = new_follower()
            _land(data, f"r-{i:03d}.tfrecord", bd.rows(40, seed=i))

    thread = threading.Thread(target=writer)
    ckpt = tn.callbacks.StreamCheckpoint(tmp_path / "ckpt", stream, verbose=0)
    publisher = tn.callbacks.PublishDeltas(export, every_seconds=3600,
                                           compact_at=None, stream=stream)
    thread.start()
    model.fit(tn.data.stream_dataset(spec, stream, "tfrecord", BATCH),
              callbacks=[ckpt, publisher], verbose=0)
    thread.join()
    assert versions == [1, 2, 3, 4]
    assert stream.files_consumed == 5
    assert len(publisher.published) == 5
    assert follower.step() == {"replica": 5}
    # The restarted server was replayed from the base: 1 ... 5 applied.
    assert any("it restarted; replaying from 1" in m for m in said), said
    applied = [m for m in said if ": applied delta-" in m]
    assert [m.rsplit("-", 1)[1] for m in applied] == [
        f"{v:06d}" for v in (1, 2, 3, 1, 2, 3, 4, 5)]
    served = server["loaded"].signatures["serving_default"](**_padded(probe))
    served = next(iter(served.values())).numpy().reshape(-1)
    trained = model(probe, training=False).numpy().reshape(-1)
    np.testing.assert_allclose(served, trained, atol=1e-5)
