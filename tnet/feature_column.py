"""Feature columns: which input feature holds ids, and how they are embedded.

    import tnet as tn
    user = tn.feature_column.category_column("user_id")            # int64 ids
    city = tn.feature_column.category_column("city", dtype=tf.string)
    cols = [tn.feature_column.embedding_column(user, 16),
            tn.feature_column.embedding_column(city, 16, table="shared")]

Ids are unbounded: int64 ids are table keys as they are, string ids are
fingerprinted to 63-bit keys (FarmHash, `tf.strings.to_hash_bucket_fast`).
There are no hash buckets, so distinct int ids never collide. Dense `[B]`,
dense `[B, L]`, ragged and sparse inputs are accepted.

Padding: one id value per column means "no id here" (never looked up,
never combined, never trained): `category_column(..., padding=)`, by
default -1 for int ids and "" for strings, shown in the column's repr.
Every other value is an ordinary id (-5 too). A column given another
padding (say 0, as Keras' `mask_zero`) treats that value as padding and
-1 (or "") as an ordinary id.

Ids must come as integers or strings: float ids are refused, never
truncated (2.7 is not id 2), and string ids fed to an int column name the
column and the fix.

Columns whose `embedding_column(..., table=name)` share a name share one
table; each column's keys are then XOR-ed with a per-column 64-bit salt so
that `C1=5` and `C2=5` are different rows.
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Optional

import numpy as np
import tensorflow as tf

PADDING_INT = -1
PADDING_STRING = ""
_COMBINERS = ("mean", "sum", "sqrtn")
_STRING_KEY_BUCKETS = 2**63 - 1


@dataclasses.dataclass(frozen=True)
class CategoryColumn:
    """Unbounded categorical ids read from `features[key]`; `padding` is the
    id value that means "no id" (default -1, or "" for strings).

    Args:
      key: the feature's name in the features dict.
      dtype: `tf.int64` or `tf.string` (strings are fingerprinted).
      padding: the "no id" value of padded batches.

    Build it with `category_column`.

    Example:
        ```python
        col = tn.feature_column.category_column("user_id")
        print(col.key, col.dtype.name, col.padding)    # user_id int64 -1
        ```
    """

    key: str
    dtype: tf.DType = tf.int64
    padding: Any = None

    def __post_init__(self):
        object.__setattr__(self, "padding",
                           _check_padding(self.key, self.dtype, self.padding))

    @property
    def name(self) -> str:
        return self.key

    @property
    def is_sequence(self) -> bool:
        """True for a `SequenceCategoryColumn`."""
        return False


@dataclasses.dataclass(frozen=True)
class SequenceCategoryColumn(CategoryColumn):
    """A behaviour sequence of ids (most recent last), truncated to
    `max_length` keeping the most recent ids.

    Args:
      key: the feature's name; ids `[B, L]` padded, ragged or sparse.
      dtype: `tf.int64` or `tf.string`.
      padding: the "no id" value of padded batches.
      max_length: L, ids kept per example (the most recent).

    Build it with `sequence_category_column`.

    Example:
        ```python
        col = tn.feature_column.sequence_category_column("history", max_length=20)
        print(col.max_length, col.is_sequence)        # 20 True
        ```
    """

    max_length: int = 50

    @property
    def is_sequence(self) -> bool:
        """True: a sequence column keeps one vector per position."""
        return True


@dataclasses.dataclass(frozen=True)
class EmbeddingColumn:
    """Embeds a categorical column into `dimension` floats.

    Args:
      categorical_column: the ids (`category_column` or
        `sequence_category_column`).
      dimension: the width of a row.
      combiner: how the ids of one example reduce to one vector: "mean",
        "sum" or "sqrtn"; sequence columns keep one vector per position.
      table: the table's name; columns with the same name share one table
        (None: the feature's name).
      initializer: the rows' initializer (see tn.SparseTable).
      min_count: the table's admission threshold (see tn.SparseTable;
        None: the layer's default).
      max_rows: the table's row cap (None: the layer's default).
      memory_budget_bytes: the disk tier's memory for rows (None: the
        layer's default, all rows in memory).
      storage_dir: the disk tier's directory.

    Columns sharing a table must agree on its last four fields. Build it
    with `embedding_column`.

    Example:
        ```python
        col = tn.feature_column.embedding_column(
            tn.feature_column.category_column("user_id"), 16, table="user")
        print(col.key, col.table_name, col.dimension)   # user_id user 16
        ```
    """

    categorical_column: CategoryColumn
    dimension: int
    combiner: str = "mean"
    table: Optional[str] = None
    initializer: Any = None
    min_count: Optional[float] = None
    max_rows: Optional[int] = None
    memory_budget_bytes: Optional[int] = None
    storage_dir: Optional[str] = None

    @property
    def name(self) -> str:
        return f"{self.categorical_column.name}_embedding"

    @property
    def key(self) -> str:
        """The feature's name (of the categorical column)."""
        return self.categorical_column.key

    @property
    def table_name(self) -> str:
        """The table's name: `table`, or the feature's name."""
        return self.table or self.categorical_column.name


