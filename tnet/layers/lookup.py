"""The fused per-table lookup and the sparse-gradient recorder.

For each table a layer does one `unique -> pull -> temporary matrix E[U, dim]
-> combine` for all of its columns: E is sized by the batch's unique keys (no
fixed bucket), only unique rows travel to and from the ps, and one push per
table carries the summed gradients back.

Training and evaluation use tnet's kernels for the worker-side steps:
`TnetUnique` (parallel dedup that also counts each key's shows and marks
padding), `TnetEmbedCombine` (reads E through the ids' indices and writes
every column's sum / mean / sqrtn into its slot of the output; its gradient
is dE [U, dim] already summed per key) and a push told that its keys are
unique. A serving export runs the same math in stock ops.

`tn.Model.train_step` opens a `tnet.scopes.recording(tape)` scope; while it
is open each lookup made in training mode asks the tape to watch its E and
registers a `Lookup`, so one `tape.gradient` gives dense and sparse
gradients together, and `train_step` sees (and may clip) dE before
`Lookup.push` sends it. Under `tnet.scopes.serving_lookups` (the export)
a lookup calls stock TF instead of the table op.
"""
from __future__ import annotations

import dataclasses
import weakref
from typing import Any, Callable, List, Optional

import tensorflow as tf
from tensorflow.python.saved_model import save_context

from tnet import _ops
from tnet.optimizer.sparse import resolve_learning_rate
from tnet.scopes import active_recorder, serving_active, serving_override
from tnet.table import RowBatch, SparseTable

@dataclasses.dataclass
class Lookup:
    """One table's lookup in one step: what a push needs."""

    table: SparseTable
    batch: RowBatch        # the pull: [U] unique keys, their route and rows
    embeddings: tf.Tensor  # [U, dim] pulled rows (watched by the tape)
    shows: tf.Tensor       # [U] occurrences of each key in the batch
    learning_rate: Optional[Callable[[Any], Any]] = None  # layer override (of step)
    batch_size: Any = None  # the step's examples (int64 scalar) or None

    @property
    def keys(self) -> tf.Tensor:
        return self.batch.keys

    def push(self, grad, learning_rate, step):
        """Sends dE (IndexedSlices from the gathers, or dense [U, dim]) over
        the pull's own route; `learning_rate` is the model optimizer's
        current rate (a layer's own rule overrides it)."""
        if isinstance(grad, tf.IndexedSlices):
            grad = sum_rows(grad.values, grad.indices, tf.shape(self.keys)[0])
        lr = resolve_learning_rate(step, layer=self.learning_rate,
                                   model=learning_rate)
        return self.table.push_rows(self.batch, grad, learning_rate=lr,
                                    step=step, shows=self.shows,
                                    unique_keys=True,
                                    batch_size=self.batch_size)


def sum_rows(values, indices, num_rows):
    """out[n] = sum of values[i] with indices[i] == n (fast CPU kernel; the
    stock unsorted_segment_sum is ~100x slower for narrow rows)."""
    return _ops.tnet_sum_rows(values, tf.cast(indices, tf.int32),
                              tf.cast(num_rows, tf.int64))


# A table's rows get their gradient from tn.Model.train_step (the tape
# watches the pulled rows and pushes dE); nothing flows into the pull's
# inputs (keys, the handle) or the integer key ops. Declared so that a
# gradient of a whole traced call (a model revived by load_model) does
# not stop at them: such a model's training trace then refuses to train
# with a clear message (_refuse_training_in_savedmodel).
for _op in ("SparseTablePull", "SparseTablePullV2", "TnetUnique",
            "TnetShardOrder", "TnetRowIds", "TnetCompactIds",
            "TnetFlattenKeys"):
    tf.no_gradient(_op)


@tf.RegisterGradient("TnetSumRows")
def _sum_rows_grad(op, grad):
    return tf.gather(grad, op.inputs[1]), None, None


class _TracedCache:
    """One graph's traced_once entries. Kept in a collection of the graph
    (so it dies with the graph); a nested FuncGraph starts with a copy of
    its outer graph's collections, hence the `graph` check."""

    def __init__(self, graph):
        self.graph = weakref.ref(graph)
        self.entries = {}


@tf.autograph.experimental.do_not_convert
def traced_once(key, build):
    """build() once per traced graph for equal `key`s: layers that read the
    same features (the wide and the deep part of a Wide&Deep) share the
    keys and the dedup instead of computing them twice. `key` holds the
    input tensors themselves (they keep their ids valid for as long as the
    graph caches them). Eager calls are not cached."""
    graph = tf.compat.v1.get_default_graph()
    if tf.executing_eagerly() or not hasattr(graph, "capture"):
        return build()
    holders = graph.get_collection_ref("_tnet_traced_once")
    cache = next((h.entries for h in holders if h.graph() is graph), None)
    if cache is None:
        holders.append(_TracedCache(graph))
        cache = holders[-1].entries
    ident = tuple(k if isinstance(k, (str, int, bool, type(None))) else id(k)
                  for k in key) + (serving_active(),)
    hit = cache.get(ident)
    if hit is None:
        hit = cache[ident] = (key, build())
    return hit[1]


