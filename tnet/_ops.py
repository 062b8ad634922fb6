"""Loads libtnet_ops.so and exposes the raw op wrappers.

Every process that runs a tnet op (the chief, each worker and each ps task)
must load the library before it starts a tf.distribute.Server, or graphs
that reach it fail with "Op type not registered".
"""
from __future__ import annotations

import json
import pathlib
import sys

import tensorflow as tf

_LIB_DIR = pathlib.Path(__file__).resolve().parent / "_lib"
_LIB_PATH = _LIB_DIR / "libtnet_ops.so"
_BUILD_INFO = _LIB_DIR / "build_info.json"  # written by setup.py's build
_REBUILD = ("rebuild tnet against the installed TensorFlow (`make build` in a "
            "checkout, or `make wheel` and install that wheel), or install "
            "the TensorFlow it was built for")


def built_for() -> str | None:
    """The TensorFlow version the op library was built against (from
    build_info.json beside it), or None if that is not recorded."""
    try:
        return json.loads(_BUILD_INFO.read_text())["tensorflow"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


class OpLibraryError(ImportError):
    """tnet's op library is missing or was built for another TensorFlow."""


def _one_line_hook(previous):
    """If an OpLibraryError ends the program uncaught, it prints as one
    line (what and how to rebuild), not a traceback into the import."""
    def hook(kind, value, tb):
        if isinstance(value, OpLibraryError):
            print(f"ImportError: {value}", file=sys.stderr, flush=True)
            return
        previous(kind, value, tb)
    return hook


def _load():
    try:
        return _load_checked()
    except OpLibraryError:
        sys.excepthook = _one_line_hook(sys.excepthook)
        raise


def _load_checked():
    """Why check first: a library built against another TensorFlow fails
    to load with an undefined C++ symbol, or loads and crashes later; the
    recorded version turns that into one line saying what to do."""
    built = built_for()
    if not _LIB_PATH.exists():
        raise OpLibraryError(
            f"tnet's op library is missing ({_LIB_PATH}"
            + (f"; built for TensorFlow {built}" if built else "")
            + "): build it with `make build` in the tnet checkout (or "
            "`make wheel` and install that wheel).")
    # No record (a library built before it was kept): loaded as is; a
    # mismatch then shows as the load failure below.
    if built is not None and built != tf.__version__:
        raise OpLibraryError(
            f"tnet's op library was built for TensorFlow {built}, but "
            f"TensorFlow {tf.__version__} is installed: {_REBUILD} "
            f"(`pip install tensorflow=={built}`).")
    try:
        return tf.load_op_library(str(_LIB_PATH))
    except tf.errors.NotFoundError as e:
        raise OpLibraryError(
            f"tnet's op library {_LIB_PATH} (built for TensorFlow "
            f"{built or 'unknown: no build_info.json'}) does not load into "
            f"TensorFlow {tf.__version__}: "
            f"{str(e).splitlines()[0][:200]}; {_REBUILD}.") from None


ops = _load()
library_path = str(_LIB_PATH)

sparse_table_handle = ops.sparse_table_handle
sparse_table_pull = ops.sparse_table_pull
sparse_table_push = ops.sparse_table_push
sparse_table_pull_v2 = ops.sparse_table_pull_v2
sparse_table_push_v2 = ops.sparse_table_push_v2
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
tnet_decode_rows = ops.tnet_decode_rows
tnet_split_lines = ops.tnet_split_lines
tnet_embed_combine = ops.tnet_embed_combine
tnet_embed_combine_grad = ops.tnet_embed_combine_grad
tnet_segment_combine = ops.tnet_segment_combine
tnet_segment_combine_grad = ops.tnet_segment_combine_grad
tnet_row_ids = ops.tnet_row_ids
tnet_compact_ids = ops.tnet_compact_ids
tnet_flatten_keys = ops.tnet_flatten_keys
tnet_shard_order = ops.tnet_shard_order
tnet_sparse_rule_slots = ops.tnet_sparse_rule_slots
tnet_sparse_rules = ops.tnet_sparse_rules
