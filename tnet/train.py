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
# JobConfig they are parsed into and the jobs live in tnet/cli/.

from absl import app, flags

import tnet as tn  # noqa: F401  (first: selects tf_keras)
from tnet import bind
from tnet.cli import flags as cli_flags
from tnet.cli.flags import parse_flags
from tnet.cli.main import main

__all__ = ["main", "parse_flags"]

# --help lists tnet's flags as this module's own (absl shows the main
# module's key flags).
flags.adopt_module_key_flags(cli_flags)

if __name__ == "__main__":
    bind.ensure()  # before any server starts: keep the port on TF_CONFIG's host
    app.run(main, flags_parser=parse_flags)