def _check_key(key: Any, what: str) -> str:
    if not isinstance(key, str) or not key:
        raise ValueError(f"{what}: key must be a non-empty feature name, "
                         f"got {key!r}")
    return key


def _check_dtype(key: str, dtype: Any) -> tf.DType:
    dtype = tf.as_dtype(dtype)
    if dtype not in (tf.int64, tf.int32, tf.string):
        raise ValueError(
            f"category_column {key!r}: dtype must be int64, int32 or string, "
            f"got {dtype.name}; float ids are not ids (bucketize them first)")
    return tf.int64 if dtype == tf.int32 else dtype


def _check_padding(key: str, dtype: tf.DType, padding: Any):
    """The column's padding value: the default for its dtype when None."""
    if dtype == tf.string:
        if padding is None:
            return PADDING_STRING
        if isinstance(padding, bytes):
            padding = padding.decode()
        if not isinstance(padding, str):
            raise ValueError(f"category_column {key!r}: padding of a string "
                             f"column must be a string, got {padding!r}")
        return padding
    if padding is None:
        return PADDING_INT
    if isinstance(padding, bool) or not isinstance(padding, (int, np.integer)):
        raise ValueError(f"category_column {key!r}: padding of an int column "
                         f"must be an int, got {padding!r}")
    return int(padding)


def category_column(key: str, dtype: Any = tf.int64,
                    padding: Any = None) -> CategoryColumn:
    """Ids of feature `key`: one id, a set of ids, or padded ids per example.

    Args:
      key: the feature's name in the features dict.
      dtype: `tf.int64` (or int32) ids are used as they are; `tf.string`
        ids are fingerprinted to int64.
      padding: the value meaning "no id" in a padded `[B, L]` batch
        (default -1, or "" for strings); it never gets a row.

    Returns:
      A `CategoryColumn`, to embed with `embedding_column`. Ids may come
      as `[B]`, `[B, 1]`, padded `[B, L]`, `tf.SparseTensor` or
      `tf.RaggedTensor`.

    Example:
        ```python
        user = tn.feature_column.category_column("user_id")
        city = tn.feature_column.category_column("city", dtype=tf.string)
        item = tn.feature_column.category_column("item_id", padding=0)  # 0: no id
        ```
    """
    _check_key(key, "category_column")
    dtype = _check_dtype(key, dtype)
    return CategoryColumn(key, dtype, _check_padding(key, dtype, padding))


def sequence_category_column(key: str, dtype: Any = tf.int64,
                             max_length: int = 50,
                             padding: Any = None) -> SequenceCategoryColumn:
    """A sequence of ids per example (most recent last), for
    `tn.layers.SequenceEmbeddingFeatures`.

    Args:
      key: the feature's name in the features dict; ids `[B, L]` padded
        with -1 (or ""), ragged or sparse.
      dtype: `tf.int64` or `tf.string`.
      max_length: ids kept per example: the most recent `max_length`.
      padding: as for `category_column`.

    Example:
        ```python
        history = tn.feature_column.sequence_category_column("history", max_length=20)
        ```
    """
    _check_key(key, "sequence_category_column")
    if not isinstance(max_length, int) or max_length < 1:
        raise ValueError(f"sequence_category_column {key!r}: max_length must "
                         f"be a positive int, got {max_length!r}")
    dtype = _check_dtype(key, dtype)
    return SequenceCategoryColumn(key, dtype, _check_padding(key, dtype,
                                                             padding),
                                  max_length=max_length)


