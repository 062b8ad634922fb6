"""Loads libtnet_ops.so and exposes the raw op wrappers.

Every process that runs a tnet op (the chief, each worker and each ps task)
must load the library before it starts a tf.distribute.Server, or graphs
that reach it fail with "Op type not registered".
"""
from __future__ import annotations

import pathlib

import tensorflow as tf

_LIB_PATH = pathlib.Path(__file__).resolve().parent / "_lib" / "libtnet_ops.so"


def _load():
    if not _LIB_PATH.exists():
        raise ImportError(
            f"tnet's op library is missing ({_LIB_PATH}). Build it with "
            "`make build` (or `pip install -e . --no-build-isolation`) in the "
            "tnet checkout.")
    try:
        return tf.load_op_library(str(_LIB_PATH))
    except tf.errors.NotFoundError as e:
        raise ImportError(
            f"tnet's op library {_LIB_PATH} does not load into TensorFlow "
            f"{tf.__version__} ({e}). It was probably built against another "
            "TensorFlow: rebuild with `make build`.") from e


ops = _load()
library_path = str(_LIB_PATH)

sparse_table_handle = ops.sparse_table_handle
sparse_table_pull = ops.sparse_table_pull
sparse_table_push = ops.sparse_table_push
sparse_table_size = ops.sparse_table_size
sparse_table_memory_bytes = ops.sparse_table_memory_bytes
sparse_table_export = ops.sparse_table_export
sparse_table_export_since = ops.sparse_table_export_since
sparse_table_mark_changes = ops.sparse_table_mark_changes
sparse_table_changes = ops.sparse_table_changes
sparse_table_import = ops.sparse_table_import
sparse_table_evict = ops.sparse_table_evict
sparse_table_stats = ops.sparse_table_stats
sparse_table_export_pending = ops.sparse_table_export_pending
sparse_table_import_pending = ops.sparse_table_import_pending
tnet_sum_rows = ops.tnet_sum_rows
tnet_unique = ops.tnet_unique
tnet_decode_id_lists = ops.tnet_decode_id_lists
tnet_embed_combine = ops.tnet_embed_combine
tnet_embed_combine_grad = ops.tnet_embed_combine_grad
tnet_segment_combine = ops.tnet_segment_combine
tnet_segment_combine_grad = ops.tnet_segment_combine_grad
tnet_sparse_rule_slots = ops.tnet_sparse_rule_slots
