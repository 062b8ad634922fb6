"""The per-table row-hash index that lets a delta checkpoint write only
the rows changed since the previous checkpoint (kept per live table).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Dict

import numpy as np

from tnet.table import SparseTable


class _UntrackedChange(Exception):
    """A delta is not valid: rows changed without a training push."""


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
