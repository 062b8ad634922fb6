"""The entry point of `python -m tnet.train`: `main` turns the parsed
flags into a JobConfig once, `run` checks it and runs the job it names,
and `main` maps what went wrong to the exit status: 2 a bad flag (or
flag combination, or TF_CONFIG), 4 bad input (one line naming
file:record), 138 a lost task (restart the cluster: it resumes from the
newest checkpoint)."""
from __future__ import annotations

import os
import traceback

from absl import app

import tnet as tn
import tf_keras
from tnet.cli import flags as cli_flags
from tnet.cli.config import JobConfig, check_config
from tnet.cli.data import explain_bad_input
from tnet.cli.train import Running
from tnet.log import get as _get_logger

_log = _get_logger("train")


def run(cfg: JobConfig, running: Running) -> dict:
    """Runs the job `cfg` names: the stream, the daily loop or one fit."""
    check_config(cfg)
    tf_keras.utils.set_random_seed(cfg.seed)
    os.makedirs(cfg.model_dir, exist_ok=True)
    strategy = tn.distribute.ParameterServerStrategy()
    distributed = tn.distribute.is_parameter_server_strategy(strategy)
    if cfg.stream:
        from tnet.cli import stream  # noqa: PLC0415
        return stream.run_stream(cfg, strategy, running, distributed)
    if cfg.feature_spec and cfg.days:
        from tnet.cli import daily  # noqa: PLC0415
        return daily.run_days(cfg, strategy, distributed)
    from tnet.cli import train  # noqa: PLC0415
    return train.train(cfg, strategy, distributed, running)


def main(argv):
    """Runs the job of the parsed flags (`python -m tnet.train` calls it
    once they are checked: tnet/train.py) and returns the exit status."""
    del argv  # tnet/train.py refuses positional arguments
    cfg = cli_flags.job_config()
    running = Running()
    try:
        run(cfg, running)
    except app.UsageError as e:  # a flag combination that cannot work
        _log.error(f"tnet.train: {e}")
        return 2
    except tn.distribute.ClusterConfigError as e:
        _log.error(f"tnet.train: bad TF_CONFIG: {e}")
        return 2
    except tn.distribute.MallocSettingError as e:
        _log.error(f"tnet.train: {e}")
        return 2
    except Exception as e:  # noqa: BLE001
        bad = explain_bad_input(e)
        if bad is not None:
            # One line (no traceback unless --verbose): what, where, the fix.
            text = " ".join(str(bad).split())
            _log.error(f"tnet.train: {text}")
            if cfg.verbose:
                traceback.print_exception(e)
            return 4
        lost = tn.distribute.explain_failure(e)
        if lost is None:
            raise
        note = tn.distribute.steps_lost_note(running.model,
                                             running.checkpoints)
        # EXIT_RESTART (138): a restart of the cluster resumes from the newest
        # checkpoint; no teardown waiting on the lost task.
        tn.distribute.exit_now(tn.distribute.EXIT_RESTART,
                               f"tnet.train: {lost} ({note})")
    if running.distributed:
        # Everything is written: skip the interpreter's teardown, which
        # removes functions from every remote task and stalled 38 s on a
        # worker that had been cut off (measured, tests/test_hosts.py).
        tn.distribute.exit_now(0)
    return 0
