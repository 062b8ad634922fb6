"""The stock-TF stand-in for a SparseTable in a serving export: a
MutableHashTable (key -> row number) and an embedding matrix with a zero
last row, optionally float16 or per-row int8 (see tnet.saving.export)."""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np
import tensorflow as tf

from tnet.table import SparseTable

_INT8_MAX = 127.0


class ServingTable(tf.Module):
    """The stock-TF stand-in for one `SparseTable` in a SavedModel.

    `lookup(keys [U] int64) -> rows [U, dim] float32`; keys the table does
    not hold read the all-zero row N.
    """

    def __init__(self, name: str, keys: np.ndarray, padded: np.ndarray,
                 quantize: Optional[str]):
        """padded: [N + 1, dim] weights whose last row is zeros."""
        super().__init__(name=_module_name(name))
        rows, dim = padded.shape[0] - 1, padded.shape[1]
        self.table_name = name
        self.rows = rows
        self.dim = dim
        # int32 row numbers: 12 bytes a key instead of 16 (2**31 rows a table).
        self.index = tf.lookup.experimental.MutableHashTable(
            key_dtype=tf.int64, value_dtype=tf.int32, default_value=rows,
            name=f"{self.name}_index")
        if rows:
            self.index.insert(tf.constant(keys, tf.int64),
                              tf.range(rows, dtype=tf.int32))
        # Row N (the last of `padded`): the zero row unknown keys map to.
        self.scale = None
        if quantize == "int8" and not int8_pays(dim):
            quantize = "float16"
        self.quantize = quantize
        if quantize is None:
            values = padded
        elif quantize == "float16":
            values = padded.astype(np.float16)
        else:
            values, scale = quantize_int8(padded)
            self.scale = tf.Variable(scale, trainable=False,
                                     name=f"{self.name}_scale")
        self.matrix = tf.Variable(values, trainable=False,
                                  name=f"{self.name}_matrix")

    def lookup(self, keys: tf.Tensor) -> tf.Tensor:
        index = self.index.lookup(keys)
        # A hash table lookup has no static shape; layers downstream (e.g.
        # tfrs' Cross) need the row width, so restore [U] (and so [U, dim]).
        index.set_shape(keys.shape)
        rows = tf.gather(self.matrix, index)
        if self.quantize is None:
            return rows
        rows = tf.cast(rows, tf.float32)
        if self.quantize == "int8":
            rows = rows * tf.gather(self.scale, index)[:, tf.newaxis]
        return rows

    def payload_bytes(self) -> Dict[str, int]:
        """Bytes of the matrix (and scales) and of the key index payload."""
        matrix = (self.rows + 1) * self.dim * self.matrix.dtype.size
        scale = 0 if self.scale is None else (self.rows + 1) * 4
        return {"matrix_bytes": matrix, "scale_bytes": scale,
                "index_bytes": self.rows * 12}


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
        s = np.abs(w).max(axis=1) / _INT8_MAX
        safe = np.where(s > 0, s, 1.0)[:, np.newaxis]
        q[start:start + block] = np.clip(np.rint(w / safe), -_INT8_MAX,
                                         _INT8_MAX)
        scale[start:start + block] = s
    return q, scale


def export_weights(table: SparseTable, chunk_rows: int = 1 << 18):
    """(keys [N], weights [N + 1, dim] with a zero last row) of a table.

    Streams the shards through the export cursor into preallocated arrays
    and keeps only keys and weights (slots and meta are not served), so the
    export never holds more than the weights plus one chunk.
    """
    expected = int(table.size())
    keys = np.empty(expected, np.int64)
    weights = np.empty((expected + 1, table.dim), np.float32)
    n = 0
    for shard in range(table.num_shards):
        cursor = 0
        while cursor != -1:
            k, w, _, _, cursor = table.export_shard(shard, cursor, chunk_rows)
            cursor = int(cursor)
            m = int(k.shape[0])
            if n + m > expected:  # rows were added meanwhile: grow
                expected = max(2 * expected, n + m)
                keys = np.resize(keys, expected)
                grown = np.empty((expected + 1, table.dim), np.float32)
                grown[:n] = weights[:n]
                weights = grown
            keys[n:n + m] = k.numpy()
            weights[n:n + m] = w.numpy()
            n += m
    weights[n] = 0.0
    return keys[:n], weights[:n + 1]


def unique_keys(name: str, keys: np.ndarray) -> np.ndarray:
    if np.unique(keys).size != keys.size:
        raise RuntimeError(f"table {name!r} exported duplicate keys; its "
                           "shards disagree on key ownership")
    return keys


def _module_name(name: str) -> str:
    cleaned = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return cleaned if cleaned[:1].isalpha() else f"t_{cleaned}"
