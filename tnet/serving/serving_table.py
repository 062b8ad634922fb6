"""The stock-TF stand-in for a SparseTable in a serving export, written
without ever holding the table's weights twice.

Serving structure (one per table, all stock TF, all in `variables/`):

* `keys` int64 `[N + 1]`: the table's N live keys, each passed through
  `mix_keys` (a bijective 64-bit mixer built from stock bitwise ops), sorted
  ascending, then a sentinel (the largest int64).
* `matrix` `[N + 1, dim]`: the rows in the same order, then an all-zero row.
  float32, float16 (stored as its int16 bits), or int8 with a float32
  per-row `scale` `[N + 1]`.

A lookup mixes the request's keys, finds each with `tf.searchsorted` (a
binary search: ~28 probes at 200M rows) and gathers its row; a key the table
does not hold reads the zero row N, as tnet's inference pull does.

Why this structure (measured, BENCHMARKS.md "Scale"): it costs the served
process exactly the payload, 8 bytes of key plus the row, where a
`MutableHashTable` of 200M keys (a node per key) costs several times its
payload and, at export, a third copy of keys and row numbers. And it can be
written in pieces: the export never materializes the table.

How the export streams (`SpilledTable`, `write_sliced`):

1. One pass over the table's export cursor spills (mixed key, row) records
   into bucket files by the top bits of the mixed key. The mixer makes the
   buckets even whatever the ids look like (consecutive ints, hashes), and
   the bucket order is the sorted order.
2. The SavedModel is saved with empty placeholder variables (shape `[None]`
   / `[None, dim]`) for keys, matrix and scale.
3. Each bucket file is read, sorted (and quantized) and written with
   `SaveV2` as one *slice* of the full `[N + 1, ...]` tensor, then deleted.
   `MergeV2Checkpoints` joins the slices, and the other variables of the
   saved model, into the SavedModel's `variables/` bundle; a loader (Python
   or TF Serving's C++ reader) sees one full tensor per variable.

Peak memory of the export is the table plus one bucket (about 1M rows); the
disk holds the spilled bucket files of one table beside the export while it
is written (inside the export's temporary directory).
"""
from __future__ import annotations

import os
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from tnet.table import SparseTable

_INT8_MAX = 127.0
SENTINEL = np.iinfo(np.int64).max
# splitmix64's finalizer: xor-shift, multiply, xor-shift, multiply,
# xor-shift. Each step is a bijection of 64-bit words, so distinct keys stay
# distinct.
_MIX = ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB), (31, None))
MAX_BUCKETS = 256            # open files while spilling one table
BUCKET_ROWS = 1 << 20        # rows a bucket aims at (one sort in memory)


def mix_keys_np(keys: np.ndarray) -> np.ndarray:
    """numpy twin of `mix_keys` (same bits), for the export side."""
    z = np.ascontiguousarray(keys, dtype=np.int64).view(np.uint64).copy()
    with np.errstate(over="ignore"):
        for shift, mult in _MIX:
            z ^= z >> np.uint64(shift)
            if mult is not None:
                z *= np.uint64(mult)
    return z.view(np.int64)


def mix_keys(keys: tf.Tensor) -> tf.Tensor:
    """int64 keys -> int64 mixed keys, with stock ops only (uint64 wraps)."""
    z = tf.bitcast(tf.convert_to_tensor(keys, tf.int64), tf.uint64)
    for shift, mult in _MIX:
        z = tf.bitwise.bitwise_xor(
            z, tf.bitwise.right_shift(z, tf.constant(shift, tf.uint64)))
        if mult is not None:
            z = z * tf.constant(mult, tf.uint64)
    return tf.bitcast(z, tf.int64)


