"""Distribution: TF_CONFIG clusters and TensorFlow's ParameterServerStrategy.

A tnet cluster is the standard TF_CONFIG layout (as Kubeflow's TFJob sets
it): one `chief` that runs the training program, `worker` tasks that run the
steps, and `ps` tasks that hold the dense variables and one shard of every
tnet table each. ps and worker processes run `python -m tnet.server`; the
chief calls `tn.distribute.ParameterServerStrategy()` and `model.fit`.

Without TF_CONFIG (or with a TF_CONFIG that has no ps job) the same program
runs in one process: `ParameterServerStrategy()` then returns the default
strategy.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
from typing import Any, Dict, Optional

import tensorflow as tf

from tnet import _ops  # noqa: F401  (load the op library before any server)


_M_MMAP_THRESHOLD = -3         # mallopt parameter (glibc malloc.h)
DEFAULT_MMAP_THRESHOLD = 128 * 1024


def pin_mmap_threshold() -> bool:
    """mallopt(M_MMAP_THRESHOLD, TNET_MMAP_THRESHOLD or 128 KiB): fixes the
    threshold (which also turns off glibc's dynamic raising of it), so every
    large transient buffer (checkpoint export chunks, gradients) is mmapped
    and returned to the OS when freed. With the dynamic threshold the heap
    fragments and a cluster process grows with every checkpoint (BENCHMARKS
    "Checkpoint memory"). Every process of a cluster pins it: ps and worker
    tasks in `python -m tnet.server`, the chief in
    `ParameterServerStrategy()`. 0 in TNET_MMAP_THRESHOLD leaves malloc
    alone. False if not glibc."""
    value = int(os.environ.get("TNET_MMAP_THRESHOLD", DEFAULT_MMAP_THRESHOLD))
    if value <= 0:
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, value))
    except (OSError, AttributeError):
        return False


class ClusterConfigError(ValueError):
    """TF_CONFIG is malformed or describes an unusable cluster."""


def parse_tf_config(raw: Optional[str] = None) -> Optional[Dict[str, Any]]:
    """Parses and validates TF_CONFIG (the environment's by default).

    Returns None when TF_CONFIG is unset or empty. Raises ClusterConfigError
    with the reason and the fix for bad JSON, a missing cluster, a missing
    chief or ps job, an unknown task type, or an index out of range.
    """
    raw = os.environ.get("TF_CONFIG", "") if raw is None else raw
    if not raw.strip():
        return None
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ClusterConfigError(
            f"TF_CONFIG is not valid JSON ({e.msg} at line {e.lineno} column "
            f"{e.colno}): {raw[:200]!r}") from None
    if not isinstance(config, dict) or not isinstance(config.get("cluster"), dict):
        raise ClusterConfigError(
            'TF_CONFIG needs a "cluster" object, e.g. {"cluster": {"chief": '
            '["host:port"], "worker": [...], "ps": [...]}, "task": {"type": '
            '"chief", "index": 0}}')
    cluster = config["cluster"]
    for job, addresses in cluster.items():
        if (not isinstance(addresses, list) or not addresses
                or not all(isinstance(a, str) and ":" in a for a in addresses)):
            raise ClusterConfigError(
                f"TF_CONFIG cluster job {job!r} must be a non-empty list of "
                f"'host:port' strings, got {addresses!r}")
    if "ps" not in cluster:
        raise ClusterConfigError(
            "TF_CONFIG has no 'ps' job: ParameterServerStrategy needs at "
            "least one ps task (unset TF_CONFIG to train in one process)")
    if "worker" not in cluster:
        raise ClusterConfigError("TF_CONFIG has no 'worker' job: add at "
                                 "least one worker task")
    if "chief" not in cluster:
        raise ClusterConfigError("TF_CONFIG has no 'chief' job: the chief "
                                 "runs the training program")
    if len(cluster["chief"]) != 1:
        raise ClusterConfigError("TF_CONFIG must have exactly one chief")
    task = config.get("task")
    if not isinstance(task, dict) or "type" not in task:
        raise ClusterConfigError('TF_CONFIG needs "task": {"type": ..., '
                                 '"index": ...}')
    kind, index = task.get("type"), task.get("index", 0)
    if kind not in cluster:
        raise ClusterConfigError(
            f"TF_CONFIG task type {kind!r} is not a job of the cluster "
            f"({sorted(cluster)})")
    if not isinstance(index, int) or not 0 <= index < len(cluster[kind]):
        raise ClusterConfigError(
            f"TF_CONFIG task index {index!r} is out of range for job {kind!r} "
            f"with {len(cluster[kind])} task(s)")
    return config


def ParameterServerStrategy(variable_partitioner=None,  # noqa: N802
                            tf_config: Optional[str] = None):
    """The strategy for this process's TF_CONFIG.

    With a ps cluster: a `tf.distribute.ParameterServerStrategy` built from
    TF_CONFIG (the caller must be the chief). `variable_partitioner`
    optionally shards large dense variables over the ps tasks, e.g.
    `tf.distribute.experimental.partitioners.MinSizePartitioner(...)`.
    Without TF_CONFIG: the default (one-process) strategy.

    The chief pins glibc's mmap threshold (`pin_mmap_threshold`): measured,
    300 full saves from a chief grew it ~40 KB a save without the pin and
    left it flat with it.
    """
    config = parse_tf_config(tf_config)
    if config is None:
        return tf.distribute.get_strategy()
    if config["task"]["type"] != "chief":
        raise ClusterConfigError(
            f"this process is {config['task']['type']}:"
            f"{config['task'].get('index', 0)} in TF_CONFIG; only the chief "
            "builds the strategy. Start ps and worker tasks with "
            "`python -m tnet.server`.")
    pin_mmap_threshold()
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    return tf.distribute.ParameterServerStrategy(
        resolver, variable_partitioner=variable_partitioner)


def unreachable_tasks(config: Optional[Dict[str, Any]] = None,
                      jobs=("ps", "worker"), timeout: float = 2.0):
    """Tasks of TF_CONFIG whose address refuses a TCP connection now.

    Used after a failed step to name the lost task in the error. Connects
    to the address as written in TF_CONFIG.
    """
    import socket  # noqa: PLC0415
    config = config or parse_tf_config()
    lost = []
    for job in jobs:
        for index, address in enumerate(config["cluster"].get(job, [])):
            host, _, port = address.rpartition(":")
            try:
                with socket.create_connection((host.strip("[]"), int(port)),
                                              timeout=timeout):
                    pass
            except OSError as e:
                lost.append((f"{job}:{index}", address, str(e)))
    return lost


class LostTaskError(RuntimeError):
    """A ps task of the cluster died; the job cannot go on without it."""


def explain_failure(error: BaseException) -> Optional[LostTaskError]:
    """If a cluster failure was caused by a lost ps task, a LostTaskError
    naming it (and what to do); otherwise None."""
    if not isinstance(error, (tf.errors.UnavailableError,
                              tf.errors.AbortedError,
                              tf.errors.CancelledError,
                              tf.errors.InternalError,
                              tf.errors.NotFoundError,
                              tf.errors.InvalidArgumentError)):
        return None
    config = parse_tf_config()
    if config is None:
        return None
    lost = unreachable_tasks(config, jobs=("ps",))
    if not lost:
        return None
    names = ", ".join(f"{name} ({address}: {why})" for name, address, why in lost)
    return LostTaskError(
        f"lost parameter server task(s) {names}. The tables and dense "
        "variables on a ps are gone with it, so training cannot continue: "
        "restart the whole cluster; with checkpoints enabled training resumes "
        f"from the newest one. Original error: {type(error).__name__}: "
        f"{str(error).splitlines()[0][:300]}")


def is_parameter_server_strategy(strategy=None) -> bool:
    strategy = strategy or tf.distribute.get_strategy()
    return isinstance(strategy, tf.distribute.ParameterServerStrategy)


def num_ps(strategy=None) -> int:
    """Number of ps tasks of the current strategy (0 in one process)."""
    strategy = strategy or (tf.distribute.get_strategy()
                            if tf.distribute.has_strategy() else None)
    return int(getattr(getattr(strategy, "extended", None), "_num_ps", 0) or 0)
