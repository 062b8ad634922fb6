"""The training CLI: python -m tnet.train --flagfile=configs/<model>_<data>.cfg

Trains a ranking model (Wide&Deep, DeepFM, DCN) on Criteo, Avazu or the
synthetic Criteo-like generator, with the Keras progress bar; evaluates AUC
and log loss on the hold-out; writes TensorBoard logs and `summary.json`
(config, metrics, throughput, table sizes) to --model_dir.
`--model=two_tower --data=movielens` trains the retrieval model instead and
evaluates recall@10/50/100 over all items (with a popularity baseline).

`--feature_spec=spec.json --format=tfrecord|csv|tsv|parquet` trains on a
user's own data (tnet.data.spec); with `--days=A..B --day_pattern=...` it
runs the daily loop of tnet/cli/daily.py (resume, evaluate the day before
training on it, train, checkpoint, export a new version).

With no flags it runs the embedded default: Wide&Deep on synthetic data.
"""
from __future__ import annotations

# The entry point only (its docstring is --help's text): the flags, the
# JobConfig they are parsed into and the jobs live in tnet/cli/. Run as
# `python -m tnet.train`, TensorFlow loads only once the flags are good:
# --help, a bad flag or flag combination answers in a fraction of a second.

from absl import app, flags

import tnet as tn  # first: selects tf_keras
from tnet import bind
from tnet.cli import flags as cli_flags
from tnet.cli.config import check_config
from tnet.cli.flags import parse_flags
from tnet.log import get as _get_logger

__all__ = ["main", "parse_flags"]

# --help lists tnet's flags as this module's own (absl shows the main
# module's key flags).
flags.adopt_module_key_flags(cli_flags)


def main(argv) -> int:
    """Runs the job the parsed flags describe (tnet/cli/main.py); a flag
    combination that cannot work exits 2 before TensorFlow loads."""
    if len(argv) > 1:
        _get_logger("train").error(f"tnet.train: unexpected arguments "
                                   f"{argv[1:]}: flags are --name=value")
        return 2
    try:
        check_config(cli_flags.job_config())
    except app.UsageError as e:
        _get_logger("train").error(f"tnet.train: {e}")
        return 2
    tn._load()  # noqa: SLF001  (TensorFlow, Keras and all of tnet)
    from tnet.cli import main as cli_main  # noqa: PLC0415
    return cli_main.main(argv)


if __name__ == "__main__":
    bind.ensure()  # before any server starts: keep the port on TF_CONFIG's host
    app.run(main, flags_parser=parse_flags)
