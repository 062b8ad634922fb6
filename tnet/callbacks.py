"""tn.callbacks: Keras callbacks for tnet models.

`Checkpoint` saves tnet checkpoints (`tn.saving.save`) during `fit` and
resumes from the newest one when training starts, like Keras'
`BackupAndRestore` but with the tables streamed to HDF5.
`TableMaintenance` runs the tables' eviction (show decay, threshold, TTL)
during `fit` and reports their lifecycle metrics.
"""
from __future__ import annotations

import os
from typing import Optional

import tensorflow as tf
import tf_keras

from tnet import distribute as tn_distribute
from tnet.saving import checkpoint as ckpt
from tnet.files import logger as _ckpt_logger
from tnet.table import hit_rate, model_tables

__all__ = ["Checkpoint", "StreamCheckpoint", "TableMaintenance",
           "PublishDeltas", "recount_steps"]


def recount_steps(model, expected: int) -> int:
    """Sets `model.optimizer.iterations` back to `expected`, the steps that
    ran, when it is above; returns the steps taken off (0 if none).

    Under ParameterServerStrategy a step whose worker failed or was cut off
    is run again (ClusterCoordinator retries it), and a step that failed on
    a ps is retried until the ps answers. A failed attempt that reached
    the ps holding `iterations` may already have counted: the optimizer's
    `iterations += 1` waits on nothing but its own read, so it runs even
    when the step's pulls from another ps fail (docs/DESIGN.md "Failures across
    hosts"). Call this when every step has finished (the end of an epoch
    or of a `fit`), so the count, and every checkpoint step, epoch and
    batch derived from it, stays the steps scheduled. The one home of this
    correction: `Checkpoint` calls it at every epoch end, `python -m
    tnet.train --days` after each day's `fit`.

    Args:
      model: the `tn.Model` being trained.
      expected: the step count `fit` should have reached.

    Returns:
      The step count, set to `expected` when a re-run step counted twice.

    Example:
        ```python
        steps = 0
        for day in days:
            model.fit(read(day), steps_per_epoch=100)
            steps += 100
            tn.callbacks.recount_steps(model, steps)
        ```
    """
    actual = int(model.optimizer.iterations.numpy())
    expected = int(expected)
    if actual <= expected:
        return 0
    model.optimizer.iterations.assign(expected)
    _ckpt_logger.warning(
        "%d retried step(s) counted twice by optimizer.iterations (%d after "
        "%d steps); set it back to %d", actual - expected, actual, expected,
        expected)
    return actual - expected


class _ResumeCounters:
    """Plays Keras' `model._training_state` (as BackupAndRestore's does) so
    that `fit` starts at the epoch and step of the restored checkpoint."""

    def __init__(self, callback: "Checkpoint", step: int):
        self.callback = callback
        self.step = step

    def maybe_load_initial_counters_from_ckpt(self, steps_per_epoch,
                                              initial_epoch, mode=None):
        del mode
        if not steps_per_epoch:
            # Unknown epoch length (a dataset of unknown cardinality):
            # optimizer.iterations is restored, epochs restart at
            # initial_epoch.
            result = (initial_epoch, 0)
        else:
            epoch, step = divmod(self.step, int(steps_per_epoch))
            result = ((epoch, step) if epoch >= initial_epoch
                      else (initial_epoch, 0))
        self.callback.resumed_at = result
        return result


