"""`ParameterServerStrategy()`: the strategy for this process's TF_CONFIG
(the default strategy without one), with the chief's malloc, gRPC, ps
failure policy and step watchdog set up first."""
from __future__ import annotations

from typing import Optional

import tensorflow as tf

from tnet import _ops  # noqa: F401  (load the op library before any server)
from tnet.distribute.grpc_options import set_grpc_defaults
from tnet.distribute.malloc import pin_mmap_threshold
from tnet.distribute.ps_policy import (_install_ps_failure_policy,
                                       _install_step_watchdog)
from tnet.distribute.tf_config import ClusterConfigError, parse_tf_config


def ParameterServerStrategy(variable_partitioner=None,  # noqa: N802
                            tf_config: Optional[str] = None):
    """The strategy for this process's TF_CONFIG.

    With a ps cluster: a `tf.distribute.ParameterServerStrategy` built from
    TF_CONFIG (the caller must be the chief). `variable_partitioner`
    optionally shards large dense variables over the ps tasks, e.g.
    `tf.distribute.experimental.partitioners.MinSizePartitioner(...)`.
    Without TF_CONFIG: the default (one-process) strategy.

    The chief sets glibc's mmap threshold and top pad (`pin_mmap_threshold`):
    measured, 300 full saves from a chief grew it ~40 KB a save without the
    mmap pin and left it flat with it.

    Args:
      variable_partitioner: optional partitioner of large dense variables
        over the ps tasks (None: each dense variable on one ps).
      tf_config: a TF_CONFIG JSON string to use instead of the environment's.

    Returns:
      A `tf.distribute.ParameterServerStrategy` under a cluster, else the
      default strategy.

    Example:
        ```python
        strategy = tn.distribute.ParameterServerStrategy()
        with strategy.scope():
            model = tn.models.WideDeep(["user_id"], [], embedding_dim=8)
            model.compile(tn.optimizer.Adagrad(0.05))
        model.fit(tf.keras.utils.experimental.DatasetCreator(dataset_fn),
                  epochs=2, steps_per_epoch=100)
        ```
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
    set_grpc_defaults()
    _install_ps_failure_policy()
    _install_step_watchdog()
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    return tf.distribute.ParameterServerStrategy(
        resolver, variable_partitioner=variable_partitioner)


def is_parameter_server_strategy(strategy=None) -> bool:
    strategy = strategy or tf.distribute.get_strategy()
    return isinstance(strategy, tf.distribute.ParameterServerStrategy)


def num_ps(strategy=None) -> int:
    """Number of ps tasks of the current strategy (0 in one process).

    Args:
      strategy: a strategy (default: the current one, if any).

    Example:
        ```python
        strategy = tn.distribute.ParameterServerStrategy()
        print(tn.distribute.num_ps(strategy))    # 0 without TF_CONFIG
        ```
    """
    strategy = strategy or (tf.distribute.get_strategy()
                            if tf.distribute.has_strategy() else None)
    return int(getattr(getattr(strategy, "extended", None), "_num_ps", 0) or 0)
