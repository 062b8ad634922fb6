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

Atomicity: everything is written into `<dir>/.ckpt-<step>.tmp-*`, each file
fsynced, the manifest written last, then the directory is renamed to
`ckpt-<step>` (and `<dir>` fsynced). A crash at any point leaves earlier
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
differ from the parent checkpoint (new keys and changed rows) plus the keys
deleted since. Which rows differ is decided exactly, independently of table
internals: the process keeps, per table, the sorted keys of the last
checkpoint it wrote or restored and a 64-bit hash of each row's bytes
(weights, slots, show, click, last_step): 16 bytes per row (160 MB for 10M
rows; the save also builds the next index, so an incremental save of a
10M-row table peaks around 0.5 GB above the table, a full save without
`incremental` stays at a few chunks). A row that changed although its
last_step is older than the parent's train_step was changed by something
other than a training push (an eviction pass with show decay, rows imported
with old meta): then the delta is abandoned and a full checkpoint written
(`full_reason` in the manifest says why), as after `full_every` saves, when
this process has no index of the newest checkpoint, or when the table set
changed. Pure evictions (decay 1.0, TTL, thresholds) stay deltas: their keys
are listed as deleted. Note that a delta still streams every row out of the
table (there is no "rows since step" export op), so it saves disk writes,
not the export pass.

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
meanwhile. The cost is one pass over the whole table at network speed
(~1.5 GB for 10M rows of dim 16 with Adagrad), full or delta. Restore
streams the rows back the same way.
"""
from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
import uuid
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import h5py
import numpy as np
import tensorflow as tf
from tensorflow.python.trackable import base as trackable_base

from tnet.table import SparseTable, _TableShard

__all__ = ["save", "restore", "latest_checkpoint", "list_checkpoints",
           "read_manifest", "CheckpointError", "CheckpointWriteError"]

FORMAT = "tnet-checkpoint"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
DENSE_PREFIX = "dense/ckpt"
DEFAULT_CHUNK_ROWS = 1 << 16
DEFAULT_FULL_EVERY = 8
SHARD_FUNCTION = "mod"
DTYPES = {"keys": "int64", "weights": "float32", "slots": "float32",
          "meta": "float64"}
_CKPT_RE = re.compile(r"^ckpt-(\d+)$")
_TMP_RE = re.compile(r"^\.ckpt-(\d+\.tmp|trash)-")
_PROGRESS_SECONDS = 5.0

logger = logging.getLogger("tnet.checkpoint")

Progress = Callable[[str], None]


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or restored; `path` names the file."""

    def __init__(self, message: str, path: Optional[str] = None):
        super().__init__(message)
        self.path = path


class CheckpointWriteError(CheckpointError, OSError):
    """Writing a checkpoint failed (disk full, permissions, I/O error).

    Also an OSError, so code that catches the underlying OSError still
    does; `errno` is the original error's (e.g. `errno.ENOSPC`) when known.
    """

    def __init__(self, message: str, path: Optional[str] = None,
                 error_number: Optional[int] = None):
        super().__init__(message, path)
        self.errno = error_number


class _UntrackedChange(Exception):
    """A delta is not valid: rows changed without a training push."""


# --------------------------------------------------------------- listing
def list_checkpoints(directory: str) -> List[Tuple[int, str]]:
    """[(step, path)] of the complete checkpoints in `directory`, oldest
    first. A checkpoint is complete when its manifest exists (it is written
    last, inside the temp directory, before the rename)."""
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        return []
    out = []
    for name in os.listdir(directory):
        m = _CKPT_RE.match(name)
        path = os.path.join(directory, name)
        if m and os.path.isfile(os.path.join(path, MANIFEST)):
            out.append((int(m.group(1)), path))
    return sorted(out)


def latest_checkpoint(directory: str) -> Optional[str]:
    """The path of the newest complete checkpoint in `directory`, or None."""
    found = list_checkpoints(directory)
    return found[-1][1] if found else None


