"""The on-disk format of an updatable export's deltas (numpy and json only).

Everything a reader of deltas needs, the follower first: importing this
module loads neither TensorFlow nor the rest of tnet's training side (a
test imports it in a process that refuses TensorFlow).

An updatable export (`export_for_serving(..., updatable=True)`, see
tnet.serving.updatable) records in `export_info.json`, under "updatable",
its base id, the step its rows hold (`through_step`), its tables (prefix
and row width), its dense variables and the salt and digest of its update
key. Beside it, the publisher (tnet.serving.publish) writes one directory
per delta, `<export_dir>/deltas/delta-NNNNNN/` (a temporary directory,
fsynced, renamed: tnet.files.publish_dir), numbered from 1 with no gap:

* `delta.npz`: per table `<prefix>_keys` (int64), `<prefix>_rows`
  (float32 [n, dim]: the rows changed since the previous delta) and
  `<prefix>_deleted` (int64: keys freed since, which read the zero row),
  and `dense_<i>` for every dense variable of the export;
* `manifest.json`: format, version, base_id, since_step, through_step,
  per table the counts, deletes_incomplete, the creation time and the
  payload's size and sha256.

`load_delta` refuses (DeltaError) a missing delta (a gap), a manifest that
names another version or base, and a payload whose size or checksum
differs. A TF Serving base path holds numbered version directories; a
compaction writes the next one as a new base (`versions_of`,
`newest_export`).
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional

import numpy as np

from tnet.files import _sha256, publish_dir

DELTAS_DIR = "deltas"
MANIFEST = "manifest.json"
PAYLOAD = "delta.npz"
INFO_FILE = "export_info.json"
# The signatures of an updatable export (tnet.serving.updatable).
APPLY_DELTA = "apply_delta"
APPLY_ROWS = "apply_rows"
SERVING_VERSION = "serving_version"


class DeltaError(RuntimeError):
    """A delta that must not be applied (gap, checksum, other base).

    Example:
        ```python
        from tnet.serving import follow
        try:
            follow.Follower("/models/ranker/1", targets).step()
        except tn.serving.DeltaError as e:
            print(e)     # the target and the delta; the target keeps serving
        ```
    """


def read_info(export_dir: str, full: bool = False) -> Dict[str, Any]:
    """The export's "updatable" entry of export_info.json (DeltaError if
    it has none), or with `full` the whole file."""
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


def write_delta(export_dir: str, version: int, arrays: Dict[str, np.ndarray],
                manifest: Dict[str, Any]) -> str:
    """Publishes delta `version` (payload `arrays`, `manifest` plus the
    payload's checksum); returns its directory."""
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
