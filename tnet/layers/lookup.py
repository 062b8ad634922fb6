"""The fused per-table lookup and the sparse-gradient recorder.

For each table a layer does one `unique -> pull -> temporary matrix E[U, dim]
-> gather` for all of its columns: E is sized by the batch's unique keys (no
fixed bucket), only unique rows travel to and from the ps, and one push per
table carries the summed gradients back.

`tn.Model.train_step` opens a `recording(tape)` scope; while it is open each
lookup made in training mode asks the tape to watch its E and registers a
`Lookup`, so one `tape.gradient` gives dense and sparse gradients together,
and `train_step` sees (and may clip) dE before `Lookup.push` sends it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Any, Callable, Iterator, List, Optional

import tensorflow as tf

from tnet import _ops
from tnet.table import SparseTable

_STATE = threading.local()


@dataclasses.dataclass
class Lookup:
    """One table's lookup in one step: what a push needs."""

    table: SparseTable
    keys: tf.Tensor        # [U] unique keys
    embeddings: tf.Tensor  # [U, dim] pulled rows (watched by the tape)
    shows: tf.Tensor       # [U] occurrences of each key in the batch
    learning_rate: Optional[Callable[[], Any]] = None  # layer override

    def push(self, grad, learning_rate, step):
        """Sends dE (IndexedSlices from the gathers, or dense [U, dim])."""
        if isinstance(grad, tf.IndexedSlices):
            grad = sum_rows(grad.values, grad.indices, tf.shape(self.keys)[0])
        if self.learning_rate is not None:
            learning_rate = self.learning_rate()
        return self.table.push(self.keys, grad, learning_rate=learning_rate,
                               step=step, shows=self.shows)


class Recorder:
    def __init__(self, tape: tf.GradientTape):
        self.tape = tape
        self.lookups: List[Lookup] = []


@contextlib.contextmanager
def recording(tape: tf.GradientTape) -> Iterator[Recorder]:
    """Records the training lookups made inside the scope."""
    stack = getattr(_STATE, "stack", None)
    if stack is None:
        stack = _STATE.stack = []
    recorder = Recorder(tape)
    stack.append(recorder)
    try:
        yield recorder
    finally:
        stack.pop()


@contextlib.contextmanager
def serving_lookups(overrides: dict) -> Iterator[None]:
    """While open, lookups of the given tables (SparseTable -> callable
    keys [U] -> rows [U, dim]) use the callables instead of the table ops.
    tn.saving.export_for_serving traces the model inside this scope."""
    previous = getattr(_STATE, "serving", None)
    _STATE.serving = {id(t): fn for t, fn in overrides.items()}
    try:
        yield
    finally:
        _STATE.serving = previous


def serving_active() -> bool:
    """True while export_for_serving traces the model: layers then build
    the serving graph from stock ops only."""
    return bool(getattr(_STATE, "serving", None))


def serving_override(table: SparseTable):
    overrides = getattr(_STATE, "serving", None)
    return overrides.get(id(table)) if overrides else None


def active_recorder() -> Optional[Recorder]:
    stack = getattr(_STATE, "stack", None)
    return stack[-1] if stack else None


def sum_rows(values, indices, num_rows):
    """out[n] = sum of values[i] with indices[i] == n (fast CPU kernel; the
    stock unsorted_segment_sum is ~100x slower for narrow rows)."""
    return _ops.tnet_sum_rows(values, tf.cast(indices, tf.int32),
                              tf.cast(num_rows, tf.int64))


@tf.RegisterGradient("TnetSumRows")
def _sum_rows_grad(op, grad):
    return tf.gather(grad, op.inputs[1]), None, None


def fused_lookup(table: SparseTable, keys_per_column: List[tf.Tensor],
                 training, learning_rate=None):
    """One unique + pull for all pieces' keys.

    Returns (E [U, dim], [idx per piece]): piece i's rows are
    `tf.gather(E, idx[i])`. Callers gather themselves so that every use of
    E is a gather and its gradient stays IndexedSlices.
    """
    sizes = [tf.shape(k)[0] for k in keys_per_column]
    all_keys = (keys_per_column[0] if len(keys_per_column) == 1
                else tf.concat(keys_per_column, 0))
    uniq, idx = tf.unique(all_keys, out_idx=tf.int32)
    if training is None:
        training = False
    serving = serving_override(table)
    if serving is not None:
        # Export for serving: a stock-TF lookup replaces the table op.
        rows = serving(uniq)
    else:
        rows = table.pull(uniq, training=training)
    recorder = active_recorder()
    # Only tn.Model.train_step opens a recorder (with training=True); a
    # tensor-valued `training` there is recorded too.
    if recorder is not None and training is not False:
        recorder.tape.watch(rows)
        n = tf.shape(uniq)[0]
        shows = tf.math.bincount(idx, minlength=n, maxlength=n,
                                 dtype=tf.float32)
        recorder.lookups.append(Lookup(table, uniq, rows, shows,
                                       learning_rate))
    if len(keys_per_column) == 1:
        return rows, [idx]
    return rows, tf.split(idx, tf.stack(sizes), axis=0, num=len(sizes))


def combine(rows: tf.Tensor, example: tf.Tensor, batch_size, combiner: str):
    """Reduces per-id rows [K, dim] to per-example vectors [B, dim]."""
    batch_size = tf.cast(batch_size, tf.int64)
    if serving_active():
        # A serving graph holds stock ops only (tnet's kernel is not there).
        total = tf.math.unsorted_segment_sum(rows, example, batch_size)
    else:
        total = sum_rows(rows, example, batch_size)
    if combiner == "sum":
        return total
    counts = tf.math.bincount(tf.cast(example, tf.int32),
                              minlength=tf.cast(batch_size, tf.int32),
                              maxlength=tf.cast(batch_size, tf.int32),
                              dtype=rows.dtype)
    if combiner == "mean":
        return tf.math.divide_no_nan(total, counts[:, tf.newaxis])
    return tf.math.divide_no_nan(total, tf.sqrt(counts)[:, tf.newaxis])
