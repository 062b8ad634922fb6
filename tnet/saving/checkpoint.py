"""Training checkpoints: dense state plus every tnet table, streamed to HDF5.

    path = tn.saving.save(model, "/ckpts")             # /ckpts/ckpt-<step>
    step = tn.saving.restore(model, "/ckpts")          # newest checkpoint
    tn.saving.latest_checkpoint("/ckpts")              # its path, or None

Layout of `<dir>/ckpt-<step>/`:

* `manifest.json`, written last: format and version, a random `id`, `step`
  (the directory's number), `train_step` (the optimizer's `iterations` at the
  save), `kind` ("full" or "delta"), for a delta `base` / `parent` / `chain`
  (names and ids of the checkpoints it applies to, oldest first) and `depth`,
  and per table: dim, num_slots, optimizer name and attrs, shard function
  ("mod": key mod num_shards), the number of shards written, live `rows`,
  `rows_written`, `deleted`, the part files. `files` lists every other file
  with its byte size and sha256; `manifest_sha256` checks the manifest
  itself (sha256 of its canonical JSON without that field).
* `dense/ckpt.*`: a `tf.train.Checkpoint` of the model with its tnet tables
  left out: the dense variables, the optimizer (iterations, slots) and the
  Keras metric variables, under the model's usual object-graph paths (so a
  plain `tf.train.Checkpoint(model=model).read(...)` restores it too).
* `sparse/<table>/part-<k>.h5`, one per shard of the saving process: HDF5
  datasets `keys` int64 [n], `weights` float32 [n, dim], `slots` float32
  [n, num_slots] (ONE matrix in the rule's own slot layout, e.g. Adagrad's
  dim accumulators, FTRL's z then n; not one dataset per slot) and `meta`
  float64 [n, 3] = (show, click, last_step), exactly what
  `SparseTable.export_shard` returns. They are written chunk by chunk through
  the export cursor into resizable (chunked) datasets, so the saving process
  holds one chunk (`chunk_rows` rows, 65536 by default: ~10 MB at dim 16 with
  Adagrad) at a time, whatever the table size.
* `sparse/<table>/deleted.h5` (deltas only): dataset `keys`, the sorted keys
  that were live at the parent checkpoint and are gone now (gzip).
* `publishing/<base_id>.h5`, one per delta publisher of the model open at
  the save (`tnet.serving.publish`; `manifest["publishers"]` lists them in
  the order of their `freed` tables, datasets `freed_0`, `freed_1`, ...):
  the keys freed since that publisher's last delta, which a trainer
  restored from this checkpoint publishes in its first delta.
* `state/<name>.json` (`save(..., state={name: value})`): a caller's own
  JSON state saved atomically with the tables, e.g. a stream's ledger of
  trained files (`tnet.data.stream`); `manifest["state"]` lists the names
  and `read_state(path, name)` reads one back, checked like every file.

Atomicity: everything is written into `<dir>/.ckpt-<step>.tmp-*`, the
manifest last, every file and directory fsynced, then the directory is
renamed to `ckpt-<step>` and `<dir>` fsynced (`files.publish_dir`, as for
exports and serving deltas). A crash at any point leaves earlier
checkpoints untouched; the next save removes the stale temp directory.
`keep=N` deletes older checkpoints only after the new one is complete, and
never one that a kept delta still needs. One process saves into a directory
at a time (under ParameterServerStrategy: the chief). A write failure (disk
full, permissions, I/O) raises `CheckpointWriteError` (a `CheckpointError`
and an `OSError`) naming the checkpoint and the newest complete one; a full
checkpoint that cannot fit in the free space is refused before writing,
because HDF5 running out of space mid-file can leave h5py unusable for the
rest of the process (tests/test_faults.py).

Incremental checkpoints (`incremental=True`): a delta holds the rows that
changed since the parent checkpoint plus the keys freed since, and costs
what changed: each shard exports only rows with last_step > its change mark
(`SparseTable.export_shard(..., since_step=)`, a scan in C++ on the ps) and
the freed keys come from a bounded C++ deletion log; the chief keeps no
per-row index (delta_marks.py: a checkpoint id and (generation, mark) per
shard). After every save / tracked restore each shard is marked: mark = the
largest last_step any row has, and from then on every change is either
stamped above the mark (pushes with a step above it, which Keras training
gives: pushes use `optimizer.iterations`, read before the step's increment,
so every push after a save has step >= the saved train_step > the mark, also
under ParameterServerStrategy where all workers are joined before a save;
rows inserted by a training pull are stamped mark + 1) or counted as
untracked (pushes with a step <= mark, imports of rows with last_step <=
mark, show decay). Untracked changes, or more freed keys than the log holds
(max(65536, rows / 2) per shard), make the save write a full checkpoint
(`full_reason` says why), as after `full_every` saves, when this process
has no marks of the newest checkpoint, or when the table set changed.
`deleted` lists keys freed since the parent and not live now (it may list
keys created and freed in between: restore skips them harmlessly).

Restore resolves the chain (full, then deltas), checks every file's size and
sha256, each table's dim, slot count and optimizer against the model, and
each HDF5 dataset's dtype and shape before it changes anything; a missing,
truncated or corrupted file raises `CheckpointError` naming the file, and the
model is left as it was (earlier checkpoints still restore). Then the dense
state is read, every table is cleared and the rows are imported newest
checkpoint first, each key once (a key seen in a newer delta, or deleted by
it, is skipped in older ones), so the result is bit-exact. `import_rows`
routes every key to shard `key mod num_shards`: a checkpoint written from 2
shards restores onto 3 or 1 (resharding). The model's tables are created if
it has not been called yet; its dense variables may be created later
(restored when Keras builds them, as with `BackupAndRestore`). A built model
whose dense variables do not match (another architecture) is refused before
any table changes; for a model not built yet TensorFlow can only report
such a mismatch when Keras creates the variables (at the first step).

ParameterServerStrategy: call save/restore on the chief (the callback does,
at epoch ends, after Keras has joined all workers). Every row travels from
its ps task to the chief through `export_shard` in `chunk_rows` chunks (one
RPC per chunk) and is written to the chief's disk; training is stopped
meanwhile. A full save costs one pass over the whole table at network
speed (~1.5 GB for 10M rows of dim 16 with Adagrad); a delta sends only the
changed rows. Restore streams the rows back in large batches, reading the
next batch while importing one (restore.py).

Code: this module saves (orchestration, deltas, disk-full handling, part
writing); `restore.py` verifies and restores; `manifest.py` holds the
layout constants, errors, manifest and listing; `delta_marks.py` the
change marks behind deltas; `model_state.py` the dense view and the
model helpers; `h5parts.py` the HDF5 part files; `files.py` fsync, sha256
and progress.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
import time
import uuid
from typing import Any, Dict, Optional

import h5py
import numpy as np
import tensorflow as tf

from tnet.saving.delta_marks import (
    _deleted_keys, _set_marks, _table_changes)
from tnet.files import (
    _default_progress, _is_disk_full, _Progress, _safe_name, _sha256,
    Progress, publish_dir, space_shortfall, variables_bytes, write_failure)
from tnet.saving.h5parts import _Part
from tnet.saving.manifest import (
    _jsonable, _manifest_digest, _TMP_RE, CheckpointError,
    CheckpointWriteError, DEFAULT_CHUNK_ROWS, DEFAULT_FULL_EVERY, DTYPES,
    FORMAT, FORMAT_VERSION, latest_checkpoint, list_checkpoints, MANIFEST,
    read_manifest, read_state, SHARD_FUNCTION)
from tnet.saving.model_state import _model_tables, _train_step, _write_dense
from tnet.saving.restore import restore
from tnet.table import SparseTable

__all__ = ["save", "restore", "latest_checkpoint", "list_checkpoints",
           "read_manifest", "read_state", "CheckpointError",
           "CheckpointWriteError"]


# ------------------------------------------------------------------ save
def save(model, directory: str, step: Optional[int] = None,
         incremental: bool = False, keep: Optional[int] = None,
         full_every: int = DEFAULT_FULL_EVERY,
         chunk_rows: int = DEFAULT_CHUNK_ROWS,
         progress: Optional[Progress] = None,
         state: Optional[Dict[str, Any]] = None) -> str:
    """Writes a checkpoint of `model` to `<directory>/ckpt-<step>`.

    Args:
      model: a `tn.Model` (tables via `model.tables()`).
      directory: where checkpoints go (created if needed).
      step: the checkpoint number; default the optimizer's `iterations`.
      incremental: write a delta on top of the newest checkpoint in
        `directory` when possible (see the module docstring for when a full
        checkpoint is written instead). A delta reads only the rows whose
        last_step is above each shard's change mark, and the keys freed
        since (the shard's deletion log); the chief keeps no per-row state.
      keep: if set, afterwards delete all but the newest `keep` checkpoints
        (and the ones their deltas need).
      full_every: with `incremental`, at most `full_every - 1` deltas
        follow a full checkpoint.
      chunk_rows: rows per export call / HDF5 append.
      progress: callable taking a progress line (default: logging INFO on
        the "tnet.checkpoint" logger).
      state: {name: JSON value} written as `state/<name>.json` inside the
        checkpoint (so it is exactly as atomic as the tables); read it
        back with `read_state`.

    Returns the checkpoint path. Do not train or evict concurrently: the
    export cursor walks live shards (compaction moves rows).

    Example:
        ```python
        path = tn.saving.save(model, "/ckpt")             # /ckpt/ckpt-<step>
        tn.saving.save(model, "/ckpt", incremental=True)  # a delta on the newest
        ```
    """
    say = progress or _default_progress
    tables = _model_tables(model)
    train_step = _train_step(model)
    if step is None:
        if train_step is None:
            raise ValueError("save: the model has no optimizer; pass step=")
        step = train_step
    step = int(step)
    if step < 0:
        raise ValueError(f"save: step must be >= 0, got {step}")
    if train_step is None:
        train_step = step
    if full_every < 1:
        raise ValueError(f"full_every must be >= 1, got {full_every}")
    if keep is not None and keep < 1:
        raise ValueError(f"keep must be >= 1 or None, got {keep}")
    directory = os.path.abspath(os.fspath(directory))
    os.makedirs(directory, exist_ok=True)
    final = os.path.join(directory, f"ckpt-{step}")
    if os.path.exists(final):
        raise CheckpointError(
            f"{final} already exists; checkpoints are immutable (a delta may "
            "build on it). Save under another step or delete it first.", final)
    _remove_stale_temps(directory)
    parent, reason = (_delta_parent(directory, tables, step, train_step,
                                    full_every) if incremental
                      else (None, None))
    if parent is None:
        if incremental:
            say(f"ckpt-{step}: {reason}; writing a full checkpoint instead")
        _check_free_space(model, tables, directory, final)
    start = time.monotonic()
    try:
        path, summary = _write(model, tables, directory, step, train_step,
                               parent, reason, chunk_rows, incremental, say,
                               state)
    except CheckpointError:
        raise
    except OSError as e:
        raise _write_error(directory, final, e) from e
    except (RuntimeError, tf.errors.OpError) as e:
        # h5py reports some write failures as RuntimeError ("file write
        # failed ... errno = 28"). Only file-system failures are wrapped: a
        # lost ps task (UnavailableError ...) must stay itself for
        # tn.distribute.explain_failure.
        if not (_is_disk_full(e) or "file write failed" in str(e)):
            raise
        raise _write_error(directory, final, e) from e
    say(f"saved {path} ({summary}) in {time.monotonic() - start:.1f}s")
    if keep is not None:
        _apply_keep(directory, keep, say)
    return path


def _write_error(directory: str, final: str, error: BaseException) -> CheckpointError:
    """A write failure (disk full, permissions, I/O) as an error that names
    the checkpoint and says what state the directory is in: a caller
    mainly needs to know that nothing was half-written."""
    message, code = write_failure(f"checkpoint {final}", directory, error,
                                  "save to another directory")
    previous = latest_checkpoint(directory)
    state = (f" The partial checkpoint was removed; the newest complete one is "
             f"{previous}." if previous else
             " The partial checkpoint was removed; there is no complete checkpoint "
             f"in {directory}.")
    return CheckpointWriteError(message + state, final, code)


def _check_free_space(model, tables, directory: str, final: str) -> None:
    """Refuses a full checkpoint that cannot fit on the file system.

    Why before writing: when HDF5 itself runs out of space, the failed close
    leaves the HDF5 library in a state where the next save of the process
    may crash (measured: a segmentation fault in h5py). The estimate is the
    raw row bytes plus the dense variables (HDF5 and index overhead is a few
    KB per file); a disk that fills up during the write is still reported
    as CheckpointWriteError, but restart the process before saving again.
    """
    need = 0
    for table in tables.values():
        need += int(table.size()) * (8 + 4 * table.dim + 4 * table.num_slots + 24)
    need += variables_bytes(getattr(model, "variables", []) + list(
        getattr(getattr(model, "optimizer", None), "variables", []) or []))
    need = int(need * 1.05) + (1 << 16)
    short = space_shortfall(f"checkpoint {final}", need, directory,
                            "save to another directory")
    if short:
        previous = latest_checkpoint(directory)
        raise CheckpointWriteError(
            f"{short} Nothing was written; the newest complete checkpoint is "
            f"{previous or '(none)'}.", final, errno.ENOSPC)


def _delta_parent(directory, tables, step, train_step, full_every):
    """((path, manifest, {table: per-shard changes}), None) for a delta, or
    (None, reason)."""
    latest = latest_checkpoint(directory)
    if latest is None:
        return None, "first checkpoint in the directory"
    manifest = read_manifest(latest)
    name = os.path.basename(latest)
    if manifest["step"] >= step or manifest.get("train_step", 0) > train_step:
        return None, f"{name} is not older than step {step}"
    if manifest.get("depth", 0) + 1 >= full_every:
        return None, f"full_every={full_every}"
    if sorted(manifest["tables"]) != sorted(tables):
        return None, f"the set of tables differs from {name}"
    changes = {}
    for tname, table in sorted(tables.items()):
        info = manifest["tables"][tname]
        if info["dim"] != table.dim or info["num_slots"] != table.num_slots:
            return None, f"table {tname!r} changed shape since {name}"
        changes[tname], reason = _table_changes(table, tname, latest,
                                                manifest["id"])
        if reason is not None:
            return None, reason
    return (latest, manifest, changes), None


def _write(model, tables, directory, step, train_step, parent, full_reason,
           chunk_rows, track, say, state=None):
    final = os.path.join(directory, f"ckpt-{step}")
    ckpt_id = uuid.uuid4().hex
    # .ckpt-<step>.tmp-*, every file fsynced, renamed (files.publish_dir).
    with publish_dir(final) as tmp:
        manifest: Dict[str, Any] = {
            "format": FORMAT, "format_version": FORMAT_VERSION,
            "id": ckpt_id, "step": step, "train_step": train_step,
            "created_unix": time.time(),
        }
        if parent is None:
            manifest.update(kind="full", base=None, base_id=None, parent=None,
                            parent_id=None, chain=[], depth=0,
                            full_reason=full_reason)
        else:
            ppath, pman, _ = parent
            pname = os.path.basename(ppath)
            chain = list(pman.get("chain", [])) + [
                {"name": pname, "id": pman["id"]}]
            manifest.update(kind="delta", base=chain[0]["name"],
                            base_id=chain[0]["id"], parent=pname,
                            parent_id=pman["id"], chain=chain,
                            depth=pman.get("depth", 0) + 1, full_reason=None)
        manifest["tables"] = {}
        total_rows = written = 0
        for name in sorted(tables):
            changes = parent[2][name] if parent is not None else None
            info = _write_table(tables[name], name, tmp, step, changes,
                                chunk_rows, say)
            manifest["tables"][name] = info
            total_rows += info["rows"]
            written += info["rows_written"]
        manifest["dense"] = _write_dense(model, tmp)
        manifest["publishers"] = _write_publishers(tables, tmp)
        manifest["state"] = _write_state(tmp, state or {})
        files = {}
        for root, _, names in os.walk(tmp):
            for fname in sorted(names):
                full = os.path.join(root, fname)
                rel = os.path.relpath(full, tmp)
                files[rel] = {"bytes": os.path.getsize(full),
                              "sha256": _sha256(full)}
        manifest["files"] = dict(sorted(files.items()))
        manifest["manifest_sha256"] = _manifest_digest(manifest)
        with open(os.path.join(tmp, MANIFEST), "w") as f:
            json.dump(manifest, f, indent=1)  # last: the checkpoint is whole
    # The new marks: training is stopped during a save, so nothing changed
    # since the rows were exported.
    for table in tables.values():
        _set_marks(table, ckpt_id if track else None)
    size = sum(v["bytes"] for v in files.values())
    summary = (f"{manifest['kind']}, {len(tables)} tables, {total_rows:,} "
               f"rows, {written:,} written, {size / 1e6:.1f} MB")
    return final, summary


def _write_part(path, table, name, shard, chunk_rows, since_step, progress,
                written_keys):
    """Streams shard `shard` of `table` into `path`: every row, or (since_step
    >= 0) only rows whose last_step > since_step (a delta). Appends the
    keys written to `written_keys` (a list) if it is not None.
    Returns the rows written."""
    part = _Part(path, table, name, shard, chunk_rows)
    try:
        for chunk in table.export_chunks(
                shard, chunk_rows,
                since_step=None if since_step < 0 else since_step):
            k, w, s, m = (x.numpy() for x in chunk)
            part.append(k, w, s, m)
            if written_keys is not None and len(k):
                written_keys.append(k)
            progress.update(len(k))
            del k, w, s, m
        part.close()
    except BaseException:
        part.abort()
        raise
    return part.rows


def _write_table(table: SparseTable, name: str, tmp: str, step: int,
                 changes: Optional[list], chunk_rows: int, say):
    """Writes one table: every row (changes None) or, for a delta, each
    shard's rows changed since its mark plus the deletion log."""
    rel_dir = os.path.join("sparse", _safe_name(name))
    os.makedirs(os.path.join(tmp, rel_dir), exist_ok=True)
    live = int(table.size())
    bytes_per_row = 8 + 4 * (table.dim + table.num_slots) + 24
    delta = changes is not None
    progress = _Progress(say, f"ckpt-{step} table {name!r}"
                         + (" (changed rows)" if delta else ""), live,
                         bytes_per_row)
    written_keys = [] if delta else None
    parts, written = [], 0
    for shard in range(table.num_shards):
        rel = os.path.join(rel_dir, f"part-{shard}.h5")
        since = changes[shard]["mark"] if delta else -1
        n = _write_part(os.path.join(tmp, rel), table, name, shard,
                        chunk_rows, since, progress, written_keys)
        parts.append({"file": rel, "shard": shard, "rows": n})
        written += n
    progress.end()
    pending_rel = os.path.join(rel_dir, "pending.h5")
    n_pending = _write_pending(os.path.join(tmp, pending_rel), table, name)
    info = {
        "dim": table.dim, "num_slots": table.num_slots,
        "optimizer": {"name": table.optimizer.name,
                      "attrs": _jsonable(table.optimizer.table_attrs())},
        "shard_function": SHARD_FUNCTION, "num_shards": table.num_shards,
        "dtypes": dict(DTYPES), "rows": live, "rows_written": written,
        "parts": parts, "deleted": 0, "deleted_file": None,
        "since_steps": ([c["mark"] for c in changes] if delta else None),
        "pending": n_pending, "pending_file": pending_rel,
    }
    if delta:
        keys = (np.concatenate(written_keys) if written_keys
                else np.zeros(0, np.int64))
        deleted = _deleted_keys(changes, keys)
        del keys, written_keys
        rel = os.path.join(rel_dir, "deleted.h5")
        with h5py.File(os.path.join(tmp, rel), "w") as f:
            f.create_dataset("keys", data=deleted, dtype=np.int64,
                             compression="gzip" if len(deleted) else None,
                             shuffle=bool(len(deleted)))
            f.attrs["format"] = FORMAT
            f.attrs["table"] = name
        info["deleted"] = int(len(deleted))
        info["deleted_file"] = rel
    return info


def _write_pending(path: str, table: SparseTable, name: str) -> int:
    """Writes the table's whole admission state (every checkpoint, full or
    delta, holds all of it: counts change without any row changing) and its
    lifecycle counters: datasets `keys` int64, `counts` float32, `ages`
    int64 (see SparseTable.export_pending) and `counters` int64 [shards, 5].
    Returns the number of pending keys."""
    state = table.export_pending()
    n = len(state["keys"])
    with h5py.File(path, "w") as f:
        for key in ("keys", "counts", "ages"):
            f.create_dataset(key, data=state[key],
                             compression="gzip" if n else None,
                             shuffle=bool(n))
        f.create_dataset("counters", data=state["counters"])
        f.attrs["format"] = FORMAT
        f.attrs["table"] = name
    return n


def _write_publishers(tables, tmp: str) -> list:
    """Per reader of the tables' change logs that says what it is
    (`describe`: the delta publishers, tnet.serving.publish), the keys it
    has read as freed and not published yet, in
    `publishing/<base_id>.h5` (one int64 dataset per table, in the order
    of the entry's `freed`): a trainer restored from this checkpoint
    publishes them in its first delta. Returns the manifest entries."""
    records: Dict[str, Dict[str, Any]] = {}
    for tname in sorted(tables):
        for rname, reader in tables[tname].change_log.readers.items():
            if reader.describe is None:
                continue
            if rname not in records:
                records[rname] = {**reader.describe(), "freed": {}}
            record = records[rname]
            record["freed"][tname] = reader.freed()
            record["deletes_incomplete"] = bool(
                record["deletes_incomplete"] or reader.dropped)
    entries = []
    for record in (records[n] for n in sorted(records)):
        rel = os.path.join("publishing", f"{record['base_id']}.h5")
        os.makedirs(os.path.join(tmp, "publishing"), exist_ok=True)
        names = sorted(record["freed"])
        with h5py.File(os.path.join(tmp, rel), "w") as f:
            for i, name in enumerate(names):
                keys = record["freed"][name]
                f.create_dataset(f"freed_{i}", data=keys, dtype=np.int64,
                                 compression="gzip" if len(keys) else None)
            f.attrs["format"] = FORMAT
        entries.append({
            "export_dir": record["export_dir"],
            "base_id": record["base_id"], "version": record["version"],
            "through_step": record["through_step"],
            "deletes_incomplete": bool(record["deletes_incomplete"]),
            "file": rel,
            "freed": {name: int(len(record["freed"][name]))
                      for name in names}})
    return entries


def _write_state(tmp: str, state: Dict[str, Any]) -> list:
    names = sorted(state)
    for name in names:
        if _safe_name(name) != name:
            raise ValueError(f"save(state=...): {name!r} is not a plain name "
                             "(letters, digits, '-', '_', '.')")
        os.makedirs(os.path.join(tmp, "state"), exist_ok=True)
        with open(os.path.join(tmp, "state", f"{name}.json"), "w") as f:
            json.dump(state[name], f, sort_keys=True)
    return names


def _remove_stale_temps(directory: str) -> None:
    for name in os.listdir(directory):
        if _TMP_RE.match(name):
            shutil.rmtree(os.path.join(directory, name), ignore_errors=True)


def _apply_keep(directory: str, keep: int, say) -> None:
    found = list_checkpoints(directory)
    if len(found) <= keep:
        return
    kept = found[-keep:]
    needed = {os.path.basename(p) for _, p in kept}
    for _, path in kept:
        try:
            manifest = read_manifest(path)
        except CheckpointError:
            continue
        needed.update(c["name"] for c in manifest.get("chain", []))
    for _, path in found[:-keep]:
        if os.path.basename(path) in needed:
            continue
        # Rename first so a half-deleted directory never looks complete.
        trash = tempfile.mkdtemp(prefix=".ckpt-trash-", dir=directory)
        os.rename(path, os.path.join(trash, "ckpt"))
        shutil.rmtree(trash, ignore_errors=True)
        say(f"deleted old checkpoint {path}")
