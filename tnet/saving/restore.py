"""Restore: verify a checkpoint chain (manifests, checksums, shapes), then
the dense state and every table, streamed in chunks and resharded.
"""
from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import h5py
import numpy as np
import tensorflow as tf

from tnet.saving.delta_marks import _set_marks
from tnet.files import (
    _default_progress, _Progress, _sha256, logger, Progress)
from tnet.saving.h5parts import _check_h5
from tnet.saving.manifest import (
    _jsonable, _resolve, CheckpointError, DTYPES, MANIFEST,
    read_manifest, SHARD_FUNCTION)
from tnet.saving.model_state import (
    _dense_variable_count, _model_tables, _restore_dense, _strategy_scope)
from tnet.table import SparseTable

# Rows per restore batch: large batches amortize the per-call overhead
# (h5py selections, op dispatch, the import's grouping by stripe).
RESTORE_BATCH_ROWS = 1 << 19


# --------------------------------------------------------------- restore
def restore(model, path: str, track_changes: bool = False,
            chunk_rows: int = RESTORE_BATCH_ROWS,
            progress: Optional[Progress] = None) -> int:
    """Restores `model` from a checkpoint; returns its step.

    Args:
      model: a `tn.Model`, compiled if its optimizer state is to be restored.
        Tables are created if the model was not called yet.
      path: a `ckpt-<step>` directory, or a directory of checkpoints (its
        newest one is used).
      track_changes: mark the tables' change tracking at the restored
        checkpoint so the next `save(..., incremental=True)` can write a
        delta on top of it (a few bytes per shard; see delta_marks.py).
      chunk_rows: rows per HDF5 read / import call (default 512K: ~45 MB
        at dim 8 with Adagrad, two batches in memory at a time).
      progress: callable taking a progress line.

    Everything is verified (files, checksums, table shapes, dtypes) before
    the model changes; a failure raises CheckpointError naming the file.

    Example:
        ```python
        step = tn.saving.restore(model, "/ckpt")   # the newest checkpoint in /ckpt
        step = tn.saving.restore(model, tn.saving.latest_checkpoint("/ckpt"))
        ```
    """
    say = progress or _default_progress
    start = time.monotonic()
    ckpt = _resolve(path)
    chain = _load_chain(ckpt)
    for cpath, manifest in chain:
        _verify_files(cpath, manifest)
    final_manifest = chain[-1][1]
    with _strategy_scope(model):
        tables = _ensure_tables(model)
        _check_tables(tables, chain)
        for cpath, manifest in chain:
            _check_parts(cpath, manifest, tables)
        built = _dense_variable_count(model)
        _restore_dense(model, ckpt, final_manifest, built)
    rows = 0
    for name in sorted(tables):
        # No tracking while the table is cleared and refilled (the clear
        # would fill the deletion log); marked afterwards if asked.
        _set_marks(tables[name], None)
        _restore_table(tables[name], name, chain, chunk_rows, say)
        _restore_pending(tables[name], name, chain[-1])
        if track_changes:
            _set_marks(tables[name], final_manifest["id"])
        rows += final_manifest["tables"][name]["rows"]
    _restore_publishers(tables, ckpt, final_manifest)
    say(f"restored {ckpt} (step {final_manifest['step']}, "
        f"{len(chain)} checkpoint(s), {len(tables)} tables, {rows:,} rows) "
        f"in {time.monotonic() - start:.1f}s")
    return int(final_manifest["step"])


def _load_chain(ckpt: str) -> List[Tuple[str, Dict[str, Any]]]:
    """[(path, manifest)] from the full checkpoint to `ckpt`."""
    manifest = read_manifest(ckpt)
    directory = os.path.dirname(ckpt)
    chain = []
    for link in manifest.get("chain", []):
        cpath = os.path.join(directory, link["name"])
        if not os.path.isdir(cpath):
            raise CheckpointError(
                f"{os.path.join(ckpt, MANIFEST)} is a delta on "
                f"{link['name']}, which is missing: {cpath}", cpath)
        cman = read_manifest(cpath)
        if cman["id"] != link["id"]:
            raise CheckpointError(
                f"{os.path.join(ckpt, MANIFEST)} was written on top of a "
                f"different {link['name']} (id {link['id']}, found "
                f"{cman['id']}): {cpath} was replaced", cpath)
        chain.append((cpath, cman))
    if chain and chain[0][1]["kind"] != "full":
        raise CheckpointError(f"the chain of {ckpt} does not start with a "
                              "full checkpoint", ckpt)
    chain.append((ckpt, manifest))
    return chain