def unique_keys(keys, valid=None):
    """(unique keys in first-occurrence order, idx [N] int32, counts [U]).

    valid: [N] bool or None; padding (False) gets idx -1 and is not counted.
    tnet's parallel kernel, or stock ops in a serving export.
    """
    if not serving_active():
        if valid is None:
            valid = tf.zeros([0], tf.bool)
        return _ops.tnet_unique(keys, valid)
    if valid is None:
        uniq, idx = tf.unique(keys, out_idx=tf.int32)
    else:
        uniq, packed = tf.unique(tf.boolean_mask(keys, valid),
                                 out_idx=tf.int32)
        pos = tf.maximum(tf.cumsum(tf.cast(valid, tf.int32)) - 1, 0)
        packed = tf.concat([packed, [0]], 0)  # in range with no valid key
        idx = tf.where(valid, tf.gather(packed, pos), -1)
    n = tf.shape(uniq)[0]
    counts = tf.math.bincount(tf.boolean_mask(idx, idx >= 0), minlength=n,
                              maxlength=n, dtype=tf.float32)
    return uniq, idx, counts


def fused_lookup(table: SparseTable, keys_per_column: List[tf.Tensor],
                 training, learning_rate=None, valid_per_column=None,
                 split: bool = True):
    """One unique + pull for all pieces' keys.

    valid_per_column: None, or per piece None / a bool mask like its keys
    (False: padding, never pulled; its idx is -1).
    Returns (E [U, dim], [idx per piece]): piece i's rows are
    `tf.gather(E, idx[i])` (or `embed_combine`); with split=False, the
    pieces' idx as one vector, in the order of their keys. Every use of E
    is a gather or a combine, so its gradient is IndexedSlices or a dense
    dE.
    """
    sizes = [tf.shape(k)[0] for k in keys_per_column]
    all_keys = (keys_per_column[0] if len(keys_per_column) == 1
                else tf.concat(keys_per_column, 0))
    valid = None
    if valid_per_column and any(v is not None for v in valid_per_column):
        masks = [tf.ones(tf.shape(k), tf.bool) if v is None else v
                 for k, v in zip(keys_per_column, valid_per_column)]
        valid = masks[0] if len(masks) == 1 else tf.concat(masks, 0)
    uniq, idx, shows = traced_once(
        ("unique", *keys_per_column, *(valid_per_column or ())),
        lambda: unique_keys(all_keys, valid))
    if training is None:
        training = False
    serving = serving_override(table)
    batch = None
    if serving is not None:
        # Export for serving: a stock-TF lookup replaces the table op.
        rows = serving(uniq)
    else:
        # A sharded table gets the keys grouped by shard (the tables of one
        # dedup with as many shards share it): its pull and push then take
        # each shard's slice, with no partition, gather or stitch.
        route, idx, shows = traced_once(
            ("shard_order", table.num_shards, uniq),
            lambda u=uniq, i=idx, c=shows: table.shard_order(u, i, c))
        # In a training step the pull inserts new rows with the
        # accumulator start for the step's batch (the examples, not the
        # ids: the recorder has it from the step's data).
        recorder = active_recorder()
        batch_size = (recorder.batch_size
                      if recorder is not None and training is not False
                      else None)
        batch = table.pull_rows(route, training=training,
                                batch_size=batch_size)
        rows = batch.rows
    recorder = active_recorder()
    if recorder is None and batch is not None and training is not False \
            and save_context.in_save_context():
        rows = _refuse_training_in_savedmodel(rows, training)
    # Only tn.Model.train_step opens a recorder (with training=True); a
    # tensor-valued `training` there is recorded too.
    if recorder is not None and training is not False and batch is not None:
        if recorder.tape is not None:  # None: a check that nothing records
            recorder.tape.watch(rows)
        recorder.lookups.append(Lookup(table, batch, rows, shows,
                                       learning_rate, recorder.batch_size))
    if not split:
        return rows, idx
    if len(keys_per_column) == 1:
        return rows, [idx]
    return rows, tf.split(idx, tf.stack(sizes), axis=0, num=len(sizes))


