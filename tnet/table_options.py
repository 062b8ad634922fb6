"""A SparseTable's options, checked and turned into its op attrs: the
initializer (`_initializer_attrs`), the disk tier and lifecycle checks,
the stripes of a capped shard and the global seed."""
from __future__ import annotations

import math
from typing import Any

import tensorflow as tf


_INIT_ALIASES = {
    "zeros": "zeros", "zero": "zeros", "ones": "constant",
    "constant": "constant", "uniform": "uniform", "randomuniform": "uniform",
    "random_uniform": "uniform", "normal": "normal", "randomnormal": "normal",
    "random_normal": "normal", "truncated_normal": "truncated_normal",
    "truncatednormal": "truncated_normal",
}


# The default initializer's stddev for columns wider than 1 (see below).
DEFAULT_STDDEV = 0.01


def _initializer_attrs(initializer: Any, dim: int, seed: int) -> dict:
    """Maps an initializer (None, name, dict or Keras initializer) to attrs.

    The table draws initial values from a generator seeded by each key, so a
    Keras initializer is translated by kind and parameters (mean, stddev,
    minval, maxval, value, seed); its own random state is not used.

    The default (None) was chosen by measurement (tools/measure_defaults.py,
    BENCHMARKS.md "Defaults"): a dim-1 column is a linear weight and starts
    at zero, as in a linear model; wider columns start normal with stddev
    0.01 (not zero: a dot product of two zero embeddings never gets a
    gradient; smaller than Keras' uniform +-0.05, which lost 0.004-0.008 AUC
    to stock with rows updated only when seen). The former default,
    truncated normal with stddev 1/sqrt(dim), put logit noise of std ~5
    into a wide part of 26 dim-1 columns and lost 0.02-0.08 AUC to stock.
    """
    # The names "normal" / "truncated_normal" without a stddev keep
    # tf.feature_column.embedding_column's 1/sqrt(dim).
    default_std = 1.0 / math.sqrt(dim)
    if initializer is None:
        name, cfg = (("zeros", {}) if dim == 1
                     else ("normal", {"stddev": DEFAULT_STDDEV}))
    elif isinstance(initializer, str):
        name, cfg = initializer, {}
    elif isinstance(initializer, dict):
        name, cfg = str(initializer.get("name", "")), initializer
    elif hasattr(initializer, "get_config"):
        name, cfg = type(initializer).__name__, initializer.get_config()
    else:
        name, cfg = repr(initializer), {}
    kind = _INIT_ALIASES.get(name.lower())
    if kind is None:
        raise ValueError(
            f"unsupported initializer {initializer!r}: tnet tables support "
            "zeros, ones, constant, uniform / RandomUniform, normal / "
            "RandomNormal and truncated_normal / TruncatedNormal")
    if cfg.get("seed") is not None:
        seed = int(cfg["seed"])
    if kind == "zeros":
        params = []
    elif kind == "constant":
        params = [1.0 if name.lower() == "ones" else float(cfg.get("value", 0.0))]
    elif kind == "uniform":
        params = [float(cfg.get("minval", -0.05)),
                  float(cfg.get("maxval", 0.05))]
    else:
        params = [float(cfg.get("mean", 0.0)),
                  float(cfg.get("stddev", default_std))]
    return {"initializer": kind, "initializer_params": params, "seed": seed}


def _global_seed() -> int:
    """The global TF seed (set_random_seed / tf.random.set_seed), else 0.
    Read without drawing an op seed, so other random ops are unaffected."""
    from tensorflow.python.eager import context  # noqa: PLC0415
    if tf.executing_eagerly():
        seed = context.global_seed()
    else:
        seed = tf.compat.v1.get_default_graph().seed
    return 0 if seed is None else int(seed)


def _check_tier(name, memory_budget_bytes, storage_dir, num_shards):
    if memory_budget_bytes is None:
        if storage_dir is not None:
            raise ValueError(f"SparseTable {name!r}: storage_dir is only used "
                             "with memory_budget_bytes; pass both")
        return
    if (isinstance(memory_budget_bytes, bool)
            or not isinstance(memory_budget_bytes, int)
            or memory_budget_bytes < num_shards):
        raise ValueError(f"SparseTable {name!r}: memory_budget_bytes must be "
                         f"a positive int (bytes of rows kept in memory), got "
                         f"{memory_budget_bytes!r}")
    if not isinstance(storage_dir, str) or not storage_dir:
        raise ValueError(f"SparseTable {name!r}: memory_budget_bytes needs "
                         "storage_dir, a writable local directory for the "
                         "rows that do not fit in memory")


def _check_lifecycle(name, min_count, admission_capacity, max_rows,
                     num_shards) -> None:
    if (isinstance(min_count, bool) or not isinstance(min_count, (int, float))
            or not math.isfinite(min_count) or min_count < 0):
        raise ValueError(f"SparseTable {name!r}: min_count must be a number "
                         f">= 0 (1 admits every key), got {min_count!r}")
    if (isinstance(admission_capacity, bool)
            or not isinstance(admission_capacity, int)
            or admission_capacity < 1):
        raise ValueError(f"SparseTable {name!r}: admission_capacity must be "
                         f"a positive int, got {admission_capacity!r}")
    if max_rows is not None and (isinstance(max_rows, bool)
                                 or not isinstance(max_rows, int)
                                 or max_rows < 0):
        raise ValueError(f"SparseTable {name!r}: max_rows must be a "
                         f"non-negative int or None, got {max_rows!r}")
    if max_rows and max_rows < num_shards:
        raise ValueError(f"SparseTable {name!r}: max_rows={max_rows} is less "
                         f"than num_shards={num_shards}; every shard needs "
                         "room for at least one row")


def _stripes_for(num_stripes: int, shard_cap: int) -> int:
    """Stripes for a shard capped at shard_cap rows: each stripe enforces
    its own share, so keep shares >= 256 rows (or 1 stripe)."""
    if shard_cap:
        while num_stripes > 1 and shard_cap // num_stripes < 256:
            num_stripes //= 2
    return num_stripes