def _verify_files(cpath: str, manifest: Dict[str, Any]) -> None:
    listed = manifest.get("files", {})
    needed = [p["file"] for t in manifest["tables"].values()
              for p in t["parts"]]
    needed += [t["deleted_file"] for t in manifest["tables"].values()
               if t.get("deleted_file")]
    needed += [t["pending_file"] for t in manifest["tables"].values()
               if t.get("pending_file")]
    needed += [p["file"] for p in manifest.get("publishers", [])]
    for rel in needed:
        if rel not in listed:
            raise CheckpointError(f"{os.path.join(cpath, MANIFEST)} does not "
                                  f"list a checksum for {rel}",
                                  os.path.join(cpath, MANIFEST))
    if not any(rel.startswith(manifest["dense"]["prefix"]) for rel in listed):
        raise CheckpointError(f"{os.path.join(cpath, MANIFEST)} lists no "
                              "dense state files", os.path.join(cpath, MANIFEST))
    for rel, info in listed.items():
        full = os.path.join(cpath, rel)
        if not os.path.isfile(full):
            raise CheckpointError(f"checkpoint file missing: {full}", full)
        size = os.path.getsize(full)
        if size != info["bytes"]:
            raise CheckpointError(
                f"checkpoint file truncated or changed: {full} has {size} "
                f"bytes, the manifest says {info['bytes']}", full)
        digest = _sha256(full)
        if digest != info["sha256"]:
            raise CheckpointError(
                f"checkpoint file corrupted: {full} (sha256 {digest[:16]}..., "
                f"the manifest says {info['sha256'][:16]}...)", full)


def _ensure_tables(model) -> Dict[str, SparseTable]:
    """Creates the tables of tnet layers that were not built yet."""
    for layer in getattr(model, "tnet_layers", lambda: [])():
        if not layer.built:
            layer.build(None)
        if not layer.tables:
            layer._create_tables()  # noqa: SLF001  (tables only, no input)
    return _model_tables(model)


def _check_tables(tables: Dict[str, SparseTable], chain) -> None:
    from tnet.optimizer import sparse  # noqa: PLC0415
    for cpath, manifest in chain:
        mfile = os.path.join(cpath, MANIFEST)
        saved = manifest["tables"]
        missing = sorted(set(tables) - set(saved))
        extra = sorted(set(saved) - set(tables))
        if missing or extra:
            raise CheckpointError(
                f"{mfile}: tables do not match the model (model only: "
                f"{missing}, checkpoint only: {extra})", mfile)
        for name, table in tables.items():
            info = saved[name]
            problems = []
            if info["dim"] != table.dim:
                problems.append(f"dim {info['dim']} != model's {table.dim}")
            if info["num_slots"] != table.num_slots:
                problems.append(f"num_slots {info['num_slots']} != model's "
                                f"{table.num_slots}")
            if info["optimizer"]["name"] != table.optimizer.name:
                problems.append(f"optimizer {info['optimizer']['name']!r} != "
                                f"model's {table.optimizer.name!r}")
            if info.get("shard_function") != SHARD_FUNCTION:
                problems.append(f"shard function "
                                f"{info.get('shard_function')!r}")
            if info.get("dtypes") != DTYPES:
                problems.append(f"dtypes {info.get('dtypes')} != {DTYPES}")
            if problems:
                raise CheckpointError(
                    f"{mfile}: table {name!r} does not fit the model: "
                    + "; ".join(problems), mfile)
            attrs = _jsonable(table.optimizer.table_attrs())
            saved_attrs = _with_later_hparams(info["optimizer"].get("attrs"),
                                              attrs)
            if saved_attrs == attrs:
                continue
            changes = _forward_only(saved_attrs, attrs)
            if changes is not None:
                for key, was, now in changes:
                    if key in sparse.START_HPARAMS:
                        # A rule reads its accumulator start only when it
                        # inserts a row: the restored rows keep theirs.
                        logger.info("table %r: rows inserted from now on "
                                    "start their accumulators at the "
                                    "model's %g (%g in %s); restored rows "
                                    "keep theirs", name, now, was, mfile)
                    else:
                        logger.info("table %r: the model's %s %g applies "
                                    "from now on (%g in %s)", name, key,
                                    now, was, mfile)
                continue
            logger.warning("table %r: optimizer attrs %s in %s differ "
                           "from the model's %s; restoring anyway", name,
                           info["optimizer"].get("attrs"), mfile, attrs)


