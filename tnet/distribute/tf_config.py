"""TF_CONFIG: parsed and checked (`parse_tf_config`, with the reason and
the fix for a bad one), and which of its tasks refuse a connection now
(`unreachable_tasks`)."""
from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional


class ClusterConfigError(ValueError):
    """TF_CONFIG is malformed or describes an unusable cluster.

    Example:
        ```python
        try:
            tn.distribute.parse_tf_config('{"cluster": {}}')
        except tn.distribute.ClusterConfigError as e:
            print(e)          # the reason and the fix, one line
        ```
    """


def parse_tf_config(raw: Optional[str] = None) -> Optional[Dict[str, Any]]:
    """Parses and validates TF_CONFIG (the environment's by default).

    Returns None when TF_CONFIG is unset or empty. Raises ClusterConfigError
    with the reason and the fix for bad JSON, a missing cluster, a missing
    chief or ps job, an unknown task type, or an index out of range.

    Args:
      raw: a TF_CONFIG JSON string (default: the environment's TF_CONFIG).

    Returns:
      The parsed dict (`cluster`, `task`), or None.

    Example:
        ```python
        config = tn.distribute.parse_tf_config(
            '{"cluster": {"chief": ["h0:2222"], "ps": ["h1:2222"],'
            ' "worker": ["h2:2222"]}, "task": {"type": "chief", "index": 0}}')
        print(config["task"])        # {'type': 'chief', 'index': 0}
        ```
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
