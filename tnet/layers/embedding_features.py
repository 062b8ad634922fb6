"""EmbeddingFeatures: the features dict in, [B, sum of dims] out."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import tensorflow as tf
import tf_keras

from tnet import _ops
from tnet import feature_column as fc
from tnet.layers import lookup
from tnet.optimizer import keras as keras_opt
from tnet.scopes import serving_active
from tnet.table import SparseTable


class EmbeddingFeatures(tf_keras.layers.Layer):
    """Embeds id features through tnet tables, like DenseFeatures.

    Args:
      columns: `tn.feature_column.embedding_column`s. Output is their
        embeddings concatenated in this order.
      optimizer: the in-table rule for this layer's tables (a tnet or Keras
        optimizer, a rule or a name). None: the model's optimizer, attached
        when a `tn.Model` is compiled.
      num_shards: shards per table; by default one shard per ps task under
        ParameterServerStrategy, one local shard otherwise.
      devices: the device of each shard (default: the ps tasks in order).
      seed: the tables' initializer seed; None: the global seed of
        `tf_keras.utils.set_random_seed` when one is set (at the tables'
        creation), else 0. See tn.SparseTable.
      min_count: admission default for this layer's tables: an id gets a
        row after this many shows (see tn.SparseTable); a column's own wins.
      max_rows: row cap default for this layer's tables; a column's own
        wins.
      admission_capacity: ids counted while waiting for admission, per
        shard.
      memory_budget_bytes: the disk tier of each of this layer's tables:
        bytes of rows kept in memory (see tn.SparseTable); a column's own
        wins.
      storage_dir: the disk tier's directory, local to each ps.
        `set_table_options` changes all of these until the tables are
        created.
      row_defaults: in-table rule hyperparameters for this layer's rows
        where the rule (its own or the model's) leaves them at tnet's row
        default, e.g. `{"initial_accumulator_value": 3e-3}` (what
        tn.models.DeepFM gives its embeddings); a value the user chose in
        the optimizer is kept (see
        tn.optimizer.sparse.SparseRule.with_row_defaults).
      **kwargs: Keras layer arguments (`name`, ...).

    Every table does one fused unique -> pull -> gather per call for all of
    its columns. In training (`training=True`) missing ids get rows; in
    inference (evaluate, predict) nothing is inserted and unknown ids read
    zeros.

    Call:
      `layer(features, training=False)`: `features` maps each column's key
      to its ids, `[B]`, `[B, 1]`, `[B, L]` padded with -1 (or ""),
      `tf.SparseTensor` or `tf.RaggedTensor`; returns `[B, sum of the
      columns' dimensions]` float32.

    Example:
        ```python
        fc = tn.feature_column
        layer = tn.layers.EmbeddingFeatures([
            fc.embedding_column(fc.category_column("user_id"), 16),
            fc.embedding_column(fc.category_column("tags", dtype=tf.string), 8)])
        out = layer({"user_id": tf.constant([1, 2]),
                     "tags": tf.constant([["a", "b"], ["c", ""]])})   # [2, 24]
        ```
    """

    def __init__(self, columns: Sequence[fc.EmbeddingColumn],
                 optimizer: Any = None, num_shards: Optional[int] = None,
                 devices: Optional[Sequence[str]] = None,
                 seed: Optional[int] = None,
                 min_count: Optional[float] = None,
                 max_rows: Optional[int] = None,
                 admission_capacity: Optional[int] = None,
                 memory_budget_bytes: Optional[int] = None,
                 storage_dir: Optional[str] = None,
                 row_defaults: Optional[Dict[str, float]] = None, **kwargs):
        super().__init__(**kwargs)
        self._columns = _check_columns(columns, type(self).__name__)
        self._groups = _group_by_table(self._columns)
        self._own_optimizer = optimizer
        self._row_defaults = dict(row_defaults or {})
        self._rule = (self._rows_rule(keras_opt.sparse_rule_of(optimizer))
                      if optimizer is not None else None)
        self._num_shards = num_shards
        self._devices = list(devices) if devices else None
        self._seed = seed
        self.tables: Dict[str, SparseTable] = {}
        self._table_options: Dict[str, Any] = {}
        self.set_table_options(min_count=min_count, max_rows=max_rows,
                               admission_capacity=admission_capacity,
                               memory_budget_bytes=memory_budget_bytes,
                               storage_dir=storage_dir)

    def set_table_options(self, **options) -> None:
        """Lifecycle and tier defaults (min_count, max_rows,
        admission_capacity, memory_budget_bytes, storage_dir) for
        tables not created yet; None leaves an option at the table default.
        Lets a CLI configure the tables of a prebuilt model."""
        unknown = set(options) - {"admission_capacity", *_COLUMN_OPTIONS}
        if unknown:
            raise TypeError(f"layer {self.name!r}: unknown table options "
                            f"{sorted(unknown)}")
        if self.tables and any(v is not None for v in options.values()):
            raise ValueError(
                f"layer {self.name!r}: its tables exist already; set table "
                "options before the model is first called or built")
        self._table_options.update(
            {k: v for k, v in options.items() if v is not None})

    def _options_for(self, cols) -> Dict[str, Any]:
        options = dict(self._table_options)
        for key in _COLUMN_OPTIONS:
            values = {getattr(c, key) for _, c in cols} - {None}
            if values:
                options[key] = values.pop()
        return options
    # --------------------------------------------------------------- config
    @property
    def columns(self) -> List[fc.EmbeddingColumn]:
        """The embedding columns, in output order."""
        return list(self._columns)

    @property
    def output_dim(self) -> int:
        """Width of the output: the sum of the columns' dimensions."""
        return sum(c.dimension for c in self._columns)

    def attach_model_optimizer(self, optimizer) -> None:
        """Called by tn.Model.compile: the model's optimizer becomes this
        layer's in-table rule unless the layer has its own.

        Args:
          optimizer: the model's optimizer (a tnet or stock Keras optimizer).
        """
        if self._own_optimizer is not None:
            return
        rule = self._rows_rule(keras_opt.sparse_rule_of(optimizer))
        changed = [t for t in self.tables.values()
                   if t.optimizer.table_attrs()
                   != _width_rule(rule, t.dim).table_attrs()]
        if changed:
            if any(int(t.size()) for t in self.tables.values()):
                t = changed[0]
                raise ValueError(
                    f"layer {self.name!r}: its tables already hold rows for "
                    f"rule {t.optimizer!r}; cannot switch to "
                    f"{_width_rule(rule, t.dim)!r}. Give the layer its own "
                    "optimizer, or compile before training.")
            self.tables = {}  # empty: recreate with the new rule
        self._rule = rule

    def _rows_rule(self, rule):
        """`rule` with this layer's row defaults (row_defaults)."""
        return rule.with_row_defaults(**self._row_defaults)

    def _rule_or_default(self):
        """The layer's in-table rule: its own or the attached model's, or
        before compile Adagrad's defaults (with the layer's row defaults)."""
        return self._rule or self._rows_rule(
            keras_opt.sparse_rule_of("adagrad"))

    def _table_rule(self, dim: int):
        """The rule a table of rows `dim` wide is created with: the
        layer's, with the width-1 row defaults where they apply."""
        return _width_rule(self._rule_or_default(), dim)

    def _learning_rate_fn(self):
        """The layer's own learning rate as a callable of the step (the
        model optimizer's iterations), if it has its own optimizer: a Keras
        optimizer's current rate, or a sparse rule's rate or schedule."""
        opt = self._own_optimizer
        if opt is None:
            return None
        if isinstance(opt, tf_keras.optimizers.Optimizer):
            return lambda step: opt.learning_rate
        lr = keras_opt.sparse_rule_of(opt).learning_rate
        return (lambda step: lr(step)) if callable(lr) else (lambda step: lr)

    # ---------------------------------------------------------------- build
    def build(self, input_shape=None):
        self._create_tables()
        super().build(input_shape)

    def _create_tables(self) -> None:
        if self.tables:
            return
        # Before a tn.Model compile attaches its optimizer (e.g. when a
        # functional model is built), tables start with Adagrad; compile
        # recreates them, still empty, with the model's rule.
        devices = self._devices or _default_devices(self._num_shards)
        with tf.init_scope():
            for table_name, cols in self._groups.items():
                first = cols[0][1]
                self.tables[table_name] = SparseTable(
                    table_name, first.dimension,
                    self._table_rule(first.dimension),
                    initializer=first.initializer, num_shards=len(devices),
                    devices=devices, seed=self._seed,
                    **self._options_for(cols))

    # ----------------------------------------------------------------- call
    def call(self, features, training=None):
        self._create_tables()
        outputs = _embed(self, features, training, sequence=False)
        if isinstance(outputs, tf.Tensor):  # already [B, sum of dims]
            return outputs
        return tf.concat(outputs, axis=1) if len(outputs) > 1 else outputs[0]

    def compute_output_shape(self, input_shape):
        return tf.TensorShape([None, self.output_dim])

    def get_config(self):
        raise NotImplementedError(
            "tnet layers hold tables: save them with tf.train.Checkpoint or "
            "tn.saving, not as Keras H5/JSON configs")


def _embed(layer, features, training, sequence: bool):
    """Shared by EmbeddingFeatures and SequenceEmbeddingFeatures.

    Per table, one fused lookup for all its columns. Every column whose ids
    are `[B]` or `[B, 1]` (as from `Input(shape=(1,))`) joins one `[B, W]`
    block per id dtype, W the number of such columns: keys, padding mask,
    dedup and combine are a handful of ops for the whole block whatever
    the number of columns, and one `embed_combine` writes every column's
    combined row into its slot of a `[B, C * dim]` output. Ragged and
    sparse ids, `[B, L]` ids padded with -1 / "" (compacted first by
    `fc.padded_to_keys`, so their padding is never keyed or listed) and
    every sequence column go through the general path, which flattens them
    to (key, example) pairs.

    Returns the per-column outputs, or (when one block of one table holds
    every column, in order) the layer's whole [B, sum of dims] output.
    """
    if not isinstance(features, dict):
        raise TypeError(
            f"layer {layer.name!r} expects a dict of features (name -> ids), "
            f"got {type(features).__name__}")
    outputs: List[Any] = [None] * len(layer._columns)
    lr_fn = layer._learning_rate_fn()
    for table_name, cols in layer._groups.items():
        salted = len(cols) > 1
        pieces = None if sequence or serving_active() else _int_pieces(
            layer, features, cols)
        if pieces is not None:
            whole = _fused_outputs(layer.tables[table_name], cols, pieces,
                                   salted, training, lr_fn)
            if len(layer._groups) == 1:
                return whole
            for (index, _), value in zip(cols, _splitter(len(cols))(whole)):
                outputs[index] = value
            continue
        blocks: Dict[bool, list] = {}  # is_string -> [(index, col, ids)]
        sources: Dict[bool, list] = {}  # the blocks' features as given
        general = []
        for index, col in cols:
            ids = _feature(layer, features, col)
            if not sequence and not isinstance(ids, (tf.SparseTensor,
                                                     tf.RaggedTensor)):
                given = ids
                ids = _dense_ids(col.categorical_column, ids)
                if ids.shape[1] != 1:  # padded [B, L]: taken as ragged
                    general.append((index, col, ("padded", given, ids)))
                    continue
                blocks.setdefault(ids.dtype == tf.string, []).append(
                    (index, col, ids))
                cat = col.categorical_column  # keys depend on name and dtype
                sources.setdefault(ids.dtype == tf.string, []).extend(
                    (given, cat.name, cat.dtype.name))
                continue
            general.append((index, col, ids))
        keys, valids, parts = [], [], []
        for is_string, block in blocks.items():
            flat_keys, flat_mask, shape = lookup.traced_once(
                ("block", salted, *sources[is_string]),
                lambda block=block: _block_keys(block, salted))
            keys.append(flat_keys)
            valids.append(flat_mask)
            parts.append(("block", block, shape))
        for index, col, ids in general:
            cat = col.categorical_column
            if sequence:
                k, r, b, p = fc.ids_to_keys(cat, ids, salted=salted,
                                            sequence=True)
                valid = None
            elif isinstance(ids, tuple):  # ("padded", as given, [B, L])
                k, r, b, valid = lookup.traced_once(
                    ("padded", salted, ids[1], cat.name, cat.dtype.name),
                    lambda cat=cat, ids=ids[2]: fc.padded_to_keys(
                        cat, ids, salted=salted))
                p = None
            else:  # padding stays in place, masked (idx -1)
                k, r, b, valid = lookup.traced_once(
                    ("general", salted, ids, cat.name, cat.dtype.name),
                    lambda cat=cat, ids=ids: fc.ids_to_masked_keys(
                        cat, ids, salted=salted))
                p = None
            keys.append(k)
            valids.append(valid)
            parts.append(("general", (index, col), (r, b, p)))
        # Dense blocks beside ragged / sparse pieces: one segment combine
        # for all of the table's columns, in its column order (no concat of
        # the pieces' outputs, no split of their gradient, one dE).
        merged = not sequence and bool(blocks) and bool(general)
        table_rows, indices = lookup.fused_lookup(
            layer.tables[table_name], keys, training, lr_fn, valids,
            split=not merged)
        every_column = list(range(len(outputs)))
        flat = []  # ragged / sparse pieces: (index, col, idx, example, batch)
        wholes = []  # ([column indices], [B, C * dim], split into columns)
        if merged:
            wholes.append(_merged_outputs(table_rows, indices, parts, cols))
        for idx, (kind, what, extra) in ([] if merged
                                         else zip(indices, parts)):
            if kind == "block":
                wholes.append(_block_outputs(table_rows, idx, what, extra))
                continue
            (index, col), (r, b, p) = what, extra
            if sequence:
                outputs[index] = (tf.gather(table_rows, idx), r, b, p)
            else:
                flat.append((index, col, idx, r, b))
        if flat:
            wholes.append(_flat_outputs(table_rows, flat))
        if (len(layer._groups) == 1 and wholes
                and [i for w in wholes for i in w[0]] == every_column):
            # The table's combined blocks already sit in column order: the
            # layer output is them side by side (no per-column split and
            # concat, forward or backward).
            if len(wholes) == 1:
                return wholes[0][1]
            return tf.concat([w for _, w, _ in wholes], axis=1)
        for column_indices, whole, split in wholes:
            for index, value in zip(column_indices, split(whole)):
                outputs[index] = value
    return outputs


def _int_pieces(layer, features, cols):
    """The table's columns as TnetFlattenKeys inputs, or None when one of
    them needs the general path (string ids, a SparseTensor).

    Returns (blocks, general): blocks [(position, col, int64 ids, ids as
    given)] of the [B] / [B, 1] columns; general [(position, col, int64
    values, row_splits, ids as given)] of the ragged columns, and of the
    padded [B, L] ones as rows of L ids. `position` is the column's place
    in the table's columns (its combine slot); the ids as given key the
    traced cache that the wide and deep layers share.
    """
    blocks, general = [], []
    for position, (_, col) in enumerate(cols):
        cat = col.categorical_column
        if cat.dtype == tf.string:
            return None
        ids = _feature(layer, features, col)
        if isinstance(ids, tf.SparseTensor):
            return None
        if isinstance(ids, tf.RaggedTensor):
            values, splits = fc.ragged_parts(cat, ids)
            general.append((position, col, values, splits, ids))
            continue
        given = ids
        ids = fc.check_id_dtype(cat, tf.convert_to_tensor(ids))
        if ids.shape.rank == 1 or (ids.shape.rank == 2 and ids.shape[1] == 1):
            blocks.append((position, col, ids, given))
            continue
        ids = _dense_ids(cat, ids)  # rank checked: [B, L] padded
        shape = tf.shape(ids, out_type=tf.int64)
        splits = tf.range(shape[0] + 1) * shape[1]
        general.append((position, col, tf.reshape(ids, [-1]), splits, given))
    return blocks, general


def _fused_outputs(table, cols, pieces, salted, training, lr_fn):
    """Every column of one table (int ids: [B] / [B, 1], padded, ragged)
    keyed by one TnetFlattenKeys, looked up and combined by one kernel:
    [B, C * dim] in `cols`' order. The same keys, in the same order, and
    the same sums as the per-column ops of the general path, with none of
    their slices, masks and concats. Without ragged or padded columns the
    ids keep their [B, C] places for `embed_combine`; with them the
    padding is dropped and each key carries its example * C + column
    segment for `segment_combine`."""
    blocks, general = pieces
    n = len(cols)
    order = blocks + general
    cats = [p[1].categorical_column for p in order]
    compact = bool(general)
    key = ("flatten", salted, compact, n,
           *(p[0] for p in order),
           *(x for p in blocks for x in (p[3], p[1].categorical_column.name)),
           *(x for p in general for x in (p[4], p[1].categorical_column.name)))
    keys, valid, segments = lookup.traced_once(key, lambda: _ops.tnet_flatten_keys(
        [p[2] for p in blocks], [p[2] for p in general],
        [p[3] for p in general],
        salts=[fc.column_salt(c.name) for c in cats] if salted else [],
        slots=[p[0] for p in order], num_slots=n, compact=compact,
        names=[c.name for c in cats]))
    combiners = [c.combiner for _, c in cols]
    if compact:
        rows, idx = lookup.fused_lookup(table, [keys], training, lr_fn, None,
                                        split=False)
        first = blocks[0][2] if blocks else general[0][3]
        batch = (tf.shape(first, out_type=tf.int64)[0] if blocks
                 else tf.shape(first, out_type=tf.int64)[0] - 1)
        out = lookup.segment_combine(rows, idx, segments, batch * n,
                                     combiners)
        return tf.reshape(out, [-1, n * cols[0][1].dimension])
    rows, idx = lookup.fused_lookup(table, [keys], training, lr_fn, [valid],
                                    split=False)
    return lookup.embed_combine(rows, tf.reshape(idx, [-1, n]),
                                tf.ones([n], tf.int32), combiners)


def _feature(layer, features, col):
    cat = col.categorical_column
    if cat.key not in features:
        raise KeyError(
            f"layer {layer.name!r}: feature {cat.key!r} (column "
            f"{cat.name!r}) is missing from the input; got "
            f"{sorted(features)}")
    ids = features[cat.key]
    if cat.padding in (fc.PADDING_INT, fc.PADDING_STRING):
        return ids  # the lookups' own padding (checked against dtype later)
    # Another padding: swapped to -1 / "" once per traced step (the wide
    # and deep layers of a model share it, as they share the keys).
    return lookup.traced_once(("padding", ids, cat.key, cat.padding),
                              lambda: fc.with_default_padding(cat, ids))


def _dense_ids(cat: fc.CategoryColumn, ids) -> tf.Tensor:
    """A dense id tensor as [B, width] (int64 or string)."""
    ids = fc.check_id_dtype(cat, tf.convert_to_tensor(ids))
    rank = ids.shape.rank
    if rank == 1:
        return ids[:, tf.newaxis]
    if rank != 2:
        raise ValueError(
            f"feature {cat.name!r}: ids must be [batch], [batch, 1] or "
            f"[batch, ids] padded with -1 / \"\" (or ragged / sparse), got "
            f"shape {ids.shape}")
    return ids


def _width_rule(rule, dim: int):
    """A table's rule: the layer's, with the row defaults of width-1 rows
    (sparse.WIDTH1_ROW_DEFAULTS: Adagrad's accumulator floor) where the
    rows are 1 wide and the user did not choose them."""
    if dim != 1:
        return rule
    from tnet.optimizer import sparse  # noqa: PLC0415
    return rule.with_row_defaults(**sparse.WIDTH1_ROW_DEFAULTS)


def _block_keys(block, salted: bool):
    """[B, width] id tensors of several columns -> (keys [B * W], padding
    mask [B * W], [B, W]).

    Keys are computed for the whole block at once; padding (-1 / "") is
    masked: the dedup skips it, so it is never pulled or inserted.
    """
    tensors = [t for _, _, t in block]
    ids = tensors[0] if len(tensors) == 1 else tf.concat(tensors, axis=1)
    mask = fc.not_padding(ids)
    salts = None
    if salted:  # one salt per column, repeated over its width
        salts = tf.constant([fc.column_salt(c.categorical_column.name)
                             for _, c, _ in block], tf.int64)
        if any(t.shape[1] != 1 for t in tensors):
            salts = tf.repeat(salts, _widths(tensors))
        salts = salts[tf.newaxis, :]
    return (tf.reshape(fc.keys_of(ids, salts), [-1]), tf.reshape(mask, [-1]),
            tf.shape(ids))


def _widths(tensors):
    return tf.stack([tf.shape(t, out_type=tf.int32)[1] for t in tensors])


def _block_outputs(table_rows, idx, block, shape):
    """A block's rows combined per column: ([column indices], [B, C * dim],
    a function splitting it into the columns' [B, dim]). idx: the block's
    flat indices into table_rows, -1 at padding (which reads as nothing: an
    all-padding mean or sum is zeros)."""
    widths = _widths([t for _, _, t in block])
    whole = lookup.embed_combine(table_rows, tf.reshape(idx, shape), widths,
                                 [c.combiner for _, c, _ in block])
    return [index for index, _, _ in block], whole, _splitter(len(block))


def _splitter(n):
    if n == 1:
        return lambda whole: [whole]
    return lambda whole: tf.split(whole, n, axis=1, num=n)


def _flat_outputs(table_rows, flat):
    """Ragged / sparse columns of one table combined in one kernel call:
    ([column indices], [B, C * dim], its split into the columns' [B, dim]).
    Entry k of column j goes to segment example * C + j, so the
    [B * C, dim] result is [B, C * dim]."""
    n = len(flat)
    dim = flat[0][1].dimension
    batch = tf.cast(flat[0][4], tf.int64)
    idx = tf.concat([i for _, _, i, _, _ in flat], 0) if n > 1 else flat[0][2]
    segments = [tf.cast(r, tf.int64) * n + j
                for j, (_, _, _, r, _) in enumerate(flat)]
    segments = tf.concat(segments, 0) if n > 1 else segments[0]
    out = lookup.segment_combine(table_rows, idx, segments, batch * n,
                                 [c.combiner for _, c, _, _, _ in flat])
    whole = tf.reshape(out, [-1, n * dim])
    return [index for index, *_ in flat], whole, _splitter(n)


def _merged_outputs(table_rows, idx, parts, cols):
    """Every column of one table, dense blocks and ragged / sparse pieces
    alike, combined by one `segment_combine`: ([column indices], [B, C *
    dim], its split into the columns' [B, dim]). idx: the table's flat
    indices in the order of its pieces' keys (blocks first, row-major).
    An entry of the column at position j (in `cols`' order) of example b
    goes to segment b * C + j, so the [B * C, dim] result is [B, C * dim]
    in `cols`' order, and its gradient is one dE [U, dim]."""
    order = [index for index, _ in cols]
    position = {index: j for j, index in enumerate(order)}
    n = len(order)
    dim = cols[0][1].dimension
    batch, sources = None, []
    for kind, what, extra in parts:
        if kind == "block":  # extra: the block's [B, W] shape
            batch = tf.cast(extra[0], tf.int64)
            sources.append(extra)
        else:
            (index, _), (rows, size, _) = what, extra
            batch = tf.cast(size, tf.int64)
            sources.append(rows)
    key = ("segments", n, *(
        tuple(position[i] for i, _, _ in what) if kind == "block"
        else position[what[0]] for kind, what, _ in parts), *sources)

    def segments():
        pieces = []
        for kind, what, extra in parts:
            if kind == "block":
                tensors = [t for _, _, t in what]
                slot = tf.constant([position[i] for i, _, _ in what],
                                   tf.int64)
                if any(t.shape[1] != 1 for t in tensors):
                    slot = tf.repeat(slot, _widths(tensors))
                first = tf.range(tf.cast(extra[0], tf.int64)) * n
                pieces.append(tf.reshape(first[:, tf.newaxis]
                                         + slot[tf.newaxis, :], [-1]))
            else:
                (index, _), (rows, _, _) = what, extra
                pieces.append(tf.cast(rows, tf.int64) * n + position[index])
        return pieces[0] if len(pieces) == 1 else tf.concat(pieces, 0)

    out = lookup.segment_combine(table_rows, idx,
                                 lookup.traced_once(key, segments), batch * n,
                                 [c.combiner for _, c in cols])
    return order, tf.reshape(out, [-1, n * dim]), _splitter(n)


def _check_columns(columns, layer_type: str) -> List[fc.EmbeddingColumn]:
    columns = list(columns) if columns is not None else []
    if not columns:
        raise ValueError(f"{layer_type} needs at least one embedding_column")
    names = set()
    for col in columns:
        if not isinstance(col, fc.EmbeddingColumn):
            raise TypeError(
                f"{layer_type} takes tn.feature_column.embedding_column(...) "
                f"items, got {type(col).__name__}: {col!r}")
        if col.name in names:
            raise ValueError(f"{layer_type}: column {col.name!r} appears "
                             "twice")
        names.add(col.name)
    return columns


# Table options a column may set (columns sharing a table must agree).
_COLUMN_OPTIONS = ("min_count", "max_rows", "memory_budget_bytes",
                   "storage_dir")


def _group_by_table(columns):
    groups: Dict[str, list] = {}
    for index, col in enumerate(columns):
        groups.setdefault(col.table_name, []).append((index, col))
    for table_name, cols in groups.items():
        dims = {c.dimension for _, c in cols}
        if len(dims) > 1:
            detail = ", ".join(f"{c.categorical_column.name}={c.dimension}"
                               for _, c in cols)
            raise ValueError(
                f"columns sharing table {table_name!r} must have the same "
                f"dimension, got {detail}")
        inits = {repr(c.initializer) for _, c in cols}
        if len(inits) > 1:
            raise ValueError(
                f"columns sharing table {table_name!r} must have the same "
                f"initializer; columns: "
                f"{[c.categorical_column.name for _, c in cols]}")
        for key in _COLUMN_OPTIONS:
            values = {getattr(c, key) for _, c in cols} - {None}
            if len(values) > 1:
                raise ValueError(
                    f"columns sharing table {table_name!r} set different "
                    f"{key} values {sorted(values)}; set it on one column or "
                    "on the layer")
    return groups


def _default_devices(num_shards: Optional[int]):
    """One shard per ps task under ParameterServerStrategy, else local."""
    strategy = tf.distribute.get_strategy() if tf.distribute.has_strategy() else None
    ps = getattr(getattr(strategy, "extended", None), "_num_ps", None)
    if ps:
        count = num_shards or ps
        return [f"/job:ps/task:{i % ps}" for i in range(count)]
    return [None] * (num_shards or 1)