def _forward_only(saved, attrs):
    """[(hyperparameter, saved, model's)] when the two attrs differ only
    in hyperparameters that leave stored rows as they are (the row start,
    sparse.START_HPARAMS, INSERT_ONLY_HPARAMS and FORWARD_HPARAMS), else
    None."""
    from tnet.optimizer import sparse  # noqa: PLC0415
    if not isinstance(saved, dict):
        return None
    keys = [k for k in (sparse.START_HPARAMS + sparse.INSERT_ONLY_HPARAMS
                        + sparse.FORWARD_HPARAMS)
            if k in saved and k in attrs and saved[k] != attrs[k]]
    if not keys or {**saved, **{k: attrs[k] for k in keys}} != attrs:
        return None
    return [(k, float(saved[k]), float(attrs[k])) for k in keys]


def _with_later_hparams(saved, attrs):
    """A checkpoint's optimizer attrs, with each hyperparameter added to
    rules.h after it was written (absent from it, in the model's attrs)
    read as its default: the rule ran with that value (an insert-only one
    reads as the model's)."""
    if not isinstance(saved, dict):
        return saved
    from tnet.optimizer import sparse
    defaults = sparse.hparam_defaults()
    later = {k: attrs[k] if k in sparse.INSERT_ONLY_HPARAMS else defaults[k]
             for k in attrs if k not in saved and k in defaults}
    return {**later, **saved}


def _check_parts(cpath: str, manifest: Dict[str, Any],
                 tables: Dict[str, SparseTable]) -> None:
    for name, info in manifest["tables"].items():
        dim, s = tables[name].dim, tables[name].num_slots
        for part in info["parts"]:
            full = os.path.join(cpath, part["file"])
            n = part["rows"]
            expect = {"keys": ((n,), "int64"), "weights": ((n, dim), "float32"),
                      "slots": ((n, s), "float32"), "meta": ((n, 3), "float64")}
            _check_h5(full, expect)
        if info.get("deleted_file"):
            _check_h5(os.path.join(cpath, info["deleted_file"]),
                      {"keys": ((info["deleted"],), "int64")})
        if info.get("pending_file"):
            n = info["pending"]
            _check_h5(os.path.join(cpath, info["pending_file"]),
                      {"keys": ((n,), "int64"), "counts": ((n,), "float32"),
                       "ages": ((n,), "int64")})


def _clear(table: SparseTable) -> None:
    """Frees every row: show *= 0, then evict show < 1."""
    table.evict(show_decay_rate=0.0, show_threshold=1.0, ttl_steps=0,
                current_step=0)


def _restore_table(table: SparseTable, name: str, chain, batch_rows: int,
                   say) -> None:
    """Clears `table` and imports the chain's rows, newest first, each key
    once.

    Speed (BENCHMARKS.md, "Checkpoint scale"): rows are read in large
    batches by a reader thread while this thread imports the previous batch
    (h5py holds the GIL while it reads; the import op releases it and runs
    on TensorFlow's thread pool, so the two overlap), and a part written by
    shard k of a table with the same shard count goes straight to shard k
    (its keys all route there) instead of through a per-key partition.
    """
    final_manifest = chain[-1][1]
    expected = final_manifest["tables"][name]["rows"]
    stored = sum(m["tables"][name]["rows_written"] for _, m in chain)
    progress = _Progress(say, f"restore table {name!r}", stored,
                         8 + 4 * (table.dim + table.num_slots) + 24)
    _clear(table)
    done = np.zeros(0, np.int64)  # sorted keys settled by newer checkpoints
    multi = len(chain) > 1
    for i, (cpath, manifest) in enumerate(reversed(chain)):
        info = manifest["tables"][name]
        newest, oldest = i == 0, i == len(chain) - 1
        same_shards = info.get("num_shards") == table.num_shards
        seen = []
        # Batches that need no filtering become tensors in the reader
        # thread too (the copy is a third of the import's time).
        filtering = multi and not newest and len(done) > 0
        batches = contextlib.closing(_prefetched(_read_batches(
            cpath, info["parts"], table.num_slots, batch_rows,
            as_tensors=not filtering)))
        with batches as it:
            for shard, k, w, s, m in it:
                n = len(k)
                k = _import_batch(table, shard, k, w, s, m, done,
                                  same_shards, not newest)
                if multi and not oldest:
                    seen.append(np.asarray(k))
                progress.update(n)
                del k, w, s, m
        if multi and not oldest:
            if info.get("deleted_file"):
                with h5py.File(os.path.join(cpath, info["deleted_file"]),
                               "r") as f:
                    seen.append(f["keys"][:])
            seen.append(done)
            done = np.unique(np.concatenate(seen))
    progress.end()
    live = int(table.size())
    if live != expected:
        raise CheckpointError(
            f"table {name!r}: restored {live} rows, "
            f"{os.path.join(chain[-1][0], MANIFEST)} says {expected}",
            chain[-1][0])


