"""File plumbing of the three writers of published directories
(checkpoints, serving exports, serving deltas): the one way to publish a
directory (`publish_dir`) and a JSON file (`write_json_atomic`), fsync,
sha256, the disk-full test and the one-line messages of a write that
failed or cannot fit, safe names, progress.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
import time
from typing import Any, Callable, Iterable, Iterator, Optional, Tuple


_PROGRESS_SECONDS = 5.0

logger = logging.getLogger("tnet.checkpoint")

Progress = Callable[[str], None]


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


def fsync_tree(path: str) -> None:
    """fsyncs every file and directory under `path` (itself included)."""
    for root, _, files in os.walk(path):
        for name in files:
            _fsync_file(os.path.join(root, name))
        _fsync_dir(root)


def temp_prefix(final: str) -> str:
    """The name prefix of `final`'s temporary directories, beside it:
    hidden (TF Serving loads numeric version names only, checkpoint and
    delta listings match their own names only)."""
    return f".{os.path.basename(os.path.normpath(final))}.tmp-"


def remove_stale_temps(final: str) -> None:
    """Removes the temporary directories of `final` a killed writer left."""
    parent, prefix = os.path.dirname(final), temp_prefix(final)
    if not os.path.isdir(parent):
        return
    for name in os.listdir(parent):
        if name.startswith(prefix):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


@contextlib.contextmanager
def publish_dir(final: str) -> Iterator[str]:
    """The one way checkpoints, serving exports and serving deltas publish
    a directory: yields an empty temporary directory beside `final`
    (`.<name>.tmp-*`, after removing any a killed writer left); when the
    block ends without an error, fsyncs every file and directory in it,
    renames it to `final` (an existing empty `final` is replaced; a
    non-empty one fails the rename) and fsyncs the parent. On any error
    the temporary directory is removed and the error propagates, so a
    reader sees the whole directory or nothing, also after a power loss.
    """
    final = os.path.abspath(os.fspath(final))
    parent = os.path.dirname(final)
    os.makedirs(parent, exist_ok=True)
    remove_stale_temps(final)
    tmp = tempfile.mkdtemp(prefix=temp_prefix(final), dir=parent)
    try:
        yield tmp
        fsync_tree(tmp)
        if os.path.isdir(final) and not os.listdir(final):
            os.rmdir(final)
        os.rename(tmp, final)
        _fsync_dir(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_json_atomic(path: str, obj: Any, **dump_args) -> None:
    """Replaces the JSON file `path` atomically and durably: a temporary
    file beside it, fsynced, renamed over it, the directory fsynced. A
    reader sees the old or the new content, never half of one. (Inside a
    `publish_dir` block a plain write is enough: the block fsyncs all.)"""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump(obj, f, **dump_args)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    _fsync_dir(os.path.dirname(os.path.abspath(path)))


def _is_disk_full(error: BaseException) -> bool:
    """An error that means the file system is full (ENOSPC from Python,
    or TensorFlow's and HDF5's texts for it)."""
    text = str(error).lower()
    return (getattr(error, "errno", None) == errno.ENOSPC
            or "no space left" in text or "errno = 28" in text
            or "resource exhausted" in text and "space" in text)


def free_bytes(path: str) -> Optional[int]:
    """The free bytes of the file system holding `path`; None if unknown."""
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def variables_bytes(variables: Iterable[Any]) -> int:
    """The bytes the values of `variables` (dense tf.Variables) hold."""
    return sum(math.prod(int(d) for d in v.shape) * v.dtype.size
               for v in variables)


def _full_hint(where: str, free: Optional[int], fix: str) -> str:
    return (f"the file system of {where} is full"
            + (f" ({free:,} bytes free)" if free is not None else "")
            + f": free space or {fix}.")


def write_failure(what: str, where: str, error: BaseException,
                  fix: str) -> Tuple[str, Optional[int]]:
    """(message, errno) of a write the file system refused, for the
    checkpoint and export errors: "could not write WHAT: Type: first line
    of the error." and, when the disk is full, which file system and `fix`
    (e.g. "save to another directory"). The caller adds what state it left.
    Why: h5py and TensorFlow report a full disk as a bare "Can't write
    data" or "No space left on device" without naming the directory."""
    text = str(error).strip()
    text = text.splitlines()[0][:500] if text else repr(error)
    message = f"could not write {what}: {type(error).__name__}: {text}."
    if not _is_disk_full(error):
        return message, getattr(error, "errno", None)
    hint = _full_hint(where, free_bytes(where), fix)
    return f"{message} {hint[0].upper()}{hint[1:]}", errno.ENOSPC


def space_shortfall(what: str, need: int, where: str,
                    fix: str) -> Optional[str]:
    """None when `need` bytes fit in the free space of `where` (or it is
    unknown); else the message refusing to write WHAT before anything is
    written: "could not write WHAT: it needs about N bytes and the file
    system of WHERE is full (F bytes free): free space or FIX." """
    free = free_bytes(where)
    if free is None or free >= need:
        return None
    return (f"could not write {what}: it needs about {need:,} bytes and "
            + _full_hint(where, free, fix))


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _safe_name(name: str) -> str:
    cleaned = "".join(c if c.isalnum() or c in "_-." else "_" for c in name)
    return cleaned.strip(".") or "table"


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
    logger.debug("%s", message)