class Checkpoint(tf_keras.callbacks.Callback):
    """Saves tnet checkpoints during `fit`; resumes from the newest one.

    Args:
      directory: where `ckpt-<step>` directories go (see
        `tnet.saving.checkpoint` for the layout).
      every_n_steps: save when `optimizer.iterations` reaches a multiple of
        this (batch hook; one process only, see below). None: no step saves.
      every_n_epochs: save at the end of every n-th epoch (None or 0: never).
      keep: keep the newest `keep` checkpoints (plus the full ones their
        deltas need); None keeps all.
      incremental: write deltas (rows changed since the previous checkpoint
        plus deleted keys) when possible; a full checkpoint at least every
        `full_every` saves.
      full_every: the longest chain is one full checkpoint + full_every - 1
        deltas.
      restore: on train begin, restore the newest checkpoint in `directory`
        (tables, dense variables, optimizer state including `iterations`).
        `fit` then resumes at epoch `step // steps_per_epoch`, batch
        `step % steps_per_epoch` (the batch counter only: the dataset
        restarts from its beginning, as with BackupAndRestore).
      verbose: 1 logs progress lines (rows written / total) and one line
        per checkpoint at info level (shown by default); 0 logs them at
        debug level (`--verbosity=1`). Both on the "tnet.checkpoint"
        logger.
      maintenance: a `TableMaintenance` whose eviction runs right before
        each save, so checkpoints hold only live rows (it may also be in
        the callback list for its own schedule).

    A newest checkpoint that fails verification (a corrupted, truncated or
    missing file) stops `fit` with `tn.saving.CheckpointError` naming the
    file; nothing falls back silently. Move that checkpoint away to resume
    from the previous one.

    After `on_train_begin`, `restored_step` is the restored checkpoint's step
    (None when training started fresh) and `restored_path` its path; a CLI
    can also read `tn.saving.latest_checkpoint(directory)` before `fit`.
    `last_saved_step` / `last_saved_path` describe the newest save.

    ParameterServerStrategy: Keras refuses batch-level callbacks there, so
    `every_n_steps` is rejected under it (with this explanation) and the
    callback saves at epoch ends only, on the chief, after Keras has joined
    the workers; use `steps_per_epoch` to choose the save interval. Every
    row then streams from the ps tasks to the chief (see
    `tnet.saving.checkpoint`).

    Example:
        ```python
        model.fit(data, epochs=10, callbacks=[
            tn.callbacks.Checkpoint("/ckpt", every_n_epochs=1, keep=3, incremental=True)])
        ```
    """

    def __init__(self, directory: str, every_n_steps: Optional[int] = None,
                 every_n_epochs: Optional[int] = 1, keep: Optional[int] = 3,
                 incremental: bool = False,
                 full_every: int = ckpt.DEFAULT_FULL_EVERY,
                 restore: bool = True, verbose: int = 1,
                 maintenance: Optional["TableMaintenance"] = None):
        super().__init__()
        if maintenance is not None and not isinstance(maintenance,
                                                      TableMaintenance):
            raise TypeError("Checkpoint(maintenance=...) takes a "
                            "tn.callbacks.TableMaintenance, got "
                            f"{type(maintenance).__name__}")
        self.maintenance = maintenance
        if every_n_steps is not None and (
                isinstance(every_n_steps, bool) or int(every_n_steps) < 1):
            raise ValueError(f"every_n_steps must be a positive int or None, "
                             f"got {every_n_steps!r}")
        if every_n_epochs is not None and int(every_n_epochs) < 0:
            raise ValueError(f"every_n_epochs must be >= 0 or None, got "
                             f"{every_n_epochs!r}")
        if keep is not None and int(keep) < 1:
            raise ValueError(f"keep must be >= 1 or None, got {keep!r}")
        if int(full_every) < 1:
            raise ValueError(f"full_every must be >= 1, got {full_every!r}")
        self.directory = os.path.abspath(os.fspath(directory))
        self.every_n_steps = int(every_n_steps) if every_n_steps else None
        self.every_n_epochs = int(every_n_epochs) if every_n_epochs else None
        self.keep = int(keep) if keep is not None else None
        self.incremental = bool(incremental)
        self.full_every = int(full_every)
        self.restore = restore
        self.verbose = verbose
        self.restored_step: Optional[int] = None
        self.restored_path: Optional[str] = None
        self.resumed_at = None
        self.last_saved_step: Optional[int] = None
        self.last_saved_path: Optional[str] = None
        self._counters = None
        self._start_step = 0
        self._first_epoch: Optional[int] = None
        self.recounted = 0  # retried steps taken off optimizer.iterations

    # Keras calls batch hooks only for callbacks that ask for them (and
    # refuses them under ParameterServerStrategy).
    def _implements_train_batch_hooks(self):
        return self.every_n_steps is not None

    def set_model(self, model):
        super().set_model(model)
        if self.every_n_steps is not None and _under_pss(model):
            raise ValueError(
                "tn.callbacks.Checkpoint(every_n_steps=...) cannot run under "
                "ParameterServerStrategy: Keras does not call batch-level "
                "callbacks there. Use every_n_epochs (with steps_per_epoch "
                "setting the interval) instead.")

    def _say(self, message: str) -> None:
        if self.verbose:
            _ckpt_logger.info(f"[tnet.checkpoint] {message}")
        else:
            _ckpt_logger.debug("%s", message)

    def on_train_begin(self, logs=None):
        self.restored_step = self.restored_path = self.resumed_at = None
        self._first_epoch = None
        self._start_step = self._step()
        if not self.restore:
            return
        path = ckpt.latest_checkpoint(self.directory)
        if path is None:
            self._say(f"no checkpoint in {self.directory}; starting fresh")
            return
        step = ckpt.restore(self.model, path,
                            track_changes=self.incremental,
                            progress=self._say)
        self.restored_step, self.restored_path = step, path
        self.last_saved_step, self.last_saved_path = step, path
        self._start_step = step
        self._counters = _ResumeCounters(self, step)
        self.model._training_state = self._counters  # noqa: SLF001

    def on_train_end(self, logs=None):
        if getattr(self.model, "_training_state", None) is self._counters:
            self.model._training_state = None  # noqa: SLF001
        self._counters = None

    def on_train_batch_end(self, batch, logs=None):
        if self.every_n_steps is None:
            return
        step = self._step()
        last = max(self._start_step, self.last_saved_step or 0)
        if step // self.every_n_steps > last // self.every_n_steps:
            self._save(step)

    def on_epoch_begin(self, epoch, logs=None):
        if self._first_epoch is None:
            self._first_epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        # Under a cluster a ps cut off now is waited out as the steps wait
        # it out (tn.distribute.through_ps_cut), not a lost ps at once.
        step = tn_distribute.through_ps_cut(
            lambda: (self._recount(epoch), self._step())[1],
            f"epoch {epoch + 1}'s end, recounting steps")
        if self.every_n_epochs and (epoch + 1) % self.every_n_epochs == 0:
            self._save(step, f"epoch {epoch + 1}'s checkpoint")

    def _recount(self, epoch: int) -> None:
        """Sets optimizer.iterations back to the steps `fit` ran when
        retried steps counted twice (`recount_steps`). At an epoch end
        every step has finished, so the step count is known exactly; the
        checkpoint's step (and with it the epoch and batch a resumed run
        starts at) stays that count."""
        steps = (self.params or {}).get("steps")
        if not steps or self._first_epoch is None:
            return
        offset = self.resumed_at[1] if self.resumed_at else 0
        expected = (self._start_step
                    + (epoch + 1 - self._first_epoch) * int(steps) - offset)
        self.recounted += recount_steps(self.model, expected)

    def _step(self) -> int:
        return int(self.model.optimizer.iterations.numpy())

    def _unsaved(self, step: int) -> bool:
        """Whether ckpt-<step> is still to be written (one that exists is
        taken as saved: checkpoints are immutable)."""
        if step == self.last_saved_step:
            return False
        if os.path.exists(os.path.join(self.directory, f"ckpt-{step}")):
            self._say(f"ckpt-{step} already exists in {self.directory}; "
                      "not saving it again")
            self.last_saved_step = step
            return False
        return True

    def _save(self, step: int, what: Optional[str] = None) -> None:
        if not self._unsaved(step):
            return
        if self.maintenance is not None:
            # Once, outside the wait below: an eviction that failed part way
            # is not run again (its show decay would apply twice on the
            # shards it reached); a lost ps ends the job as before.
            self.maintenance.run(self.model, step)

        def write():
            # Run again after a ps cut: the failed attempt may have
            # published the checkpoint before its change marks failed.
            if self._unsaved(step):
                self.last_saved_path = ckpt.save(
                    self.model, self.directory, step=step,
                    incremental=self.incremental, keep=self.keep,
                    full_every=self.full_every, progress=self._say,
                    state=self._state())
                self.last_saved_step = step
        tn_distribute.through_ps_cut(write, what or f"checkpoint ckpt-{step}")

    def _state(self) -> Optional[dict]:
        """Extra JSON state saved inside each checkpoint (subclasses)."""
        return None


