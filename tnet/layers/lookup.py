"""The fused per-table lookup and the sparse-gradient recorder.

For each table a layer does one `unique -> pull -> temporary matrix E[U, dim]
-> gather` for all of its columns: E is sized by the batch's unique keys (no
fixed bucket), only unique rows travel to and from the ps, and one push per
table carries the summed gradients back.

`tn.Model.train_step` opens a `tnet.scopes.recording(tape)` scope; while it
is open each lookup made in training mode asks the tape to watch its E and
registers a `Lookup`, so one `tape.gradient` gives dense and sparse
gradients together, and `train_step` sees (and may clip) dE before
`Lookup.push` sends it. Under `tnet.scopes.serving_lookups` (the export)
a lookup calls stock TF instead of the table op.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, List, Optional

import tensorflow as tf

from tnet import _ops
from tnet.optimizer.sparse import resolve_learning_rate
from tnet.scopes import active_recorder, serving_active, serving_override
from tnet.table import SparseTable

@dataclasses.dataclass
class Lookup:
    """One table's lookup in one step: what a push needs."""

    table: SparseTable
    keys: tf.Tensor        # [U] unique keys
    embeddings: tf.Tensor  # [U, dim] pulled rows (watched by the tape)
    shows: tf.Tensor       # [U] occurrences of each key in the batch
    learning_rate: Optional[Callable[[], Any]] = None  # layer override

    def push(self, grad, learning_rate, step):
        """Sends dE (IndexedSlices from the gathers, or dense [U, dim]);
        `learning_rate` is the model optimizer's current rate."""
        if isinstance(grad, tf.IndexedSlices):
            grad = sum_rows(grad.values, grad.indices, tf.shape(self.keys)[0])
        lr = resolve_learning_rate(step, layer=self.learning_rate,
                                   model=learning_rate)
        return self.table.push(self.keys, grad, learning_rate=lr,
                               step=step, shows=self.shows)


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