def read_manifest(path: str) -> Dict[str, Any]:
    """The manifest of checkpoint `path` (a `ckpt-<step>` directory)."""
    file = os.path.join(os.fspath(path), MANIFEST)
    if not os.path.isfile(file):
        raise CheckpointError(f"checkpoint manifest missing: {file} (not a "
                              "complete tnet checkpoint)", file)
    try:
        with open(file) as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"checkpoint manifest {file} is unreadable or "
                              f"corrupted: {e}", file) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{file} is not a tnet checkpoint manifest",
                              file)
    if manifest.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"{file} has format version {manifest.get('format_version')}; "
            f"this tnet reads version {FORMAT_VERSION}", file)
    if manifest.get("manifest_sha256") != _manifest_digest(manifest):
        raise CheckpointError(f"checkpoint manifest {file} is corrupted "
                              "(its checksum does not match its content)",
                              file)
    return manifest


def _manifest_digest(manifest: Dict[str, Any]) -> str:
    """sha256 of the manifest's canonical JSON without this field."""
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _resolve(path: str) -> str:
    path = os.path.abspath(os.fspath(path))
    if os.path.isfile(os.path.join(path, MANIFEST)):
        return path
    if _CKPT_RE.match(os.path.basename(path)):
        # A checkpoint directory whose manifest is missing: say so.
        read_manifest(path)
    latest = latest_checkpoint(path)
    if latest is None:
        raise CheckpointError(f"no tnet checkpoint in {path} (expected "
                              f"ckpt-<step>/{MANIFEST})", path)
    return latest


# ------------------------------------------------------------ row index
@dataclass
class _Index:
    """Sorted keys and row hashes of one table at one checkpoint."""
    ckpt_id: str
    train_step: int
    keys: np.ndarray
    hashes: np.ndarray


# Per live table: the index of the last checkpoint this process wrote or
# restored with change tracking.
_INDEXES: "weakref.WeakKeyDictionary[SparseTable, _Index]" = (
    weakref.WeakKeyDictionary())
_MULTIPLIERS: Dict[int, np.ndarray] = {}


def _row_hash(weights: np.ndarray, slots: np.ndarray,
              meta: np.ndarray) -> np.ndarray:
    """64-bit hash of each row's bytes: sum of 32-bit words times odd
    constants, mod 2^64 (any single-word change changes it)."""
    n, dim = weights.shape
    s = slots.shape[1]
    width = dim + s + 6
    mult = _MULTIPLIERS.get(width)
    if mult is None:
        rng = np.random.default_rng(0x74_6e_65_74 + width)
        mult = rng.integers(0, 2**63, width, dtype=np.uint64) | np.uint64(1)
        _MULTIPLIERS[width] = mult
    words = np.empty((n, width), np.uint64)
    words[:, :dim] = np.ascontiguousarray(weights).view(np.uint32)
    if s:
        words[:, dim:dim + s] = np.ascontiguousarray(slots).view(np.uint32)
    words[:, dim + s:] = np.ascontiguousarray(meta).view(np.uint32)
    return words @ mult


class _IndexBuilder:
    def __init__(self, capacity: int):
        self.keys = np.empty(max(capacity, 1), np.int64)
        self.hashes = np.empty(max(capacity, 1), np.uint64)
        self.n = 0

    def add(self, keys: np.ndarray, hashes: np.ndarray) -> None:
        end = self.n + len(keys)
        if end > len(self.keys):
            cap = max(end, 2 * len(self.keys))
            self.keys = np.resize(self.keys, cap)
            self.hashes = np.resize(self.hashes, cap)
        self.keys[self.n:end] = keys
        self.hashes[self.n:end] = hashes
        self.n = end

    def finish(self, ckpt_id: str, train_step: int) -> _Index:
        keys = self.keys[:self.n]
        order = np.argsort(keys, kind="stable")
        sorted_keys = keys[order]
        self.keys = None
        sorted_hashes = self.hashes[:self.n][order]
        self.hashes = None
        del order
        return _Index(ckpt_id, train_step, sorted_keys, sorted_hashes)


