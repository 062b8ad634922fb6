"""Fresh models in serving: deltas applied to a running stock-TF SavedModel.

The loop:

1. `export_for_serving(model, dir, updatable=True)` writes the base (as any
   export) plus, per table, an overlay: a stock
   `tf.lookup.experimental.MutableHashTable` from the table's int64 key to
   `[state, row...]` (state 1: a row published since the base, 2: a key
   freed since, which reads the zero row), a `serving_version` variable,
   and three more signatures, all callable through TF Serving's Predict:

   * `apply_delta(version, update_key, <table>_keys, <table>_rows,
     <table>_deleted, ..., dense_0, dense_1, ...) -> {"applied"}`: refuses
     (InvalidArgument, nothing changed) unless `update_key` is the
     export's (tnet.serving.update_key: the export holds only its salted
     SHA-256) and version == serving_version + 1; inserts each
     table's freed keys and rows into its overlay, assigns every dense
     variable, then sets serving_version.
   * `apply_rows(version, update_key, <table>_keys/_rows/_deleted ...)`:
     the rows of a delta too big for one request (same key and version
     checks; the version is set by the final `apply_delta`).
   * `serving_version() -> {"version", "base_id"}`.

   `serving_default` reads the overlay first, then the base.

2. `publish_delta(model, dir)` (or the `tn.callbacks.PublishDeltas`
   callback) writes `dir/deltas/delta-NNNNNN/` (temp dir, fsync, rename):
   `delta.npz` holds every row whose last push came after the previous
   publish (`SparseTable.export_shard(since_step=...)`, the same per-row
   step stamps incremental checkpoints read; publishing sets no mark of its
   own), the keys freed since (the tables' deletion log, see below) and
   every dense variable; `manifest.json` its version, base id, steps and
   sha256.

3. `python -m tnet.serving.follow` applies new deltas in order to each
   target (tnet.serving.follow).

What a request sees while a delta is applied: each table's rows arrive in
one `LookupTableInsertV2` (the hash table takes its lock for the whole
insert and a lookup takes it for the whole find), so a request sees all of
a table's rows of that request or none of them, never half a row; a dense
variable is assigned whole (`AssignVariableOp`). Between tables and
variables there is no common lock: a request that runs during
`apply_delta` may see table A's new rows with table B's old ones, or new
embeddings with the previous dense weights, for the microseconds the apply
takes. A delta sent in several `apply_rows` chunks is visible chunk by
chunk; `serving_version` moves only once all of it is in.

Freed keys: the tables' deletion log (`SparseTable.changes()`) counts from
the last `mark_changes`, which checkpoints also call. A publisher reads the
log at each publish and, through the `delta_marks._BEFORE_MARK` hook,
right before any checkpoint re-marks a table, and keeps tracking on when a
non-incremental checkpoint would stop it; checkpoints' own marks are never
moved by a publish. Limit: the log is bounded; when it overflowed
(`dropped`), the manifest says `deletes_incomplete` and those keys keep
serving their last published row until the next base export.

Trainer restarts: the publisher's position is the newest delta's manifest
(its `through_step`), beside the deltas. A trainer restored to an earlier
step than the last publish re-publishes, in its first delta, every row
changed since the restored step plus the current value (zero if gone) of
every key the deltas after that step touched, so nothing served stays
ahead of the trainer. A base exported after the restored step cannot be
corrected this way: publish_delta refuses and asks for a new base.

A trainer restored to a checkpoint newer than the last publish needs the
keys freed between that publish and the checkpoint, which only the dead
publisher had read from the deletion log. So every checkpoint records,
per live publisher of the model, the keys it has read and not published
yet (`publishing/<base_id>.h5`, `manifest["publishers"]`: base id, the
last published version, deletes_incomplete; see `checkpoint_records`).
`restore` hands them to the next publisher of that base
(`restored_records`), which publishes them in its first delta when no
delta was published after the checkpoint (otherwise the restored trainer
is behind the last publish and the replay above covers them).
"""
from __future__ import annotations

