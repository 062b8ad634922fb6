"""The trainer's Prometheus metrics (tnet/monitoring.py): the exposition
text a scrape gets, parsed back, against the stream and model they
describe; and the /metrics endpoint."""
from __future__ import annotations

import os
import time
import urllib.request

import pytest

import tnet as tn
from prometheus_client.parser import text_string_to_metric_families

from support import byod_data as bd
from tnet.data import spec as spec_lib
from tnet.data.stream import FileStream


def _values(text: str) -> dict:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = sample.name
            if sample.labels:
                key += "{" + ",".join(f"{k}={v}" for k, v in
                                      sorted(sample.labels.items())) + "}"
            out[key] = sample.value
    return out


def test_exposition_text_describes_the_stream(tmp_path):
    data = tmp_path / "in"
    data.mkdir()
    now = float(int(time.time()))  # whole seconds (exact on any file system)
    for name, age in (("a", 300), ("b", 200), ("c", 100), ("d", 50)):
        (data / name).write_text(name)
        os.utime(data / name, (now - age, now - age))
    stream = FileStream(str(data))
    metrics = tn.monitoring.TrainerMetrics(stream)
    assert stream.poll() == [str(data / n) for n in "abcd"]
    for name, examples, status in (("a", 10, "ok"), ("b", 0, "bad")):
        path = data / name
        stream._consume({"path": str(path), "status": status,
                         "examples": examples, "size": 1, "sha256": "0" * 64,
                         "mtime": path.stat().st_mtime})
    stream.bad_files_found = 1
    values = _values(metrics.exposition())
    after = time.time()
    assert values["tnet_stream_files_trained_total"] == 1
    assert values["tnet_stream_examples_trained_total"] == 10
    assert values["tnet_stream_bad_files_total"] == 1
    assert values["tnet_stream_files_pending"] == 2  # c and d
    # The oldest pending file is c, written 100 s ago.
    assert 100 <= values["tnet_stream_oldest_pending_age_seconds"] <= after - now + 100
    # The newest trained file is a (b was bad), written 300 s ago.
    assert 300 <= values["tnet_stream_lag_seconds"] <= after - now + 300
    # One trained file observed: ready-to-trained ~300 s (bucket 600).
    h = "tnet_stream_file_ready_to_trained_seconds"
    assert values[f"{h}_count"] == 1
    assert values[f"{h}_bucket{{le=300.0}}"] == 0
    assert values[f"{h}_bucket{{le=600.0}}"] == 1
    assert values["tnet_train_step"] == 0
    assert "tnet_last_checkpoint_timestamp_seconds" not in values
    assert values["process_resident_memory_bytes"] > 0


def test_endpoint_serves_the_trainers_metrics(tmp_path):
    spec = spec_lib.load(bd.write_spec(tmp_path / "spec.json"))
    data = tmp_path / "in"
    bd.write_tfrecord(data / "f-1.tfrecord", bd.rows(70, seed=1))
    stream = FileStream(str(data), poll_seconds=0.05, idle_seconds=0.5)
    metrics = tn.monitoring.TrainerMetrics(stream)
    port = metrics.serve(0, addr="127.0.0.1")
    try:
        model = tn.models.WideDeep(spec.embedding_columns(), spec.dense,
                                   hidden_units=[8])
        model.compile(tn.optimizer.Adagrad(0.05))
        ckpt = tn.callbacks.StreamCheckpoint(tmp_path / "ckpt", stream,
                                             verbose=0)
        model.fit(tn.data.stream_dataset(spec, stream, "tfrecord", 32),
                  callbacks=[ckpt, metrics.callback(ckpt)], verbose=0)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                    timeout=10) as r:
            text = r.read().decode()
    finally:
        metrics.close()
    values = _values(text)
    assert values["tnet_stream_examples_trained_total"] == 70
    assert values["tnet_train_step"] == 3
    assert values["tnet_last_checkpoint_timestamp_seconds"] == pytest.approx(
        time.time(), abs=120)
    for name, table in model.tables().items():
        assert values[f"tnet_table_rows{{table={name}}}"] == int(table.size()) > 0


