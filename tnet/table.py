"""SparseTable: one logical embedding table sharded over parameter servers.

A table maps unbounded int64 keys to rows of `dim` float weights. Its rows
also hold the sparse optimizer's slots and show/click counts, so the update
runs where the row lives (`push`), and only the rows a batch touches travel.

Keys go to shard `key mod num_shards` (floor modulo, so negative keys such as
string fingerprints are fine). Each shard is a TF resource created under
`tf.device(device)`: in one process all shards are local; under
ParameterServerStrategy shard i lives on "/job:ps/task:i".

The table saves and restores inside ordinary TF checkpoints and SavedModels
through the export/import ops (see `_TableShard`).

Feature lifecycle (all of it runs inside each shard, on its ps):
* admission: with `min_count > 1` a key gets a row only after its pushes
  have counted `min_count` shows; until then it reads zeros and its
  gradient is dropped. Counts wait in an exact, bounded per-shard map
  (`admission_capacity` keys; when full, the lower-count half is dropped and
  those keys count again from zero: admission comes late, never early).
* cap: with `max_rows` a table never holds more rows than that after any
  operation; the lowest-show rows go first (down to 90% of each stripe's
  share) and their memory is reused.
* eviction: `evict()` decays shows and frees cold (show < threshold) or
  stale (TTL in steps) rows; `tn.callbacks.TableMaintenance` runs it.
* `stats()`: rows, admitted, rejected, evicted, bytes (and more) per table.
"""
from __future__ import annotations

import itertools
import os
import tempfile
from typing import Any, Optional, Sequence

import numpy as np
import tensorflow as tf

from tnet.optimizer.sparse import resolve_learning_rate
from tnet import _ops
from tnet.optimizer import keras as keras_opt
from tnet.table_options import (DEFAULT_STDDEV, _check_lifecycle,  # noqa: F401
                                _check_tier, _global_seed,
                                _initializer_attrs, _stripes_for)
from tnet.table_routing import (RowBatch, RowRoute, _batch_size,
                                _partition_rows, _rows_check, _shard_op,
                                _stitch_rows)

_INT64_MAX = 2**63 - 1

# Tests only: bytes of rows per shard in memory for every table created
# without memory_budget_bytes (a disk tier in the temp directory), so the
# table and optimizer tests run against the tier too
# (tests/test_tier.py reruns them with it in a subprocess).
TEST_TIER_ENV = "TNET_TEST_TIER_BYTES"

# Columns of the sparse_table_stats op, in order.
STATS_FIELDS = ("rows", "admitted", "rejected", "evicted", "bytes", "pending",
                "pending_dropped", "cap_evicted", "tier_lookups",
                "tier_misses", "tier_resident", "tier_on_disk",
                "tier_disk_bytes", "tier_writebacks")


def hit_rate(lookups: int, misses: int, idle: float = 1.0) -> float:
    """The share of a tier's lookups served from memory; `idle` if none."""
    return 1.0 - misses / lookups if lookups > 0 else idle


class _TableShard(tf.saved_model.experimental.TrackableResource):
    """One shard: a SparseTableHandle resource plus checkpoint hooks."""

    def __init__(self, shared_name: str, dim: int, attrs: dict):
        self._shared_name = shared_name
        self._dim = dim
        self._attrs = attrs
        # Create the resource now, under the caller's tf.device scope: a
        # `device=` on the resource itself would be written into SavedModels.
        super().__init__()
        _ = self.resource_handle

    def _create_resource(self):
        return _ops.sparse_table_handle(shared_name=self._shared_name,
                                        dim=self._dim, **self._attrs)

    def _destroy_resource(self):
        if self._resource_handle is not None and tf.executing_eagerly():
            tf.raw_ops.DestroyResourceOp(resource=self._resource_handle,
                                         ignore_lookup_error=True)

    # Checkpointing (tf.train.Checkpoint, Keras' TF-format save_weights,
    # BackupAndRestore): the whole shard as tensors, its rows (keys,
    # weights, slots, meta) and its admission state (the keys still
    # counting towards min_count, their counts and ages, and the lifecycle
    # counters), so a restore is the shard as it was.
    def _serialize_to_tensors(self):
        keys, weights, slots, meta, _ = _ops.sparse_table_export(
            self.resource_handle, cursor=tf.constant(0, tf.int64),
            max_rows=tf.constant(_INT64_MAX, tf.int64), dim=self._dim)
        p_keys, p_counts, p_ages, counters = \
            _ops.sparse_table_export_pending(self.resource_handle)
        return {"keys": keys, "weights": weights, "slots": slots, "meta": meta,
                "pending_keys": p_keys, "pending_counts": p_counts,
                "pending_ages": p_ages, "counters": counters}

    def _restore_from_tensors(self, restored_tensors):
        t = restored_tensors
        with tf.control_dependencies([_clear(self.resource_handle)]):
            rows = _ops.sparse_table_import(
                self.resource_handle, t["keys"], t["weights"], t["slots"],
                t["meta"], dim=self._dim)
        with tf.control_dependencies([rows]):
            return _ops.sparse_table_import_pending(
                self.resource_handle, t["pending_keys"], t["pending_counts"],
                t["pending_ages"], t["counters"], replace=True)