def with_default_padding(column: CategoryColumn, ids: Any):
    """A column's ids as the lookups take them: its padding as -1 / "".

    Unchanged (no op) for a column with the default padding. Otherwise the
    column's padding and the default value swap places (two compares and
    two selects): the padding becomes -1 / "", and an id equal to -1 / ""
    becomes the padding value, a key no other id of the column has, so
    every id keeps a key of its own."""
    default = PADDING_STRING if column.dtype == tf.string else PADDING_INT
    if column.padding == default:
        return ids
    if isinstance(ids, tf.SparseTensor):
        return ids.with_values(_swap_padding(column, ids.values))
    if isinstance(ids, tf.RaggedTensor):
        return ids.with_flat_values(_swap_padding(column, ids.flat_values))
    return _swap_padding(column, tf.convert_to_tensor(ids))


def _swap_padding(column: CategoryColumn, values):
    values = check_id_dtype(column, values)
    default = PADDING_STRING if column.dtype == tf.string else PADDING_INT
    pad = tf.constant(column.padding, values.dtype)
    default = tf.constant(default, values.dtype)
    return tf.where(tf.equal(values, pad), default,
                    tf.where(tf.equal(values, default), pad, values))


def embedding_column(categorical_column: CategoryColumn, dimension: int,
                     combiner: str = "mean", table: Optional[str] = None,
                     initializer: Any = None,
                     min_count: Optional[float] = None,
                     max_rows: Optional[int] = None,
                     memory_budget_bytes: Optional[int] = None,
                     storage_dir: Optional[str] = None) -> EmbeddingColumn:
    """Embeds `categorical_column` into `dimension` floats per id.

    Args:
      categorical_column: from `category_column` or
        `sequence_category_column`.
      dimension: the width of each row.
      combiner: how the ids of one example reduce to one vector: "mean",
        "sum" or "sqrtn" (padding never counts). Sequence columns keep one
        vector per position.
      table: the table's name; columns with the same name share one table
        (the column is mixed into the key) and one lookup per step. None:
        a table of its own, named after the feature.
      initializer: the rows' initializer (default: zeros for dimension 1,
        normal(0, 0.01) wider; see tn.SparseTable).
      min_count: admission: shows an id needs before it gets a row (None:
        the layer's default).
      max_rows: the table's row cap (None: the layer's default).
      memory_budget_bytes: a disk tier: bytes of rows kept in memory.
      storage_dir: the disk tier's directory, local to each ps.

    Returns:
      An `EmbeddingColumn`, for `tn.layers.EmbeddingFeatures`.

    Example:
        ```python
        col = tn.feature_column.embedding_column(
            tn.feature_column.category_column("user_id"), 16, table="user")
        ```
    """
    if not isinstance(categorical_column, CategoryColumn):
        raise TypeError("embedding_column needs a tn.feature_column."
                        "category_column, got "
                        f"{type(categorical_column).__name__}")
    name = categorical_column.name
    if isinstance(dimension, bool) or not isinstance(dimension, int) or dimension < 1:
        raise ValueError(f"embedding_column {name!r}: dimension must be a "
                         f"positive int, got {dimension!r}")
    if combiner not in _COMBINERS:
        raise ValueError(f"embedding_column {name!r}: combiner must be one of "
                         f"{_COMBINERS}, got {combiner!r}")
    if table is not None and (not isinstance(table, str) or not table):
        raise ValueError(f"embedding_column {name!r}: table must be a "
                         f"non-empty name, got {table!r}")
    if min_count is not None and (
            isinstance(min_count, bool) or not isinstance(min_count, (int, float))
            or not min_count >= 0):
        raise ValueError(f"embedding_column {name!r}: min_count must be a "
                         f"number >= 0 or None, got {min_count!r}")
    if max_rows is not None and (isinstance(max_rows, bool)
                                 or not isinstance(max_rows, int)
                                 or max_rows < 1):
        raise ValueError(f"embedding_column {name!r}: max_rows must be a "
                         f"positive int or None, got {max_rows!r}")
    if memory_budget_bytes is not None and (
            isinstance(memory_budget_bytes, bool)
            or not isinstance(memory_budget_bytes, int)
            or memory_budget_bytes < 1):
        raise ValueError(f"embedding_column {name!r}: memory_budget_bytes "
                         "must be a positive int or None, got "
                         f"{memory_budget_bytes!r}")
    if storage_dir is not None and (not isinstance(storage_dir, str)
                                    or not storage_dir):
        raise ValueError(f"embedding_column {name!r}: storage_dir must be a "
                         f"directory path or None, got {storage_dir!r}")
    return EmbeddingColumn(categorical_column, dimension, combiner, table,
                           initializer, min_count, max_rows,
                           memory_budget_bytes, storage_dir)


