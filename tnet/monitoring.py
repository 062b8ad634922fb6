"""Prometheus metrics of a streaming trainer (`--metrics_port`).

    metrics = tn.monitoring.TrainerMetrics(stream)
    port = metrics.serve(9100)           # http://host:9100/metrics
    model.fit(data, callbacks=[checkpoint, metrics.callback(checkpoint)])

Exposed (text format, scraped by Prometheus):

* `tnet_stream_files_trained_total`, `tnet_stream_examples_trained_total`,
  `tnet_stream_bad_files_total`: counters of this process.
* `tnet_stream_files_pending`: files landed and not trained, at the
  newest listing; `tnet_stream_oldest_pending_age_seconds`: now minus the
  modification time of the oldest of them (0 when none).
* `tnet_stream_lag_seconds`: the input lag, now minus the newest event
  time trained when the stream has an event-time feature
  (`--event_time_feature`), else now minus the modification time of the
  newest file trained (when its writer closed it); it grows while training
  falls behind or no file lands. It counts from the files trained in this
  process (absent until the first one).
* `tnet_stream_file_ready_to_trained_seconds`: histogram, per file, from
  its modification time to the end of its training.
* `tnet_train_step`, `tnet_last_checkpoint_timestamp_seconds`,
  `tnet_last_publish_timestamp_seconds` (with publishing),
  `tnet_table_rows{table=...}`.
* `tnet_table_tier_lookups_total{table=...}`,
  `tnet_table_tier_misses_total{table=...}` and
  `tnet_table_tier_hit_rate{table=...}` (since the previous update) for a
  table with a disk tier.
* `process_resident_memory_bytes` and the other `process_*` metrics of
  prometheus_client's process collector.

`FollowerMetrics` are those of `python -m tnet.serving.follow
--metrics_port`, per served replica (label `target`):
`tnet_follow_delta_version` (the version the replica serves, at the newest
poll), `tnet_follow_published_version` (the newest delta in the export),
`tnet_follow_deltas_applied_total`, `tnet_follow_deltas_refused_total` (a
gap or a checksum mismatch: the replica stays where it was),
`tnet_follow_errors_total` (the replica did not answer),
`tnet_follow_apply_seconds` (histogram, per delta) and
`tnet_follow_last_apply_timestamp_seconds`.

Values of the stream are read when scraped; the step, checkpoint, publish
and table rows are updated by the callback on the training thread (the
table sizes at most every `rows_every_seconds`), so a scrape never runs a
TensorFlow op beside training.
"""
from __future__ import annotations

import time
from typing import Optional

import tf_keras

from tnet.table import hit_rate

__all__ = ["TrainerMetrics", "FollowerMetrics"]

BUCKETS = (0.25, 0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 60, 120, 300, 600,
           1800, 3600)


class TrainerMetrics:
    """The metrics of a trainer reading `stream` (a tn.data.FileStream, or
    None for a trainer without one), in their own registry.

    Args:
      stream: the `tn.data.FileStream` trained, or None.
      registry: a prometheus_client registry (default: a new one).

    Example:
        ```python
        data = tn.data.stream_dataset(spec, "/landing/", "tfrecord", 512)
        metrics = tn.monitoring.TrainerMetrics(data.stream)
        port = metrics.serve(9100)
        model.fit(data, callbacks=[metrics.callback()])
        ```
    """

    def __init__(self, stream=None, registry=None):
        import prometheus_client as pc  # noqa: PLC0415
        self._pc = pc
        self.stream = stream
        self.registry = registry or pc.CollectorRegistry()
        pc.ProcessCollector(registry=self.registry)
        self.freshness = pc.Histogram(
            "tnet_stream_file_ready_to_trained_seconds",
            "Per file: from its modification time to the end of its training.",
            buckets=BUCKETS, registry=self.registry)
        self.step = 0
        self.last_checkpoint: Optional[float] = None
        self.last_publish: Optional[float] = None
        self.table_rows: dict = {}
        self.tier: dict = {}  # table -> (lookups, misses, hit rate)
        self.server = None
        self.registry.register(_Collector(self))
        if stream is not None:
            previous = stream.on_consume

            def consumed(path, entry):
                if previous is not None:
                    previous(path, entry)
                self.observe_file(entry)
            stream.on_consume = consumed

    def observe_file(self, entry: dict) -> None:
        """Records a trained file's freshness (the stream calls it).

        Args:
          entry: the stream's ledger entry of a trained file.
        """
        if entry.get("status") == "ok" and entry.get("mtime"):
            self.freshness.observe(max(0.0, entry["consumed_unix"]
                                       - entry["mtime"]))

    def serve(self, port: int, addr: str = "0.0.0.0") -> int:
        """Serves /metrics on `port` (0: any free port); returns the port.

        Args:
          port: the port (0: any free one).
          addr: the address to listen on.
        """
        server, _ = self._pc.start_http_server(port, addr=addr,
                                               registry=self.registry)
        self.server = server
        return server.server_port

    def close(self) -> None:
        """Stops serving /metrics."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def exposition(self) -> str:
        """The metrics in Prometheus' text format, as a scrape gets them."""
        return self._pc.generate_latest(self.registry).decode()

    def callback(self, checkpoint=None, publisher=None,
                 rows_every_seconds: float = 5.0) -> tf_keras.callbacks.Callback:
        """A Keras callback that keeps the step, the checkpoint and publish
        times and the table rows current (one process).

        Args:
          checkpoint: the checkpoint callback whose saves are timed, or None.
          publisher: the `PublishDeltas` callback whose publishes are timed, or None.
          rows_every_seconds: how often the table sizes are read.
        """
        return _Updater(self, checkpoint, publisher, rows_every_seconds)