def _clear(handle):
    """Frees every row: decay show to 0, then evict show < 1."""
    return _ops.sparse_table_evict(handle, show_decay_rate=0.0,
                                   show_threshold=1.0, ttl_steps=0,
                                   current_step=0)


class SparseTable(tf.Module):
    """An embedding table with unbounded int64 keys, sharded by key.

    Args:
      name: table name (used in checkpoints and resource names).
      dim: row width.
      optimizer: the sparse rule (`tn.optimizer.Adagrad(...)`, a name such
        as "adagrad", or None for SGD). Fixed at creation: slots live in rows.
      initializer: None (zeros for dim 1, else normal with stddev 0.01;
        chosen by measurement, see BENCHMARKS.md "Defaults"), a name, a
        dict, or a Keras initializer. Values are seeded by key, so a key
        starts the same whatever order or shard it arrives in.
      num_shards: number of shards (one per parameter server task).
      devices: optional device per shard, e.g. ["/job:ps/task:0", ...].
      seed: initializer seed. None (default): the global seed of
        `tf_keras.utils.set_random_seed` / `tf.random.set_seed` when one
        is set at the table's creation, else 0. A given seed (or an
        initializer's own `seed`) wins over the global one. A row's initial
        value depends only on (seed, key), so a fixed seed is bit-exact
        reproducible.
      num_stripes: lock stripes per shard (power of two). Lowered
        automatically for small `max_rows` so each stripe's share of the cap
        stays >= 256 rows (a stripe's cap is its own: fewer, larger stripes
        waste less of the cap on uneven key spread).
      min_count: shows (occurrences pushed) a key needs before it gets a
        row; 1 admits every key at once. See the module docstring.
      admission_capacity: pending keys each shard counts while they wait
        for admission (only with min_count > 1). About 40 bytes per key.
      max_rows: most rows the table may hold (split over shards exactly);
        None: unbounded.
      memory_budget_bytes: with a disk tier, the bytes of rows (weights,
        slots and meta) the table keeps in memory, split over shards; the
        other rows live in a file in `storage_dir` on each shard's host.
        None: every row in memory. See docs/guides/lifecycle.md "Tables larger than memory".
      storage_dir: a writable local directory for the tier (required with
        memory_budget_bytes; on a cluster, a path on every ps host).

    Example:
        ```python
        table = tn.SparseTable("items", dim=16, optimizer=tn.optimizer.Adagrad(0.05))
        rows = table.pull([42, 7], training=True)            # [2, 16]; new ids get rows
        table.push([42, 7], grads=tf.ones([2, 16]), step=1)  # Adagrad in the table
        ```
    """

    def __init__(self, name: str, dim: int, optimizer: Any = None,
                 initializer: Any = None, num_shards: int = 1,
                 devices: Sequence[str] | None = None,
                 seed: int | None = None, num_stripes: int = 64, min_count: float = 1,
                 admission_capacity: int = 1 << 20,
                 max_rows: int | None = None,
                 memory_budget_bytes: int | None = None,
                 storage_dir: str | None = None):
        super().__init__(name=name)
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"SparseTable {name!r}: dim must be a positive "
                             f"int, got {dim!r}")
        if (isinstance(num_shards, bool) or not isinstance(num_shards, int)
                or num_shards < 1):
            raise ValueError(f"SparseTable {name!r}: num_shards must be a "
                             f"positive int, got {num_shards!r}")
        if devices is not None and len(devices) != num_shards:
            raise ValueError(
                f"SparseTable {name!r}: got {len(devices)} devices for "
                f"{num_shards} shards; pass one device per shard")
        _check_lifecycle(name, min_count, admission_capacity, max_rows,
                         num_shards)
        if memory_budget_bytes is None and os.environ.get(TEST_TIER_ENV):
            # Test hook (TEST_TIER_ENV): every table gets a disk tier.
            memory_budget_bytes = int(os.environ[TEST_TIER_ENV]) * num_shards
            storage_dir = tempfile.gettempdir()
        _check_tier(name, memory_budget_bytes, storage_dir, num_shards)
        self.memory_budget_bytes = memory_budget_bytes or None
        self.storage_dir = storage_dir if memory_budget_bytes else None
        self.table_name = name
        self.dim = dim
        self.num_shards = num_shards
        self.min_count = float(min_count)
        self.admission_capacity = int(admission_capacity)
        self.max_rows = int(max_rows) if max_rows else None
        self.optimizer = keras_opt.sparse_rule_of(optimizer)
        self.num_slots = self.optimizer.num_slots(dim)
        attrs = dict(self.optimizer.table_attrs())
        if seed is None:
            seed = _global_seed()
        self.seed = int(seed)
        attrs.update(_initializer_attrs(initializer, dim, self.seed))
        attrs["min_count"] = self.min_count
        attrs["admission_capacity"] = self.admission_capacity
        self.devices = list(devices) if devices else [None] * num_shards
        self.shards = []
        for i, device in enumerate(self.devices):
            shard_attrs = dict(attrs)
            cap = self.shard_max_rows(i)
            shard_attrs["max_rows"] = cap
            shard_attrs["num_stripes"] = _stripes_for(num_stripes, cap)
            if self.memory_budget_bytes:
                shard_attrs["memory_budget_bytes"] = (
                    self.memory_budget_bytes // num_shards)
                shard_attrs["storage_dir"] = self.storage_dir
            shared = f"tnet/{name}/shard{i}/{next(_UIDS)}"
            with tf.device(device):
                self.shards.append(_TableShard(shared, dim, shard_attrs))

    def shard_max_rows(self, shard: int) -> int:
        """Shard `shard`'s share of max_rows (0: unbounded); shares sum to
        max_rows.

        Args:
          shard: the shard index, 0 <= shard < num_shards.
        """
        if not self.max_rows:
            return 0
        n = self.num_shards
        return self.max_rows // n + (1 if shard < self.max_rows % n else 0)

    # ------------------------------------------------------------------ I/O
    def _route(self, keys):
        """Flat keys -> (shard index per key) for num_shards > 1."""
        return tf.cast(tf.math.floormod(keys, self.num_shards), tf.int32)

    def route(self, keys) -> "RowRoute":
        """How the flat `keys` split over the shards: the one partition a
        pull and the push of the same keys share (`pull_rows`).

        Args:
          keys: int64 keys, any shape (flattened).
        """
        keys = tf.reshape(self._keys(keys), [-1])
        if self.num_shards == 1:
            return RowRoute(keys)
        shard = self._route(keys)
        parts = tf.dynamic_partition(keys, shard, self.num_shards)
        where = tf.dynamic_partition(tf.range(tf.size(keys)), shard,
                                     self.num_shards)
        return RowRoute(keys, shard, parts, where)

    def shard_order(self, keys, idx, counts):
        """A dedup's result (unique keys [U], each id's index into them,
        each key's count) with the keys grouped by shard, as
        (RowRoute, idx, counts): every shard's keys, rows, gradients and
        counts are then one slice each (no partition, gather or stitch by
        position). For a one-shard table, the inputs as they are.

        Args:
          keys: `[U]` unique int64 keys.
          idx: `[N]` int, each id's index into `keys`.
          counts: `[U]` each key's count.
        """
        keys = tf.reshape(self._keys(keys), [-1])
        if self.num_shards == 1:
            return RowRoute(keys), idx, counts
        keys, idx, counts, sizes = _ops.tnet_shard_order(
            keys, idx, counts, num_shards=self.num_shards)
        parts = tf.split(keys, sizes, num=self.num_shards)
        return RowRoute(keys, parts=parts, sizes=sizes), idx, counts

    def pull_rows(self, keys, training: bool | tf.Tensor = False,
                  batch_size=None) -> "RowBatch":
        """The rows of flat `keys` (unique, for a push to reuse) as a
        RowBatch: rows [N, dim] plus the route they took, so `push_rows`
        sends the gradients back over the same partition without routing
        the keys again. One request per shard each way. keys: a tensor,
        or the RowRoute of `shard_order`.

        Args:
          keys: `[N]` unique int64 keys, or the RowRoute of `shard_order`.
          training: True inserts missing keys; False reads zeros for them.
          batch_size: as for `pull`.
        """
        route = keys if isinstance(keys, RowRoute) else self.route(keys)
        training = tf.convert_to_tensor(training, tf.bool)
        batch_size = _batch_size(batch_size)
        if route.parts is None:
            with tf.device(self.devices[0]):
                rows = _ops.sparse_table_pull_v2(
                    self.shards[0].resource_handle, route.keys, training,
                    batch_size, dim=self.dim)
            return RowBatch(route, rows)
        outs = []
        for i in range(self.num_shards):
            with tf.device(self.devices[i]):
                outs.append(_ops.sparse_table_pull_v2(
                    self.shards[i].resource_handle, route.parts[i], training,
                    batch_size, dim=self.dim))
        return RowBatch(route, _stitch_rows(route, outs, self.dim))

    def pull(self, keys, training: bool | tf.Tensor = False,
             batch_size=None) -> tf.Tensor:
        """Rows of `keys` (any shape) as a [*keys.shape, dim] float tensor.

        training=True inserts missing keys (initialized by key); otherwise
        missing keys read zeros and nothing is inserted.

        Args:
          keys: int64 keys (or ids of the table's key dtype), any shape.
          training: insert missing keys (True) or read zeros (False).
          batch_size: the examples the keys come from (not the keys), or
            None: a row this call inserts starts its accumulator at the
            rule's start x (start_reference_batch / batch_size)^2 (None:
            the start as given). `tn.Model` passes its batch's examples.

        Example:
            ```python
            table = tn.SparseTable("items", dim=4, optimizer=tn.optimizer.Adagrad(0.05))
            rows = table.pull([[1, 2], [3, 4]], training=True)   # [2, 2, 4]
            ```
        """
        keys = self._keys(keys)
        rows = self.pull_rows(keys, training, batch_size).rows
        return tf.reshape(rows, tf.concat([tf.shape(keys), [self.dim]], 0))

    def push(self, keys, grads, learning_rate=None, step=0, shows=None,
             clicks=None, unique_keys=False, batch_size=None):
        """Applies the table's optimizer to the rows of `keys` (1-D).

        grads: [N, dim]. Duplicate keys are summed before the update;
        unique_keys=True promises there are none and skips that pass (a
        repeated key would then be updated once per occurrence).
        learning_rate: defaults to the optimizer's (a schedule is called with
        `step`). shows / clicks: optional per-key counts for the lifecycle.

        Args:
          keys: `[N]` int64 keys.
          grads: `[N, dim]` float32 gradients of the rows.
          learning_rate: a float (default: the optimizer's, or its schedule at
            `step`).
          step: the training step (last_step of the rows; schedules).
          shows: `[N]` show counts, or None.
          clicks: `[N]` click counts, or None.
          unique_keys: True promises `keys` has no duplicates.
          batch_size: the examples behind the gradients, as for `pull`
            (rows this push inserts start scaled for it).

        Example:
            ```python
            table.push([1, 2], grads=tf.ones([2, 4]), step=1)
            ```
        """
        return self.push_rows(self.route(keys), grads,
                              learning_rate=learning_rate, step=step,
                              shows=shows, clicks=clicks,
                              unique_keys=unique_keys, batch_size=batch_size)

    def push_rows(self, route, grads, learning_rate=None, step=0, shows=None,
                  clicks=None, unique_keys=False, batch_size=None):
        """`push` over a route already made (a RowRoute, or the RowBatch of
        the pull whose rows the gradients are for): the gradients, shows
        and clicks are split by the pull's partition, the keys not at all.
        learning_rate: resolved here once (the optimizer's, or its schedule
        at `step`, when None).

        Args:
          route: a RowRoute, or the RowBatch `pull_rows` returned.
          grads: `[N, dim]` float32, in the route's key order.
          learning_rate: as for `push`.
          step: as for `push`.
          shows: as for `push`.
          clicks: as for `push`.
          unique_keys: as for `push`.
          batch_size: as for `push`.
        """
        if isinstance(route, RowBatch):
            route = route.route
        grads = tf.convert_to_tensor(grads, tf.float32)
        lr = tf.cast(resolve_learning_rate(step, model=learning_rate,
                                           rule=self.optimizer), tf.float32)
        step = tf.cast(step, tf.int64)
        empty = tf.zeros([0], tf.float32)
        shows = empty if shows is None else tf.cast(shows, tf.float32)
        clicks = empty if clicks is None else tf.cast(clicks, tf.float32)
        batch_size = _batch_size(batch_size)
        if route.parts is None:
            with tf.device(self.devices[0]):
                return _ops.sparse_table_push_v2(
                    self.shards[0].resource_handle, route.keys, grads, lr,
                    step, shows, clicks, batch_size, dim=self.dim,
                    unique_keys=unique_keys)
        n = self.num_shards
        g_parts = _partition_rows(grads, route)
        s_parts = (_partition_rows(shows, route)
                   if shows is not empty else [empty] * n)
        c_parts = (_partition_rows(clicks, route)
                   if clicks is not empty else [empty] * n)
        checks = _rows_check(route, grads, *[t for t in (shows, clicks)
                                             if t is not empty])
        ops = []
        for i in range(n):
            with tf.device(self.devices[i]), tf.control_dependencies(checks):
                ops.append(_ops.sparse_table_push_v2(
                    self.shards[i].resource_handle, route.parts[i],
                    g_parts[i], lr, step, s_parts[i], c_parts[i], batch_size,
                    dim=self.dim, unique_keys=unique_keys))
        return tf.group(ops)

    def _keys(self, keys):
        keys = tf.convert_to_tensor(keys)
        if keys.dtype == tf.int32:
            keys = tf.cast(keys, tf.int64)
        if keys.dtype != tf.int64:
            raise TypeError(
                f"SparseTable {self.table_name!r}: keys must be int64 (or "
                f"int32), got {keys.dtype.name}; string ids must be "
                "fingerprinted first (tn.feature_column does this)")
        return keys

    # ----------------------------------------------------------- inspection
    def size(self) -> tf.Tensor:
        """Live rows over all shards (int64 scalar)."""
        return tf.add_n([_ops.sparse_table_size(s.resource_handle)
                         for s in self.shards])

    def memory_bytes(self) -> tf.Tensor:
        """Bytes held by all shards (rows, indexes, bookkeeping)."""
        return tf.add_n([_ops.sparse_table_memory_bytes(s.resource_handle)
                         for s in self.shards])

    def shard_stats(self) -> list[dict]:
        """Per shard: {field: int} for STATS_FIELDS (eager). Each op runs on
        its shard's device (the ps under ParameterServerStrategy)."""
        out = []
        for s in self.shards:
            v = _shard_op(_ops.sparse_table_stats, s.resource_handle).numpy()
            out.append({f: int(x) for f, x in zip(STATS_FIELDS, v)})
        return out

    def stats(self) -> dict:
        """Lifecycle counters summed over shards (eager): rows, admitted,
        rejected (pushed keys dropped before admission), evicted (by evict()
        and by the cap), bytes, pending (keys counting towards admission),
        pending_dropped, cap_evicted, the disk tier's tier_* counters and
        tier_hit_rate (1 - tier_misses / tier_lookups, 1.0 before any). All
        run since the table was created; a checkpoint restore clears the
        table by eviction, so it adds the cleared rows to `evicted`."""
        total = {f: 0 for f in STATS_FIELDS}
        for shard in self.shard_stats():
            for f, v in shard.items():
                total[f] += v
        total["tier_hit_rate"] = hit_rate(total["tier_lookups"],
                                          total["tier_misses"])
        return total

    def shard_sizes(self) -> list[tf.Tensor]:
        """The number of rows of each shard, one int64 scalar tensor per shard."""
        return [_ops.sparse_table_size(s.resource_handle) for s in self.shards]

    def export_shard(self, shard: int, cursor=0, max_rows=1 << 20,
                     since_step=None, weights_only: bool = False):
        """(keys, weights, slots, meta, next_cursor) from one shard's cursor.

        meta columns are (show, click, last_step); next_cursor is -1 at the
        end. Loop until it is -1 to stream a shard in bounded chunks.
        since_step: if given (>= 0), only rows whose last_step > since_step
        (rows skipped do not count against max_rows, so a call may scan the
        whole shard and return few rows); None or -1: every row.
        weights_only: slots and meta come back with no columns, so a reader
        that drops them (the serving export, deltas) does not move them off
        the ps (for Adagrad rows of dim 16: 2x fewer bytes; Adam: 3x).

        Args:
          shard: the shard index.
          cursor: where to start (0 first; then the returned next_cursor).
          max_rows: at most this many rows per call.
          since_step: see above.
          weights_only: see above.

        Example:
            ```python
            cursor = 0
            while cursor != -1:
                keys, weights, slots, meta, cursor = table.export_shard(0, cursor, 4096)
                cursor = int(cursor)
            ```
        """
        handle = self.shards[shard].resource_handle
        cursor = tf.cast(cursor, tf.int64)
        max_rows = tf.cast(max_rows, tf.int64)
        if since_step is None:
            return _shard_op(_ops.sparse_table_export, handle, cursor,
                             max_rows, dim=self.dim,
                             weights_only=bool(weights_only))
        return _shard_op(_ops.sparse_table_export_since, handle, cursor,
                         max_rows, tf.cast(since_step, tf.int64), dim=self.dim,
                         weights_only=bool(weights_only))

    def mark_changes(self, enable: bool = True) -> list[tuple[int, int]]:
        """Starts (or with enable=False stops) change tracking on every
        shard (eager): afterwards `export_shard(..., since_step=mark)`
        returns every row changed since, and `changes()` lists the keys
        freed since and counts the changes such an export would miss.
        Returns [(generation, mark)] per shard (mark -1: not tracking).
        Incremental checkpoints call this after each save and restore;
        see tnet/saving/checkpoint.py.

        Args:
          enable: start (True) or stop (False) tracking.
        """
        out = []
        for s in self.shards:
            v = _shard_op(_ops.sparse_table_mark_changes, s.resource_handle,
                          tf.constant(bool(enable))).numpy()
            out.append((int(v[0]), int(v[1])))
        return out

    def changes(self) -> list[dict]:
        """Per shard (eager): {generation, mark, untracked, dropped,
        deleted} since the last `mark_changes`. untracked counts row
        changes an export since the mark misses (pushes with a step not
        above it, show decay, imports of old rows); dropped counts freed
        keys the bounded log could not hold; deleted is the int64 numpy
        array of keys freed since (may repeat a key). A delta since the
        mark is exact iff untracked == dropped == 0."""
        out = []
        for s in self.shards:
            info, deleted = _shard_op(_ops.sparse_table_changes,
                                      s.resource_handle)
            v = info.numpy()
            out.append({"generation": int(v[0]), "mark": int(v[1]),
                        "untracked": int(v[2]), "dropped": int(v[3]),
                        "deleted": deleted.numpy()})
        return out

    @property
    def change_log(self):
        """The readers of this table's change marks and deletion log (the
        checkpoints', each delta publisher's), by name; the one way to
        re-mark it (tnet/change_log.py)."""
        log = self.__dict__.get("_tnet_change_log")
        if log is None:
            from tnet.change_log import ChangeLog  # noqa: PLC0415
            log = ChangeLog(self)
            object.__setattr__(self, "_tnet_change_log", log)
        return log

    def export_chunks(self, shard: Optional[int] = None,
                      chunk_rows: int = 1 << 20, since_step=None,
                      weights_only: bool = False):
        """Yields (keys, weights, slots, meta) chunk by chunk (eager), from
        shard `shard` or every shard in order, through the export cursor:
        the one loop every reader of a whole table uses (checkpoints, the
        serving export, deltas). `since_step` and `weights_only` are
        `export_shard`'s; a chunk may be empty.

        Args:
          shard: one shard, or None for all.
          chunk_rows: rows per chunk at most.
          since_step: as for `export_shard`.
          weights_only: as for `export_shard`.

        Example:
            ```python
            rows = sum(len(keys) for keys, _, _, _ in table.export_chunks())
            ```
        """
        for i in range(self.num_shards) if shard is None else [shard]:
            cursor = 0
            while cursor != -1:
                k, w, s, m, cursor = self.export_shard(
                    i, cursor, chunk_rows, since_step=since_step,
                    weights_only=weights_only)
                cursor = int(cursor)
                yield k, w, s, m

    def export(self, max_rows_per_call: int = 1 << 20):
        """Eagerly exports every live row: (keys, weights, slots, meta)."""
        parts = list(self.export_chunks(chunk_rows=max_rows_per_call))
        if not parts:
            parts = [(tf.zeros([0], tf.int64), tf.zeros([0, self.dim]),
                      tf.zeros([0, self.num_slots]),
                      tf.zeros([0, 3], tf.float64))]
        return tuple(tf.concat(list(col), 0) for col in zip(*parts))

    def import_rows(self, keys, weights, slots, meta):
        """Inserts or overwrites rows, routing each key to its shard.

        Args:
          keys: `[N]` int64 keys.
          weights: `[N, dim]` float32.
          slots: `[N, num_slots * dim]` (or the row-wise width) float32, as
            `export` returns them.
          meta: `[N, 3]` float64 (show, click, last_step).

        Example:
            ```python
            keys, weights, slots, meta = old_table.export()
            new_table.import_rows(keys, weights, slots, meta)
            ```
        """
        keys = self._keys(keys)
        weights = tf.convert_to_tensor(weights, tf.float32)
        slots = tf.convert_to_tensor(slots, tf.float32)
        meta = tf.convert_to_tensor(meta, tf.float64)
        if self.num_shards == 1:
            return _shard_op(_ops.sparse_table_import,
                             self.shards[0].resource_handle, keys, weights,
                             slots, meta, dim=self.dim)
        route = self.route(keys)
        n = self.num_shards
        parts = [route.parts] + [_partition_rows(t, route)
                                 for t in (weights, slots, meta)]
        ops = []
        with tf.control_dependencies(_rows_check(route, weights, slots,
                                                 meta)):
            for i in range(n):
                ops.append(_shard_op(
                    _ops.sparse_table_import, self.shards[i].resource_handle,
                    parts[0][i], parts[1][i], parts[2][i], parts[3][i],
                    dim=self.dim))
        return tf.group(ops)

    def import_shard(self, shard: int, keys, weights, slots, meta):
        """Inserts or overwrites rows of shard `shard` only (eager). Every key must route there (key mod num_shards ==
        shard), as the rows of one exported shard do: a restore of a
        checkpoint with the same shard count skips import_rows' per-key
        partition this way. A key that routes elsewhere raises
        InvalidArgument.

        Args:
          shard: the shard index.
          keys: `[N]` int64 keys, all of that shard.
          weights: as for `import_rows`.
          slots: as for `import_rows`.
          meta: as for `import_rows`.
        """
        keys = self._keys(keys)
        if self.num_shards > 1:
            bad = tf.reduce_any(tf.not_equal(
                tf.math.floormod(keys, self.num_shards), shard))
            if bool(bad):
                raise tf.errors.InvalidArgumentError(
                    None, None, f"SparseTable {self.table_name!r}: "
                    f"import_shard({shard}) got keys of other shards "
                    "(key mod num_shards != shard); use import_rows")
        return _shard_op(_ops.sparse_table_import,
                         self.shards[shard].resource_handle, keys,
                         tf.convert_to_tensor(weights, tf.float32),
                         tf.convert_to_tensor(slots, tf.float32),
                         tf.convert_to_tensor(meta, tf.float64), dim=self.dim)

    def export_pending(self) -> dict:
        """The admission state of every shard (eager), for checkpoints:
        {"keys", "counts", "ages"} (numpy; every key still waiting for
        admission, its show count and its age in its stripe's ticks) and
        "counters" [num_shards, 5] (admitted, rejected, evicted,
        pending_dropped, cap_evicted per shard)."""
        keys, counts, ages, counters = [], [], [], []
        for s in self.shards:
            k, c, a, ctr = _shard_op(_ops.sparse_table_export_pending,
                                     s.resource_handle)
            keys.append(k.numpy())
            counts.append(c.numpy())
            ages.append(a.numpy())
            counters.append(ctr.numpy())
        return {"keys": np.concatenate(keys), "counts": np.concatenate(counts),
                "ages": np.concatenate(ages), "counters": np.stack(counters)}

    def import_pending(self, keys, counts, ages, counters=None) -> None:
        """Replaces every shard's admission state with `export_pending`'s
        (eager): each key goes to the shard that owns it (any shard count);
        keys that have a row are skipped. counters: [n, 5] per saved shard;
        with the same number of shards each shard gets its own, otherwise
        shard 0 gets their sums (stats() sums shards either way).

        Args:
          keys: int64 keys waiting for admission.
          counts: their show counts.
          ages: their ages in ticks.
          counters: `[n, 5]` per-shard lifecycle counters, or None.
        """
        keys = np.asarray(keys, np.int64).reshape(-1)
        counts = np.asarray(counts, np.float32).reshape(-1)
        ages = np.asarray(ages, np.int64).reshape(-1)
        if not len(keys) == len(counts) == len(ages):
            raise ValueError(
                f"SparseTable {self.table_name!r}: import_pending needs keys, "
                f"counts and ages of one length, got {len(keys)}, "
                f"{len(counts)} and {len(ages)}")
        n = self.num_shards
        per_shard = [np.zeros([0], np.int64)] * n
        if counters is not None:
            counters = np.asarray(counters, np.int64).reshape(-1, 5)
            if len(counters) == n:
                per_shard = list(counters)
            else:
                per_shard = [counters.sum(axis=0)] + [np.zeros(5, np.int64)] * (n - 1)
        where = np.mod(keys, n) if n > 1 else np.zeros(len(keys), np.int64)
        for i, s in enumerate(self.shards):
            mine = where == i
            _shard_op(_ops.sparse_table_import_pending, s.resource_handle,
                      tf.constant(keys[mine]), tf.constant(counts[mine]),
                      tf.constant(ages[mine]),
                      tf.constant(per_shard[i], tf.int64), replace=True)

    def evict(self, show_decay_rate: float = 1.0, show_threshold: float = 0.0,
              ttl_steps: int = 0, current_step: int = 0,
              compact: bool = True) -> tf.Tensor:
        """Decays show counts and frees cold or stale rows on every shard.

        show *= show_decay_rate, then rows with show < show_threshold, or
        (ttl_steps > 0) with current_step - last_step > ttl_steps, are freed
        and their memory reused. compact=True also moves the surviving rows
        into the holes so the arena releases whole chunks; it must not run
        while an export cursor is in flight (compact=False may). Returns the
        number of rows evicted.

        Args:
          show_decay_rate: multiplies every row's show count first.
          show_threshold: rows below it are freed.
          ttl_steps: rows not updated for more steps are freed (0: no TTL).
          current_step: the step TTL counts from.
          compact: move rows into the holes (see above).

        Example:
            ```python
            freed = table.evict(show_decay_rate=0.98, show_threshold=1.0,
                                ttl_steps=10_000, current_step=20_000)
            ```
        """
        counts = []
        for s in self.shards:
            counts.append(_shard_op(
                _ops.sparse_table_evict, s.resource_handle,
                tf.cast(show_decay_rate, tf.float32),
                tf.cast(show_threshold, tf.float32),
                tf.cast(ttl_steps, tf.int64),
                tf.cast(current_step, tf.int64), compact=compact))
        return tf.add_n(counts)


# Process-unique resource names (as tf.lookup tables do in eager mode).
_UIDS = itertools.count()


def model_tables(model, needed_by: str, modules: bool = False,
                 nonempty: bool = False) -> dict:
    """{name: SparseTable} of `model`: the one way tnet finds a model's
    tables. A `tn.Model` lists them (`tables()`); with `modules`, any Keras
    model or tf.Module is searched for them. `needed_by` names the caller
    in the error: a model that is not a tn.Model (TypeError) or, with
    `nonempty`, one without tables (ValueError)."""
    if hasattr(model, "tables"):
        tables = model.tables()
    elif modules:
        tables = {m.table_name: m for m in model._flatten_modules(  # noqa: SLF001
            include_self=True) if isinstance(m, SparseTable)}
    else:
        raise TypeError(f"{needed_by} needs a tn.Model (with tables()), "
                        f"got {type(model).__name__}")
    if nonempty and not tables:
        raise ValueError(
            f"{needed_by}: {type(model).__name__} has no tnet tables; build "
            "the model (call or fit it once) first, or save a model without "
            "tnet layers with tf.saved_model.save")
    return tables
