"""Criteo Kaggle (Display Advertising Challenge) readers for `tf.data`.

The raw files are tab-separated, no header: `label, I1..I13, C1..C26`
(`train.txt`) or `I1..I13, C1..C26` (`test.txt`, 39 fields). Every field may
be empty. Each batch is a dict plus the label (float32 `[B]`, 0 or 1):

* `I1`..`I13`: float32 `[B]`, `log(1 + x)` for `x > 0`, else 0. Empty and
  negative values (I2 has `-1`, `-2`, `-3`) become 0; the usual Criteo
  transform, so a model needs no normalization layer.
* `C1`..`C26`: int64 `[B]`, the 8-hex-digit id read as an unsigned 32-bit
  number (0 .. 2**32-1). An empty field is `CRITEO_MISSING_ID` (2**32): a
  real id of its own, so "missing" gets a learned embedding, and it can
  never collide with a hex id (why not -1: tnet treats -1 as padding, which
  would drop the column from the row instead of learning "missing").

The readers are pure `tf.data` graphs (see `tnet/data/_rows.py`), so they
work in a ParameterServerStrategy `dataset_fn` (tested with
`ClusterCoordinator.create_per_worker_dataset`). Files are listed and sized
when the dataset is built (on the chief under ParameterServerStrategy), so
they must be visible there too, and must not change while being read.
"""
from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from tnet.data._rows import Field, PathLike, ReadStats, RowFormat, read_rows

CRITEO_INT_COLUMNS: tuple[str, ...] = tuple(f"I{i}" for i in range(1, 14))
CRITEO_CAT_COLUMNS: tuple[str, ...] = tuple(f"C{i}" for i in range(1, 27))
CRITEO_MISSING_ID: int = 2**32

_LABEL = Field("label", "[01]", "0 or 1")
# At most 18 digits: always fits int64, and stays finite and exact enough in float64.
_INT = r"(?:-?[0-9]{1,18})?"
_NUMBER = r"(?:-?(?:[0-9]{1,18}(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]{1,2})?)?"
_HEX = r"(?:[0-9a-fA-F]{8})?"
# Weights of the 8 nibbles for the high and low 16 bits of an id.
_HI_LO = [[16.0**(3 - k), 0.0] for k in range(4)] + [[0.0, 16.0**(3 - k)] for k in range(4)]


def _hex_ids(fields: tf.Tensor, first: int) -> tf.Tensor:
    """fields[:, first:] (0 or 8 hex digits each) -> int64 ids (empty -> missing id).

    The bytes of all fields are decoded and then sliced: slicing the string
    tensor first would copy every string.

    Arithmetic on the raw bytes (measured 2x faster than per-nibble int64
    `where` chains): OR 0x20 folds 'A'-'F' onto 'a'-'f' and keeps '0'-'9';
    one float32 matmul gives the high and low 16 bits (exact: at most 65535),
    combined in int64. An empty field decodes to zero bytes.
    """
    raw = tf.io.decode_raw(fields, tf.uint8, fixed_length=8)[:, first:]
    c = tf.cast(tf.bitwise.bitwise_or(raw, tf.constant(0x20, tf.uint8)), tf.float32)
    nibbles = c - 48.0 - 39.0 * tf.cast(c > 57.0, tf.float32)
    hi_lo = tf.reshape(tf.reshape(nibbles, [-1, 8]) @ tf.constant(_HI_LO),
                       tf.concat([tf.shape(raw)[:2], [2]], 0))
    ids = tf.cast(hi_lo[..., 0], tf.int64) * 65536 + tf.cast(hi_lo[..., 1], tf.int64)
    return tf.where(raw[..., 0] == 0, tf.constant(CRITEO_MISSING_ID, tf.int64), ids)


def _log1p_positive(text: tf.Tensor) -> tf.Tensor:
    """Numbers as text (empty allowed) -> float32 log(1 + x) for x > 0, else 0."""
    text = tf.where(tf.strings.length(text) == 0, "0", text)
    x = tf.strings.to_number(text, tf.float64)
    return tf.cast(tf.math.log1p(tf.maximum(x, 0.0)), tf.float32)


def _criteo_decoder(labeled: bool):
    first = 1 if labeled else 0

    def decode(fields: tf.Tensor):
        dense = _log1p_positive(fields[:, first:first + 13])
        ids = _hex_ids(fields, first + 13)
        features = dict(zip(CRITEO_INT_COLUMNS, tf.unstack(tf.transpose(dense), 13)))
        features.update(zip(CRITEO_CAT_COLUMNS, tf.unstack(tf.transpose(ids), 26)))
        if not labeled:
            return features
        return features, tf.cast(tf.equal(fields[:, 0], "1"), tf.float32)

    return decode


def _criteo_format(labeled: bool, delimiter: str, dense: str, header: bool) -> RowFormat:
    dense_what = "an integer (at most 18 digits) or empty" if dense == _INT else \
        "a number or empty"
    fields = ([_LABEL] if labeled else []) + \
        [Field(c, dense, dense_what) for c in CRITEO_INT_COLUMNS] + \
        [Field(c, _HEX, "an 8-digit hex id or empty") for c in CRITEO_CAT_COLUMNS]
    names = [f.name for f in fields]
    return RowFormat(
        name="Criteo CSV" if delimiter == "," else "Criteo TSV",
        delimiter=delimiter, fields=tuple(fields), decode=_criteo_decoder(labeled),
        placeholder=("0" if labeled else "") + delimiter * (len(fields) - 1),
        header=delimiter.join(names) if header else None)


