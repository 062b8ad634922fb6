"""`python -m tnet.train --feature_spec=... --stream=DIR_OR_GLOB`: trains
continuously on files as they land (tnet.data.stream), exactly once across
restarts.

The loop is one `fit` over `tn.data.stream_dataset` with
`tn.callbacks.StreamCheckpoint`: it restores the newest checkpoint (tables,
dense state and the ledger of trained files), trains every landed file not
in the ledger in name order, and checkpoints at file boundaries every
`--checkpoint_every_n_files` files or `--checkpoint_every_seconds` seconds.
It stops at the next file boundary on SIGTERM, or after
`--stream_idle_secs` without a new file, writes a last checkpoint and
exits 0. A damaged file is named (file:record) and recorded as bad
(`--bad_files=skip`), or ends the run after a checkpoint of the files
before it with exit status 4 (`--bad_files=fail`).
"""
from __future__ import annotations

import json
import os
import signal
import time

from absl import app

import tnet as tn
from tnet.cli import model as cli_model
from tnet.cli.config import JobConfig
from tnet.cli.data import BadInputError, SpecJobData
from tnet.cli.export import export_and_check, updatable_export_of
from tnet.data.stream import check_event_time_feature
from tnet.files import write_json_atomic

_LOG = tn.log.get("train")


def run_stream(cfg: JobConfig, strategy, running,
               distributed: bool = False) -> dict:
    """`running` (a tnet.cli.train.Running) gets the model and the
    checkpoint callback once they exist. `distributed`: this process is
    the chief of a cluster (it reads the stream and schedules each batch
    on a worker: tn.data.fit_stream)."""
    from tnet.data import spec as spec_lib  # noqa: PLC0415
    spec = full_spec = spec_lib.load(cfg.feature_spec)
    event_time = cfg.event_time_feature or None
    if event_time is not None:
        try:
            check_event_time_feature(spec, event_time)
        except ValueError as e:
            raise app.UsageError(f"--event_time_feature: {e}") from None
        # The model does not get the event time (the stream takes it out).
        spec = spec_lib.FeatureSpec(
            [f for f in spec.features if f.name != event_time], spec.source)
    model = cli_model.compiled_model(
        cfg, strategy, spec.embedding_columns(cfg.embedding_dim), spec.dense,
        spec.string_ids)
    stream = tn.data.FileStream(
        cfg.stream, landed=cfg.stream_landed,
        poll_seconds=cfg.stream_poll_secs,
        idle_seconds=cfg.stream_idle_secs or None,
        max_file_age_seconds=cfg.stream_max_file_age_secs,
        bad_files=cfg.bad_files)
    stream.on_consume = _log_file
    data = tn.data.stream_dataset(
        full_spec, stream, cfg.format, cfg.batch_size, bad_rows=cfg.bad_rows,
        shuffle_buffer=cfg.shuffle_buffer, seed=cfg.seed,
        event_time_feature=event_time)
    checkpoints, callbacks = cli_model.checkpoint_callbacks(cfg, stream)
    running.model, running.checkpoints = model, checkpoints
    running.distributed = distributed
    if checkpoints is None:
        _LOG.warning("tnet.train: --stream without --checkpoint_dir: nothing is "
                     "saved, a restart trains every file again")
    restore_signals = _stop_on_sigterm(stream)
    publisher = None
    if cfg.publishing:
        base = _publish_base(cfg, model, spec, stream)
        if base is not None:
            # After the StreamCheckpoint: it publishes from the restored
            # model; at once when training catches up with the stream.
            publisher = cli_model.publisher_callback(cfg)
            publisher.stream = stream
            callbacks.append(publisher)
            _LOG.info(f"tnet.train: publishing deltas to {base}")
    metrics = None
    if cfg.metrics_port >= 0:
        metrics = tn.monitoring.TrainerMetrics(stream)
        port = metrics.serve(cfg.metrics_port)
        callbacks.append(metrics.callback(checkpoints, publisher))
        _LOG.info(f"tnet.train: metrics on http://0.0.0.0:{port}/metrics")
    _LOG.info(f"tnet.train: streaming {cfg.stream} (landed: "
          f"{cfg.stream_landed}, poll {cfg.stream_poll_secs:g} s)")
    start = time.perf_counter()
    try:
        try:
            tn.data.fit_stream(model, data, callbacks=callbacks,
                               verbose=2 if os.environ.get("CI") else 0)
        except ValueError as e:
            # Keras refuses an epoch of no step (only damaged files, or
            # none, landed in this run): still record and checkpoint them.
            if "Empty logs" not in str(e):
                raise
            if checkpoints is not None:
                checkpoints.finish()
    finally:
        restore_signals()
        if metrics is not None:
            metrics.close()
    seconds = time.perf_counter() - start
    if stream.error is not None:
        raise RuntimeError(stream.error)
    summary = {
        "model": cfg.model, "data": "feature_spec", "stream": cfg.stream,
        "cluster": ({"ps": tn.distribute.num_ps(strategy),
                     "workers": strategy.extended._num_workers}  # noqa: SLF001
                    if distributed else None),
        "flags": cfg.as_dict(),
        "train": {"steps": int(model.optimizer.iterations.numpy()),
                  "seconds": round(seconds, 3)},
        "streamed": {"files": stream.files_consumed,
                     "examples": stream.examples_consumed,
                     "bad_files": sorted(
                         p for p, e in stream.ledger.entries.items()
                         if e["status"] == "bad"),
                     "ledger_files": len(stream.ledger),
                     "stopped": stream.stop_reason},
        "tables": {n: {"rows": int(t.size())}
                   for n, t in model.tables().items()},
    }
    if publisher is not None:
        summary["published"] = publisher.published
    if checkpoints is not None:
        summary["checkpoint"] = {
            "restored_step": checkpoints.restored_step,
            "last_saved_step": checkpoints.last_saved_step,
            "last_saved_path": checkpoints.last_saved_path}
    os.makedirs(cfg.model_dir, exist_ok=True)
    write_json_atomic(os.path.join(cfg.model_dir, "summary.json"), summary,
                      indent=2)
    _LOG.info(f"tnet.train: stream stopped ({stream.stop_reason}): "
              f"{stream.files_consumed} files, {stream.examples_consumed} "
              f"examples trained in this run")
    print(json.dumps({"train": summary["train"],
                      "streamed": summary["streamed"]}, indent=2), flush=True)
    if stream.failure is not None:
        raise BadInputError(stream.failure)
    return summary