def column_salt(column_name: str) -> int:
    """The column's 64-bit key salt (as a signed int64), fixed by its name.

    Its top bits are set, so for ids below 2**56 no two columns' salted keys
    can coincide; string fingerprints are random 63-bit values anyway.
    """
    digest = hashlib.blake2b(column_name.encode(), digest_size=8).digest()
    salt = int.from_bytes(digest, "little") | (0xFF << 56)
    return salt - (1 << 64)  # as int64


def ids_to_keys(column: CategoryColumn, ids: Any, salted: bool = False,
                sequence: bool = False):
    """Validates one column's ids and flattens them to table keys.

    Returns (keys int64 [K], example int64 [K], batch_size, position) with
    padding removed; `example` is the row of the batch each key belongs to.
    With sequence=True only the last `max_length` ids of each example are
    kept and `position` gives each id's index in its (truncated) sequence;
    otherwise position is None.
    """
    values, rows, batch = _flatten_ids(column, ids, ordered=sequence)
    position = None
    if sequence:
        max_length = getattr(column, "max_length", None)
        values, rows, position = _truncate_recent(values, rows, batch,
                                                  max_length)
    return _to_keys(column, values, salted), rows, batch, position


def ids_to_masked_keys(column: CategoryColumn, ids: Any,
                       salted: bool = False):
    """A ragged or sparse column's ids as table keys, padding kept in place.

    Returns (keys int64 [K], example int64 [K], batch_size, valid bool
    [K]): every stored value (K of them) with its example row; `valid` is
    False at padding (-1 / ""), which the dedup skips (idx -1) and the
    combine reads as nothing. The same keys and rows as `ids_to_keys`
    without the compaction (two boolean_masks per column per step).
    """
    if not isinstance(ids, (tf.SparseTensor, tf.RaggedTensor)):
        raise TypeError(f"feature {column.name!r}: expected ragged or sparse "
                        f"ids, got {type(ids).__name__}")
    values, rows, batch = _stored_ids(column, ids)
    return (_to_keys(column, values, salted), tf.cast(rows, tf.int64), batch,
            not_padding(values))


def padded_to_keys(column: CategoryColumn, ids: tf.Tensor,
                   salted: bool = False):
    """A [B, L] id tensor padded with -1 / "" as the keys of its ids without
    the padding, as `ids_to_masked_keys` gives a ragged column's: (keys
    int64 [K], example int64 [K], batch_size, None: no padding is left).
    One kernel pass in training; stock ops in a serving export."""
    from tnet.scopes import serving_active  # noqa: PLC0415 (light module)
    ids = check_id_dtype(column, ids)
    if serving_active():
        where = tf.where(not_padding(ids))
        values, rows = tf.gather_nd(ids, where), where[:, 0]
    else:
        from tnet import _ops  # noqa: PLC0415
        values, rows = _ops.tnet_compact_ids(ids)
    return (_to_keys(column, values, salted), rows,
            tf.shape(ids, out_type=tf.int64)[0], None)


def _truncate_recent(values, rows, batch, max_length):
    """Keeps each example's last max_length ids; returns their positions."""
    counts = tf.math.unsorted_segment_sum(tf.ones_like(rows), rows, batch)
    starts = tf.cumsum(counts, exclusive=True)
    index = tf.range(tf.shape(rows, out_type=tf.int64)[0])
    pos = index - tf.gather(starts, rows)
    if max_length is None:
        return values, rows, pos
    drop = tf.maximum(tf.gather(counts, rows) - max_length, 0)
    keep = pos >= drop
    return (tf.boolean_mask(values, keep), tf.boolean_mask(rows, keep),
            tf.boolean_mask(pos - drop, keep))


def _stored_ids(column: CategoryColumn, ids: Any, ordered: bool = False):
    """A sparse or ragged column's stored values, their example rows and the
    batch size, padding included; checks rank and dtype."""
    name = column.name
    if isinstance(ids, tf.SparseTensor):
        if ordered:
            ids = tf.sparse.reorder(ids)
        if ids.shape.rank is not None and ids.shape.rank != 2:
            raise ValueError(f"feature {name!r}: a SparseTensor of ids must "
                             f"have rank 2 [batch, ids], got rank {ids.shape.rank}")
        return (check_id_dtype(column, ids.values), ids.indices[:, 0],
                ids.dense_shape[0])
    values, _ = ragged_parts(column, ids)
    return values, _value_rowids(ids), ids.nrows()


