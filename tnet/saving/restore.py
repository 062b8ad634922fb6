"""Restore: verify a checkpoint chain (manifests, checksums, shapes), then
the dense state and every table, streamed in chunks and resharded.
"""
from __future__ import annotations

import os
import time
from typing import Any, Dict, List, Optional, Tuple

import h5py
import numpy as np

from tnet.saving.delta_index import (
    _Index, _IndexBuilder, _INDEXES, _lookup, _row_hash)
from tnet.saving.files import (
    _default_progress, _Progress, _sha256, logger, Progress)
from tnet.saving.h5parts import _check_h5
from tnet.saving.manifest import (
    _jsonable, _resolve, CheckpointError, DEFAULT_CHUNK_ROWS, DTYPES, MANIFEST,
    read_manifest, SHARD_FUNCTION)
from tnet.saving.model_state import (
    _dense_variable_count, _model_tables, _restore_dense, _strategy_scope)
from tnet.table import SparseTable


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