def _publish_base(cfg: JobConfig, model, spec, stream):
    """The updatable export the stream publishes into: the newest one in
    --export_dir, else the model as it stands (restored from the newest
    checkpoint, or new) exported once a first file has landed (its rows
    are the export's sample). None when the stream stopped before. Either
    way the model is built (called on that sample) before `fit`."""
    landed = []
    while not stream.stopping:
        landed = stream.list_landed()
        if landed:
            break
        time.sleep(cfg.stream_poll_secs)
    if not landed:
        return None
    from tnet.serving import deltas as fresh  # noqa: PLC0415
    job = SpecJobData(cfg, False, spec, landed[:1], landed[:1], count=False)
    if not model.built:
        # The publisher reads the model's tables. Built in the strategy's
        # scope: under a cluster its variables go to the ps.
        features = dict(next(iter(job.eval()))[0])
        features.pop(spec.group_key or "", None)
        with model.distribute_strategy.scope():
            model(features, training=False)
    latest = (tn.saving.latest_checkpoint(cfg.checkpoint_dir)
              if cfg.checkpoint_dir else None)
    start = tn.saving.read_manifest(latest)["train_step"] if latest else 0
    base = updatable_export_of(cfg.export_dir)
    if base is not None and fresh.read_info(base)["through_step"] <= start - 1:
        return base
    if base is not None:
        # A base newer than the checkpoint (a compaction after it, then a
        # kill): deltas cannot take it back, a new base from the restored
        # model can (the follower moves to the newest base).
        _LOG.info(f"tnet.train: {base} holds training after the newest "
                  f"checkpoint (step {start}); exporting a new base")
    if latest is not None:
        tn.saving.restore(model, latest)
    return export_and_check(cfg, model, job, sample_data=job.eval())["path"]


def _stop_on_sigterm(stream):
    """SIGTERM stops the stream at its next file boundary. A Python signal
    handler runs only when the main thread runs Python, and during `fit`
    it may wait inside a step for the next file to land: so the signal is
    also written to a wakeup pipe that a thread watches. Returns the undo."""
    import threading  # noqa: PLC0415
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    previous = signal.signal(signal.SIGTERM,
                             lambda *_: stream.stop("SIGTERM"))
    previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

    def watch():
        while True:
            try:
                got = os.read(read_fd, 64)
            except OSError:
                return
            if not got:
                return
            if signal.SIGTERM in got:
                stream.stop("SIGTERM")

    threading.Thread(target=watch, daemon=True,
                     name="tnet-stream-sigterm").start()

    def undo():
        signal.set_wakeup_fd(previous_fd)
        signal.signal(signal.SIGTERM, previous)
        os.close(write_fd)
    return undo


def _log_file(path: str, entry: dict) -> None:
    if entry["status"] == "ok":
        _LOG.info(f"tnet.train: trained {path} ({entry['examples']} examples)")
    else:
        _LOG.info(f"tnet.train: recorded bad file {entry['where']}")
