"""export_for_serving: a SavedModel that serves a tnet model without tnet.

A tnet model reads its embeddings through custom ops on `SparseTable`
resources, which neither TF Serving nor a plain `tf.saved_model.load` can run.
The export therefore replaces every table by stock TensorFlow:

* `keys`: the table's live keys, mixed by a bijective 64-bit function of
  stock bitwise ops and sorted, plus a sentinel; a lookup is one
  `tf.searchsorted` (binary search) and one `tf.gather`.
* `matrix` `[N + 1, dim]`: the rows in key order and an all-zero last row,
  so an unknown id reads zeros exactly as tnet's inference pull does.
  Optionally float16, or int8 with one float32 scale per row
  (`max|w| / 127`); it is dequantized after the gather, so only the rows a
  request touches are ever converted.

Both live in the SavedModel's `variables/` files, not in `saved_model.pb`
(graph constants bloat the graph proto, which protobuf caps at 2 GB). They
are written in slices, bucket by bucket, after the model is saved with
empty placeholders (`serving_table.write_sliced`): the export's memory is
the table plus about one million rows, whatever the table's size, and the
served process holds exactly the payload (8 bytes of key plus the row).
Earlier exports (format 1) used a `MutableHashTable`, which at 200M rows
needed several times the payload to export and to load (BENCHMARKS.md,
"Scale").

The model is then traced as `serve(features) -> {"prediction": ...}` inside
`tnet.scopes.serving_lookups`, which makes every fused lookup call the
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
(`tnet.scopes.serving_active`).

Serving inputs: by default what Keras' `model.save` would infer, the
inputs of the model's first call or fit (`_get_save_spec`). Features the
model read as `tf.SparseTensor` / `tf.RaggedTensor` are served as dense
`[None, None]` tensors padded with their column's padding (-1 or "" unless
`category_column(padding=)` says otherwise) and turned back into the
sparse / ragged form inside the graph, because a signature input that TF
Serving can feed is a plain tensor.

Retrieval models: `export_for_serving(two_tower, dir, candidates=..., k=...)`
embeds the whole candidate corpus at export time and writes a top-K
retriever instead (query features in, {"ids", "scores"} out; only the query
tower's tables are exported). See `tnet.serving.retrieval`.

Distributed training: under ParameterServerStrategy the dense variables
live on ps tasks. `tf.saved_model.save` already writes copies of them
(without device placement, the default `VariablePolicy.NONE`), reading their
values from the ps at save time, so the loaded model owns local variables.
What could still pin the graph to the cluster is a device string on an op;
`op_check.strip_cluster_devices` removes the job/replica/task part of every device in
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
from typing import Any, Dict, Mapping, Optional

import tensorflow as tf

from tnet import scopes
from tnet.serving import deltas
from tnet.serving import outputs as outputs_lib
from tnet.files import (_is_disk_full, publish_dir, space_shortfall,
                        variables_bytes, write_failure)
from tnet.serving.op_check import (ops_of, raise_if_tnet_ops,  # noqa: F401
                                  stock_op_types, strip_cluster_devices,
                                  tnet_ops_in)
from tnet.serving.serving_table import (ServingTable, int8_pays,  # noqa: F401
                                       quantize_int8, write_sliced)
from tnet.serving import updatable as updatable_lib
from tnet.serving.signature import Signature
from tnet.serving.signature import input_signature as input_signature_of
from tnet.table import model_tables

__all__ = ["export_for_serving", "ExportWriteError", "tnet_ops_in",
           "stock_op_types"]

QUANTIZE_MODES = (None, "float16", "int8")
SIGNATURE_KEY = "serving_default"
OUTPUT_KEY = "prediction"
INFO_FILE = deltas.INFO_FILE
SCRATCH_DIR = ".tnet-scratch"  # inside the temporary export dir


def export_for_serving(model, export_dir: str, quantize: Optional[str] = None,
                       input_signature: Optional[Mapping[str, tf.TensorSpec]] = None,
                       candidates: Optional[Mapping[str, Any]] = None,
                       k: int = 100, updatable: bool = False,
                       update_key: Optional[str] = None,
                       update_key_file: Optional[str] = None,
                       rotate_update_key: bool = False,
                       prediction: Optional[str] = None) -> str:
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
        top-K retriever (see `tnet.serving.retrieval`).
      k: with candidates, how many (id, score) pairs a query returns.
      updatable: also write, per table, an overlay of stock TF state and
        the signatures `apply_delta`, `apply_rows` and `serving_version`,
        so deltas published by `tn.serving.publish_delta` can be applied to
        the running model (`python -m tnet.serving.follow`); see
        `tnet.serving.updatable`. `apply_delta` and `apply_rows` require the
        update key (`tnet.serving.update_key`); the export holds only a
        salted SHA-256 of it.
      update_key: with updatable: the key (32 to 1024 printable ASCII
        characters). Default: the newest key of the key file, or a new
        random 256-bit key when there is none.
      update_key_file: where the key is kept on the trainer's side
        (owner-only, 0600, newest key first, the previous one second).
        Default: beside the export's base path, `/models/ranker.update_key`
        for `/models/ranker/1`; never inside the export.
      rotate_update_key: generate a new key for this export (the previous
        one stays second in the key file for replicas still on an older
        base).
      prediction: what the model's output holds, "logits",
        "probabilities" or "values", when tnet cannot tell from the model's
        loss (see `tnet.serving.outputs`).

    Returns the export directory. The SavedModel's "serving_default"
    signature takes the features by name and returns {"prediction": model
    output}, plus the same output named by what it holds ("logits" or
    "probabilities"; a binary model's logits also as "probabilities");
    see `tnet.serving.outputs` and docs/guides/serving-contract.md. A
    retrieval export returns {"ids": [B, k] int64, "scores": [B, k]}.
    `export_info.json` beside `saved_model.pb` lists the outputs, what
    "prediction" holds (`prediction_holds`), the tables (rows, dims,
    bytes) and the quantize mode.

    Example:
        ```python
        tn.serving.export_for_serving(model, "/export/ranker/1")
        tn.serving.export_for_serving(model, "/export/ranker/2", quantize="int8")
        served = tf.saved_model.load("/export/ranker/1")   # no tnet needed
        served.signatures["serving_default"](user_id=tf.constant([3], tf.int64))
        ```
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
    if not updatable and (update_key is not None or update_key_file
                          is not None or rotate_update_key):
        raise ValueError("export_for_serving: update_key, update_key_file "
                         "and rotate_update_key need updatable=True")
    if updatable and (candidates is not None or quantize is not None):
        raise ValueError(
            "export_for_serving(updatable=True) serves float32 embeddings of "
            "a ranking model: drop quantize= and candidates=")
    if candidates is not None:
        from tnet.serving import retrieval as retrieval_lib  # noqa: PLC0415
        retrieval = retrieval_lib.RetrievalExport(model, candidates, k)
        if input_signature is None:
            input_signature = retrieval.input_signature()
    signature = input_signature_of(model, input_signature)
    export_dir = os.path.abspath(os.fspath(export_dir))
    if os.path.exists(export_dir) and (not os.path.isdir(export_dir)
                                       or os.listdir(export_dir)):
        raise FileExistsError(
            f"export_dir {export_dir!r} already exists and is not empty; "
            "export to a new directory (TF Serving loads numbered version "
            "directories: write the next version number)")
    parent = os.path.dirname(export_dir)
    key_record = None
    if updatable:
        from tnet.serving import update_key as keys  # noqa: PLC0415
        key, key_file, keys_before = keys.key_for_export(
            export_dir, update_key, update_key_file, rotate_update_key)
        # Salt and digest, and where the trainer keeps the key (a
        # compaction's new base reads it there); never the key.
        key_record = dict(keys.entry(key), file=key_file)
        del key
    try:
        # Temp dir, fsync, rename (an empty export_dir is replaced); the
        # temp dirs of a killed export of the same version are removed
        # first, before the free space is counted.
        with publish_dir(export_dir) as tmp:
            _check_free_space(model, parent, export_dir, quantize)
            info = _write(model, tmp, quantize, signature, retrieval,
                          key_record, prediction)
            with open(os.path.join(tmp, INFO_FILE), "w") as f:
                json.dump(info, f, indent=2, sort_keys=True)
    except BaseException as e:
        if key_record is not None:
            keys.restore_key_file(key_record["file"], keys_before)
        if isinstance(e, ExportWriteError):
            raise
        if _is_write_failure(e):
            raise ExportWriteError(export_dir, e) from e
        raise
    return export_dir


class ExportWriteError(OSError):
    """The file system refused the export (full disk, permissions, I/O).

    Nothing was left at `export_dir` and no other version in its parent
    directory was touched, so a server keeps serving the previous one.

    Args:
      export_dir: the export directory that was not written.
      error: the file system's error.
      message: the line to show (default: one naming both).

    Example:
        ```python
        try:
            tn.serving.export_for_serving(model, "/models/ranker/2")
        except tn.serving.ExportWriteError as e:
            print(e)     # version 1 is still served
        ```
    """

    def __init__(self, export_dir: str, error: BaseException,
                 message: Optional[str] = None):
        code = errno.ENOSPC
        if message is None:
            message, code = write_failure(
                f"the export {export_dir}", os.path.dirname(export_dir),
                error, "export to another directory")
            message += (" Nothing was left at the export directory; other "
                        "versions beside it are untouched.")
        super().__init__(code, message)
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


def _check_free_space(model, parent: str, export_dir: str,
                      quantize: Optional[str]) -> None:
    """Refuses an export that cannot fit, before writing anything.

    The estimate is what the SavedModel's variables hold: per row the
    8-byte key and the weights in the export's dtype, plus the dense
    variables (the graph is small), plus the largest table's spilled rows
    (key + float32 weights), which sit beside the export while it is
    written. A disk that fills during the write still ends in
    ExportWriteError.
    """
    width = {None: 4, "float16": 2, "int8": 1}[quantize]
    need = 1 << 20
    spill = 0
    for table in getattr(model, "tables", dict)().values():
        extra = 4 if quantize == "int8" else 0
        rows = int(table.size())
        need += rows * (8 + table.dim * width + extra)
        spill = max(spill, rows * (8 + 4 * table.dim))
    need += spill
    need += variables_bytes(getattr(model, "variables", []))
    short = space_shortfall(f"the export {export_dir}", need, parent,
                            "export to another directory")
    if short:
        raise ExportWriteError(export_dir, None, f"{short} Nothing was written.")


def _write(model, path: str, quantize: Optional[str],
           signature: "Signature", retrieval=None,
           key_record: Optional[Dict[str, str]] = None,
           prediction: Optional[str] = None) -> Dict[str, Any]:
    updatable = key_record is not None
    tables = model_tables(model, "export_for_serving", nonempty=True)
    kind, binary = outputs_lib.prediction_kind(model, prediction)
    if kind == outputs_lib.UNKNOWN and retrieval is None:
        outputs_lib.log_unknown(model)
    if retrieval is not None:
        # The candidate side is precomputed: only the query's tables serve.
        tables = retrieval.query_tables(tables)
    module = tf.Module(name="tnet_serving")
    # tf.device(None) clears any caller's device scope while the export's
    # tables and variables are created and the model is traced. (The saver
    # re-creates resources from their own `device=` argument, which is
    # unset here, and writes no variable devices; see also
    # op_check.strip_cluster_devices.)
    with tf.device(None):
        # Placeholders: the weights are written after the save, bucket by
        # bucket (serving_table.write_sliced), never all in memory.
        serving = {name: ServingTable(name, tables[name].dim, quantize)
                   for name in sorted(tables)}
        if updatable:
            for t in serving.values():
                t.make_updatable()
        module.tables = serving
        module.streamed_variables = [v for name in sorted(serving)
                                     for v in serving[name].placeholders()]
        overrides = {tables[n]: serving[n].lookup for n in serving}

        def serve(features):
            output = model(signature.model_inputs(features), training=False)
            return outputs_lib.serving_outputs(output, kind, binary)

        if retrieval is not None:
            module.retrieval = retrieval.build_index()
            serve = retrieval.serve_fn(module.retrieval)

        with scopes.serving_lookups(overrides):
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
    raise_if_tnet_ops(ops_of(concrete.graph.as_graph_def()), "traced")
    own = {id(v) for t in serving.values() for v in t.variables}
    if retrieval is not None:
        own |= {id(v) for v in module.retrieval.variables}
    dense = [v for v in concrete.variables if id(v) not in own]
    # Tracked in a list, not through the Keras model: see the module doc.
    module.dense_variables = dense
    signatures = {SIGNATURE_KEY: concrete}
    fresh_info = None
    if updatable:
        with tf.device(None):
            extra, fresh_info = updatable_lib.updatable_signatures(
                module, serving, dense, model, key_record)
        for name, fn in extra.items():
            raise_if_tnet_ops(ops_of(fn.graph.as_graph_def()), name)
        signatures.update(extra)
    tf.saved_model.save(module, path, signatures=signatures)
    scratch = os.path.join(path, SCRATCH_DIR)
    write_sliced(path, module, [(serving[n], tables[n]) for n in
                                sorted(serving)], scratch)
    shutil.rmtree(scratch)
    strip_cluster_devices(path)
    raise_if_tnet_ops(tnet_ops_in(path), "saved")
    entries = {}
    for name, table in serving.items():
        entries[name] = {"rows": table.rows, "dim": table.dim,
                         "dtype": table.weight_dtype,
                         **table.payload_bytes()}
    return {
        "format": 2,  # 2: sorted mixed keys + searchsorted (1: hash table)
        "quantize": quantize,
        "signature": SIGNATURE_KEY,
        "inputs": {n: {"dtype": s.dtype.name, "shape": s.shape.as_list()}
                   for n, s in sorted(signature.specs.items())},
        "padded_inputs": sorted(signature.converters),
        "outputs": sorted(concrete.structured_outputs),
        **({} if retrieval is not None else {"prediction_holds": kind}),
        **({} if retrieval is None else {"retrieval": retrieval.info()}),
        **({} if fresh_info is None else {"updatable": fresh_info}),
        "tables": entries,
        "dense_variables": len(dense),
        "dense_bytes": int(sum(v.shape.num_elements() * v.dtype.size
                               for v in dense)),
        "saved_model_bytes": _dir_bytes(path),
    }


def _dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f))
               for d, _, files in os.walk(path) for f in files)
