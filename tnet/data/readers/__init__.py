"""Readers for a user's data described by a feature spec (tnet.data.spec).

    ds = tn.data.spec_dataset(spec, "data/2026-11-01/*", "tfrecord", 1024)
    for features, label in ds: ...           # (features, label, weight) with a weight

Every format gives the same element: `features` maps each id feature to
int64/string ids (`[B]` for kind id, padded with the feature's default;
a `tf.RaggedTensor` `[B, None]` for ids and sequences), each dense feature
to float32 `[B]`; the label is float32 `[B]`; a weight feature adds a third
element. `with_group=True` adds the group key to `features` (for group AUC;
leave it out of training so it does not become a serving input).

* tfrecord: tf.Example records (`tf.io.parse_example`, in batches; gzip when
  the name ends in .gz or `compression="GZIP"`). A single id is a
  FixedLen feature (absent: the default), ids are VarLen. A record that is
  not a tf.Example or does not match the spec fails with `file:record` (the
  1-based record number) and the feature; `bad_rows="skip"` validates each
  record alone (slower, see BENCHMARKS.md), drops the bad ones and counts
  them in `ReadStats`.
* csv / tsv: a header line naming the columns (extra columns are allowed,
  every file the same header), read by the same block reader and RE2 row
  check as the Criteo/Avazu readers (tnet/data/_rows.py): bad lines fail
  with `file:line` and the column, or are skipped and counted. Multi-valued
  ids are one cell separated by the feature's `separator` ("|"). No quoted
  fields: a cell cannot contain the delimiter.
* parquet: read with pyarrow (`pip install pyarrow`) in record batches;
  single ids int64/string, ids `list<int64|string>`, numbers int or float.
  A null label or a type that does not match fails with `file:row`.
  Through `Dataset.from_generator`, so one process only: under
  ParameterServerStrategy the CLI converts Parquet to TFRecord first
  (`parquet_to_tfrecord`).

Finding bad rows: `scan_files` reads files once in file order (eager
Python over the same checks) and counts the bad records per file with the
first few named; `tnet.train` uses it to count `--bad_rows=skip` rows and,
after a read failure, to name the first bad record in file order.

One module per format (tfrecord.py, delimited.py for CSV/TSV,
parquet.py), their shared parts in _common.py, and scan.py for counting
and scanning files in file order. The spec (tnet.data.spec) imports the
readers; the readers import nothing of it but its type names.

Sharding (`input_context`): by file when there are at least as many files
as input pipelines, else by record (each pipeline reads everything and
keeps every n-th chunk), as the Criteo reader does.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import tensorflow as tf

from tnet.data._rows import ReadStats
from tnet.data.readers._common import FORMATS, BadDataError
from tnet.data.readers.delimited import _delimited
from tnet.data.readers.parquet import _parquet, parquet_to_tfrecord
from tnet.data.readers.scan import (FileScan, count_records, find_bad_records,
                                    scan_files)
from tnet.data.readers.tfrecord import _tfrecord

if TYPE_CHECKING:  # annotations only: the spec imports the readers
    from tnet.data.spec import FeatureSpec

__all__ = ["FORMATS", "BadDataError", "FileScan", "count_records",
           "find_bad_records", "parquet_to_tfrecord", "scan_files",
           "spec_dataset"]


def spec_dataset(spec: FeatureSpec, paths, format: str, batch_size: int, *,
                 bad_rows: str = "fail", shuffle_buffer: int = 0,
                 num_epochs: Optional[int] = 1, seed: Optional[int] = None,
                 drop_remainder: bool = False,
                 input_context: Optional[tf.distribute.InputContext] = None,
                 stats: Optional[ReadStats] = None, with_group: bool = False,
                 compression: Optional[str] = None,
                 log_limit: int = 5) -> tf.data.Dataset:
    """Reads `paths` (files, globs or a list) in `format` as described by
    `spec`; see the module docstring. Arguments as tn.data.criteo_dataset;
    `log_limit`: with bad_rows="skip", the first bad rows logged to stderr
    per pass (then one notice that more are skipped without logging; 0:
    log nothing, e.g. when `scan_files` has reported them already).

    Args:
      spec: the `FeatureSpec`.
      paths: a file, a glob or a list of them.
      format: "tfrecord", "csv", "tsv" or "parquet".
      batch_size: examples per batch.
      bad_rows: "fail" (raise `BadDataError` naming the row) or "skip".
      shuffle_buffer: examples shuffled (0: none).
      num_epochs: passes (None: repeat forever).
      seed: the shuffle seed.
      drop_remainder: drop a short last batch.
      input_context: a `tf.distribute.InputContext`: read this worker's shard.
      stats: a `ReadStats` counting the skipped rows.
      with_group: also return the spec's group feature.
      compression: "GZIP" or None (default: from the file name).
      log_limit: bad rows logged one by one at most.

    Returns:
      A dataset of `(features, label)` (`(features, label, weight)` with a
      weight feature); the label and dense features are float32 `[B]`.

    Example:
        ```python
        spec = tn.data.spec.load("spec.json")
        ds = tn.data.spec_dataset(spec, "data/2026-11-0*/*.csv", "csv", 256,
                                  shuffle_buffer=10_000, seed=0)
        ```
    """
    if format not in FORMATS:
        raise ValueError(f"format must be one of {list(FORMATS)}, got {format!r}")
    if bad_rows not in ("fail", "skip"):
        raise ValueError(f"bad_rows must be 'fail' or 'skip', got {bad_rows!r}")
    if format == "tfrecord":
        fn = _tfrecord
    elif format == "parquet":
        fn = _parquet
    else:
        fn = _delimited
    return fn(spec, paths, format, int(batch_size), bad_rows=bad_rows,
              shuffle_buffer=shuffle_buffer, num_epochs=num_epochs, seed=seed,
              drop_remainder=drop_remainder, input_context=input_context,
              stats=stats, with_group=with_group, compression=compression,
              log_limit=int(log_limit))