def _lookup(sorted_keys: np.ndarray, keys: np.ndarray):
    """(found mask, position) of `keys` in `sorted_keys`.

    The queries are sorted first: binary searches for keys in table order
    (random) miss the cache at every probe; in sorted order neighbouring
    searches share their path (measured: 5x faster over 10M keys).
    """
    if len(sorted_keys) == 0:
        return np.zeros(len(keys), bool), np.zeros(len(keys), np.int64)
    order = np.argsort(keys, kind="stable")
    pos = np.empty(len(keys), np.int64)
    pos[order] = np.searchsorted(sorted_keys, keys[order])
    np.minimum(pos, len(sorted_keys) - 1, out=pos)
    return sorted_keys[pos] == keys, pos


# ------------------------------------------------------- dense state
class _WithoutTables(trackable_base.Trackable):
    """A view of a trackable whose children omit tnet tables (recursively).

    Children that hold no table are the real objects, so the saved object
    graph has the model's own paths; only objects that (transitively) hold
    a SparseTable are replaced by such a view.
    """

    def __init__(self, obj, memo: Dict[int, Any], holds: Dict[int, bool]):
        self._obj = obj
        self._memo = memo
        self._holds = holds

    def _trackable_children(self, save_type=trackable_base.SaveType.CHECKPOINT,
                            **kwargs):
        out = {}
        for name, child in self._obj._trackable_children(save_type,
                                                         **kwargs).items():
            if isinstance(child, (SparseTable, _TableShard)):
                continue
            if _holds_table(child, self._holds):
                view = self._memo.get(id(child))
                if view is None:
                    view = self._memo[id(child)] = _WithoutTables(
                        child, self._memo, self._holds)
                child = view
            out[name] = child
        return out


def _holds_table(obj, cache: Dict[int, bool], _stack=None) -> bool:
    if isinstance(obj, (SparseTable, _TableShard)):
        return True
    key = id(obj)
    if key in cache:
        return cache[key]
    cache[key] = False  # cycles
    try:
        children = obj._trackable_children(trackable_base.SaveType.CHECKPOINT)
    except Exception:  # noqa: BLE001  (objects that cannot list children)
        children = {}
    result = any(_holds_table(c, cache) for c in children.values())
    cache[key] = result
    return result


def _dense_view(model):
    return _WithoutTables(model, {}, {})


def _dense_variable_count(model) -> int:
    seen = set()
    view = _dense_view(model)  # TrackableView holds its root weakly
    for obj in tf.train.TrackableView(view).descendants():
        if isinstance(obj, tf.Variable):
            seen.add(id(obj))
    return len(seen)


def _strategy_scope(model):
    strategy = getattr(model, "distribute_strategy", None)
    if strategy is None:
        return tf.distribute.get_strategy().scope()
    return strategy.scope()


# ---------------------------------------------------------------- files
def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _safe_name(name: str) -> str:
    cleaned = "".join(c if c.isalnum() or c in "_-." else "_" for c in name)
    return cleaned.strip(".") or "table"


def _model_tables(model) -> Dict[str, SparseTable]:
    if not hasattr(model, "tables"):
        raise TypeError("tn.saving checkpoints need a tn.Model (with "
                        f"tables()), got {type(model).__name__}")
    return model.tables()


def _train_step(model) -> Optional[int]:
    opt = getattr(model, "optimizer", None)
    if opt is None or not hasattr(opt, "iterations"):
        return None
    return int(opt.iterations.numpy())


class _Progress:
    """Rows written / total, at most every few seconds, and at the end."""

    def __init__(self, say: Progress, what: str, total: int, bytes_per_row: int):
        self.say, self.what, self.total = say, what, max(total, 0)
        self.bytes_per_row = bytes_per_row
        self.start = self.last = time.monotonic()
        self.done = 0

    def update(self, rows: int) -> None:
        self.done += rows
        now = time.monotonic()
        if now - self.last >= _PROGRESS_SECONDS:
            self.last = now
            self.say(self._line(now))

    def end(self) -> None:
        if time.monotonic() - self.start >= 1.0 or self.total >= 1_000_000:
            self.say(self._line(time.monotonic()))

    def _line(self, now: float) -> str:
        pct = 100.0 * self.done / self.total if self.total else 100.0
        mbs = self.done * self.bytes_per_row / 1e6 / max(now - self.start, 1e-9)
        return (f"{self.what}: {self.done:,}/{self.total:,} rows "
                f"({pct:.0f}%), "
                f"{mbs:.0f} MB/s")


