"""Constants and helpers shared by tools/bench_ops.py and its sections."""
from __future__ import annotations

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _bench_common as bc  # noqa: E402

LR = 0.01
EPSILON = 1e-7
INITIAL_ACCUMULATOR = 0.1
META_BYTES = 16  # show float32, click float32, last_step int64
KEY_BYTES = 8


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def distinct_keys(start: int, n: int) -> np.ndarray:
    """n distinct, random-looking int64 keys (a bijection of start..start+n).

    Multiplying by an odd constant modulo 2^64 is invertible, so disjoint
    ranges give disjoint key sets. -1 and -2 (the DenseHashTable's empty and
    deleted keys) are checked to be absent.
    """
    x = np.arange(start, start + n, dtype=np.uint64)
    keys = (x * np.uint64(0x9E3779B97F4A7C15)).view(np.int64)
    assert not ((keys == -1) | (keys == -2)).any()
    return keys


def rows_per_sec(fn, args, calls: int, rows_per_call: int) -> float:
    return rows_per_call * calls / bc.time_calls(fn, args, calls)