import json
import logging
import os
import time
import uuid
import warnings
import weakref
from typing import Any, Dict, List, Optional

import numpy as np
import tensorflow as tf

from tnet.saving import delta_marks
from tnet.serving import update_key
from tnet.files import _sha256, publish_dir

logger = logging.getLogger("tnet.fresh")

DELTAS_DIR = "deltas"
MANIFEST = "manifest.json"
PAYLOAD = "delta.npz"
APPLY_DELTA = "apply_delta"
APPLY_ROWS = "apply_rows"
SERVING_VERSION = "serving_version"
INFO_FILE = "export_info.json"


class DeltaError(RuntimeError):
    """A delta that must not be applied (gap, checksum, other base)."""


# ------------------------------------------------------------ export side
def updatable_signatures(module, serving, dense, model, key_record):
    """The extra signatures of an updatable export and its info entry.

    `key_record` ({"salt", "sha256"}, `update_key.entry`): the digest of the
    update key that `apply_delta` and `apply_rows` require; the key itself
    is never in the export."""
    base_id = uuid.uuid4().hex
    module.serving_version = tf.Variable(tf.constant(0, tf.int64),
                                         trainable=False,
                                         name="serving_version")
    names = {n: serving[n].name for n in sorted(serving)}
    table_specs = {}
    for n, p in names.items():
        dim = serving[n].dim
        table_specs[f"{p}_keys"] = tf.TensorSpec([None], tf.int64)
        table_specs[f"{p}_rows"] = tf.TensorSpec([None, dim], tf.float32)
        table_specs[f"{p}_deleted"] = tf.TensorSpec([None], tf.int64)
    dense_specs = {f"dense_{i}": tf.TensorSpec(v.shape, v.dtype)
                   for i, v in enumerate(dense)}
    version_spec = {"version": tf.TensorSpec([], tf.int64),
                    update_key.KEY_INPUT: tf.TensorSpec([], tf.string)}

    def _named(specs):
        return {k: tf.TensorSpec(s.shape, s.dtype, name=k)
                for k, s in specs.items()}

    if key_record is None:
        # The format before update keys (no key input, no check): only
        # reproduced by tests of old exports.
        del version_spec[update_key.KEY_INPUT]

    def checks(inputs, signature):
        """The key check, then the version check: every mutation depends
        on both, so a refused request changes nothing."""
        key = tf.no_op() if key_record is None else update_key.refuse_unless(
            update_key.key_ok(key_record, inputs[update_key.KEY_INPUT]),
            signature)
        with tf.control_dependencies([key]):
            version = tf.debugging.assert_equal(
                inputs["version"], module.serving_version + 1,
                message=f"{signature}: refused, the delta's version is not "
                        "serving_version + 1 (applied twice, out of order, "
                        "or a gap)")
        return [key, version]

    def insert_rows(inputs, signature):
        ops = []
        with tf.control_dependencies(checks(inputs, signature)):
            for n, p in names.items():
                ops.append(serving[n].apply(inputs[f"{p}_keys"],
                                            inputs[f"{p}_rows"],
                                            inputs[f"{p}_deleted"]))
        return ops

    def apply_rows(inputs):
        ops = insert_rows(inputs, APPLY_ROWS)
        with tf.control_dependencies(ops):
            return {"applied": tf.identity(inputs["version"])}

    def apply_delta(inputs):
        ops = insert_rows(inputs, APPLY_DELTA)
        with tf.control_dependencies(ops):
            assigns = [v.assign(inputs[f"dense_{i}"])
                       for i, v in enumerate(dense)]
        with tf.control_dependencies(assigns):
            done = module.serving_version.assign(inputs["version"])
        with tf.control_dependencies([done]):
            return {"applied": tf.identity(inputs["version"])}

    def version():
        return {"version": tf.identity(module.serving_version),
                "base_id": tf.constant(base_id)}

    sigs = {
        APPLY_DELTA: tf.function(apply_delta, input_signature=[_named(
            {**version_spec, **table_specs, **dense_specs})],
            autograph=False).get_concrete_function(),
        APPLY_ROWS: tf.function(apply_rows, input_signature=[_named(
            {**version_spec, **table_specs})],
            autograph=False).get_concrete_function(),
        SERVING_VERSION: tf.function(
            version, input_signature=[],
            autograph=False).get_concrete_function(),
    }
    info = {
        "base_id": base_id,
        "through_step": _step(model) - 1,
        "tables": {n: {"prefix": p, "dim": serving[n].dim}
                   for n, p in names.items()},
        "dense": _dense_entries(model, dense),
        "signatures": [APPLY_DELTA, APPLY_ROWS, SERVING_VERSION],
        # Salt and digest only (update_key): the follower picks its key
        # for this base by it.
        **({} if key_record is None else {"update_key": dict(key_record)}),
    }
    return sigs, info