def _default_progress(message: str) -> None:
    logger.info("%s", message)


# ------------------------------------------------------------------ save
def save(model, directory: str, step: Optional[int] = None,
         incremental: bool = False, keep: Optional[int] = None,
         full_every: int = DEFAULT_FULL_EVERY,
         chunk_rows: int = DEFAULT_CHUNK_ROWS,
         progress: Optional[Progress] = None) -> str:
    """Writes a checkpoint of `model` to `<directory>/ckpt-<step>`.

    Args:
      model: a `tn.Model` (tables via `model.tables()`).
      directory: where checkpoints go (created if needed).
      step: the checkpoint number; default the optimizer's `iterations`.
      incremental: write a delta on top of the newest checkpoint in
        `directory` when possible (see the module docstring for when a full
        checkpoint is written instead), and keep the row index this needs.
      keep: if set, afterwards delete all but the newest `keep` checkpoints
        (and the ones their deltas need).
      full_every: with `incremental`, at most `full_every - 1` deltas
        follow a full checkpoint.
      chunk_rows: rows per export call / HDF5 append.
      progress: callable taking a progress line (default: logging INFO on
        the "tnet.checkpoint" logger).

    Returns the checkpoint path. Do not train or evict concurrently: the
    export cursor walks live shards (compaction moves rows).
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
        _check_free_space(model, tables, directory, final)
    start = time.monotonic()
    try:
        try:
            path, summary = _write(model, tables, directory, step, train_step,
                                   parent, reason, chunk_rows, incremental, say)
        except _UntrackedChange as e:
            say(f"ckpt-{step}: {e}; writing a full checkpoint instead")
            path, summary = _write(model, tables, directory, step, train_step,
                                   None, str(e), chunk_rows, incremental, say)
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
    the checkpoint and says what state the directory is in.

    Why: h5py and TensorFlow report a full disk as a bare "Can't write data"
    or "No space left on device" without the directory, and a caller
    mainly needs to know that nothing was half-written.
    """
    text = str(error).strip().splitlines()[0][:500] if str(error).strip() else repr(error)
    full = _is_disk_full(error)
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        free = None
    hint = ""
    if full:
        hint = (f" The file system of {directory} is full"
                + (f" ({free:,} bytes free)" if free is not None else "")
                + ": free space or save to another directory.")
    previous = latest_checkpoint(directory)
    state = (f" The partial checkpoint was removed; the newest complete one is "
             f"{previous}." if previous else
             " The partial checkpoint was removed; there is no complete checkpoint "
             f"in {directory}.")
    return CheckpointWriteError(
        f"could not write checkpoint {final}: {type(error).__name__}: {text}."
        f"{hint}{state}", final,
        errno.ENOSPC if full else getattr(error, "errno", None))


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
    for v in getattr(model, "variables", []) + list(
            getattr(getattr(model, "optimizer", None), "variables", []) or []):
        need += int(np.prod(v.shape)) * v.dtype.size
    need = int(need * 1.05) + (1 << 16)
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        return
    if free < need:
        previous = latest_checkpoint(directory)
        raise CheckpointWriteError(
            f"could not write checkpoint {final}: it needs about {need:,} bytes and "
            f"the file system of {directory} is full ({free:,} bytes free): free "
            "space or save to another directory. Nothing was written; the newest "
            f"complete checkpoint is {previous or '(none)'}.", final, errno.ENOSPC)


def _is_disk_full(error: BaseException) -> bool:
    text = str(error).lower()
    return (getattr(error, "errno", None) == errno.ENOSPC or "no space left" in text
            or "errno = 28" in text)


def _delta_parent(directory, tables, step, train_step, full_every):
    """(parent (path, manifest), None) for a delta, or (None, reason)."""
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
    for tname, table in tables.items():
        index = _INDEXES.get(table)
        if index is None or index.ckpt_id != manifest["id"]:
            return None, (f"this process holds no row index of {name} for "
                          f"table {tname!r} (it did not write it or restore "
                          "it with track_changes=True)")
        info = manifest["tables"][tname]
        if info["dim"] != table.dim or info["num_slots"] != table.num_slots:
            return None, f"table {tname!r} changed shape since {name}"
    return (latest, manifest), None


