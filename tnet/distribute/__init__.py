"""Distribution: TF_CONFIG clusters and TensorFlow's ParameterServerStrategy.

A tnet cluster is the standard TF_CONFIG layout (as Kubeflow's TFJob sets
it): one `chief` that runs the training program, `worker` tasks that run the
steps, and `ps` tasks that hold the dense variables and one shard of every
tnet table each. ps and worker processes run `python -m tnet.server`; the
chief calls `tn.distribute.ParameterServerStrategy()` and `model.fit`.

Without TF_CONFIG (or with a TF_CONFIG that has no ps job) the same program
runs in one process: `ParameterServerStrategy()` then returns the default
strategy.

One module per concern: tf_config.py (TF_CONFIG parsed and checked),
strategy.py (ParameterServerStrategy), malloc.py (glibc malloc tuning),
grpc_options.py (channel keepalive), ps_policy.py (what the chief does
when a ps stops answering: through_ps_cut, the step watchdog),
failures.py (naming a lost task, the steps a restart redoes, exit_now).
Their public names are this package's: `tn.distribute.<name>`.
"""
from __future__ import annotations

from tnet import _ops  # noqa: F401  (load the op library before any server)
from tnet.distribute.failures import (EXIT_RESTART, LostTaskError, blamed_ps,
                                      exit_now, explain_failure,
                                      steps_lost_note, tasks_named_in)
from tnet.distribute.grpc_options import (GRPC_DEFAULT_OPTIONS,
                                          set_grpc_defaults)
from tnet.distribute.malloc import (DEFAULT_MMAP_THRESHOLD, DEFAULT_TOP_PAD,
                                    MallocSettingError, pin_mmap_threshold,
                                    set_top_pad)
from tnet.distribute.ps_policy import (DEFAULT_PS_TIMEOUT,
                                       DEFAULT_STEP_TIMEOUT,
                                       _install_step_watchdog, ps_timeout,
                                       silent_ps, through_ps_cut)
from tnet.distribute.strategy import (ParameterServerStrategy,
                                      is_parameter_server_strategy, num_ps)
from tnet.distribute.tf_config import (ClusterConfigError, parse_tf_config,
                                       unreachable_tasks)