def ragged_parts(column: CategoryColumn, ids: tf.RaggedTensor):
    """A [batch, (ids)] RaggedTensor's checked ids (int64 or string) and
    its int64 row_splits."""
    if ids.ragged_rank != 1 or (ids.shape.rank is not None and ids.shape.rank != 2):
        raise ValueError(f"feature {column.name!r}: a RaggedTensor of ids "
                         f"must be [batch, (ids)], got shape {ids.shape}")
    return (check_id_dtype(column, ids.flat_values),
            tf.cast(ids.row_splits, tf.int64))


def _value_rowids(ids: tf.RaggedTensor):
    """A ragged tensor's example row per value: tnet's one-pass kernel in
    training (the stock value_rowids() builds a [rows, longest row] mask),
    the stock op in a serving export (no custom op in a SavedModel)."""
    from tnet.scopes import serving_active  # noqa: PLC0415 (light module)
    if serving_active():
        return ids.value_rowids()
    from tnet import _ops  # noqa: PLC0415
    return _ops.tnet_row_ids(ids.row_splits)


def _flatten_ids(column: CategoryColumn, ids: Any, ordered: bool = False):
    name = column.name
    if isinstance(ids, (tf.SparseTensor, tf.RaggedTensor)):
        values, rows, batch = _stored_ids(column, ids, ordered)
    else:
        ids = tf.convert_to_tensor(ids)
        check_id_dtype(column, ids)
        rank = ids.shape.rank
        if rank == 1:
            ids = ids[:, tf.newaxis]
        elif rank != 2:
            raise ValueError(
                f"feature {name!r}: ids must be [batch] or [batch, ids] (or "
                f"ragged / sparse), got shape {ids.shape}")
        batch = tf.shape(ids, out_type=tf.int64)[0]
        width = tf.shape(ids, out_type=tf.int64)[1]
        rows = tf.reshape(tf.tile(tf.range(batch)[:, tf.newaxis], [1, width]), [-1])
        values = tf.reshape(ids, [-1])
    values = check_id_dtype(column, values)
    keep = not_padding(values)
    return tf.boolean_mask(values, keep), tf.boolean_mask(tf.cast(rows, tf.int64), keep), batch


def check_id_dtype(column: CategoryColumn, values):
    if values.dtype.is_floating or values.dtype == tf.bool:
        raise TypeError(float_ids_message(column.name, values.dtype))
    if values.dtype == tf.string:
        if column.dtype != tf.string:
            raise TypeError(string_ids_message(column.name))
        return values
    if not values.dtype.is_integer:
        raise TypeError(f"feature {column.name!r}: unsupported id dtype "
                        f"{values.dtype.name}")
    if column.dtype == tf.string:
        raise TypeError(
            f"feature {column.name!r}: got {values.dtype.name} ids but the "
            "column was declared tf.string; declare it int64 (the default)")
    return tf.cast(values, tf.int64)


def float_ids_message(feature: str, dtype: tf.DType) -> str:
    return (f"feature {feature!r}: ids must be integers or strings, got "
            f"{dtype.name}; tnet never truncates floats to ids (2.7 is not "
            "id 2). Feed int64 ids (np.asarray(ids, np.int64), or tf.cast "
            "in the input pipeline after checking they are whole), or "
            "bucketize real values first.")


def string_ids_message(feature: str) -> str:
    return (f"feature {feature!r}: got string ids but the column is int64. "
            "Declare it category_column(..., dtype=tf.string) (and "
            "Input(dtype=tf.string)), or convert the ids to integers in "
            "the input pipeline (tf.strings.to_number(ids, tf.int64)).")


def _to_keys(column: CategoryColumn, values, salted: bool):
    salt = column_salt(column.name) if salted else None
    return keys_of(values, salt)


def keys_of(ids, salt=None):
    """Table keys of validated ids (int64 or string, any shape): int ids
    are their own key, strings are fingerprinted; `salt` (an int64 or a
    tensor broadcasting against `ids`, e.g. one salt per column of a
    [B, C] block) is XOR-ed in when columns share a table. The one place
    keys are derived, for training and serving alike."""
    if ids.dtype == tf.string:
        keys = tf.strings.to_hash_bucket_fast(ids, _STRING_KEY_BUCKETS)
    else:
        keys = ids
    if salt is not None:
        keys = tf.bitwise.bitwise_xor(keys, tf.cast(salt, tf.int64))
    return keys


def not_padding(ids):
    """True where ids (int or string, any shape) are not padding."""
    pad = PADDING_STRING if ids.dtype == tf.string else tf.cast(PADDING_INT, ids.dtype)
    return tf.not_equal(ids, pad)
