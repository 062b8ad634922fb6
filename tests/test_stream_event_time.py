"""A stream's input lag from an event-time feature (tn.data.stream_dataset
event_time_feature=, `python -m tnet.train --event_time_feature`): the lag
gauge and the "training is behind" line count from the newest event time
trained, not from the files' modification times; the model never gets
the feature; a bad name is one line and exit 2."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest

import tnet as tn

from tests.support import forkrun
from tests.support.ckpt import assert_same_model, spec_wide_deep as _model
from tnet.data import spec as spec_lib
from tnet.data.stream import FileStream

ROOT = pathlib.Path(__file__).resolve().parents[1]
BATCH = 16
SPEC = {"defaults": {"dim": 4, "table": "emb"},
        "features": [{"name": "click", "kind": "label", "dtype": "int64"},
                     {"name": "user_id", "kind": "id", "dtype": "int64"},
                     {"name": "item_id", "kind": "id", "dtype": "int64"},
                     {"name": "price", "kind": "dense", "dtype": "float32"},
                     {"name": "ts", "kind": "dense", "dtype": "int64"}]}
AGO = 3600  # the events happened an hour before their files landed


def _land_csv(directory: pathlib.Path, name: str, n: int, seed: int,
              newest: int) -> int:
    """A CSV file of n clicks whose event times end at `newest` (unix s),
    renamed into place now (its mtime is now); returns its newest time."""
    rng = np.random.default_rng(seed)
    ts = np.sort(newest - rng.integers(0, 300, n))
    ts[-1] = newest
    rng.shuffle(ts)  # the newest event anywhere in the file
    lines = ["click,user_id,item_id,price,ts"] + [
        f"{rng.integers(0, 2)},{rng.integers(0, 40)},{rng.integers(0, 30)},"
        f"{rng.random():.3f},{t}" for t in ts]
    tmp = directory / f".{name}.tmp"
    tmp.write_text("\n".join(lines) + "\n")
    os.rename(tmp, directory / name)
    return int(ts.max())


def _lag(metrics) -> float:
    from prometheus_client.parser import (  # noqa: PLC0415
        text_string_to_metric_families)
    for family in text_string_to_metric_families(metrics.exposition()):
        if family.name == "tnet_stream_lag_seconds":
            return family.samples[0].value
    raise AssertionError("no tnet_stream_lag_seconds in the exposition")


def test_lag_counts_from_the_newest_event_time_trained(tmp_path, caplog):
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(SPEC))
    spec = spec_lib.load(spec_path)
    data = tmp_path / "in"
    data.mkdir()
    # Odd seconds: float32 holds unix seconds in steps of 128 s, so an
    # exact max proves the feature is read at full precision.
    landing = time.time()
    base = int(landing) - AGO
    newest = [_land_csv(data, f"c-{i}.csv", 40 + 7 * i, seed=i,
                        newest=base - 97 + 41 * i) for i in range(3)]
    stream = FileStream(str(data), poll_seconds=0.05, idle_seconds=0.5)
    metrics = tn.monitoring.TrainerMetrics(stream)
    ckpt = tn.callbacks.StreamCheckpoint(tmp_path / "ckpt", stream, verbose=0)
    data_set = tn.data.stream_dataset(spec, stream, "csv", BATCH,
                                      event_time_feature="ts")
    # The model does not get the event time: the spec without it.
    model_spec = spec_lib.FeatureSpec(
        [f for f in spec.features if f.name != "ts"], spec.source)
    assert "ts" not in data_set.element_spec[0]
    model = _model(model_spec)
    model.fit(data_set, callbacks=[ckpt], verbose=0)
    assert stream.files_consumed == 3
    assert stream.newest_trained_event_time == max(newest)
    ledger = tn.saving.read_state(ckpt.last_saved_path, "stream")
    assert [ledger["files"][str(data / f"c-{i}.csv")]["event_time_max"]
            for i in range(3)] == newest
    # The gauge: ~AGO s (newest file 15 s later than base), where the
    # files' mtimes say ~0.
    expected = time.time() - max(newest)
    lag = _lag(metrics)
    assert abs(lag - expected) < 30 and lag > AGO - 120, (lag, expected)
    # What the files' mtimes would say: since they landed (seconds to
    # minutes on a loaded machine), not an hour.
    assert stream.newest_trained_mtime >= landing - 2
    assert time.time() - stream.newest_trained_mtime < AGO / 2
    # The "training is behind" line says the same lag.
    stream.pending = [str(data / "x-1.csv"), str(data / "x-2.csv")]
    stream._mtimes.update({p: time.time() for p in stream.pending})  # noqa: SLF001
    stream.behind_log_seconds = 0.0
    caplog.clear()
    with caplog.at_level("WARNING"):
        stream._say_if_behind()  # noqa: SLF001
    said = caplog.text.split("lag (now minus the newest event time trained) ")
    assert len(said) == 2, caplog.text
    assert abs(float(said[1].split(" s")[0]) - expected) < 30, said
    # Trained as a plain fit of the same files without the feature.
    reference = _model(model_spec)
    plain = None
    for i in range(3):
        one = model_spec.dataset(str(data / f"c-{i}.csv"), "csv", BATCH)
        plain = one if plain is None else plain.concatenate(one)
    reference.fit(plain, verbose=0)
    assert_same_model(model, reference)


def test_without_the_feature_the_lag_is_the_files_mtime(tmp_path):
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(SPEC))
    spec = spec_lib.load(spec_path)
    data = tmp_path / "in"
    data.mkdir()
    _land_csv(data, "c-0.csv", 30, seed=0, newest=int(time.time()) - AGO)
    stream = FileStream(str(data), poll_seconds=0.05, idle_seconds=0.5)
    metrics = tn.monitoring.TrainerMetrics(stream)
    _model(spec).fit(tn.data.stream_dataset(spec, stream, "csv", BATCH),
                     verbose=0)
    assert stream.files_consumed == 1
    assert _lag(metrics) < AGO / 2  # the file landed just now


def test_milliseconds_are_named_once(tmp_path, caplog):
    """Event times in milliseconds lie in the future: one log line says
    so (the lag gauge cannot go below 0)."""
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(SPEC))
    spec = spec_lib.load(spec_path)
    data = tmp_path / "in"
    data.mkdir()
    for i in range(2):
        _land_csv(data, f"c-{i}.csv", 20, seed=i,
                  newest=int(time.time() * 1000) + i)
    stream = FileStream(str(data), poll_seconds=0.05, idle_seconds=0.5)
    metrics = tn.monitoring.TrainerMetrics(stream)
    model_spec = spec_lib.FeatureSpec(
        [f for f in spec.features if f.name != "ts"], spec.source)
    with caplog.at_level("WARNING"):
        _model(model_spec).fit(tn.data.stream_dataset(
            spec, stream, "csv", BATCH, event_time_feature="ts"), verbose=0)
    assert stream.files_consumed == 2
    assert caplog.text.count("more than a day ahead of now") == 1
    assert "c-0.csv: event time feature 'ts'" in caplog.text
    assert _lag(metrics) == 0.0


@pytest.mark.parametrize("name,why", [("nope", "is not a feature of the spec"),
                                      ("user_id", "of kind 'id'")])
def test_a_bad_event_time_feature_is_one_line(tmp_path, name, why):
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(SPEC))
    spec = spec_lib.load(spec_path)
    with pytest.raises(ValueError, match=why) as e:
        tn.data.stream_dataset(spec, str(tmp_path), "csv", BATCH,
                               event_time_feature=name)
    assert "'price', 'ts'" in str(e.value)


def test_cli_a_bad_event_time_feature_exits_2(tmp_path):
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(SPEC))
    (tmp_path / "in").mkdir()
    res = forkrun.run(
        [sys.executable, "-m", "tnet.train", f"--feature_spec={spec_path}",
         "--format=csv", f"--stream={tmp_path / 'in'}",
         f"--model_dir={tmp_path / 'run'}", "--stream_idle_secs=1",
         "--event_time_feature=event_ts"],
        cwd=tmp_path, text=True, capture_output=True, timeout=300,
        env=dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2"))
    assert res.returncode == 2, res.stderr[-3000:]
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("tnet.train: --event_time_feature: event time "
                           "feature 'event_ts' is not a feature of the spec")
    assert "Traceback" not in res.stderr