def test_tier_hit_rate_since_the_previous_update(tmp_path):
    import types  # noqa: PLC0415

    import numpy as np  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415
    table = tn.SparseTable("tiered", 4, "adagrad", num_shards=2,
                           memory_budget_bytes=4096,
                           storage_dir=str(tmp_path))
    model = types.SimpleNamespace(
        optimizer=types.SimpleNamespace(iterations=tf.Variable(0, tf.int64)),
        tables=lambda: {"tiered": table})
    metrics = tn.monitoring.TrainerMetrics()
    callback = metrics.callback(rows_every_seconds=0)
    callback.set_model(model)
    rng = np.random.default_rng(0)
    seen = []
    for step in range(2):
        for _ in range(4):
            keys = np.unique(rng.integers(0, 3000, 500)).astype(np.int64)
            table.pull(keys, training=True)
        (callback.on_train_begin if step == 0 else callback.on_train_end)()
        stats = table.stats()
        seen.append((int(stats["tier_lookups"]), int(stats["tier_misses"])))
        values = _values(metrics.exposition())
        assert values["tnet_table_tier_lookups_total{table=tiered}"] == seen[-1][0]
        assert values["tnet_table_tier_misses_total{table=tiered}"] == seen[-1][1]
        before = seen[-2] if step else (0, 0)
        lookups = seen[-1][0] - before[0]
        misses = seen[-1][1] - before[1]
        assert lookups > 0 and 0 < misses < lookups  # a budget of ~100 rows
        assert values["tnet_table_tier_hit_rate{table=tiered}"] == \
            pytest.approx(1 - misses / lookups)
    assert values["tnet_table_rows{table=tiered}"] == int(table.size())


def test_follower_metrics_per_replica(tmp_path):
    """Deltas applied, a corrupted one refused, a replica that does not
    answer: what the follower's endpoint says, against what happened."""
    import numpy as np  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415
    from tnet.serving import deltas as fresh  # noqa: PLC0415
    from tnet.serving import follow  # noqa: PLC0415
    spec = spec_lib.load(bd.write_spec(tmp_path / "spec.json"))
    bd.write_tfrecord(tmp_path / "f.tfrecord", bd.rows(64, seed=1))
    data = spec.dataset(str(tmp_path / "f.tfrecord"), "tfrecord", 32)
    model = tn.models.WideDeep(spec.embedding_columns(), spec.dense,
                               hidden_units=[8])
    model.compile(tn.optimizer.Adagrad(0.05))
    model.fit(data.take(1), verbose=0)
    export = str(tmp_path / "export" / "1")
    tn.serving.export_for_serving(model, export, updatable=True)
    loaded = tf.saved_model.load(export)

    class Down:
        name = "down"

        def call(self, signature, inputs):
            raise ConnectionError("no replica here")

    good = follow.InProcessTarget(loaded, name="replica-a")
    follower = follow.Follower(export, [good], say=lambda m: None)
    follower.metrics = tn.monitoring.FollowerMetrics()
    port = follower.metrics.serve(0, addr="127.0.0.1")
    try:
        for _ in range(2):
            model.fit(data, verbose=0)
            tn.serving.publish_delta(model, export, compact_at=None)
        assert follower.step() == {"replica-a": 2}
        model.fit(data, verbose=0)
        path = tn.serving.publish_delta(model, export, compact_at=None)
        with open(os.path.join(path, fresh.PAYLOAD), "r+b") as f:
            f.truncate(100)
        with pytest.raises(fresh.DeltaError, match="checksum"):
            follower.step()
        follower.targets = [Down()]
        with pytest.raises(ConnectionError):
            follower.step()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                    timeout=10) as r:
            values = _values(r.read().decode())
    finally:
        follower.metrics.close()
    a = "{target=replica-a}"
    assert values[f"tnet_follow_delta_version{a}"] == 2
    assert values[f"tnet_follow_published_version{a}"] == 2  # at its last poll
    assert values[f"tnet_follow_deltas_applied_total{a}"] == 2
    assert values[f"tnet_follow_deltas_refused_total{a}"] == 1
    assert values[f"tnet_follow_apply_seconds_count{a}"] == 2
    assert values[f"tnet_follow_last_apply_timestamp_seconds{a}"] == \
        pytest.approx(time.time(), abs=120)
    assert values["tnet_follow_errors_total{target=down}"] == 1
    assert "tnet_follow_errors_total{target=replica-a}" not in values or \
        values["tnet_follow_errors_total{target=replica-a}"] == 0
    assert values["process_resident_memory_bytes"] > 0
    np.testing.assert_equal(fresh.list_deltas(export), [1, 2, 3])