class _Updater(tf_keras.callbacks.Callback):
    def __init__(self, metrics, checkpoint, publisher, rows_every_seconds):
        super().__init__()
        self.metrics = metrics
        self.checkpoint = checkpoint
        self.publisher = publisher
        self.rows_every = float(rows_every_seconds)
        self._rows_at = 0.0
        self._saved = None
        self._published = 0

    def _update(self, force_rows: bool = False) -> None:
        m = self.metrics
        m.step = int(self.model.optimizer.iterations.numpy())
        if self.checkpoint is not None and (
                self.checkpoint.last_saved_path != self._saved):
            self._saved = self.checkpoint.last_saved_path
            m.last_checkpoint = time.time()
        if self.publisher is not None and len(
                self.publisher.published) != self._published:
            self._published = len(self.publisher.published)
            m.last_publish = time.time()
        now = time.monotonic()
        if force_rows or now - self._rows_at >= self.rows_every:
            self._rows_at = now
            tables = getattr(self.model, "tables", None)
            if tables is not None:
                m.table_rows = {n: int(t.size()) for n, t in tables().items()}
                for n, t in tables().items():
                    if getattr(t, "memory_budget_bytes", None):
                        stats = t.stats()
                        lookups = int(stats["tier_lookups"])
                        misses = int(stats["tier_misses"])
                        before = m.tier.get(n, (0, 0, 1.0))
                        rate = hit_rate(lookups - before[0],
                                        misses - before[1], idle=before[2])
                        m.tier[n] = (lookups, misses, rate)

    def on_train_begin(self, logs=None):
        self._saved = (self.checkpoint.last_saved_path
                       if self.checkpoint is not None else None)
        self._update(force_rows=True)

    def on_train_batch_end(self, batch, logs=None):
        self._update()

    def on_train_end(self, logs=None):
        self._update(force_rows=True)


