"""Avazu (Kaggle CTR prediction, 2014) reader for `tf.data`.

The raw files are CSV with a header: `id,click,hour,C1,banner_pos,...,C21`
(`train`) or without `click` (`test`). Every column is categorical, so the
reader keeps each one as its raw token (tf.string `[B]`); tnet's
`category_column` fingerprints strings, so no vocabulary pass is needed.
`id` is a row id, not a feature, and is dropped. From `hour` (YYMMDDHH) the
reader derives `hour_of_day` ("00".."23") and `weekday` ("0" = Monday ..
"6" = Sunday): the raw hour is unique per hour of the 10-day log, so on its
own it cannot generalize to the test day. The label is `click` as float32.

Rows are validated like the Criteo reader's (`bad_rows="fail"|"skip"`,
file:line in messages); a token may hold any printable ASCII except a comma.
Pure tf.data, so it works in a ParameterServerStrategy `dataset_fn`.
"""
from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from tnet.data._rows import Field, PathLike, ReadStats, RowFormat, read_rows

AVAZU_RAW_COLUMNS: tuple[str, ...] = (
    "id", "click", "hour", "C1", "banner_pos", "site_id", "site_domain",
    "site_category", "app_id", "app_domain", "app_category", "device_id",
    "device_ip", "device_model", "device_type", "device_conn_type",
    "C14", "C15", "C16", "C17", "C18", "C19", "C20", "C21")
AVAZU_CAT_COLUMNS: tuple[str, ...] = tuple(
    c for c in AVAZU_RAW_COLUMNS if c not in ("id", "click")) + ("hour_of_day", "weekday")

_TOKEN = Field("", r"[!-+\--~]*", "printable ASCII without commas")
# YYMMDDHH of a real date in 2000-2099 (an impossible date such as Feb 30
# would otherwise get a made-up weekday): days 1-28 of any month, 29-30 of
# any month but February, 31 of the long months, Feb 29 of leap years (in
# 2000-2099: YY divisible by 4).
_MONTH_DAY = (r"(?:(?:0[1-9]|1[0-2])(?:0[1-9]|1[0-9]|2[0-8])|(?:0[13-9]|1[0-2])(?:29|30)"
              r"|(?:0[13578]|1[02])31)")
_LEAP_YY = r"(?:[02468][048]|[13579][26])"
_HOUR = rf"(?:[0-9]{{2}}{_MONTH_DAY}|{_LEAP_YY}0229)(?:[01][0-9]|2[0-3])"


def _field(name: str) -> Field:
    if name == "id":
        return Field(name, r"[0-9]{1,20}", "a decimal row id")
    if name == "click":
        return Field(name, "[01]", "0 or 1")
    if name == "hour":
        return Field(name, _HOUR, "a YYMMDDHH hour")
    return Field(name, _TOKEN.pattern, _TOKEN.expected)


def _weekday(yymmdd: tf.Tensor) -> tf.Tensor:
    """Monday = 0 from YYMMDD text (20YY), by days since 1970-01-01 (a Thursday).

    Integer civil-calendar arithmetic (H. Hinnant's days_from_civil), so it
    runs in the graph with no date library.
    """
    n = tf.strings.to_number(yymmdd, tf.int64)
    y, m, d = 2000 + n // 10000, n // 100 % 100, n % 100
    y = y - tf.cast(m <= 2, tf.int64)
    era = y // 400
    yoe = y - era * 400
    doy = (153 * tf.where(m > 2, m - 3, m + 9) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    days = era * 146097 + doe - 719468
    return tf.strings.as_string((days + 3) % 7)


def _avazu_format(labeled: bool) -> RowFormat:
    columns = [c for c in AVAZU_RAW_COLUMNS if labeled or c != "click"]
    fields = tuple(_field(c) for c in columns)
    keep = [(i, c) for i, c in enumerate(columns) if c not in ("id", "click")]
    hour = columns.index("hour")

    def decode(f: tf.Tensor):
        features = {c: f[:, i] for i, c in keep}
        features["hour_of_day"] = tf.strings.substr(f[:, hour], 6, 2)
        features["weekday"] = _weekday(tf.strings.substr(f[:, hour], 0, 6))
        if not labeled:
            return features
        return features, tf.cast(tf.equal(f[:, 1], "1"), tf.float32)

    placeholder = ",".join({"id": "0", "click": "0", "hour": "14102100"}.get(c, "")
                           for c in columns)
    return RowFormat(name="Avazu CSV", delimiter=",", fields=fields, decode=decode,
                     placeholder=placeholder, header=",".join(columns))


AVAZU_CSV = _avazu_format(True)
AVAZU_CSV_UNLABELED = _avazu_format(False)


def avazu_dataset(paths: PathLike | Sequence[PathLike], batch_size: int, *,
                  labeled: bool = True, bad_rows: str = "fail", shuffle_buffer: int = 0,
                  num_epochs: int | None = 1, skip: int = 0, take: int = -1,
                  seed: int | None = None, drop_remainder: bool = False,
                  input_context: tf.distribute.InputContext | None = None,
                  stats: ReadStats | None = None, log_limit: int = 5) -> tf.data.Dataset:
    """Streams Avazu CSV files as `(features, label)` batches.

    `features` maps each name in `AVAZU_CAT_COLUMNS` to tf.string `[B]`;
    `label` is float32 `[B]`. `labeled=False` reads the test files (no
    `click` column) and yields features only. Each file must start with the
    header line. Other arguments are those of `tnet.data.criteo_dataset`
    (bad-row policy, shuffling, skip/take by data line, sharding, stats).

    Args:
      paths: a file, a glob pattern, or a list of them (read in order).
      batch_size: rows per batch (per input pipeline).
      labeled: False reads the test files (features only).
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
        ds = tn.data.avazu_dataset("avazu/train.csv", 512, shuffle_buffer=10_000)
        model = tn.models.WideDeep(tn.data.AVAZU_CAT_COLUMNS, [])
        ```
    """
    return read_rows(AVAZU_CSV if labeled else AVAZU_CSV_UNLABELED, paths, batch_size,
                     bad_rows=bad_rows, shuffle_buffer=shuffle_buffer,
                     num_epochs=num_epochs, skip=skip, take=take, seed=seed,
                     drop_remainder=drop_remainder, input_context=input_context,
                     stats=stats, log_limit=log_limit)
