"""HDF5 part files: one resizable dataset per column (keys, weights,
slots, meta), appended chunk by chunk, and their shape/dtype check.
"""
from __future__ import annotations

import os
from typing import Dict, Tuple

import h5py
import numpy as np

from tnet.saving.manifest import CheckpointError, FORMAT, FORMAT_VERSION
from tnet.table import SparseTable


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
