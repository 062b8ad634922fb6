"""A stream under ParameterServerStrategy: `fit_stream`.

The chief reads a `stream_dataset` as one process does (its reader
thread, its ledger) and hands each batch to a worker as the argument of
a scheduled train step; at each file end it joins the workers, and there
the files move into the ledger and the stream's callbacks save and
publish. Kept apart from tnet/data/stream.py, which tnet.callbacks
imports: this one drives those callbacks.
"""
from __future__ import annotations

import tensorflow as tf

from tnet.data.stream import FileStream, _Feed

__all__ = ["fit_stream"]


def fit_stream(model, data, callbacks=None, verbose: int = 0):
    """Trains `model` on a `stream_dataset` until the stream stops, under
    ParameterServerStrategy too.

    In one process this is `model.fit(data, epochs=1, callbacks=...,
    verbose=...)`. Under ParameterServerStrategy (`model` built and
    compiled in its scope, this process the chief) the chief reads the
    stream as in one process (its files are listed, decoded whole and
    recorded by this process) and hands each batch to a worker as the
    argument of a scheduled train step (`ClusterCoordinator.schedule`):
    no worker reads a file. At the end of each file the chief waits for
    every step scheduled so far (`coordinator.join()`), so every file
    boundary is a point where all of a file's batches are trained and no
    batch of the next one is: there the files are moved into the ledger,
    and `StreamCheckpoint` checkpoints and `PublishDeltas` publishes when
    they are due. A step that a lost worker did not finish is run again
    on another worker (ClusterCoordinator); a lost ps ends the loop with
    the error (`python -m tnet.train` exits 138; a rerun resumes from the
    newest checkpoint and trains every file after it once).

    Callbacks: `StreamCheckpoint`, `PublishDeltas` and the metrics
    callback (`tn.monitoring.TrainerMetrics.callback`) work as in one
    process. Any other callback gets `on_train_begin`, one
    `on_train_batch_end` per file boundary (its `batch`: the steps trained
    in this call minus one; no logs) and `on_train_end`; no epoch hooks (a
    stream has no epochs).

    Args:
      model: a compiled `tn.Model`.
      data: a `tn.data.stream_dataset`.
      callbacks: Keras callbacks (see above).
      verbose: fit's verbosity in one process (a cluster's loop prints no
        progress: `FileStream.on_consume` sees each file trained).

    Returns:
      The History of `fit` in one process; under a cluster, the number of
      steps trained.

    Example:
        ```python
        data = tn.data.stream_dataset(spec, stream, "tfrecord", 512)
        tn.data.fit_stream(model, data, callbacks=[
            tn.callbacks.StreamCheckpoint("/ckpt", stream, every_n_files=10)])
        ```
    """
    from tnet import distribute as tn_distribute  # noqa: PLC0415
    parts = getattr(data, "_tnet_stream_parts", None)
    if parts is None:
        raise TypeError("fit_stream(data=...) takes a tn.data.stream_dataset, "
                        f"got {type(data).__name__}")
    strategy = model.distribute_strategy
    if not tn_distribute.is_parameter_server_strategy(strategy):
        return model.fit(data, epochs=1, callbacks=callbacks, verbose=verbose)
    return _ClusterStreamLoop(model, data.stream, parts,
                              list(callbacks or [])).run()


class _DropJoinLines:
    """A logging filter: drops ClusterCoordinator's line at each join."""

    def filter(self, record) -> bool:
        return not str(record.msg).startswith(
            "Waiting for all global closures to be finished")


class _ClusterStreamLoop:
    """fit_stream under ParameterServerStrategy: the chief schedules one
    train step per batch and joins at file ends."""

    def __init__(self, model, stream: FileStream, parts, callbacks):
        self.model, self.stream = model, stream
        self.reader, self.queue_batches, self.structure, self.flat_specs = parts
        self.callbacks = callbacks
        self.strategy = model.distribute_strategy
        self.it0 = 0

    def _step_function(self):
        model, structure = self.model, self.structure

        def step(*flat):
            data = tf.nest.pack_sequence_as(structure, list(flat),
                                            expand_composites=True)
            return model.distribute_strategy.run(model.train_step,
                                                 args=(data,))
        return tf.function(step, input_signature=self.flat_specs)

    def _trained(self, steps: int) -> None:
        """Every step scheduled has finished: `steps` since train begin."""
        from tnet import callbacks as tn_callbacks  # noqa: PLC0415
        from tnet import distribute as tn_distribute  # noqa: PLC0415
        # A step run again (its worker lost) may have counted twice in
        # optimizer.iterations: the count stays the batches trained.
        tn_distribute.through_ps_cut(
            lambda: tn_callbacks.recount_steps(self.model, self.it0 + steps),
            "recounting the steps at a file boundary")
        for callback in self.callbacks:
            hook = getattr(callback, "_on_stream_trained", None)
            if hook is not None:
                hook(steps)
            else:
                callback.on_train_batch_end(max(steps - 1, 0))

    def run(self) -> int:
        coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(
            self.strategy)
        model = self.model
        model._tnet_fit_stream = True  # noqa: SLF001  (StreamCheckpoint asks)
        # The coordinator logs a line at each join: one per file here.
        quiet = _DropJoinLines()
        tf.get_logger().addFilter(quiet)
        try:
            return self._loop(coordinator)
        finally:
            model._tnet_fit_stream = False  # noqa: SLF001
            tf.get_logger().removeFilter(quiet)

    def _loop(self, coordinator) -> int:
        model = self.model
        # The restore and the first step's trace (the optimizer's slots)
        # run in the strategy's scope, so the variables they build go to
        # the ps. The saves and publishes at file ends run outside it, as
        # in one process: a publish that compacts exports a new base,
        # which cannot be done inside a strategy's scope.
        with self.strategy.scope():
            for callback in self.callbacks:
                callback.set_model(model)
            for callback in self.callbacks:
                callback.on_train_begin()
        self.it0 = int(model.optimizer.iterations.numpy())
        feed = _Feed(self.stream, self.reader, self.queue_batches)
        self.stream._feed = feed  # noqa: SLF001
        scheduled = reported = 0
        step = self._step_function()
        batches = feed.generate()
        try:
            for batch in batches:
                args = tuple(tf.constant(a) for a in batch)
                with self.strategy.scope():
                    coordinator.schedule(step, args=args)
                scheduled += 1
                if scheduled == feed.last_end:  # a file's last batch
                    coordinator.join()
                    self._trained(scheduled)
                    reported = scheduled
        finally:
            batches.close()  # on an error too: the reader thread ends
        coordinator.join()
        if scheduled != reported:
            self._trained(scheduled)
        for callback in self.callbacks:
            callback.on_train_end()
        return scheduled