def _step(model) -> int:
    opt = getattr(model, "optimizer", None)
    it = getattr(opt, "iterations", None)
    return int(it.numpy()) if it is not None else 0


def _dense_entries(model, dense) -> List[Dict[str, Any]]:
    """Per dense variable of the export: its position in model.variables
    (stable for the same model code in another process, where names may
    carry other suffixes), name, shape and dtype."""
    index = {}
    names: Dict[str, list] = {}
    for i, v in enumerate(model.variables):
        # Under ParameterServerStrategy model.variables holds wrappers
        # (AggregatingVariable: `_v`) of what the traced graph captured.
        for inner in (v, getattr(v, "_v", None), getattr(v, "_variable",
                                                         None)):
            if inner is not None:
                index[id(inner)] = i
        names.setdefault(v.name, []).append(i)
    out = []
    for v in dense:
        if id(v) not in index and len(names.get(v.name, [])) == 1:
            index[id(v)] = names[v.name][0]
        if id(v) not in index:
            raise ValueError(
                f"updatable export: the serving graph reads variable "
                f"{v.name!r}, which is not in model.variables; only the "
                "model's own variables can ship with each delta")
        out.append({"index": index[id(v)], "name": v.name,
                    "shape": v.shape.as_list(), "dtype": v.dtype.name})
    return out


def _model_dense(model, entries) -> List[tf.Variable]:
    """The model's variables an export's dense list names, in order."""
    variables = model.variables
    out = []
    for e in entries:
        v = variables[e["index"]] if e["index"] < len(variables) else None
        if v is None or v.shape.as_list() != e["shape"] or \
                v.dtype.name != e["dtype"]:
            raise ValueError(
                f"publish_delta: the model's variable #{e['index']} is "
                f"{None if v is None else (v.name, v.shape.as_list())}, but "
                f"the export serves {e['name']} {e['shape']}: this is not "
                "the model the export was written from")
        out.append(v)
    return out


# ------------------------------------------------------------ delta files
def read_info(export_dir: str, full: bool = False) -> Dict[str, Any]:
    with open(os.path.join(export_dir, INFO_FILE)) as f:
        info = json.load(f)
    if full:
        return info
    if "updatable" not in info:
        raise DeltaError(f"{export_dir} is not an updatable export "
                         "(export it with export_for_serving(..., "
                         "updatable=True))")
    return info["updatable"]


def deltas_dir(export_dir: str) -> str:
    return os.path.join(export_dir, DELTAS_DIR)


def delta_name(version: int) -> str:
    return f"delta-{version:06d}"


def list_deltas(export_dir: str) -> List[int]:
    """Versions of the published deltas (complete directories), sorted."""
    d = deltas_dir(export_dir)
    if not os.path.isdir(d):
        return []
    out = []
    for name in os.listdir(d):
        if name.startswith("delta-") and name[6:].isdigit() and \
                os.path.exists(os.path.join(d, name, MANIFEST)):
            out.append(int(name[6:]))
    return sorted(out)


def read_manifest(export_dir: str, version: int) -> Dict[str, Any]:
    path = os.path.join(deltas_dir(export_dir), delta_name(version), MANIFEST)
    with open(path) as f:
        return json.load(f)


