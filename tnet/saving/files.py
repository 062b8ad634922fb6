"""File plumbing of the three writers of published directories
(checkpoints, serving exports, serving deltas): fsync, sha256, the
disk-full test, safe names, progress.
"""
from __future__ import annotations

import errno
import hashlib
import logging
import os
import time
from typing import Callable


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


def _is_disk_full(error: BaseException) -> bool:
    """An error that means the file system is full (ENOSPC from Python,
    or TensorFlow's and HDF5's texts for it)."""
    text = str(error).lower()
    return (getattr(error, "errno", None) == errno.ENOSPC
            or "no space left" in text or "errno = 28" in text
            or "resource exhausted" in text and "space" in text)


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
    logger.info("%s", message)