class ServingTable(tf.Module):
    """The stock-TF stand-in for one `SparseTable` in a SavedModel.

    `lookup(keys [U] int64) -> rows [U, dim] float32`. Built with empty
    placeholder variables; `write_sliced` fills them in the saved bundle.
    """

    def __init__(self, name: str, dim: int, quantize: Optional[str]):
        super().__init__(name=_module_name(name))
        self.table_name = name
        self.rows = None  # known once `write_sliced` has spilled the table
        self.dim = int(dim)
        if quantize == "int8" and not int8_pays(dim):
            quantize = "float16"
        self.quantize = quantize
        # float16 is stored as its int16 bits: TF's reader of sliced
        # tensors (RestoreV2) does not support half; tf.bitcast after the
        # gather gives the float16 back.
        dtype = {None: tf.float32, "float16": tf.int16,
                 "int8": tf.int8}[quantize]
        self.keys = _placeholder(tf.int64, [None], f"{self.name}_keys")
        self.matrix = _placeholder(dtype, [None, self.dim],
                                   f"{self.name}_matrix")
        self.scale = (_placeholder(tf.float32, [None], f"{self.name}_scale")
                      if quantize == "int8" else None)
        self.overlay = None  # see make_updatable

    def make_updatable(self) -> None:
        """Adds the overlay of an updatable export (tnet.serving.updatable): a
        stock `MutableHashTable` from the table's key to [state, row...],
        state 1 a row published since the base, 2 a key freed since (reads
        the zero row); a key absent from it reads the base."""
        self.overlay = tf.lookup.experimental.MutableHashTable(
            key_dtype=tf.int64, value_dtype=tf.float32,
            default_value=tf.zeros([self.dim + 1], tf.float32),
            name=f"{self.name}_overlay")

    def apply(self, keys, rows, deleted):
        """Overlay insert of published rows and freed keys (one stock
        LookupTableInsertV2 each: a reader sees all of a call's rows or
        none, never half a row)."""
        rows = tf.reshape(rows, [-1, self.dim])
        value = tf.concat([tf.ones([tf.shape(rows)[0], 1]), rows], axis=1)
        gone = tf.concat([tf.fill([tf.size(deleted), 1], 2.0),
                          tf.zeros([tf.size(deleted), self.dim])], axis=1)
        # Deleted first: a key both freed and published (freed, then
        # re-inserted) ends as the published row.
        ins = self.overlay.insert(deleted, gone)
        with tf.control_dependencies([ins]):
            return self.overlay.insert(keys, value)

    def overlay_size(self):
        return self.overlay.size()

    @property
    def weight_dtype(self) -> str:
        """The served weights' dtype (float16 is stored as int16 bits)."""
        return self.quantize or "float32"

    def placeholders(self) -> List[tf.Variable]:
        return [v for v in (self.keys, self.matrix, self.scale)
                if v is not None]

    def lookup(self, keys: tf.Tensor) -> tf.Tensor:
        mixed = mix_keys(keys)
        # The keys are read once as a tensor and gathered from that tensor
        # (GatherV2). A tf.gather on the variable itself (ResourceGather)
        # would switch it to copy-on-read, and every later read (the
        # searchsorted's) would copy all N keys: ~15 ms a request at 2M rows.
        sorted_keys = self.keys.value()
        # N, the row count, is read from the variable: the function is
        # traced before the table is written.
        rows = tf.shape(sorted_keys, out_type=tf.int32)[0] - 1
        index = tf.searchsorted(sorted_keys, mixed, side="left",
                                out_type=tf.int32)
        hit = tf.logical_and(index < rows,
                             tf.equal(tf.gather(sorted_keys, index), mixed))
        index = tf.where(hit, index, rows)
        rows = tf.gather(self.matrix, index)
        if self.quantize == "float16":
            rows = tf.bitcast(rows, tf.float16)
        if self.quantize is not None:
            rows = tf.cast(rows, tf.float32)
        if self.quantize == "int8":
            rows = rows * tf.gather(self.scale, index)[:, tf.newaxis]
        if self.overlay is None:
            return rows
        # Overlay first (one LookupTableFindV2: a consistent snapshot of
        # the overlay), then the base.
        found = self.overlay.lookup(tf.convert_to_tensor(keys, tf.int64))
        state = found[:, :1]
        return tf.where(state > 0.5, found[:, 1:], rows)

    def payload_bytes(self) -> Dict[str, int]:
        """Bytes of the matrix (and scales) and of the sorted keys."""
        n = self.rows + 1
        return {"matrix_bytes": n * self.dim * self.matrix.dtype.size,
                "scale_bytes": 0 if self.scale is None else n * 4,
                "index_bytes": n * 8}

    def slices(self, spilled: "SpilledTable"
               ) -> Iterator[List[Tuple[tf.Variable, int, np.ndarray]]]:
        """Per bucket in key order: [(variable, first row, values)]."""
        start = 0
        for keys, weights in spilled.sorted_buckets():
            yield self._encode(start, keys, weights)
            start += keys.shape[0]
        if start != self.rows:
            raise RuntimeError(
                f"table {self.table_name!r}: the export spilled {start} rows "
                f"but counted {self.rows}")
        # The sentinel key and the zero row unknown keys read.
        yield self._encode(start, np.array([SENTINEL], np.int64),
                           np.zeros((1, self.dim), np.float32))

    def _encode(self, start, keys, weights):
        out = [(self.keys, start, keys)]
        if self.quantize is None:
            out.append((self.matrix, start, weights))
        elif self.quantize == "float16":
            out.append((self.matrix, start,
                        weights.astype(np.float16).view(np.int16)))
        else:
            q, scale = quantize_int8(weights)
            out += [(self.matrix, start, q), (self.scale, start, scale)]
        return out