class _Collector:
    """Reads the stream's counters when scraped."""

    def __init__(self, metrics: TrainerMetrics):
        self.metrics = metrics

    def collect(self):
        from prometheus_client.core import (  # noqa: PLC0415
            CounterMetricFamily, GaugeMetricFamily)
        m, s = self.metrics, self.metrics.stream
        now = time.time()
        if s is not None:
            yield CounterMetricFamily(
                "tnet_stream_files_trained", "Files trained by this process.",
                value=s.files_consumed)
            yield CounterMetricFamily(
                "tnet_stream_examples_trained",
                "Examples trained by this process.",
                value=s.examples_consumed)
            yield CounterMetricFamily(
                "tnet_stream_bad_files", "Damaged files found and recorded.",
                value=s.bad_files_found)
            pending, oldest = s.pending_state()
            yield GaugeMetricFamily(
                "tnet_stream_files_pending",
                "Files landed and not trained, at the newest listing.",
                value=pending)
            yield GaugeMetricFamily(
                "tnet_stream_oldest_pending_age_seconds",
                "Now minus the modification time of the oldest pending file.",
                value=max(0.0, now - oldest) if oldest is not None else 0.0)
            since = s.lag_reference()
            if since is not None:
                yield GaugeMetricFamily(
                    "tnet_stream_lag_seconds",
                    "Now minus the newest event time trained (with an "
                    "event-time feature), else minus the modification time "
                    "of the newest file trained.",
                    value=max(0.0, now - since))
        yield GaugeMetricFamily("tnet_train_step", "optimizer.iterations.",
                                value=m.step)
        if m.last_checkpoint is not None:
            yield GaugeMetricFamily(
                "tnet_last_checkpoint_timestamp_seconds",
                "Unix time of the newest checkpoint.",
                value=m.last_checkpoint)
        if m.last_publish is not None:
            yield GaugeMetricFamily(
                "tnet_last_publish_timestamp_seconds",
                "Unix time of the newest delta published.",
                value=m.last_publish)
        if m.table_rows:
            rows = GaugeMetricFamily("tnet_table_rows", "Rows per table.",
                                     labels=["table"])
            for name, n in sorted(m.table_rows.items()):
                rows.add_metric([name], n)
            yield rows
        if m.tier:
            families = (
                CounterMetricFamily("tnet_table_tier_lookups",
                                    "Rows looked up in a disk tier.",
                                    labels=["table"]),
                CounterMetricFamily("tnet_table_tier_misses",
                                    "Rows of those read from disk.",
                                    labels=["table"]),
                GaugeMetricFamily("tnet_table_tier_hit_rate",
                                  "Lookups found in memory, since the "
                                  "previous update.", labels=["table"]))
            for name, values in sorted(m.tier.items()):
                for family, value in zip(families, values):
                    family.add_metric([name], value)
            yield from families


class FollowerMetrics:
    """The metrics of a follower (tnet.serving.follow), per target, in
    their own registry. The follower calls `polled`, `applied`, `refused`
    and `error`; a scrape reads them.

    Args:
      registry: a prometheus_client registry (default: a new one).

    Example:
        ```python
        follower = follow.Follower("/models/ranker/1", targets)
        follower.metrics = tn.monitoring.FollowerMetrics()
        port = follower.metrics.serve(9101)
        follower.step()
        ```
    """

    def __init__(self, registry=None):
        import prometheus_client as pc  # noqa: PLC0415
        self._pc = pc
        self.registry = registry or pc.CollectorRegistry()
        pc.ProcessCollector(registry=self.registry)
        label = ["target"]
        self.version = pc.Gauge(
            "tnet_follow_delta_version",
            "The delta version the replica serves, at the newest poll.",
            label, registry=self.registry)
        self.published = pc.Gauge(
            "tnet_follow_published_version",
            "The newest delta version in the export the replica follows.",
            label, registry=self.registry)
        self.applied_total = pc.Counter(
            "tnet_follow_deltas_applied", "Deltas applied to the replica.",
            label, registry=self.registry)
        self.refused_total = pc.Counter(
            "tnet_follow_deltas_refused",
            "Polls that refused a delta (a gap, a checksum mismatch, no "
            "matching key): the replica keeps what it served.",
            label, registry=self.registry)
        self.errors_total = pc.Counter(
            "tnet_follow_errors", "Polls where the replica did not answer.",
            label, registry=self.registry)
        self.apply_seconds = pc.Histogram(
            "tnet_follow_apply_seconds", "Seconds to apply one delta.",
            label, buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
                            30, 60), registry=self.registry)
        self.last_apply = pc.Gauge(
            "tnet_follow_last_apply_timestamp_seconds",
            "Unix time of the newest delta applied to the replica.",
            label, registry=self.registry)
        self.server = None

    def polled(self, target: str, version: int, published: int) -> None:
        """After a poll of `target`.

        Args:
          target: the target's name.
          version: the delta version it serves.
          published: the newest delta version in its export.
        """
        self.version.labels(target).set(version)
        self.published.labels(target).set(published)

    def applied(self, target: str, version: int, seconds: float) -> None:
        """After a delta is applied to `target`.

        Args:
          target: the target's name.
          version: the delta's version.
          seconds: how long the apply took.
        """
        self.applied_total.labels(target).inc()
        self.apply_seconds.labels(target).observe(seconds)
        self.last_apply.labels(target).set(time.time())
        self.version.labels(target).set(version)

    def refused(self, target: str) -> None:
        """After a poll of `target` refused a delta.

        Args:
          target: the target's name.
        """
        self.refused_total.labels(target).inc()

    def error(self, target: str) -> None:
        """After a poll where `target` did not answer.

        Args:
          target: the target's name.
        """
        self.errors_total.labels(target).inc()

    serve = TrainerMetrics.serve
    close = TrainerMetrics.close
    exposition = TrainerMetrics.exposition