CRITEO_TSV = _criteo_format(True, "\t", _INT, header=False)
CRITEO_TSV_UNLABELED = _criteo_format(False, "\t", _INT, header=False)
CRITEO_CSV = _criteo_format(True, ",", _NUMBER, header=True)


def criteo_dataset(paths: PathLike | Sequence[PathLike], batch_size: int, *,
                   labeled: bool = True, bad_rows: str = "fail", shuffle_buffer: int = 0,
                   num_epochs: int | None = 1, skip: int = 0, take: int = -1,
                   seed: int | None = None, drop_remainder: bool = False,
                   input_context: tf.distribute.InputContext | None = None,
                   stats: ReadStats | None = None, log_limit: int = 5) -> tf.data.Dataset:
    """Streams Criteo Kaggle TSV files as `(features, label)` batches.

    Args:
      paths: a file, a glob pattern, or a list of them (read in order).
      batch_size: rows per batch (per input pipeline: with `input_context`,
        pass `input_context.get_per_replica_batch_size(global_batch)`).
      labeled: False reads the 39-field test files and yields features only.
      bad_rows: "fail" raises `tf.errors.InvalidArgumentError` on the first
        malformed row, naming `file:line` (1-based) and what is wrong. "skip"
        drops malformed rows, logs the first few to stderr (file:line and
        reason) and counts them in `stats`. Good rows come out in the same
        batches as from a clean file.
      shuffle_buffer: > 0 randomly permutes each run of this many
        consecutive lines (a new permutation every epoch / iteration; rows
        move at most this far, as with a shuffle buffer, but not across
        window borders). Nearly free, unlike a per-row `Dataset.shuffle`.
      num_epochs: passes over the data; None or -1 repeats forever.
      skip: data lines to skip, by position in the concatenated files
        (before sharding and shuffling; malformed lines count too), e.g.
        `skip=8000` for evaluation.
      take: data lines to read after `skip` (e.g. `take=8000` for
        training).
      seed: shuffle seed (None: a different order each run).
      drop_remainder: drop the last partial batch.
      input_context: shards the input: by file when there are at least as
        many files as pipelines (and no skip/take), else by chunks of
        `max(batch_size, 1024)` lines (each pipeline then reads all files).
      stats: a `ReadStats` to count lines, rows and skipped rows (optional).
      log_limit: with bad_rows="skip", the malformed rows logged per pass,
        then one notice that more are skipped without logging (0: none).

    Lines may end in LF or CRLF; a missing final newline is fine. An empty
    line is malformed. Rows are validated in the graph, so the pipeline runs
    in a ParameterServerStrategy `dataset_fn` (stats must then stay None).

    Example:
        ```python
        train = tn.data.criteo_dataset("criteo/train.tsv", 512, take=8000,
                                       shuffle_buffer=10_000, seed=0)
        holdout = tn.data.criteo_dataset("criteo/train.tsv", 4096, skip=8000)
        model = tn.models.WideDeep(tn.data.CRITEO_CAT_COLUMNS, tn.data.CRITEO_INT_COLUMNS)
        ```
    """
    fmt = CRITEO_TSV if labeled else CRITEO_TSV_UNLABELED
    return read_rows(fmt, paths, batch_size, bad_rows=bad_rows,
                     shuffle_buffer=shuffle_buffer, num_epochs=num_epochs, skip=skip,
                     take=take, seed=seed, drop_remainder=drop_remainder,
                     input_context=input_context, stats=stats,
                     log_limit=log_limit)


def criteo_csv_dataset(paths: PathLike | Sequence[PathLike], batch_size: int, *,
                       bad_rows: str = "fail", shuffle_buffer: int = 0,
                       num_epochs: int | None = 1, skip: int = 0, take: int = -1,
                       seed: int | None = None, drop_remainder: bool = False,
                       input_context: tf.distribute.InputContext | None = None,
                       stats: ReadStats | None = None, log_limit: int = 5) -> tf.data.Dataset:
    """Criteo as CSV with a `label,I1,..,C26` header (DeepCTR's sample file).

    Dense fields may be written as floats (`260.0`); output and arguments are
    those of `criteo_dataset`. Each file's first line must be the header.

    Args:
      paths: a file, a glob pattern, or a list of them (read in order).
      batch_size: rows per batch (per input pipeline).
      bad_rows: "fail" or "skip" (as in `criteo_dataset`).
      shuffle_buffer: lines permuted per window (as in `criteo_dataset`).
      num_epochs: passes; None or -1 repeats forever.
      skip: data lines skipped first.
      take: data lines read after `skip` (-1: all).
      seed: the shuffle seed.
      drop_remainder: drop the last partial batch.
      input_context: shards the input per pipeline.
      stats: a `ReadStats` counting rows and skipped rows.
      log_limit: skipped rows logged one by one at most.

    Example:
        ```python
        ds = tn.data.criteo_csv_dataset("criteo_sample.csv", 256)
        ```
    """
    return read_rows(CRITEO_CSV, paths, batch_size, bad_rows=bad_rows,
                     shuffle_buffer=shuffle_buffer, num_epochs=num_epochs, skip=skip,
                     take=take, seed=seed, drop_remainder=drop_remainder,
                     input_context=input_context, stats=stats,
                     log_limit=log_limit)