def _placeholder(dtype, shape, name) -> tf.Variable:
    empty = tf.zeros([0] + list(shape[1:]), dtype)
    return tf.Variable(empty, shape=tf.TensorShape(shape), trainable=False,
                       name=name)


def int8_pays(dim: int) -> bool:
    """int8 costs dim + 4 bytes a row (the float32 scale), float16 2 * dim:
    below dim 5 (e.g. the 1-wide rows of a wide/linear table) int8 is no
    smaller than float16 and less exact, so such tables use float16."""
    return dim + 4 < 2 * dim


def quantize_int8(weights: np.ndarray):
    """Per-row symmetric int8: q = round(w / s), s = max|w| / 127.

    The error per weight is at most s / 2. All-zero rows get s = 0 (and
    q = 0), so they dequantize to exact zeros.
    """
    q = np.empty(weights.shape, np.int8)
    scale = np.empty(weights.shape[0], np.float32)
    block = 1 << 20  # bounded temporaries for big tables
    for start in range(0, weights.shape[0], block):
        w = weights[start:start + block]
        s = np.abs(w).max(axis=1) / _INT8_MAX if w.size else \
            np.zeros(w.shape[0], np.float32)
        safe = np.where(s > 0, s, 1.0)[:, np.newaxis]
        q[start:start + block] = np.clip(np.rint(w / safe), -_INT8_MAX,
                                         _INT8_MAX)
        scale[start:start + block] = s
    return q, scale


class SpilledTable:
    """A table's (mixed key, weights) rows in bucket files, in one pass.

    Bucket b holds the rows whose mixed key has top bits b (as a signed
    int64: bucket order is the keys' sorted order). Only the weights are
    kept (slots and meta are not served).
    """

    def __init__(self, table: SparseTable, name: str, directory: str,
                 chunk_rows: int = 1 << 18,
                 bucket_rows: Optional[int] = None):
        self.name = name
        self.dim = table.dim
        self.directory = directory
        os.makedirs(directory, exist_ok=True)
        expected = int(table.size())
        bucket_rows = bucket_rows or BUCKET_ROWS
        buckets = 1
        while buckets < MAX_BUCKETS and buckets * bucket_rows < expected:
            buckets *= 2
        self.bits = buckets.bit_length() - 1
        self.counts = np.zeros(buckets, np.int64)
        self.record = np.dtype([("k", "<i8"), ("w", "<f4", (self.dim,))])
        files = [None] * buckets
        try:
            for k, w, _, _ in table.export_chunks(chunk_rows=chunk_rows,
                                                  weights_only=True):
                if k.shape[0]:
                    self._spill(k.numpy(), w.numpy(), files)
        finally:
            for f in files:
                if f is not None:
                    f.close()
        self.rows = int(self.counts.sum())

    def _path(self, b: int) -> str:
        return os.path.join(self.directory, f"bucket-{b:05d}")

    def _spill(self, keys, weights, files) -> None:
        mixed = mix_keys_np(keys)
        if self.bits:
            bucket = (mixed >> (64 - self.bits)) + (1 << (self.bits - 1))
        else:
            bucket = np.zeros(mixed.shape, np.int64)
        # < 2**16 buckets: a stable sort of uint16 is numpy's radix sort.
        order = np.argsort(bucket.astype(np.uint16), kind="stable")
        rec = np.empty(keys.shape[0], self.record)
        rec["k"] = mixed[order]
        rec["w"] = weights[order]
        counts = np.bincount(bucket, minlength=self.counts.shape[0])
        self.counts += counts
        start = 0
        for b in np.flatnonzero(counts):
            end = start + int(counts[b])
            if files[b] is None:
                files[b] = open(self._path(b), "ab")
            files[b].write(rec[start:end].tobytes())
            start = end

    def sorted_buckets(self) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
        """(sorted mixed keys, their weights) per bucket in order; each
        bucket file is deleted once read."""
        for b in np.flatnonzero(self.counts):
            path = self._path(b)
            rec = np.fromfile(path, dtype=self.record)
            os.remove(path)
            order = np.argsort(rec["k"])  # unique keys: stability moot
            keys = rec["k"][order]
            if keys.shape[0] > 1 and np.any(keys[1:] == keys[:-1]):
                raise RuntimeError(
                    f"table {self.name!r} exported duplicate keys; its "
                    "shards disagree on key ownership")
            weights = rec["w"][order]
            del rec, order
            yield keys, weights