def _write(model, tables, directory, step, train_step, parent, full_reason,
           chunk_rows, track, say):
    tmp = tempfile.mkdtemp(prefix=f".ckpt-{step}.tmp-", dir=directory)
    final = os.path.join(directory, f"ckpt-{step}")
    ckpt_id = uuid.uuid4().hex
    try:
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
            ppath, pman = parent
            pname = os.path.basename(ppath)
            chain = list(pman.get("chain", [])) + [
                {"name": pname, "id": pman["id"]}]
            manifest.update(kind="delta", base=chain[0]["name"],
                            base_id=chain[0]["id"], parent=pname,
                            parent_id=pman["id"], chain=chain,
                            depth=pman.get("depth", 0) + 1, full_reason=None)
        manifest["tables"] = {}
        indexes = {}
        total_rows = written = 0
        for name in sorted(tables):
            prev = _INDEXES.get(tables[name]) if parent is not None else None
            info, index = _write_table(tables[name], name, tmp, step,
                                       train_step, prev, chunk_rows,
                                       track or parent is not None, say)
            manifest["tables"][name] = info
            indexes[name] = index
            total_rows += info["rows"]
            written += info["rows_written"]
        manifest["dense"] = _write_dense(model, tmp)
        files = {}
        for root, _, names in os.walk(tmp):
            for fname in sorted(names):
                full = os.path.join(root, fname)
                _fsync_file(full)
                rel = os.path.relpath(full, tmp)
                files[rel] = {"bytes": os.path.getsize(full),
                              "sha256": _sha256(full)}
            _fsync_dir(root)
        manifest["files"] = dict(sorted(files.items()))
        manifest["manifest_sha256"] = _manifest_digest(manifest)
        mfile = os.path.join(tmp, MANIFEST)
        with open(mfile, "w") as f:
            json.dump(manifest, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        os.rename(tmp, final)
        _fsync_dir(directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for name, table in tables.items():
        if track and indexes[name] is not None:
            indexes[name].ckpt_id = ckpt_id
            _INDEXES[table] = indexes[name]
        else:
            _INDEXES.pop(table, None)
    size = sum(v["bytes"] for v in files.values())
    summary = (f"{manifest['kind']}, {len(tables)} tables, {total_rows:,} "
               f"rows, {written:,} written, {size / 1e6:.1f} MB")
    return final, summary


class _DenseWriter:
    """Writes the dense state through one traced `Checkpoint.write`.

    An eager `tf.train.Checkpoint.write` of variables placed on ps tasks
    grows every ps process by ~0.3 MB per save, without bound (measured
    here: +96 MB per 300 writes of 20 ps variables, each ps); the same
    write traced once in a tf.function and called again rises once (~30 MB)
    and then stays flat over 1,200 writes. The function is retraced only
    when the model's set of dense variables changes (e.g. optimizer slots
    created by the first step): the object graph is fixed at trace time.
    """

    def __init__(self, model):
        self._view = _dense_view(model)   # TrackableView holds it weakly
        self.key = _dense_variable_ids(self._view)
        checkpoint = tf.train.Checkpoint(model=self._view)
        self._write = tf.function(checkpoint.write, autograph=False)

    def __call__(self, prefix: str) -> None:
        self._write(tf.constant(prefix))


_DENSE_WRITERS: "weakref.WeakKeyDictionary[Any, _DenseWriter]" = (
    weakref.WeakKeyDictionary())


def _on_ps_tasks(model) -> bool:
    strategy = getattr(model, "distribute_strategy", None)
    return isinstance(strategy,
                      tf.distribute.experimental.ParameterServerStrategy)


def _dense_variable_ids(view) -> Tuple[int, ...]:
    return tuple(sorted({id(obj) for obj in
                         tf.train.TrackableView(view).descendants()
                         if isinstance(obj, tf.Variable)}))


def _write_dense(model, tmp: str) -> Dict[str, Any]:
    prefix = os.path.join(tmp, DENSE_PREFIX)
    os.makedirs(os.path.dirname(prefix), exist_ok=True)
    if not _on_ps_tasks(model):   # one process: the plain eager write
        tf.train.Checkpoint(model=_dense_view(model)).write(prefix)
    else:
        writer = _DENSE_WRITERS.get(model)
        if writer is None or writer.key != _dense_variable_ids(
                _dense_view(model)):
            writer = _DENSE_WRITERS[model] = _DenseWriter(model)
        writer(prefix)
    entries = [n for n, _ in tf.train.list_variables(prefix)
               if n != "_CHECKPOINTABLE_OBJECT_GRAPH"]
    return {"prefix": DENSE_PREFIX, "entries": len(entries)}


class _Part:
    """One HDF5 part file with resizable datasets, appended chunk by chunk.

    Datasets are created at the first append (or at close, empty), with an
    HDF5 chunk of at most ~512 KB and never more rows than that first
    append, so a small table does not pay for large preallocated chunks.
    """

    def __init__(self, path: str, table: SparseTable, name: str, shard: int,
                 chunk_rows: int):
        self.path = path
        self.dim, self.num_slots = table.dim, table.num_slots
        self.chunk_rows = chunk_rows
        self.file = h5py.File(path, "w")
        attrs = self.file.attrs
        attrs["format"] = FORMAT
        attrs["format_version"] = FORMAT_VERSION
        attrs["table"] = name
        attrs["shard"] = shard
        attrs["num_shards"] = table.num_shards
        attrs["dim"] = table.dim
        attrs["num_slots"] = table.num_slots
        attrs["optimizer"] = table.optimizer.name
        attrs["meta_columns"] = "show,click,last_step"
        self.datasets = None
        self.rows = 0

    def _create(self, first_rows: int) -> None:
        dim, s = self.dim, self.num_slots
        widest = 4 * max(dim, s, 6)
        rows = max(1, min(self.chunk_rows, first_rows, (1 << 19) // widest))
        ds = self.file.create_dataset
        self.datasets = [
            ds("keys", shape=(0,), maxshape=(None,), dtype=np.int64,
               chunks=(rows,)),
            ds("weights", shape=(0, dim), maxshape=(None, dim),
               dtype=np.float32, chunks=(rows, dim)),
            ds("slots", shape=(0, s), maxshape=(None, s), dtype=np.float32,
               chunks=(rows, s) if s else None),
            ds("meta", shape=(0, 3), maxshape=(None, 3), dtype=np.float64,
               chunks=(rows, 3)),
        ]

    def append(self, keys, weights, slots, meta) -> None:
        n = len(keys)
        if n == 0:
            return
        if self.datasets is None:
            self._create(n)
        a, b = self.rows, self.rows + n
        for ds, values in zip(self.datasets, (keys, weights, slots, meta)):
            ds.resize(b, axis=0)
            if values.ndim == 1 or values.shape[1]:
                ds[a:b] = values
        self.rows = b

    def close(self) -> None:
        if self.datasets is None:
            self._create(1)
        self.file.attrs["rows"] = self.rows
        self.file.close()

    def abort(self) -> None:
        """Closes the file after a failed write, hiding the close's own error
        (on a full disk the close fails too and would mask the first error)."""
        try:
            fd = self.file.id.get_vfd_handle()
        except Exception:  # noqa: BLE001
            fd = None
        try:
            self.file.close()
            return
        except Exception:  # noqa: BLE001
            pass
        # HDF5 keeps a file whose close failed open, and a deleted file's
        # space is only freed when it is closed: on a full disk the failed
        # save would keep the disk full. Truncating the file frees it now.
        if isinstance(fd, int) and fd >= 0:
            try:
                os.ftruncate(fd, 0)
            except OSError:
                pass


def _write_part(path, table, name, shard, chunk_rows, select, progress):
    """Streams shard `shard` of `table` into `path`.

    `select(keys, weights, slots, meta) -> mask or None` sees every chunk
    (it maintains the row index) and picks the rows to write (None: all).
    Returns (live rows, rows written).
    """
    part = _Part(path, table, name, shard, chunk_rows)
    live = 0
    try:
        cursor = 0
        while cursor != -1:
            k, w, s, m, cursor = table.export_shard(shard, cursor, chunk_rows)
            cursor = int(cursor)
            k, w, s, m = k.numpy(), w.numpy(), s.numpy(), m.numpy()
            n = len(k)
            live += n
            mask = select(k, w, s, m)
            if mask is not None:
                k, w, s, m = k[mask], w[mask], s[mask], m[mask]
            part.append(k, w, s, m)
            progress.update(n)
            del k, w, s, m
        part.close()
    except BaseException:
        part.abort()
        raise
    return live, part.rows


def _write_table(table: SparseTable, name: str, tmp: str, step: int,
                 train_step: int, prev: Optional[_Index], chunk_rows: int,
                 track: bool, say):
    rel_dir = os.path.join("sparse", _safe_name(name))
    os.makedirs(os.path.join(tmp, rel_dir), exist_ok=True)
    total = int(table.size())
    bytes_per_row = 8 + 4 * (table.dim + table.num_slots) + 24
    progress = _Progress(say, f"ckpt-{step} table {name!r}", total,
                         bytes_per_row)
    builder = _IndexBuilder(total) if track else None

    def select(k, w, s, m):
        if builder is None:
            return None
        h = _row_hash(w, s, m)
        builder.add(k, h)
        if prev is None:
            return None
        known, pos = _lookup(prev.keys, k)
        same = known & (prev.hashes[pos] == h)
        untracked = known & ~same & (m[:, 2] < prev.train_step)
        if untracked.any():
            raise _UntrackedChange(
                f"table {name!r}: {int(untracked.sum())}+ rows changed since "
                f"the parent checkpoint without a training push (last_step < "
                f"{prev.train_step}), e.g. an eviction with show decay")
        return ~same

    parts, live, written = [], 0, 0
    for shard in range(table.num_shards):
        rel = os.path.join(rel_dir, f"part-{shard}.h5")
        n_live, n_written = _write_part(os.path.join(tmp, rel), table, name,
                                        shard, chunk_rows, select, progress)
        parts.append({"file": rel, "shard": shard, "rows": n_written})
        live += n_live
        written += n_written
    progress.end()
    index = builder.finish("", train_step) if builder is not None else None
    info = {
        "dim": table.dim, "num_slots": table.num_slots,
        "optimizer": {"name": table.optimizer.name,
                      "attrs": _jsonable(table.optimizer.table_attrs())},
        "shard_function": SHARD_FUNCTION, "num_shards": table.num_shards,
        "dtypes": dict(DTYPES), "rows": live, "rows_written": written,
        "parts": parts, "deleted": 0, "deleted_file": None,
    }
    if prev is not None:
        found, _ = _lookup(index.keys, prev.keys)
        deleted = prev.keys[~found]
        rel = os.path.join(rel_dir, "deleted.h5")
        with h5py.File(os.path.join(tmp, rel), "w") as f:
            f.create_dataset("keys", data=deleted, dtype=np.int64,
                             compression="gzip" if len(deleted) else None,
                             shuffle=bool(len(deleted)))
            f.attrs["format"] = FORMAT
            f.attrs["table"] = name
        info["deleted"] = int(len(deleted))
        info["deleted_file"] = rel
    return info, index


def _jsonable(attrs: Dict[str, Any]) -> Dict[str, Any]:
    return {k: (float(v) if isinstance(v, (float, np.floating)) else v)
            for k, v in attrs.items()}


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


# --------------------------------------------------------------- restore
def restore(model, path: str, track_changes: bool = False,
            chunk_rows: int = DEFAULT_CHUNK_ROWS,
            progress: Optional[Progress] = None) -> int:
    """Restores `model` from a checkpoint; returns its step.

    Args:
      model: a `tn.Model`, compiled if its optimizer state is to be restored.
        Tables are created if the model was not called yet.
      path: a `ckpt-<step>` directory, or a directory of checkpoints (its
        newest one is used).
      track_changes: keep the row index of the restored state so the next
        `save(..., incremental=True)` can write a delta on top of it.
      chunk_rows: rows per HDF5 read / import call.
      progress: callable taking a progress line.

    Everything is verified (files, checksums, table shapes, dtypes) before
    the model changes; a failure raises CheckpointError naming the file.
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
        index = _restore_table(tables[name], name, chain, chunk_rows,
                               track_changes, say)
        if index is not None:
            _INDEXES[tables[name]] = index
        else:
            _INDEXES.pop(tables[name], None)
        rows += final_manifest["tables"][name]["rows"]
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
            if info["optimizer"].get("attrs") != attrs:
                logger.warning("table %r: optimizer attrs %s in %s differ "
                               "from the model's %s; restoring anyway", name,
                               info["optimizer"].get("attrs"), mfile, attrs)


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


def _check_h5(path: str, expect: Dict[str, Tuple[tuple, str]]) -> None:
    try:
        with h5py.File(path, "r") as f:
            for key, (shape, dtype) in expect.items():
                if key not in f:
                    raise CheckpointError(f"{path}: dataset {key!r} missing",
                                          path)
                ds = f[key]
                if ds.dtype != np.dtype(dtype) or tuple(ds.shape) != shape:
                    raise CheckpointError(
                        f"{path}: dataset {key!r} is {ds.dtype}{ds.shape}, "
                        f"expected {dtype}{shape}", path)
    except OSError as e:
        raise CheckpointError(f"{path}: not a readable HDF5 file ({e})",
                              path) from None


def _restore_dense(model, ckpt: str, manifest: Dict[str, Any],
                   built: int) -> None:
    prefix = os.path.join(ckpt, manifest["dense"]["prefix"])
    entries = manifest["dense"]["entries"]
    if built > entries:
        raise CheckpointError(
            f"{prefix}: the model has {built} dense variables, the checkpoint "
            f"{entries}; it was written by a different architecture", prefix)
    try:
        tf.train.Checkpoint(model=model).read(prefix).expect_partial()
    except (tf.errors.OpError, ValueError, AssertionError) as e:
        raise CheckpointError(f"{prefix}: dense state does not restore into "
                              f"this model: {e}", prefix) from None
    train_step = manifest.get("train_step")
    got = _train_step(model)
    if got is not None and train_step is not None and got != train_step:
        raise CheckpointError(
            f"{prefix}: restored optimizer.iterations is {got}, the manifest "
            f"says {train_step} (was the model compiled with an optimizer?)",
            prefix)


def _clear(table: SparseTable) -> None:
    """Frees every row: show *= 0, then evict show < 1."""
    table.evict(show_decay_rate=0.0, show_threshold=1.0, ttl_steps=0,
                current_step=0)


def _restore_table(table: SparseTable, name: str, chain, chunk_rows: int,
                   track: bool, say) -> Optional[_Index]:
    """Clears `table` and imports the chain's rows, newest first, each key
    once. Returns the row index (track) or None."""
    final_manifest = chain[-1][1]
    expected = final_manifest["tables"][name]["rows"]
    stored = sum(m["tables"][name]["rows_written"] for _, m in chain)
    progress = _Progress(say, f"restore table {name!r}", stored,
                         8 + 4 * (table.dim + table.num_slots) + 24)
    builder = _IndexBuilder(expected) if track else None
    _clear(table)
    done = np.zeros(0, np.int64)  # keys settled by newer checkpoints
    multi = len(chain) > 1
    for i, (cpath, manifest) in enumerate(reversed(chain)):
        info = manifest["tables"][name]
        newest, oldest = i == 0, i == len(chain) - 1
        seen = []
        for part in info["parts"]:
            with h5py.File(os.path.join(cpath, part["file"]), "r") as f:
                n = part["rows"]
                for a in range(0, n, chunk_rows):
                    b = min(n, a + chunk_rows)
                    k = f["keys"][a:b]
                    w = f["weights"][a:b]
                    s = f["slots"][a:b] if table.num_slots else np.zeros(
                        (b - a, 0), np.float32)
                    m = f["meta"][a:b]
                    if multi and not newest:
                        keep, _ = _lookup(done, k)
                        keep = ~keep
                        k, w, s, m = k[keep], w[keep], s[keep], m[keep]
                    if len(k):
                        table.import_rows(k, w, s, m)
                        if builder is not None:
                            builder.add(k, _row_hash(w, s, m))
                    if multi and not oldest:
                        seen.append(k)
                    progress.update(b - a)
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
    if builder is None:
        return None
    return builder.finish(final_manifest["id"],
                          int(final_manifest.get("train_step",
                                                 final_manifest["step"])))