def _refuse_training_in_savedmodel(rows, training):
    """The training trace Keras' model.save() writes into a SavedModel: a
    model revived by tf_keras.models.load_model would run it under its own
    train_step, which pushes nothing to the tables (they would silently
    stay as saved while the dense layers train). It fails instead."""
    refuse = tf.constant(True) if training is True else tf.cast(training,
                                                                tf.bool)
    check = tf.debugging.Assert(tf.logical_not(refuse), [
        "tnet: this model was loaded from a model.save() SavedModel, whose "
        "tables cannot train (Keras' own train_step pushes nothing to "
        "them). To train on, build the model in code and restore it with "
        "model.load_weights(...) or tn.saving.restore(model, dir); "
        "predict and evaluate work on the loaded model."])
    with tf.control_dependencies([check]):
        return tf.identity(rows)


COMBINERS = {"sum": 0, "mean": 1, "sqrtn": 2}


def embed_combine(rows, idx, widths, combiners):
    """[B, C * dim]: per example, each column's combiner over the rows its
    ids read. idx [B, W] (-1: padding) holds the C columns side by side,
    column c `widths[c]` wide; combiners are names ("sum", "mean",
    "sqrtn"). tnet's kernel (its gradient is dE [U, dim] summed per row),
    or stock ops in a serving export."""
    codes = [COMBINERS[c] for c in combiners]
    widths = tf.cast(widths, tf.int32)
    if not serving_active():
        return _ops.tnet_embed_combine(rows, idx, widths,
                                       tf.constant(codes, tf.int32))
    mask = idx >= 0
    padded = tf.concat([rows, tf.zeros([1, tf.shape(rows)[1]], rows.dtype)],
                       0)
    emb = tf.gather(padded, tf.where(mask, idx, tf.shape(rows)[0]))
    pieces = tf.split(emb, widths, axis=1, num=len(codes))
    masks = tf.split(mask, widths, axis=1, num=len(codes))
    out = []
    for piece, piece_mask, combiner in zip(pieces, masks, combiners):
        total = tf.reduce_sum(piece, axis=1)
        if combiner != "sum":
            counts = tf.reduce_sum(tf.cast(piece_mask, rows.dtype), axis=1,
                                   keepdims=True)
            if combiner == "sqrtn":
                counts = tf.sqrt(counts)
            total = tf.math.divide_no_nan(total, counts)
        out.append(total)
    return out[0] if len(out) == 1 else tf.concat(out, 1)


@tf.RegisterGradient("TnetEmbedCombine")
def _embed_combine_grad(op, grad):
    rows, idx, widths, combiners = op.inputs
    num_rows = tf.shape(rows, out_type=tf.int64)[0]
    return (_ops.tnet_embed_combine_grad(grad, idx, widths, combiners,
                                         num_rows), None, None, None)


def segment_combine(rows, idx, segments, num_segments, combiners):
    """[num_segments, dim]: segment s is combiners[s % C] ("sum", "mean",
    "sqrtn") of rows[idx[k]] over the entries with segments[k] == s (any
    order); idx -1 (padding) reads as nothing and is not counted. tnet's
    kernel (gradient: dE [U, dim] summed per row), or stock ops in a
    serving export."""
    codes = tf.constant([COMBINERS[c] for c in combiners], tf.int32)
    num_segments = tf.cast(num_segments, tf.int64)
    idx = tf.cast(idx, tf.int32)
    segments = tf.cast(segments, tf.int64)
    if not serving_active():
        return _ops.tnet_segment_combine(rows, idx, segments, num_segments,
                                         codes)
    keep = idx >= 0  # -1: padding, read as nothing
    idx, segments = tf.boolean_mask(idx, keep), tf.boolean_mask(segments, keep)
    total = tf.math.unsorted_segment_sum(tf.gather(rows, idx), segments,
                                         num_segments)
    if all(c == "sum" for c in combiners):
        return total
    counts = tf.math.unsorted_segment_sum(tf.ones_like(segments, rows.dtype),
                                          segments, num_segments)
    kind = tf.gather(codes, tf.math.floormod(
        tf.range(num_segments), len(combiners)))
    divisor = tf.where(kind == COMBINERS["mean"], counts,
                       tf.where(kind == COMBINERS["sqrtn"], tf.sqrt(counts),
                                tf.ones_like(counts)))
    return tf.math.divide_no_nan(total, divisor[:, tf.newaxis])


@tf.RegisterGradient("TnetSegmentCombine")
def _segment_combine_grad(op, grad):
    rows, idx, segments, num_segments, combiners = op.inputs
    num_rows = tf.shape(rows, out_type=tf.int64)[0]
    return (_ops.tnet_segment_combine_grad(grad, idx, segments, num_segments,
                                           combiners, num_rows),
            None, None, None, None)