def _slice_spec(var: tf.Variable, rows: int, start: int,
                length: int) -> str:
    """SaveV2's "full shape" + "start,length" spec of a row range."""
    rest = [int(d) for d in var.shape[1:]]
    full = " ".join(str(d) for d in [rows] + rest)
    return f"{full} {start},{length}" + ":-" * len(rest)


def write_sliced(saved_model_dir: str, module_root,
                 fills: List[Tuple["ServingTable", SparseTable]],
                 scratch: str) -> None:
    """Replaces the placeholder variables of a saved model by full tensors
    written bucket by bucket (see the module doc); sets each
    ServingTable's `rows`. Tables are spilled one at a time, so the scratch
    disk holds one table's rows beside the export.

    `module_root` is the module that was saved; its attribute
    `streamed_variables` lists every placeholder, so the object graph path
    of placeholder i is ("streamed_variables", str(i)).
    """
    prefix = os.path.join(saved_model_dir, "variables", "variables")
    reader = tf.train.load_checkpoint(prefix)
    keys = _placeholder_keys(reader, len(module_root.streamed_variables))
    key_of = {id(v): keys[i]
              for i, v in enumerate(module_root.streamed_variables)}
    os.makedirs(scratch, exist_ok=True)
    parts = []
    for i, (serving, table) in enumerate(fills):
        spilled = SpilledTable(table, serving.table_name,
                               os.path.join(scratch, f"spill-{i}"))
        serving.rows = spilled.rows
        full_rows = serving.rows + 1
        for piece in serving.slices(spilled):
            part = os.path.join(scratch, f"part-{len(parts):06d}")
            tf.raw_ops.SaveV2(
                prefix=part,
                tensor_names=[key_of[id(v)] for v, _, _ in piece],
                shape_and_slices=[_slice_spec(v, full_rows, s, a.shape[0])
                                  for v, s, a in piece],
                tensors=[a for _, _, a in piece])
            parts.append(part)
        os.rmdir(spilled.directory)
    streamed = set(keys)
    rest = [n for n in sorted(reader.get_variable_to_shape_map())
            if n not in streamed]
    others = os.path.join(scratch, "others")
    tf.raw_ops.SaveV2(prefix=others, tensor_names=rest,
                      shape_and_slices=[""] * len(rest),
                      tensors=[reader.get_tensor(n) for n in rest])
    del reader
    vdir = os.path.dirname(prefix)
    for name in os.listdir(vdir):
        if name.startswith("variables."):
            os.remove(os.path.join(vdir, name))
    tf.raw_ops.MergeV2Checkpoints(checkpoint_prefixes=[others] + parts,
                                  destination_prefix=prefix,
                                  delete_old_dirs=False)
    shapes = tf.train.load_checkpoint(prefix).get_variable_to_shape_map()
    for serving, _ in fills:
        for v in serving.placeholders():
            got = shapes.get(key_of[id(v)])
            if not got or got[0] != serving.rows + 1:
                raise RuntimeError(
                    f"export of table {serving.table_name!r}: variable "
                    f"{v.name} was written with shape {got}, expected "
                    f"{serving.rows + 1} rows")


def _placeholder_keys(reader, count: int) -> List[str]:
    """Checkpoint keys of streamed_variables[0..count) in the saved
    object graph."""
    from tensorflow.core.protobuf import (  # noqa: PLC0415
        trackable_object_graph_pb2)
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))

    def child(node, name):
        for c in node.children:
            if c.local_name == name:
                return graph.nodes[c.node_id]
        raise RuntimeError(f"saved object graph has no child {name!r}")

    holder = child(graph.nodes[0], "streamed_variables")
    keys = []
    for i in range(count):
        attrs = [a.checkpoint_key for a in child(holder, str(i)).attributes
                 if a.name == "VARIABLE_VALUE"]
        if len(attrs) != 1:
            raise RuntimeError(f"saved placeholder {i} has no value key")
        keys.append(attrs[0])
    return keys


def _module_name(name: str) -> str:
    cleaned = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return cleaned if cleaned[:1].isalpha() else f"t_{cleaned}"