def _restore_pending(table: SparseTable, name: str, newest) -> None:
    """The admission state and lifecycle counters of the newest checkpoint
    of the chain (each one holds all of it). Checkpoints written before
    tnet saved it have none: the table then starts with no pending keys
    (counts start again) and its counters as the restore left them."""
    cpath, manifest = newest
    rel = manifest["tables"][name].get("pending_file")
    if not rel:
        return
    with h5py.File(os.path.join(cpath, rel), "r") as f:
        table.import_pending(f["keys"][:], f["counts"][:], f["ages"][:],
                             f["counters"][:])


def _restore_publishers(tables, cpath: str, manifest) -> None:
    """The delta publishers' unpublished freed keys the checkpoint
    recorded (checkpoint._write_publishers), handed to each table's change
    log (`restored`, by base id) for the next publisher of that base
    (tnet.serving.publish) to take; what an earlier restore handed over
    goes. Checkpoints written before this, or by a trainer that published
    nothing, have none."""
    for table in tables.values():
        table.change_log.restored = {}
    for entry in manifest.get("publishers", []):
        with h5py.File(os.path.join(cpath, entry["file"]), "r") as f:
            freed = {name: f[f"freed_{i}"][:].astype(np.int64)
                     for i, name in enumerate(sorted(entry["freed"]))}
        for name, keys in freed.items():
            if name in tables:
                tables[name].change_log.restored[entry["base_id"]] = {
                    **entry, "freed": keys}


def _import_batch(table: SparseTable, shard: int, k, w, s, m,
                  done: np.ndarray, same_shards: bool, filter_done: bool):
    """Imports one batch, minus the keys in `done` (settled by newer
    checkpoints) if filter_done; returns the keys imported."""
    if filter_done and len(done):
        k, w, s, m = (np.asarray(x) for x in (k, w, s, m))
        keep = ~_in_sorted(done, k)
        k, w, s, m = k[keep], w[keep], s[keep], m[keep]
    if (k.shape[0] if hasattr(k, "shape") else len(k)):
        if same_shards:
            table.import_shard(shard, k, w, s, m)
        else:
            table.import_rows(k, w, s, m)
    return k


def _read_batches(cpath: str, parts, num_slots: int, batch_rows: int,
                  as_tensors: bool = False):
    """Yields (shard, keys, weights, slots, meta) batches of every part, as
    numpy arrays or (as_tensors) tf.Tensors."""
    for part in parts:
        with h5py.File(os.path.join(cpath, part["file"]), "r") as f:
            n = part["rows"]
            cols = [f["keys"], f["weights"], f["slots"], f["meta"]]
            for a in range(0, n, batch_rows):
                b = min(n, a + batch_rows)
                out = []
                for ds in cols:
                    arr = np.empty((b - a,) + ds.shape[1:], ds.dtype)
                    if arr.size:
                        ds.read_direct(arr, np.s_[a:b])
                    out.append(tf.convert_to_tensor(arr) if as_tensors
                               else arr)
                yield (part["shard"], *out)


def _prefetched(items, depth: int = 1):
    """Iterates `items` in a reader thread, up to `depth` items ahead, so
    reading the next batch overlaps with the caller's work on this one.
    The reader stops when the caller stops early (an error)."""
    q: "queue.Queue" = queue.Queue(maxsize=depth)
    stop = threading.Event()
    end = object()

    def run():
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        q.put(("item", item), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(("end", end))
        except BaseException as e:  # noqa: BLE001  (re-raised by the caller)
            q.put(("error", e))

    thread = threading.Thread(target=run, name="tnet-restore-reader",
                              daemon=True)
    thread.start()
    try:
        while True:
            kind, value = q.get()
            if kind == "end":
                return
            if kind == "error":
                raise value
            yield value
    finally:
        stop.set()
        while thread.is_alive():
            try:
                q.get_nowait()
            except queue.Empty:
                pass
            thread.join(0.05)


def _in_sorted(sorted_keys: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Mask of `keys` found in `sorted_keys`. The queries are sorted first:
    binary searches for keys in table order (random) miss the cache at
    every probe; in sorted order neighbouring searches share their path."""
    if len(sorted_keys) == 0 or len(keys) == 0:
        return np.zeros(len(keys), bool)
    order = np.argsort(keys, kind="stable")
    pos = np.searchsorted(sorted_keys, keys[order])
    np.minimum(pos, len(sorted_keys) - 1, out=pos)
    found = np.empty(len(keys), bool)
    found[order] = sorted_keys[pos] == keys[order]
    return found
