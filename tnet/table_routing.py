"""How a table's keys and rows travel to and from its shards: `RowRoute`
(which keys go to which shard, `SparseTable.route` / `shard_order`), the
rows split the same way (`_partition_rows`) and put back in the keys'
order (`_stitch_rows`), and `RowBatch` (a pull's rows and the route a
push reuses), the examples behind a pull or push (`_batch_size`), and how
one op runs on one shard outside a graph (`_shard_op`)."""
from __future__ import annotations

import functools
from typing import NamedTuple, Optional

import tensorflow as tf


class RowRoute(NamedTuple):
    """How flat keys split over a table's shards (`SparseTable.route`, or
    `SparseTable.shard_order` for keys it grouped by shard: then `sizes`
    holds each shard's count, every shard's keys are one slice and shard /
    where are None). parts is None for a one-shard table."""
    keys: tf.Tensor                       # [N] int64
    shard: Optional[tf.Tensor] = None     # [N] int32: the shard of each key
    parts: Optional[list] = None          # per shard: its keys
    where: Optional[list] = None          # per shard: their positions in keys
    sizes: Optional[tf.Tensor] = None     # [shards] int64, keys grouped


def _partition_rows(t, route):
    """t's rows split as the route split its keys: exactly
    `tf.dynamic_partition(t, route.shard)`, but one gather per shard of
    the positions the route keeps (`where`). DynamicPartition copies a 2-D
    tensor row by row through an Eigen slice (~60 ns a row whatever its
    width: 8 ms for the 128k gradient rows of a SPARSE-HEAVY push against
    ~1 ms gathered; BENCHMARKS "The route's partition and stitch"). Keys
    grouped by shard need no copy: t is cut into slices.
    `_rows_check` makes the ops that consume the parts check t's rows."""
    if route.sizes is not None:
        return tf.split(t, route.sizes, num=len(route.parts))
    return [tf.gather(t, w) for w in route.where]


def _rows_check(route, *tensors):
    """Ops that fail unless each of `tensors` has one row per route key (a
    mismatch known now is a ValueError now). Callers make the per-shard ops
    wait on them, not the gathers: under ParameterServerStrategy, gathers
    that waited on a check were placed on a ps, which then received the
    whole shows vector (405 KB a SPARSE-HEAVY step)."""
    what = ("SparseTable: one row per key is needed (gradients, shows, "
            "clicks, weights, slots and meta have as many rows as there are "
            "keys)")
    keys = route.keys.shape[0]
    for t in tensors:
        rows = t.shape[0]
        if rows is not None and keys is not None and rows != keys:
            raise ValueError(f"{what}; got {rows} rows for {keys} keys")
    n = tf.shape(route.keys, out_type=tf.int64)[0]
    return [tf.debugging.assert_equal(tf.shape(t, out_type=tf.int64)[0], n,
                                      message=what) for t in tensors]


def _stitch_rows(route, parts, dim):
    """The rows pulled per shard back in the keys' order (the inverse of
    `_partition_rows`): for keys grouped by shard, the parts one after the
    other. Otherwise dynamic_stitch, which copies row by row on one thread:
    as fast as a gather for narrow rows, 1.7x slower at dim 16, so wider
    rows are concatenated and gathered through the inverse permutation."""
    if route.sizes is not None:
        return tf.concat(parts, 0)
    where = route.where
    if dim <= 8:
        return tf.dynamic_stitch(where, parts)
    order = tf.math.invert_permutation(tf.concat(where, 0))
    return tf.gather(tf.concat(parts, 0), order)


class RowBatch(NamedTuple):
    """Rows a pull moved and the route they took (`SparseTable.pull_rows`);
    `SparseTable.push_rows(batch, grads, ...)` reuses the route."""
    route: RowRoute
    rows: tf.Tensor                       # [N, dim]

    @property
    def keys(self) -> tf.Tensor:
        return self.route.keys


def _batch_size(batch_size) -> tf.Tensor:
    """A pull's or push's `batch_size` as the op's int64 scalar (0: None,
    unknown: the rows it inserts start as the rule gives)."""
    if batch_size is None:
        return tf.constant(0, tf.int64)
    return tf.cast(batch_size, tf.int64)


@functools.lru_cache(maxsize=None)
def _traced_op(op, attrs: tuple, specs: tuple):
    """`op(handle, *args, **attrs)` as a tf.function of (handle, *args)."""
    kwargs = dict(attrs)

    @tf.function(input_signature=[tf.TensorSpec([], tf.resource), *specs],
                 autograph=False)
    def call(handle, *args):
        out = op(handle, *args, **kwargs)
        # An op without outputs (import) runs as part of the call.
        return None if isinstance(out, tf.Operation) else out
    return call


def _shard_op(op, handle, *args, **attrs):
    """Runs a table op on one shard; eagerly, through a traced function.

    Why: under ParameterServerStrategy a bare eager op on a ps-placed shard
    whose inputs come from the chief (a cursor, a flag, a step) leaves
    about 1-10 KB on that ps per call that is never given back (measured:
    `mark_changes` 2-4 KB, a chunked export ~10 KB; an op whose only input
    is the handle, like `size`, leaves nothing). Called as a function (one
    trace per op, attrs and input ranks; the op is placed with its
    resource) it leaves nothing, so periodic work (checkpoints, eviction,
    stats) keeps every ps flat (BENCHMARKS.md, Reliability: checkpoint
    memory). Inside a tf.function the op is just added to the graph.
    """
    if tf.inside_function():
        return op(handle, *args, **attrs)
    args = [tf.convert_to_tensor(a) for a in args]
    specs = tuple(tf.TensorSpec([None] * a.shape.rank, a.dtype) for a in args)
    return _traced_op(op, tuple(sorted(attrs.items())), specs)(handle, *args)
