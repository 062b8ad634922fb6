"""The delta publisher: what `publish_delta` and `tn.callbacks.PublishDeltas`
run.

`publish_delta(model, dir)` writes the next delta of the updatable export
`dir` (the format: tnet.serving.deltas): every row whose last push came
after the previous publish (`SparseTable.export_shard(since_step=...)`,
the same per-row step stamps incremental checkpoints read; publishing sets
no mark of its own), the keys freed since and every dense variable.
`python -m tnet.serving.follow` then applies the deltas to each serving
replica (tnet.serving.follow; the signatures it calls:
tnet.serving.updatable).

Freed keys: each publisher reads the tables' deletion log through its own
reader on each table's change log (`table.change_log`, named
"publisher:<export_dir>"; tnet/change_log.py). A checkpoint re-marks a
table through the same change log, which lets every reader read what is
left first, and keeps the table tracking while a publisher reads it;
checkpoints' own marks are never moved by a publish. Limit: the log is
bounded; when it overflowed (`dropped`), the manifest says
`deletes_incomplete` and those keys keep serving their last published row
until the next base export.

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
per publisher reading the model's tables, the keys it has read and not
published yet (`publishing/<base_id>.h5`, `manifest["publishers"]`: base
id, the last published version, deletes_incomplete; the reader's
`describe` and `freed`). `restore` hands them to the tables' change logs,
and the next publisher of that base takes them (its readers' `restored`)
and publishes them in its first delta when no delta was published after
the checkpoint (otherwise the restored trainer is behind the last publish
and the replay above covers them).
"""
from __future__ import annotations

import logging
import os
import time
import warnings
from typing import Any, Dict, List, Optional

import numpy as np
import tensorflow as tf

from tnet.serving.deltas import (DeltaError, list_deltas, load_delta,
                                 newest_export, read_info, read_manifest,
                                 write_delta)
from tnet.serving.export import export_for_serving
from tnet.serving.updatable import model_dense, model_step
from tnet.table import model_tables

logger = logging.getLogger("tnet.fresh")

READER_PREFIX = "publisher:"  # + the export directory: its change-log reader


class DeltaPublisher:
    """Publishes deltas of `model` beside the updatable export `export_dir`.

    Create it (or call `publish_delta` once) before training resumes after
    a restore: its start step is the model's step when it was created,
    which tells a restarted trainer what the served model may hold that
    the restored trainer does not (see the module doc). It reads each
    served table's freed keys through a reader named
    "publisher:<export_dir>" on the table's change log (`readers`).
    """

    def __init__(self, model, export_dir: str):
        self.model = model
        self.export_dir = os.path.abspath(os.fspath(export_dir))
        self.name = READER_PREFIX + self.export_dir
        self.info = read_info(self.export_dir)
        self.tables = model_tables(model, "publish_delta")
        missing = set(self.info["tables"]) - set(self.tables)
        if missing:
            raise ValueError(f"publish_delta: the model has no tables "
                             f"{sorted(missing)} that {self.export_dir} "
                             "serves")
        self.dense = model_dense(model, self.info["dense"])
        self.start_step = model_step(model)
        self._first = True
        # The deletion log overflowed before a restored checkpoint (its
        # record); the readers say whether it did since.
        self._incomplete = False
        self.readers = {}
        for name in self.info["tables"]:
            log = self.tables[name].change_log
            if any(c["mark"] < 0 for c in self.tables[name].changes()):
                log.mark(self.name, True)  # not tracked yet
            self.readers[name] = log.register(
                self.name, owner=self, describe=self._describe,
                handoff=self.info["base_id"])
        self._take_restored()

    def _take_restored(self) -> None:
        """The freed keys the checkpoint the model was restored from
        recorded for this base and that were not published yet."""
        records = {n: r.restored for n, r in self.readers.items()
                   if r.restored is not None}
        for reader in self.readers.values():
            reader.restored = None
        if not records:
            return
        record = next(iter(records.values()))
        last = self.last_version()
        if record["version"] != last:
            # Deltas after the checkpoint: the restored trainer is behind
            # the last publish, and the first delta replays every key they
            # touched (publish); the record's keys are among them.
            logger.info("%s: the restored checkpoint's record is at delta "
                        "%d, the export at %d: not used", self.export_dir,
                        record["version"], last)
            return
        for name, r in records.items():
            self.readers[name].add(r["freed"])
        self._incomplete = self._incomplete or bool(
            record["deletes_incomplete"])

    def close(self) -> None:
        """Stops reading the tables' change logs (its readers go)."""
        for name in self.readers:
            self.tables[name].change_log.unregister(self.name)

    def _describe(self) -> Dict[str, Any]:
        """What a checkpoint records of this publisher besides the freed
        keys its readers hold (tnet.saving.checkpoint)."""
        return {"export_dir": self.export_dir,
                "base_id": self.info["base_id"],
                "version": self.last_version(),
                "through_step": self.through_step(),
                "deletes_incomplete": self._incomplete}

    def deletes_incomplete(self) -> bool:
        """Some keys freed since the last publish were not logged."""
        return self._incomplete or any(r.dropped
                                       for r in self.readers.values())

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
        step = model_step(self.model)
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
            deleted = self.readers[name].freed()
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
        incomplete = self.deletes_incomplete()
        manifest = {"format": 1, "version": version,
                    "base_id": self.info["base_id"], "since_step": since,
                    "through_step": through, "tables": counts,
                    "deletes_incomplete": incomplete,
                    "created": time.time()}
        path = write_delta(self.export_dir, version, arrays, manifest)
        for reader in self.readers.values():
            reader.clear()
        if incomplete:
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

def publishers(model) -> Dict[str, DeltaPublisher]:
    """The open publishers of `model` by export directory: the owners of
    the "publisher:" readers on its tables' change logs."""
    out: Dict[str, DeltaPublisher] = {}
    for table in model_tables(model, "publish_delta").values():
        for reader in table.change_log.readers.values():
            if isinstance(reader.owner, DeltaPublisher):
                out[reader.owner.export_dir] = reader.owner
    return out


def publisher(model, export_dir: str) -> DeltaPublisher:
    """The process's publisher of `model` into `export_dir` (created at
    the first call: call it before training resumes after a restore).
    Creating one for a numeric version directory closes the model's
    publishers of older versions beside it (the daily loop's days, a
    compaction): the new base holds what they had left to publish."""
    export_dir = os.path.abspath(os.fspath(export_dir))
    open_ = publishers(model)
    if export_dir in open_:
        return open_[export_dir]
    pub = DeltaPublisher(model, export_dir)
    base, version = os.path.split(export_dir)
    for other, old in open_.items():
        obase, oversion = os.path.split(other)
        if obase == base and version.isdigit() and oversion.isdigit() \
                and int(oversion) < int(version):
            old.close()
    return pub


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

    Args:
      model: the trained `tn.Model` whose updatable export it is.
      export_dir: the updatable export or its base path.
      compact_at: see above (None: never a new base).
      rotate_update_key: see above.
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
            nxt = os.path.join(os.path.dirname(current),
                               str(int(os.path.basename(current)) + 1))
            record = read_info(current).get("update_key") or {}
            path = export_for_serving(model, nxt, updatable=True,
                                      update_key_file=record.get("file"),
                                      rotate_update_key=rotate_update_key)
            publisher(model, path)  # starts at the new base's step; closes pub
            return path
    return pub.publish()