class StreamCheckpoint(Checkpoint):
    """Checkpoints a `fit` over `tn.data.stream_dataset`: the tables and
    the stream's ledger of trained files in one atomic checkpoint, at file
    boundaries only, so a rerun after a kill trains every landed file
    exactly once.

        stream = tn.data.FileStream("/data/clicks", idle_seconds=600)
        data = tn.data.stream_dataset(spec, stream, "tfrecord", 1024)
        model.fit(data, callbacks=[
            tn.callbacks.StreamCheckpoint("/ckpt", stream, every_n_files=10)])

    On train begin it restores the newest checkpoint (tables, dense state,
    the ledger) before the stream lists anything. After each step it moves
    the files whose batches have all been trained into the ledger, and
    saves when `every_n_files` files were trained since the last save or
    `every_seconds` have passed, at the first step that ends a file (a
    stream has no epochs); and once more at train end (the stream stops at
    a file boundary: `stream.stop()`, its idle time, a damaged file under
    bad_files="fail"). A file interrupted by a kill is not in any ledger:
    the rerun trains it from its start against the tables saved before it.

    `steps_per_execution=1` (a step must end on each file boundary).
    Under ParameterServerStrategy train with `tn.data.fit_stream` (this
    saves at file ends). Other arguments as `Checkpoint`'s.

    Args:
      directory: where checkpoints go.
      stream: the `tn.data.FileStream` (or the `stream_dataset`) being
        trained; its ledger of trained files is saved with the tables.
      every_n_files: checkpoint after this many trained files.
      every_seconds: checkpoint at most this often.
      keep: checkpoints kept (None: all).
      incremental: write deltas on top of the newest full checkpoint.
      full_every: with `incremental`, a full checkpoint every N.
      verbose: 1 logs each save.
      maintenance: a `TableMaintenance` run before each save.

    Example:
        ```python
        data = tn.data.stream_dataset(spec, "/landing/*.tfrecord.gz", "tfrecord", 512)
        model.fit(data, callbacks=[tn.callbacks.StreamCheckpoint(
            "/ckpt", data.stream, every_n_files=10)])
        ```
    """

    def __init__(self, directory: str, stream, every_n_files: Optional[int] = None,
                 every_seconds: Optional[float] = None, keep: Optional[int] = 3,
                 incremental: bool = False,
                 full_every: int = ckpt.DEFAULT_FULL_EVERY, verbose: int = 1,
                 maintenance: Optional["TableMaintenance"] = None):
        super().__init__(directory, every_n_steps=None, every_n_epochs=None,
                         keep=keep, incremental=incremental,
                         full_every=full_every, restore=True, verbose=verbose,
                         maintenance=maintenance)
        from tnet.data.stream import FileStream  # noqa: PLC0415
        stream = getattr(stream, "stream", stream)  # a stream_dataset too
        if not isinstance(stream, FileStream):
            raise TypeError("StreamCheckpoint(stream=...) takes the "
                            "tn.data.FileStream (or the stream_dataset) it "
                            f"checkpoints, got {type(stream).__name__}")
        for name, value in (("every_n_files", every_n_files),
                            ("every_seconds", every_seconds)):
            if value is not None and (isinstance(value, bool) or value <= 0):
                raise ValueError(f"{name} must be > 0 or None, got {value!r}")
        self.stream = stream
        self.every_n_files = int(every_n_files) if every_n_files else None
        self.every_seconds = float(every_seconds) if every_seconds else None
        stream.attach()
        self._it0 = 0
        self._trained = 0
        self._files_since = 0
        self._last_time = 0.0
        self._boundary = 0  # batches trained at the newest file end

    def _implements_train_batch_hooks(self):
        return True

    def set_model(self, model):
        super().set_model(model)
        if _under_pss(model) and not getattr(model, "_tnet_fit_stream", False):
            raise ValueError("StreamCheckpoint under ParameterServerStrategy:"
                             " train with tn.data.fit_stream(model, data, "
                             "callbacks=...), not fit")

    def on_train_begin(self, logs=None):
        import time  # noqa: PLC0415
        from tnet.data.stream import Ledger  # noqa: PLC0415
        per_call = getattr(self.model, "_steps_per_execution", None)
        if per_call is not None and int(per_call.numpy()) != 1:
            raise ValueError("StreamCheckpoint needs steps_per_execution=1 "
                             "(checkpoints fall on file boundaries)")
        super().on_train_begin(logs)
        ledger = Ledger()
        if self.restored_path is not None:
            ledger = Ledger.from_json(ckpt.read_state(self.restored_path,
                                                      "stream"))
            self._say(f"stream ledger: {len(ledger)} files trained before "
                      f"{os.path.basename(self.restored_path)}")
        self._it0 = self._step()
        self._trained = 0
        self._files_since = 0
        self._boundary = 0
        self._last_time = time.monotonic()
        self.stream.start(ledger)

    def _consume(self) -> bool:
        """Moves trained files into the ledger; True at a file boundary."""
        feed = getattr(self.stream, "_feed", None)
        if feed is None:
            return self._trained == 0
        before = self.stream.entries_consumed
        end = feed.consume_through(self._trained)
        if end >= 0:
            self._boundary = end
        self._files_since += self.stream.entries_consumed - before
        return self._trained == self._boundary

    def _due(self) -> bool:
        import time  # noqa: PLC0415
        if not self._files_since:
            return False
        if self.every_n_files and self._files_since >= self.every_n_files:
            return True
        return bool(self.every_seconds and time.monotonic() - self._last_time
                    >= self.every_seconds)

    def _save_stream(self) -> None:
        import time  # noqa: PLC0415
        self._save(self._step(), "the stream's checkpoint")
        self._files_since = 0
        self._last_time = time.monotonic()

    def on_train_batch_end(self, batch, logs=None):  # one call per step
        self._on_stream_trained(self._trained + 1)

    def _on_stream_trained(self, steps: int) -> None:
        """`steps` batches trained since train begin, all finished (after
        each step in one process; at each file end from
        `tn.data.fit_stream`): moves the files trained into the ledger
        and saves when due."""
        self._trained = int(steps)
        if self._consume() and self._due():
            self._save_stream()

    def on_epoch_end(self, epoch, logs=None):
        pass  # a stream has no epochs

    def on_train_end(self, logs=None):
        self.finish()
        super().on_train_end(logs)

    def finish(self) -> None:
        """The end of a stream's `fit`: the files trained go into the
        ledger and a last checkpoint is written. `on_train_end` calls it;
        call it yourself when `fit` raised Keras' "Empty logs" error (a
        run that trained no batch, e.g. only damaged files landed)."""
        # The step that met the end of the data counted in
        # optimizer.iterations without training: count the steps trained.
        if self._step() > self._it0 + self._trained:
            self.model.optimizer.iterations.assign(self._it0 + self._trained)
        if self._consume() and (self._files_since
                                or self.last_saved_step is None):
            self._save_stream()

    def _state(self) -> Optional[dict]:
        return {"stream": self.stream.ledger_state()}


