"""Checkpoint layout constants, errors, the manifest, and listing.

A checkpoint is complete when its `manifest.json` exists (written last);
`read_manifest` verifies the manifest's own checksum. See
`tnet.saving.checkpoint` for the whole layout.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Any, Dict, List, Optional, Tuple

import numpy as np


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


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or restored; `path` names the file.

    Args:
      message: what is wrong and the fix.
      path: the file or checkpoint concerned, or None.

    Example:
        ```python
        try:
            tn.saving.restore(model, "/ckpt")
        except tn.saving.CheckpointError as e:
            print(e, e.path)      # e.g. a checksum mismatch, naming the file
        ```
    """

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


# --------------------------------------------------------------- listing
def list_checkpoints(directory: str) -> List[Tuple[int, str]]:
    """[(step, path)] of the complete checkpoints in `directory`, oldest
    first. A checkpoint is complete when its manifest exists (it is written
    last, inside the temp directory, before the rename).

    Args:
      directory: the checkpoint directory.

    Example:
        ```python
        for step, path in tn.saving.list_checkpoints("/ckpt"):
            print(step, path)          # 100 /ckpt/ckpt-100 ...
        ```
    """
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
    """The path of the newest complete checkpoint in `directory`, or None.

    Args:
      directory: the checkpoint directory.

    Example:
        ```python
        path = tn.saving.latest_checkpoint("/ckpt")    # "/ckpt/ckpt-300" or None
        if path:
            tn.saving.restore(model, path)
        ```
    """
    found = list_checkpoints(directory)
    return found[-1][1] if found else None


def read_manifest(path: str) -> Dict[str, Any]:
    """The manifest of checkpoint `path` (a `ckpt-<step>` directory).

    Args:
      path: a `ckpt-<step>` directory.

    Returns:
      The manifest dict: step, tables (rows, dim, shards), files and their
      sha256, the parent of a delta checkpoint.

    Example:
        ```python
        manifest = tn.saving.read_manifest(tn.saving.latest_checkpoint("/ckpt"))
        print(manifest["step"], sorted(manifest["tables"]))
        ```
    """
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


def read_state(path: str, name: str) -> Optional[Any]:
    """The JSON state `name` that `save(..., state={name: ...})` wrote into
    checkpoint `path`, or None when it holds none. Its size and sha256 are
    checked against the manifest (a damaged file raises CheckpointError).

    Args:
      path: a `ckpt-<step>` directory.
      name: the state's name.

    Example:
        ```python
        path = tn.saving.save(model, "/ckpt", state={"days": ["2026-11-01"]})
        print(tn.saving.read_state(path, "days"))     # ['2026-11-01']
        ```
    """
    manifest = read_manifest(path)
    if name not in manifest.get("state", []):
        return None
    rel = os.path.join("state", f"{name}.json")
    file = os.path.join(os.fspath(path), rel)
    expect = manifest.get("files", {}).get(rel)
    try:
        with open(file, "rb") as f:
            data = f.read()
    except OSError as e:
        raise CheckpointError(f"checkpoint state file {file} is missing or "
                              f"unreadable: {e}", file) from None
    if expect is None or len(data) != expect["bytes"] or hashlib.sha256(
            data).hexdigest() != expect["sha256"]:
        raise CheckpointError(f"checkpoint state file {file} is corrupted "
                              "(its size or sha256 does not match the "
                              "manifest)", file)
    return json.loads(data)


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


def _jsonable(attrs: Dict[str, Any]) -> Dict[str, Any]:
    return {k: (float(v) if isinstance(v, (float, np.floating)) else v)
            for k, v in attrs.items()}
