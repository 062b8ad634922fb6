"""export_for_serving: a SavedModel that serves a tnet model without tnet.

A tnet model reads its embeddings through custom ops on `SparseTable`
resources, which neither TF Serving nor a plain `tf.saved_model.load` can run.
The export therefore replaces every table by stock TensorFlow:

* `keys -> row index`: a `tf.lookup.experimental.MutableHashTable` (int64 ->
  int64) holding the table's live keys, with default value N (the number of
  live rows) for unknown keys.
* `row index -> weights`: an embedding matrix `[N + 1, dim]` whose last row
  is all zeros, so an unknown id reads zeros exactly as tnet's inference pull
  does. Optionally stored as float16, or as int8 with one float32 scale per
  row (`max|w| / 127`); it is dequantized after the gather, so only the rows
  a request touches are ever converted.

Both live in the SavedModel's `variables/` files, not in `saved_model.pb`: a
production table has 10M+ rows, and graph constants (what a `StaticHashTable`
with a `KeyValueTensorInitializer` or a constant matrix would become) bloat
the graph proto, which protobuf caps at 2 GB, and every loader parses it.
`MutableHashTable` saves its contents through the checkpoint like a variable.
`DenseHashTable` would too, but it rejects a lookup of its reserved
`empty_key` / `deleted_key` with an error, so one request carrying that id
would fail; `MutableHashTable` has no reserved key.

The model is then traced as `serve(features) -> {"prediction": ...}` inside
`tnet.layers.lookup.serving_lookups`, which makes every fused lookup call the
stock lookup instead of the table op. Everything before the lookup (string
fingerprints, per-column salts, padding removal) is already stock TF, so
serving computes exactly the keys training did.

What is saved is a bare `tf.Module`, not the Keras model: the Keras model
tracks its `SparseTable` resources (whose saving needs tnet's ops) and its
optimizer and metrics, none of which serving needs. The module tracks the
stock lookups and the dense variables the traced function reads, and
nothing else. Before and after saving, every op type in the graph and in
every function body is checked against the ops a Python process that
never imports tnet has registered (`stock_op_types`): anything else fails
the export, and nothing is left at `export_dir`. Multi-valued combiners
trace to stock ops while the serving override is active
(`lookup.serving_active`).

Serving inputs: by default what Keras' `model.save` would infer, the
inputs of the model's first call or fit (`_get_save_spec`). Features the
model read as `tf.SparseTensor` / `tf.RaggedTensor` are served as dense
`[None, None]` tensors padded with -1 (or "") and turned back into the
sparse / ragged form inside the graph, because a signature input that TF
Serving can feed is a plain tensor.

Retrieval models: `export_for_serving(two_tower, dir, candidates=..., k=...)`
embeds the whole candidate corpus at export time and writes a top-K
retriever instead (query features in, {"ids", "scores"} out; only the query
tower's tables are exported). See `tnet.saving.retrieval`.

Distributed training: under ParameterServerStrategy the dense variables
live on ps tasks. `tf.saved_model.save` already writes copies of them
(without device placement, the default `VariablePolicy.NONE`), reading their
values from the ps at save time, so the loaded model owns local variables.
What could still pin the graph to the cluster is a device string on an op;
`_strip_cluster_devices` removes the job/replica/task part of every device in
the saved graph (keeping e.g. "/device:CPU:0"), so the export loads in a
process that has no cluster. Call `export_for_serving` outside
`strategy.scope()`: inside it the export's own variables would be created on
ps tasks.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Dict, Mapping, Optional

import numpy as np
import tensorflow as tf

from tnet.layers import lookup
from tnet.table import SparseTable

__all__ = ["export_for_serving", "ExportWriteError", "tnet_ops_in",
           "stock_op_types"]

QUANTIZE_MODES = (None, "float16", "int8")
SIGNATURE_KEY = "serving_default"
OUTPUT_KEY = "prediction"
INFO_FILE = "export_info.json"
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


def export_for_serving(model, export_dir: str, quantize: Optional[str] = None,
                       input_signature: Optional[Mapping[str, tf.TensorSpec]] = None,
                       candidates: Optional[Mapping[str, Any]] = None,
                       k: int = 100) -> str:
    """Writes `model` as a SavedModel that stock TensorFlow serves.

    Args:
      model: a `tn.Model` (or any Keras model whose tnet layers are reachable
        through `tables()`), called as `model(features, training=False)`.
      export_dir: where the SavedModel goes (for TF Serving, a numbered
        version directory such as `.../my_model/3`). It must not exist or be
        empty: the export is written to a temporary sibling and renamed into
        place, so a reader never sees half an export.
      quantize: None (float32 embeddings), "float16", or "int8" (per-row
        scale; tables narrower than 5 use float16, see `int8_pays`). Only
        embeddings are quantized; dense variables stay float32.
      input_signature: {feature name: tf.TensorSpec}, to override the
        inferred one. Default: the inputs the model was first called or fit
        with (as Keras' `model.save` infers them), sparse / ragged id
        features as `[None, None]` tensors padded with -1 / ""; for a
        `tn.models.CTRModel` never called, one `[None]` tensor per feature.

      candidates: for a retrieval model (`tn.models.TwoTower`): the
        candidate features of the whole corpus ({name: array [N, ...]}, ids
        included). They are embedded here, once, and the export becomes a
        top-K retriever (see `tnet.saving.retrieval`).
      k: with candidates, how many (id, score) pairs a query returns.

    Returns the export directory. The SavedModel's "serving_default"
    signature takes the features by name and returns {"prediction": model
    output} (a retrieval export: {"ids": [B, k] int64, "scores": [B, k]}). `export_info.json` beside `saved_model.pb` lists the tables
    (rows, dims, bytes) and the quantize mode.
    """
    if quantize not in QUANTIZE_MODES:
        raise ValueError(f"quantize must be one of {QUANTIZE_MODES}, got "
                         f"{quantize!r}")
    if tf.distribute.has_strategy():
        raise RuntimeError(
            "export_for_serving was called inside a distribution strategy "
            "scope; call it outside `strategy.scope()` so the export's "
            "variables are created locally, not on ps tasks")
    retrieval = None
    if candidates is not None:
        from tnet.saving import retrieval as retrieval_lib  # noqa: PLC0415
        retrieval = retrieval_lib.RetrievalExport(model, candidates, k)
        if input_signature is None:
            input_signature = retrieval.input_signature()
    signature = _input_signature(model, input_signature)
    export_dir = os.path.abspath(os.fspath(export_dir))
    if os.path.exists(export_dir) and (not os.path.isdir(export_dir)
                                       or os.listdir(export_dir)):
        raise FileExistsError(
            f"export_dir {export_dir!r} already exists and is not empty; "
            "export to a new directory (TF Serving loads numbered version "
            "directories: write the next version number)")
    parent = os.path.dirname(export_dir)
    os.makedirs(parent, exist_ok=True)
    prefix = f".{os.path.basename(export_dir)}.tmp-"
    _remove_stale_temps(parent, prefix)
    _check_free_space(model, parent, export_dir, quantize)
    tmp = tempfile.mkdtemp(prefix=prefix, dir=parent)
    try:
        info = _write(model, tmp, quantize, signature, retrieval)
        with open(os.path.join(tmp, INFO_FILE), "w") as f:
            json.dump(info, f, indent=2, sort_keys=True)
        _fsync_tree(tmp)
        if os.path.isdir(export_dir):
            os.rmdir(export_dir)  # empty, checked above
        os.rename(tmp, export_dir)
        _fsync_dir(parent)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if _is_write_failure(e):
            raise ExportWriteError(export_dir, e) from e
        raise
    return export_dir


class ExportWriteError(OSError):
    """The file system refused the export (full disk, permissions, I/O).

    Nothing was left at `export_dir` and no other version in its parent
    directory was touched, so a server keeps serving the previous one.
    """

    def __init__(self, export_dir: str, error: BaseException,
                 message: Optional[str] = None):
        full = _is_disk_full(error) if error is not None else True
        if message is None:
            text = (str(error).strip().splitlines() or [repr(error)])[0][:500]
            free = _free_bytes(os.path.dirname(export_dir))
            message = (
                f"could not write the export {export_dir}: "
                f"{type(error).__name__}: {text}."
                + (f" The file system of {os.path.dirname(export_dir)} is "
                   f"full ({free:,} bytes free): free space or export to "
                   "another directory." if full and free is not None else "")
                + " Nothing was left at the export directory; other "
                "versions beside it are untouched.")
        super().__init__(errno.ENOSPC if full else getattr(error, "errno",
                                                           None), message)
        self.export_dir = export_dir

    def __str__(self) -> str:
        return self.strerror


def _is_write_failure(error: BaseException) -> bool:
    if isinstance(error, OSError) and not isinstance(error,
                                                     FileExistsError):
        return True
    text = str(error).lower()
    return _is_disk_full(error) or "read-only file system" in text or (
        "permission denied" in text)


def _is_disk_full(error: BaseException) -> bool:
    text = str(error).lower()
    return (getattr(error, "errno", None) == errno.ENOSPC
            or "no space left" in text or "errno = 28" in text
            or "resource exhausted" in text and "space" in text)


def _free_bytes(path: str) -> Optional[int]:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def _check_free_space(model, parent: str, export_dir: str,
                      quantize: Optional[str]) -> None:
    """Refuses an export that cannot fit, before writing anything.

    The estimate is what the SavedModel's variables hold: per row the key
    and row number of the hash table (12 bytes) and the weights in the
    export's dtype, plus the dense variables; the graph is small. A disk
    that fills during the write still ends in ExportWriteError.
    """
    width = {None: 4, "float16": 2, "int8": 1}[quantize]
    need = 1 << 20
    for table in getattr(model, "tables", dict)().values():
        extra = 4 if quantize == "int8" else 0
        need += int(table.size()) * (12 + table.dim * width + extra)
    for v in getattr(model, "variables", []):
        need += int(np.prod(v.shape)) * v.dtype.size
    free = _free_bytes(parent)
    if free is not None and free < need:
        raise ExportWriteError(export_dir, None, (
            f"could not write the export {export_dir}: it needs about "
            f"{need:,} bytes and the file system of {parent} has {free:,} "
            "bytes free: free space or export to another directory. Nothing "
            "was written."))


def _remove_stale_temps(parent: str, prefix: str) -> None:
    """Temp dirs of this same export left by a killed process.

    (They never look like a version to TF Serving, which only loads
    numeric directory names, but they hold space.)
    """
    for name in os.listdir(parent):
        if name.startswith(prefix):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def _fsync_tree(path: str) -> None:
    """Flushes every file of the export before the rename publishes it,
    so a power loss cannot leave a visible version with missing bytes."""
    for root, _, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(root)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write(model, path: str, quantize: Optional[str],
           signature: "Signature", retrieval=None
           ) -> Dict[str, Any]:
    tables = _model_tables(model)
    if retrieval is not None:
        # The candidate side is precomputed: only the query's tables serve.
        tables = retrieval.query_tables(tables)
    module = tf.Module(name="tnet_serving")
    # tf.device(None) clears any caller's device scope while the export's
    # tables and variables are created and the model is traced. (The saver
    # re-creates resources from their own `device=` argument, which is
    # unset here, and writes no variable devices; see also
    # _strip_cluster_devices.)
    with tf.device(None):
        serving = {}
        for name in sorted(tables):
            keys, padded = _export_weights(tables[name])
            serving[name] = ServingTable(name, _unique_keys(name, keys),
                                         padded, quantize)
            del keys, padded
        module.tables = serving
        overrides = {tables[n]: serving[n].lookup for n in serving}

        def serve(features):
            prediction = model(signature.model_inputs(features),
                               training=False)
            return {OUTPUT_KEY: tf.identity(prediction, name=OUTPUT_KEY)}

        if retrieval is not None:
            module.retrieval = retrieval.build_index()
            serve = retrieval.serve_fn(module.retrieval)

        with lookup.serving_lookups(overrides):
            try:
                concrete = tf.function(
                    serve, input_signature=[signature.specs],
                    autograph=False).get_concrete_function()
            except KeyError as e:
                raise ValueError(
                    f"export_for_serving: the serving inputs "
                    f"{sorted(signature.specs)} lack a feature the model "
                    f"reads: {e.args[0] if e.args else e}. Add it to "
                    "input_signature (or omit input_signature after fitting "
                    "or calling the model once, to infer it)") from e
    # Checked before saving too: the saver would otherwise fail first, with
    # an obscure "untracked resource" error about the table's handle.
    _raise_if_tnet_ops(_ops_of(concrete.graph.as_graph_def()), "traced")
    own = {id(v) for t in serving.values() for v in t.variables}
    if retrieval is not None:
        own |= {id(v) for v in module.retrieval.variables}
    dense = [v for v in concrete.variables if id(v) not in own]
    # Tracked in a list, not through the Keras model: see the module doc.
    module.dense_variables = dense
    tf.saved_model.save(module, path,
                        signatures={SIGNATURE_KEY: concrete})
    _strip_cluster_devices(path)
    _raise_if_tnet_ops(tnet_ops_in(path), "saved")
    entries = {}
    for name, table in serving.items():
        entries[name] = {"rows": table.rows, "dim": table.dim,
                         "dtype": table.matrix.dtype.name,
                         **table.payload_bytes()}
    return {
        "format": 1,
        "quantize": quantize,
        "signature": SIGNATURE_KEY,
        "inputs": {n: {"dtype": s.dtype.name, "shape": s.shape.as_list()}
                   for n, s in sorted(signature.specs.items())},
        "padded_inputs": sorted(signature.converters),
        "outputs": ([OUTPUT_KEY] if retrieval is None
                    else list(retrieval.OUTPUT_KEYS)),
        **({} if retrieval is None else {"retrieval": retrieval.info()}),
        "tables": entries,
        "dense_variables": len(dense),
        "dense_bytes": int(sum(v.shape.num_elements() * v.dtype.size
                               for v in dense)),
        "saved_model_bytes": _dir_bytes(path),
    }


def _model_tables(model) -> Dict[str, SparseTable]:
    if not hasattr(model, "tables"):
        raise TypeError(
            f"export_for_serving needs a tn.Model (with tables()), got "
            f"{type(model).__name__}")
    tables = model.tables()
    if not tables:
        raise ValueError(
            f"{type(model).__name__} has no tnet tables; build the model "
            "(call or fit it once) before exporting, or save a model without "
            "tnet layers with tf.saved_model.save")
    return tables


def _export_weights(table: SparseTable, chunk_rows: int = 1 << 18):
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


def _unique_keys(name: str, keys: np.ndarray) -> np.ndarray:
    if np.unique(keys).size != keys.size:
        raise RuntimeError(f"table {name!r} exported duplicate keys; its "
                           "shards disagree on key ownership")
    return keys


def _input_signature(model, signature) -> "Signature":
    """The serving inputs: the caller's, else what Keras' `model.save` would
    infer (the inputs of the model's first call or fit), else, for a
    `tn.models.CTRModel`, one `[None]` tensor per feature it names."""
    if signature is None:
        return _inferred_signature(model)
    if not isinstance(signature, Mapping) or not signature:
        raise TypeError("input_signature must be a non-empty dict of feature "
                        f"name -> tf.TensorSpec, got {signature!r}")
    specs = {}
    for name, spec in signature.items():
        if not isinstance(spec, tf.TensorSpec):
            raise TypeError(
                f"input_signature[{name!r}] must be a tf.TensorSpec, got "
                f"{spec!r}; sparse and ragged ids are served as a dense "
                f"[None, None] tensor padded with -1 (or \"\" for strings)")
        specs[name] = spec
    return Signature(specs, {}, None)


class Signature:
    """What serving_default takes and how it becomes the model's input.

    specs: {name: TensorSpec} of the signature. A feature the model read
    as a `tf.SparseTensor` or `tf.RaggedTensor` is served as a dense
    `[None, None]` tensor padded with -1 / "" (what a TF Serving client can
    send: a signature input is a plain tensor) and rebuilt in the graph
    with stock ops (`converters`). structure: None (the model takes the
    dict) or the list of names a functional model takes positionally.
    """

    def __init__(self, specs, converters, structure):
        # The spec's name becomes the signature's input name.
        self.specs = {n: tf.TensorSpec(s.shape, s.dtype, name=n)
                      for n, s in specs.items()}
        self.converters = converters
        self.structure = structure

    def model_inputs(self, features):
        features = {n: self.converters.get(n, _identity)(t)
                    for n, t in features.items()}
        if self.structure is None:
            return features
        inputs = [features[n] for n in self.structure]
        return inputs[0] if len(inputs) == 1 else inputs


def _identity(t):
    return t


def _inferred_signature(model) -> Signature:
    spec = None
    get_spec = getattr(model, "_get_save_spec", None)
    if get_spec is not None:
        spec = get_spec(dynamic_batch=True, inputs_only=True)
    if spec is None:
        return _ctr_model_signature(model)
    structure = None
    if not isinstance(spec, Mapping):
        names = list(getattr(model, "input_names", None) or [])
        flat = tf.nest.flatten(spec, expand_composites=False)
        if len(names) != len(flat):
            raise ValueError(
                f"export_for_serving cannot name the inputs of "
                f"{type(model).__name__} (it takes {len(flat)} unnamed "
                "tensors); pass input_signature={name: tf.TensorSpec(...)} "
                "or give the model a dict of named inputs")
        structure, spec = names, dict(zip(names, flat))
    specs, converters = {}, {}
    for name, s in spec.items():
        if isinstance(s, (tf.SparseTensorSpec, tf.RaggedTensorSpec)):
            if s.shape.rank != 2:
                raise ValueError(
                    f"export_for_serving: feature {name!r} is a {s}; only "
                    "[batch, ids] sparse / ragged features can be served. "
                    "Pass input_signature to choose the serving input.")
            specs[name] = tf.TensorSpec([None, None], s.dtype)
            converters[name] = _PaddedTo(
                "sparse" if isinstance(s, tf.SparseTensorSpec) else "ragged")
        elif isinstance(s, tf.TensorSpec):
            specs[name] = s
        else:
            raise ValueError(
                f"export_for_serving: cannot serve feature {name!r} of type "
                f"{type(s).__name__}; pass input_signature")
    return Signature(specs, converters, structure)


class _PaddedTo:
    """Padded dense ids [B, L] (-1 / "") -> the SparseTensor or
    RaggedTensor the model was trained on, with stock ops only."""

    def __init__(self, kind: str):
        self.kind = kind

    def __call__(self, ids):
        pad = "" if ids.dtype == tf.string else tf.constant(-1, ids.dtype)
        ragged = tf.ragged.boolean_mask(ids, tf.not_equal(ids, pad))
        # Sparse: values left-aligned per row, as tf.Example VarLen parsing
        # gives them.
        return ragged if self.kind == "ragged" else ragged.to_sparse()


def _ctr_model_signature(model) -> Signature:
    categorical = getattr(model, "categorical", None)
    columns = getattr(model, "category_columns", None)
    dense = getattr(model, "dense_names", None)
    if categorical is None or columns is None or dense is None:
        raise ValueError(
            f"export_for_serving cannot infer the input features of "
            f"{type(model).__name__}: it has not been called or fit yet. Fit "
            "or call it once on a batch (as Keras' model.save needs), or "
            "pass input_signature={name: tf.TensorSpec([None], dtype), ...} "
            "with one entry per feature the model reads")
    specs = {c.key: tf.TensorSpec([None], c.dtype) for c in columns}
    specs.update({n: tf.TensorSpec([None], tf.float32) for n in dense})
    return Signature(specs, {}, None)


def _nodes_of(graph_def):
    """(where, NodeDef) for a GraphDef's nodes and its function bodies."""
    nodes = [("graph", n) for n in graph_def.node]
    for fn in graph_def.library.function:
        nodes += [(fn.signature.name, n) for n in fn.node_def]
    return nodes


def _saved_graph_nodes(path: str):
    """The SavedModel proto of `path` and (where, NodeDef) for all its nodes."""
    from tensorflow.core.protobuf import saved_model_pb2
    proto = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        proto.ParseFromString(f.read())
    nodes = []
    for meta in proto.meta_graphs:
        nodes += _nodes_of(meta.graph_def)
    return proto, nodes


def _ops_of(graph_def) -> Dict[str, list]:
    functions = {f.signature.name for f in graph_def.library.function}
    return _foreign_ops(_nodes_of(graph_def), functions)


_STOCK_OPS_SCRIPT = r"""
import json
from tensorflow.core.framework import op_def_pb2
from tensorflow.python.client import pywrap_tf_session as c_api
ops = op_def_pb2.OpList()
ops.ParseFromString(c_api.TF_GetBuffer(c_api.TF_GetAllOpList()))
print(json.dumps(sorted(o.name for o in ops.op)))
"""
_STOCK_OPS: Optional[frozenset] = None


def stock_op_types() -> frozenset:
    """Op types registered in a Python process that imports TensorFlow and
    never imports tnet (computed once per process, in a subprocess).

    This, not a name pattern, decides what a serving graph may hold: a
    SavedModel op outside this set would not load in TF Serving or in a
    plain `tf.saved_model.load` (a name-prefix check once let `TnetSumRows`
    through).
    """
    global _STOCK_OPS
    if _STOCK_OPS is None:
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        env["TF_CPP_MIN_LOG_LEVEL"] = "3"
        done = subprocess.run([sys.executable, "-c", _STOCK_OPS_SCRIPT],
                              capture_output=True, text=True, env=env,
                              cwd=tempfile.gettempdir(), timeout=600)
        if done.returncode != 0:
            raise RuntimeError(
                "export_for_serving: could not list TensorFlow's stock ops "
                f"in a fresh process (exit {done.returncode}): "
                f"{done.stderr[-2000:]}")
        _STOCK_OPS = frozenset(json.loads(done.stdout.strip().splitlines()[-1]))
    return _STOCK_OPS


def _foreign_ops(nodes, functions) -> Dict[str, list]:
    """{op type: [where]} of ops that are neither stock nor functions."""
    stock = stock_op_types()
    found: Dict[str, list] = {}
    for where, node in nodes:
        if node.op not in stock and node.op not in functions:
            found.setdefault(node.op, []).append(where)
    return found


def tnet_ops_in(path: str) -> Dict[str, list]:
    """{op type: [graph or function names]} of the ops in a SavedModel that
    a process without tnet has not registered (tnet's custom ops or any
    other); every function body of saved_model.pb is scanned."""
    proto, nodes = _saved_graph_nodes(path)
    functions = {f.signature.name for m in proto.meta_graphs
                 for f in m.graph_def.library.function}
    return _foreign_ops(nodes, functions)


def _raise_if_tnet_ops(found: Dict[str, list], what: str) -> None:
    if found:
        raise RuntimeError(
            f"export_for_serving: the {what} serving graph contains ops "
            f"{sorted(found)} that stock TensorFlow (a process without tnet) "
            "does not register, so it could not load in TF Serving. A lookup "
            "bypassed tnet.layers.lookup.fused_lookup (which honours the "
            "serving override), one of its tables is not in model.tables(), "
            "or the model calls a custom op of its own. Nothing was written "
            "to the export directory.")


def _strip_cluster_devices(path: str) -> None:
    """Drops job/replica/task from every device string in saved_model.pb.

    A device such as "/job:ps/task:0/device:CPU:0" (an op traced next to a
    variable on a ps task) names a cluster that a serving process does not
    have; "/device:CPU:0" is valid anywhere.
    """
    proto, nodes = _saved_graph_nodes(path)
    changed = False
    for _, node in nodes:
        if node.device:
            local = _local_device(node.device)
            if local != node.device:
                node.device = local
                changed = True
    for obj in (o for m in proto.meta_graphs
                for o in m.object_graph_def.nodes):
        if obj.HasField("variable") and obj.variable.device:
            obj.variable.device = _local_device(obj.variable.device)
            changed = True
    if changed:
        with open(os.path.join(path, "saved_model.pb"), "wb") as f:
            f.write(proto.SerializeToString())


def _local_device(device: str) -> str:
    spec = tf.DeviceSpec.from_string(device)
    return spec.replace(job=None, replica=None, task=None).to_string()


def _module_name(name: str) -> str:
    cleaned = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return cleaned if cleaned[:1].isalpha() else f"t_{cleaned}"


def _dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f))
               for d, _, files in os.walk(path) for f in files)