class TableMaintenance(tf_keras.callbacks.Callback):
    """Evicts cold and stale rows from every tnet table during `fit`, and
    reports each table's lifecycle metrics.

    Each run calls `SparseTable.evict` on every table (each shard's op runs
    on its own ps): show *= show_decay_rate, then rows with show <
    show_threshold or (ttl_steps > 0) not updated for more than ttl_steps
    steps (current step: `optimizer.iterations`) are freed and their memory
    reused. Admission (`min_count`) and the row cap (`max_rows`) live in the
    tables themselves and need no callback.

    Args:
      every_n_steps: run when `optimizer.iterations` crosses a multiple of
        this (batch hook). Under ParameterServerStrategy Keras refuses batch
        hooks, so there it runs at epoch ends instead (choose the interval
        with `steps_per_epoch`); `every_n_epochs` applies as well.
      every_n_epochs: also run at the end of every n-th epoch (None / 0:
        not at epoch ends, except as the PSS fallback above).
      show_decay_rate: each run multiplies every row's show count by this
        (TensorNet's name; 1.0: no decay).
      show_threshold: rows whose decayed show count falls below this are
        freed (0: none by count).
      ttl_steps: rows not updated for this many steps are freed (0: off).
      tables: names of the tables to maintain (None: all the model's).
      log_dir: if set, every run writes `table/<name>/<metric>` scalars
        there (tf.summary, step = optimizer.iterations).
      compact: compact arenas after eviction (gives whole chunks back).

    With neither schedule set it only reports the metrics at epoch ends.
    Metrics (`rows`, `admitted`, `rejected`, `evicted`, `bytes`, `pending`)
    go into the epoch logs as `table/<name>/<metric>` (so History and a
    later TensorBoard callback see them); `last_metrics` holds the newest
    and `last_evicted` the rows each table lost in the newest run. A table
    with a disk tier (`memory_budget_bytes`) adds `tier_lookups`,
    `tier_misses`, `tier_hit_rate` (since the previous measurement),
    `tier_resident`, `tier_on_disk`, `tier_disk_bytes` and
    `tier_writebacks`.

    Example:
        ```python
        model.fit(data, callbacks=[tn.callbacks.TableMaintenance(
            every_n_steps=1000, show_decay_rate=0.98, show_threshold=1.0,
            ttl_steps=100_000, log_dir="/run/logs/tables")])
        ```
    """

    METRICS = ("rows", "admitted", "rejected", "evicted", "bytes", "pending")
    TIER_METRICS = ("tier_lookups", "tier_misses", "tier_resident",
                    "tier_on_disk", "tier_disk_bytes", "tier_writebacks")

    def __init__(self, every_n_steps: Optional[int] = None,
                 every_n_epochs: Optional[int] = None,
                 show_decay_rate: float = 1.0, show_threshold: float = 0.0,
                 ttl_steps: int = 0, tables=None,
                 log_dir: Optional[str] = None, compact: bool = True):
        super().__init__()
        if every_n_steps is not None and (
                isinstance(every_n_steps, bool) or int(every_n_steps) < 1):
            raise ValueError(f"every_n_steps must be a positive int or None, "
                             f"got {every_n_steps!r}")
        if not 0.0 <= float(show_decay_rate) <= 1.0:
            raise ValueError(f"show_decay_rate must be in [0, 1], got "
                             f"{show_decay_rate!r}")
        if int(ttl_steps) < 0:
            raise ValueError(f"ttl_steps must be >= 0 (0: no TTL), got "
                             f"{ttl_steps!r}")
        self.every_n_steps = int(every_n_steps) if every_n_steps else None
        self.every_n_epochs = int(every_n_epochs) if every_n_epochs else None
        self.show_decay_rate = float(show_decay_rate)
        self.show_threshold = float(show_threshold)
        self.ttl_steps = int(ttl_steps)
        self.table_names = list(tables) if tables is not None else None
        self.log_dir = log_dir
        self.compact = compact
        self._tier_prev = {}
        self.runs = 0
        self.last_metrics: dict = {}
        self.last_evicted: dict = {}
        self._epoch_only = False
        self._last_step = 0
        self._last_run_step: Optional[int] = None
        self._writer = None

    def _implements_train_batch_hooks(self):
        return self.every_n_steps is not None and not self._epoch_only

    def set_model(self, model):
        super().set_model(model)
        # Keras calls _implements_train_batch_hooks after set_model.
        self._epoch_only = _under_pss(model)

    def on_train_begin(self, logs=None):
        self._last_step = _iterations(self.model)

    def on_train_batch_end(self, batch, logs=None):
        step = _iterations(self.model)
        if step // self.every_n_steps > self._last_step // self.every_n_steps:
            self.run(self.model, step)

    def on_epoch_end(self, epoch, logs=None):
        by_epoch = self.every_n_epochs and (epoch + 1) % self.every_n_epochs == 0
        fallback = self._epoch_only and self.every_n_steps is not None
        step = _iterations(self.model)
        if by_epoch or (fallback and step // self.every_n_steps >
                        self._last_step // self.every_n_steps):
            self.run(self.model, step)
        else:
            self._measure(self._tables(self.model), step)
        if logs is not None:
            logs.update(self.last_metrics)

    def _tables(self, model) -> dict:
        tables = model_tables(model, "TableMaintenance", modules=True)
        if self.table_names is None:
            return tables
        missing = sorted(set(self.table_names) - set(tables))
        if missing:
            raise ValueError(f"TableMaintenance(tables=...): the model has no "
                             f"tables {missing}; it has {sorted(tables)}")
        return {n: tables[n] for n in self.table_names}

    def run(self, model, step: Optional[int] = None) -> dict:
        """Evicts on every table now; returns {name: rows evicted}.

        A second run at the same step (e.g. the epoch-end run and a
        Checkpoint's pre-save run) is skipped, so shows decay once a step.

        Args:
          model: the model whose tables are maintained.
          step: the current step (default: the optimizer's iterations).
        """
        step = _iterations(model) if step is None else int(step)
        if step == self._last_run_step:
            return {name: 0 for name in self.last_evicted}
        self._last_run_step = step
        tables = self._tables(model)
        evicted = {}
        for name, table in tables.items():
            evicted[name] = int(table.evict(
                self.show_decay_rate, self.show_threshold,
                ttl_steps=self.ttl_steps, current_step=step,
                compact=self.compact))
        self.runs += 1
        self._last_step = step
        self.last_evicted = evicted
        self._measure(tables, step)
        return evicted

    def _measure(self, tables: dict, step: int) -> None:
        metrics = {}
        for name, table in tables.items():
            stats = table.stats()
            for key in self.METRICS:
                metrics[f"table/{name}/{key}"] = stats[key]
            if getattr(table, "memory_budget_bytes", None):
                for key in self.TIER_METRICS:
                    metrics[f"table/{name}/{key}"] = stats[key]
                prev = self._tier_prev.get(name, (0, 0))
                lookups = stats["tier_lookups"] - prev[0]
                misses = stats["tier_misses"] - prev[1]
                self._tier_prev[name] = (stats["tier_lookups"],
                                         stats["tier_misses"])
                metrics[f"table/{name}/tier_hit_rate"] = hit_rate(lookups,
                                                                  misses)
        self.last_metrics = metrics
        if self.log_dir:
            if self._writer is None:
                self._writer = tf.summary.create_file_writer(self.log_dir)
            with self._writer.as_default():
                for key, value in metrics.items():
                    tf.summary.scalar(key, value, step=step)
            self._writer.flush()


def _iterations(model) -> int:
    return int(model.optimizer.iterations.numpy())


def _under_pss(model) -> bool:
    strategy = getattr(model, "distribute_strategy", None)
    if strategy is None and tf.distribute.has_strategy():
        strategy = tf.distribute.get_strategy()
    return strategy is not None and tn_distribute.is_parameter_server_strategy(
        strategy)


class PublishDeltas(tf_keras.callbacks.Callback):
    """Publishes deltas of the model into an updatable export during `fit`.

    `tn.serving.publish_delta(model, export_dir)` (see `tnet.serving.publish`)
    runs when `optimizer.iterations` crosses a multiple of `every_n_steps`,
    or `every_seconds` after the previous publish (checked after each
    batch), and at train end. `export_dir` must hold an export written with
    `export_for_serving(model, export_dir, updatable=True)`.

    Put it after `tn.callbacks.Checkpoint` in the callback list: the
    publisher starts at `on_train_begin`, after the restore, so a trainer
    that restarted from a checkpoint older than its last publish
    re-publishes what the served model may hold beyond it.

    ParameterServerStrategy: Keras calls no batch hooks there, so it
    publishes at epoch ends (choose the interval with `steps_per_epoch`),
    after Keras has joined the workers.

    `compact_at`: see `tn.serving.publish_delta` (a new base version when
    the published rows reach that fraction of the base's; None: never).
    `rotate_update_key`: such a new base gets a new update key (see
    `tn.serving.publish_delta`).
    `published` lists the delta (or new base) directories it wrote.

    `stream`: the `tn.data.FileStream` of a `stream_dataset` being
    trained. Then it also publishes as soon as training has caught up
    with the landed files (the step that ends a file when no other file
    is waiting), so the served model does not wait for a timer while no
    file lands; `every_seconds` / `every_n_steps` bound the interval
    while training is behind.

    Example:
        ```python
        tn.serving.export_for_serving(model, "/models/ranker/1", updatable=True)
        model.fit(data, epochs=100, callbacks=[
            tn.callbacks.Checkpoint("/ckpt", every_n_steps=1000, incremental=True),
            tn.callbacks.PublishDeltas("/models/ranker/1", every_seconds=60)])
        ```

    Args:
      export_dir: the updatable export (`/models/ranker/1`) or its base path.
      every_n_steps: publish every N steps (None: not by steps).
      every_seconds: publish every S seconds (None: not by time).
      at_train_end: also publish when `fit` ends.
      compact_at: see above.
      rotate_update_key: see above.
      stream: see above.
    """

    def __init__(self, export_dir: str, every_n_steps: Optional[int] = None,
                 every_seconds: Optional[float] = None,
                 at_train_end: bool = True,
                 compact_at: Optional[float] = 0.1,
                 rotate_update_key: bool = False, stream=None):
        super().__init__()
        self.stream = getattr(stream, "stream", stream)
        self._batches = 0
        if every_n_steps is not None and (
                isinstance(every_n_steps, bool) or int(every_n_steps) < 1):
            raise ValueError(f"every_n_steps must be a positive int or None, "
                             f"got {every_n_steps!r}")
        if every_seconds is not None and float(every_seconds) <= 0:
            raise ValueError(f"every_seconds must be > 0 or None, got "
                             f"{every_seconds!r}")
        self.export_dir = os.path.abspath(os.fspath(export_dir))
        self.every_n_steps = int(every_n_steps) if every_n_steps else None
        self.every_seconds = (float(every_seconds) if every_seconds
                              else None)
        self.at_train_end = at_train_end
        self.compact_at = compact_at
        self.rotate_update_key = bool(rotate_update_key)
        self.published = []
        self._publisher = None
        self._last_time = 0.0
        self._last_step = 0

    def _implements_train_batch_hooks(self):
        return (self.every_n_steps is not None
                or self.every_seconds is not None
                or self.stream is not None) and not _under_pss(self.model)

    def on_train_begin(self, logs=None):
        import time  # noqa: PLC0415
        from tnet.serving import deltas, publish  # noqa: PLC0415
        self._publisher = publish.publisher(
            self.model, deltas.newest_export(self.export_dir))
        self._last_time = time.monotonic()
        self._last_step = _iterations(self.model)
        self._batches = 0

    def _publish(self):
        import time  # noqa: PLC0415
        step = _iterations(self.model)
        if step == self._last_step and self.published:
            return
        from tnet.serving import publish  # noqa: PLC0415
        # A publish that failed part way writes nothing and keeps the freed
        # keys it read for the next one, so a ps cut is waited out.
        self.published.append(tn_distribute.through_ps_cut(
            lambda: publish.publish_delta(
                self.model, self.export_dir, compact_at=self.compact_at,
                rotate_update_key=self.rotate_update_key),
            f"publishing a delta at step {step}"))
        self._last_time = time.monotonic()
        self._last_step = step

    def _due(self) -> bool:
        import time  # noqa: PLC0415
        step = _iterations(self.model)
        if self.every_n_steps and (step // self.every_n_steps
                                   > self._last_step // self.every_n_steps):
            return True
        return bool(self.every_seconds and time.monotonic() - self._last_time
                    >= self.every_seconds)

    def on_train_batch_end(self, batch, logs=None):
        self._on_stream_trained(self._batches + 1)

    def _on_stream_trained(self, steps: int) -> None:
        """`steps` batches trained since train begin, all finished (as
        StreamCheckpoint's): publishes when due or caught up."""
        self._batches = int(steps)
        if self._due() or self._caught_up():
            self._publish()

    def _caught_up(self) -> bool:
        feed = getattr(self.stream, "_feed", None)
        return (feed is not None and feed.caught_up(self._batches)
                and _iterations(self.model) != self._last_step)

    def on_epoch_end(self, epoch, logs=None):
        if _under_pss(self.model) and (self._due() or self.every_n_steps is
                                       None and self.every_seconds is None):
            self._publish()

    def on_train_end(self, logs=None):
        if self.at_train_end and _iterations(self.model) != self._last_step:
            self._publish()