def load_delta(export_dir: str, version: int,
               base_id: Optional[str] = None) -> Dict[str, np.ndarray]:
    """The verified payload of delta `version` (DeltaError if its files
    do not match the manifest's checksum, version or base)."""
    path = os.path.join(deltas_dir(export_dir), delta_name(version))
    if not os.path.isdir(path):
        raise DeltaError(f"delta {delta_name(version)} is missing in "
                         f"{deltas_dir(export_dir)} (a gap): re-export a base "
                         "or restore the missing delta")
    try:
        manifest = read_manifest(export_dir, version)
    except (OSError, ValueError) as e:
        raise DeltaError(f"{path}/{MANIFEST} is unreadable ({e}); refusing "
                         "it") from e
    if manifest.get("version") != version:
        raise DeltaError(f"{path}: manifest says version "
                         f"{manifest.get('version')}, expected {version}")
    if base_id is not None and manifest.get("base_id") != base_id:
        raise DeltaError(f"{path} belongs to base {manifest.get('base_id')}, "
                         f"not {base_id}; refusing it")
    payload = os.path.join(path, PAYLOAD)
    want = manifest["files"][PAYLOAD]
    if not os.path.exists(payload) or os.path.getsize(payload) != \
            want["bytes"] or _sha256(payload) != want["sha256"]:
        raise DeltaError(f"{payload}: checksum mismatch (truncated or "
                         "corrupted); refusing it and every later delta")
    with np.load(payload, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _write_delta(export_dir: str, version: int, arrays: Dict[str, np.ndarray],
                 manifest: Dict[str, Any]) -> str:
    final = os.path.join(deltas_dir(export_dir), delta_name(version))
    if os.path.exists(final):
        raise DeltaError(f"{final} already exists; not publishing it twice")
    # .delta-NNNNNN.tmp-*, fsynced, renamed (files.publish_dir).
    with publish_dir(final) as tmp:
        payload = os.path.join(tmp, PAYLOAD)
        with open(payload, "wb") as f:
            np.savez(f, **arrays)
        manifest = dict(manifest, files={PAYLOAD: {
            "sha256": _sha256(payload), "bytes": os.path.getsize(payload)}})
        with open(os.path.join(tmp, MANIFEST), "w") as f:
            json.dump(manifest, f, indent=2, sort_keys=True)
    return final


# ------------------------------------------------------------ publishing
class DeltaPublisher:
    """Publishes deltas of `model` beside the updatable export `export_dir`.

    Create it (or call `publish_delta` once) before training resumes after
    a restore: its start step is the model's step when it was created,
    which tells a restarted trainer what the served model may hold that
    the restored trainer does not (see the module doc).
    """

    def __init__(self, model, export_dir: str):
        self.model = model
        self.export_dir = os.path.abspath(os.fspath(export_dir))
        self.info = read_info(self.export_dir)
        self.tables = model.tables()
        missing = set(self.info["tables"]) - set(self.tables)
        if missing:
            raise ValueError(f"publish_delta: the model has no tables "
                             f"{sorted(missing)} that {self.export_dir} "
                             "serves")
        self.dense = _model_dense(model, self.info["dense"])
        self.start_step = _step(model)
        self._first = True
        # Deletion log per table: per shard ((generation, mark), consumed),
        # and the keys read from it since the last publish.
        self._log: Dict[str, List] = {n: [] for n in self.info["tables"]}
        self._pending: Dict[str, List[np.ndarray]] = {
            n: [] for n in self.info["tables"]}
        self._incomplete = False
        ref = weakref.ref(self)

        def drain(table):
            me = ref()
            if me is None:
                delta_marks._BEFORE_MARK.remove(drain)  # noqa: SLF001
                return False
            return me._drain_table(table)

        self._drain_hook = drain
        delta_marks._BEFORE_MARK.append(drain)  # noqa: SLF001
        for name in self.info["tables"]:
            if any(c["mark"] < 0 for c in self.tables[name].changes()):
                self.tables[name].mark_changes(True)  # not tracked yet
            self._drain(name, reset=True)
        self._take_restored()
        _LIVE.add(self)

    def _take_restored(self) -> None:
        """The freed keys the checkpoint the model was restored from
        recorded for this base and that were not published yet."""
        record = _RESTORED.get(self.model, {}).pop(self.info["base_id"],
                                                   None)
        if record is None:
            return
        last = self.last_version()
        if record["version"] != last:
            # Deltas after the checkpoint: the restored trainer is behind
            # the last publish, and the first delta replays every key they
            # touched (publish); the record's keys are among them.
            logger.info("%s: the restored checkpoint's record is at delta "
                        "%d, the export at %d: not used", self.export_dir,
                        record["version"], last)
            return
        for name, keys in record["freed"].items():
            if name in self._pending and len(keys):
                self._pending[name].append(np.asarray(keys, np.int64))
        self._incomplete = self._incomplete or bool(
            record["deletes_incomplete"])

    def close(self) -> None:
        if self._drain_hook in delta_marks._BEFORE_MARK:  # noqa: SLF001
            delta_marks._BEFORE_MARK.remove(self._drain_hook)  # noqa: SLF001
        _LIVE.discard(self)

    def checkpoint_record(self) -> Dict[str, Any]:
        """What a checkpoint of the model keeps of this publisher: the keys
        freed since the last publish (read from the deletion log now),
        and where publishing stands."""
        freed = {}
        for name in self.info["tables"]:
            self._drain(name)
            pending = self._pending[name]
            freed[name] = (np.unique(np.concatenate(pending)) if pending
                           else np.zeros(0, np.int64))
        return {"export_dir": self.export_dir,
                "base_id": self.info["base_id"],
                "version": self.last_version(),
                "through_step": self.through_step(),
                "deletes_incomplete": self._incomplete, "freed": freed}

    def _drain_table(self, table) -> bool:
        for name, t in self.tables.items():
            if t is table and name in self._log:
                self._drain(name)
                self._log[name] = []  # the log restarts at the new mark
                return True
        return False

    def _drain(self, name: str, reset: bool = False) -> None:
        changes = self.tables[name].changes()
        log = self._log[name]
        new_log = []
        for shard, c in enumerate(changes):
            key = (c["generation"], c["mark"])
            consumed = log[shard][1] if shard < len(log) and \
                log[shard][0] == key else 0
            deleted = c["deleted"]
            if not reset and len(deleted) > consumed:
                self._pending[name].append(np.asarray(deleted[consumed:],
                                                      np.int64))
            if c["dropped"] and not reset:
                self._incomplete = True
            new_log.append((key, len(deleted)))
        self._log[name] = new_log

    def last_version(self) -> int:
        versions = list_deltas(self.export_dir)
        return versions[-1] if versions else 0

    def through_step(self) -> int:
        v = self.last_version()
        if v == 0:
            return int(self.info["through_step"])
        return int(read_manifest(self.export_dir, v)["through_step"])

    def publish(self) -> Optional[str]:
        """Writes the next delta; returns its path."""
        version = self.last_version() + 1
        previous = self.through_step()
        step = _step(self.model)
        through = step - 1
        since = previous
        replay = {}
        if self._first and self.start_step - 1 < previous:
            # Restarted from a checkpoint older than the last publish.
            if int(self.info["through_step"]) > self.start_step - 1:
                raise DeltaError(
                    f"publish_delta: the base {self.export_dir} holds rows "
                    f"up to step {self.info['through_step']} but the trainer "
                    f"restarted at step {self.start_step}; export a new base "
                    "(export_for_serving(..., updatable=True)) instead")
            since = self.start_step - 1
            replay = self._keys_after(since)
        arrays: Dict[str, np.ndarray] = {}
        counts = {}
        for name, entry in self.info["tables"].items():
            table, p = self.tables[name], entry["prefix"]
            keys, rows = _export_since(table, since)
            self._drain(name)
            pending = self._pending[name]
            deleted = (np.unique(np.concatenate(pending)) if pending
                       else np.zeros(0, np.int64))
            if len(keys):
                deleted = deleted[~np.isin(deleted, keys)]
            extra = replay.get(name)
            if extra is not None and len(extra):
                extra = np.setdiff1d(extra, np.concatenate([keys, deleted]))
                if len(extra):
                    got = table.pull(tf.constant(extra, tf.int64),
                                     training=False).numpy()
                    keys = np.concatenate([keys, extra])
                    rows = np.concatenate([rows, got.reshape(len(extra), -1)])
            arrays[f"{p}_keys"] = keys.astype(np.int64)
            arrays[f"{p}_rows"] = rows.astype(np.float32).reshape(
                -1, entry["dim"])
            arrays[f"{p}_deleted"] = deleted.astype(np.int64)
            counts[name] = {"rows": int(len(keys)),
                            "deleted": int(len(deleted))}
        for i, v in enumerate(self.dense):
            arrays[f"dense_{i}"] = v.numpy()
        manifest = {"format": 1, "version": version,
                    "base_id": self.info["base_id"], "since_step": since,
                    "through_step": through, "tables": counts,
                    "deletes_incomplete": self._incomplete,
                    "created": time.time()}
        path = _write_delta(self.export_dir, version, arrays, manifest)
        for name in self._pending:
            self._pending[name] = []
        if self._incomplete:
            warnings.warn(
                f"{path}: the tables' deletion log overflowed; some freed "
                "keys keep serving their last row until the next base")
        self._incomplete = False
        self._first = False
        return path

    def _keys_after(self, step: int) -> Dict[str, np.ndarray]:
        """Per table: every key the published deltas after `step` touched."""
        out: Dict[str, List[np.ndarray]] = {}
        for v in list_deltas(self.export_dir):
            m = read_manifest(self.export_dir, v)
            if m["through_step"] <= step:
                continue
            payload = load_delta(self.export_dir, v, self.info["base_id"])
            for name, entry in self.info["tables"].items():
                p = entry["prefix"]
                out.setdefault(name, []).extend(
                    [payload[f"{p}_keys"], payload[f"{p}_deleted"]])
        return {n: np.unique(np.concatenate(a)) for n, a in out.items()}


def _export_since(table, since: int, chunk: int = 1 << 20):
    keys, rows = [], []
    for k, w, _, _ in table.export_chunks(chunk_rows=chunk, since_step=since,
                                          weights_only=True):
        if k.shape[0]:
            keys.append(k.numpy())
            rows.append(w.numpy())
    if not keys:
        return np.zeros(0, np.int64), np.zeros((0, table.dim), np.float32)
    return np.concatenate(keys), np.concatenate(rows)


_PUBLISHERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
# Open publishers (checkpoints record theirs), and per model the records
# of the checkpoint it was restored from ({base_id: record}).
_LIVE: "weakref.WeakSet" = weakref.WeakSet()
_RESTORED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def checkpoint_records(model) -> List[Dict[str, Any]]:
    """For a checkpoint of `model`: per open publisher of it, the record
    of `DeltaPublisher.checkpoint_record`."""
    return [p.checkpoint_record() for p in list(_LIVE) if p.model is model]


def restored_records(model, records: List[Dict[str, Any]]) -> None:
    """Called by restore with the records of the checkpoint `model` was
    restored from; the next publisher of each base takes its own."""
    _RESTORED[model] = {r["base_id"]: r for r in records}


def publisher(model, export_dir: str) -> DeltaPublisher:
    """The process's publisher of `model` into `export_dir` (created at
    the first call: call it before training resumes after a restore).
    Creating one for a numeric version directory closes the model's
    publishers of older versions beside it (the daily loop's days, a
    compaction): the new base holds what they had left to publish."""
    export_dir = os.path.abspath(os.fspath(export_dir))
    per_model = _PUBLISHERS.setdefault(model, {})
    if export_dir not in per_model:
        per_model[export_dir] = DeltaPublisher(model, export_dir)
        base, version = os.path.split(export_dir)
        for other in list(per_model):
            obase, oversion = os.path.split(other)
            if obase == base and version.isdigit() and oversion.isdigit() \
                    and int(oversion) < int(version):
                per_model.pop(other).close()
    return per_model[export_dir]


def versions_of(base_path: str) -> List[int]:
    """Numeric version directories of a TF Serving base path that hold an
    updatable export, sorted."""
    out = []
    if os.path.isdir(base_path):
        for name in os.listdir(base_path):
            if name.isdigit() and os.path.exists(os.path.join(
                    base_path, name, INFO_FILE)):
                out.append(int(name))
    return sorted(out)


def newest_export(export_dir: str) -> str:
    """`export_dir` itself, or, when it is a numeric version directory (or
    a base path of them), the newest updatable version beside it: where
    publishing continues after a compaction wrote a new base."""
    export_dir = os.path.abspath(os.fspath(export_dir))
    if os.path.basename(export_dir).isdigit():
        base = os.path.dirname(export_dir)
    elif versions_of(export_dir):
        base = export_dir
    else:
        return export_dir
    for v in reversed(versions_of(base)):  # newest first: one read a poll
        if "updatable" in read_info(os.path.join(base, str(v)), full=True):
            return os.path.join(base, str(v))
    return export_dir


def publish_delta(model, export_dir: str,
                  compact_at: Optional[float] = 0.1,
                  rotate_update_key: bool = False) -> str:
    """Publishes the rows changed (and keys freed) since the last publish,
    and the dense weights, as the next numbered delta of the updatable
    export `export_dir` (a numeric version directory such as
    `/models/ranker/1`, or its base path `/models/ranker`: publishing goes
    to the newest version). Returns the delta's directory.

    Compaction: when the rows published since the base (rows + freed
    keys of its deltas) have reached `compact_at` times the base's rows,
    a new base is exported
    instead, as the next version directory (`/models/ranker/2`, with
    updatable=True), and its path is returned; TF Serving loads it by
    itself and the follower follows each replica's base. None: never.
    Inside a distribution strategy scope (a callback under
    ParameterServerStrategy) no base can be exported: a delta is
    published and a warning logged. The new base keeps the update key of
    the current one (its key file), or gets a new one with
    `rotate_update_key` (the key file then holds the new key and, second,
    the previous one).

    Example:
        ```python
        tn.serving.export_for_serving(model, "/models/ranker/1", updatable=True)
        model.fit(data)
        tn.serving.publish_delta(model, "/models/ranker/1")  # .../deltas/delta-000001
        ```
    """
    current = newest_export(export_dir)
    pub = publisher(model, current)
    if compact_at is not None and os.path.basename(current).isdigit():
        base_rows = max(1, sum(int(t.get("rows") or 0) for t in read_info(
            current, full=True)["tables"].values()))
        published = 0
        for v in list_deltas(current):
            published += sum(c["rows"] + c["deleted"] for c in
                             read_manifest(current, v)["tables"].values())
        if published >= compact_at * base_rows and \
                tf.distribute.has_strategy():
            # Keras runs callbacks inside the strategy's scope, where an
            # export's variables would be created on ps tasks.
            logger.warning(
                "%s: the overlay passed compact_at=%s but publish_delta runs "
                "inside a distribution strategy scope, where a new base "
                "cannot be exported; publishing a delta (export a new base "
                "outside the scope, e.g. after fit)", current, compact_at)
        elif published >= compact_at * base_rows:
            from tnet.serving.export import (  # noqa: PLC0415
                export_for_serving)
            nxt = os.path.join(os.path.dirname(current),
                               str(int(os.path.basename(current)) + 1))
            record = read_info(current).get("update_key") or {}
            path = export_for_serving(model, nxt, updatable=True,
                                      update_key_file=record.get("file"),
                                      rotate_update_key=rotate_update_key)
            publisher(model, path)  # starts at the new base's step; closes pub
            return path
    return pub.publish()
