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

Sharding (`input_context`): by file when there are at least as many files
as input pipelines, else by record (each pipeline reads everything and
keeps every n-th chunk), as the Criteo reader does.
"""
from __future__ import annotations

import os
import re
import struct
import sys
import zlib
from typing import Any, Dict, List, Optional

import numpy as np
import tensorflow as tf

from tnet import _ops
from tnet.data import _rows
from tnet.data._rows import LINE_BITS, Field, ReadStats, RowFormat, read_rows
from tnet.log import get as _get_logger

_log = _get_logger("data")
from tnet.data.spec import Feature, FeatureSpec

FORMATS = ("tfrecord", "csv", "tsv", "parquet")
_MASK = (1 << LINE_BITS) - 1


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


# ------------------------------------------------------------ shared parts
class BadDataError(ValueError):
    """A data file does not match the spec as a whole (a CSV header without
    a spec column, a Parquet column of another type); the message names the
    file and the feature.

    Example:
        ```python
        try:
            model.fit(spec.dataset("data/*.csv", "csv", 256))
        except tn.data.BadDataError as e:
            print(e)          # file:record, the feature, the value, the fix
        ```
    """


def _pipes(input_context) -> tuple[int, int]:
    if input_context is None:
        return 1, 0
    return input_context.num_input_pipelines, input_context.input_pipeline_id


def _ids(f: Feature, values):
    """Parsed values of one column -> what the model gets for feature f."""
    if f.kind == "id":
        return values
    if f.max_length is not None:
        n = f.max_length

        def cut():
            return values[:, -n:] if f.kind == "sequence" else values[:, :n]

        if not isinstance(values, tf.RaggedTensor):
            return cut()
        # Slicing a RaggedTensor gathers every value (a ragged range and a
        # gather: ~9% of a SPARSE-HEAVY TSV batch's reader CPU) even when
        # no row is longer than max_length, the usual case: cut only then.
        longest = tf.reduce_max(values.row_lengths())
        return tf.cond(longest > n, cut, lambda: values)
    return values


def _element(spec: FeatureSpec, columns: Dict[str, Any], with_group: bool):
    """(features, label[, weight]) from parsed columns (by file column)."""
    features = {}
    for f in spec.features:
        value = columns[f.column]
        if f.is_id:
            features[f.name] = _ids(f, value)
        elif f.kind == "dense":
            features[f.name] = tf.cast(value, tf.float32)
        elif f.kind == "group" and with_group:
            features[f.name] = value
    label = tf.cast(columns[spec.label.column], tf.float32)
    if spec.weight is None:
        return features, label
    return features, label, tf.cast(columns[spec.weight.column], tf.float32)


def _value_checks(spec: FeatureSpec, columns: Dict[str, Any]):
    """[(feature name, ok [B], what it must be)] for values a parser accepts
    but the spec does not: labels outside [0, 1], non-finite numbers,
    negative weights."""
    checks = []
    for f in spec.features:
        if f.kind not in ("label", "dense", "weight"):
            continue
        x = tf.cast(columns[f.column], tf.float64)
        if f.kind == "label":
            checks.append((f.name, (x >= 0.0) & (x <= 1.0), "a label in [0, 1]"))
        elif f.kind == "weight":
            checks.append((f.name, tf.math.is_finite(x) & (x >= 0.0),
                           "a finite weight >= 0"))
        else:
            checks.append((f.name, tf.math.is_finite(x), "a finite number"))
    return checks


def _assert_values(spec, columns, names: tf.Tensor):
    """Raises InvalidArgument naming the first bad value's record/feature."""
    asserts = []
    for name, ok, what in _value_checks(spec, columns):
        i = tf.argmin(tf.cast(ok, tf.int32), output_type=tf.int32)
        value = tf.strings.as_string(tf.cast(columns[spec_feature(spec, name).column],
                                             tf.float64)[i:i + 1])
        msg = tf.strings.join([
            names[i:i + 1], f": feature {name!r} value ", value,
            f" is not {what} (spec {spec.source}). Fix the data, or pass "
            "bad_rows=skip to drop and count bad records."])
        asserts.append(tf.debugging.Assert(tf.reduce_all(ok), [msg], summarize=1))
    return asserts


def spec_feature(spec: FeatureSpec, name: str) -> Feature:
    return next(f for f in spec.features if f.name == name)


# ---------------------------------------------------------------- tfrecord
def _parse_spec(spec: FeatureSpec) -> Dict[str, Any]:
    out = {}
    for f in spec.features:
        if f.column in out:
            continue
        dtype = f.tf_dtype
        if f.multi:
            out[f.column] = tf.io.RaggedFeature(dtype, row_splits_dtype=tf.int64)
        elif f.kind == "label":
            out[f.column] = tf.io.FixedLenFeature([], dtype)
        else:
            default = f.padding
            if dtype != tf.string:
                default = (float(default) if dtype == tf.float32 else int(default))
            out[f.column] = tf.io.FixedLenFeature([], dtype, default_value=default)
    return out


def _record_names(paths_t: tf.Tensor, keys: tf.Tensor) -> tf.Tensor:
    return tf.strings.join([
        tf.gather(paths_t, tf.bitwise.right_shift(keys, LINE_BITS)), ":",
        tf.strings.as_string(tf.bitwise.bitwise_and(keys, _MASK))])


def _compression(name: str, compression: Optional[str]) -> str:
    if compression is not None:
        return compression
    return "GZIP" if name.endswith(".gz") else ""


def _tfrecord(spec, paths, fmt, batch_size, *, bad_rows, shuffle_buffer, log_limit,
              num_epochs, seed, drop_remainder, input_context, stats,
              with_group, compression):
    names = _rows._expand_paths(paths)
    paths_t = tf.constant(names)
    comps = tf.constant([_compression(n, compression) for n in names])
    chunk = max(batch_size, 1024)
    pipes, pipe_id = _pipes(input_context)
    by_file = pipes > 1 and len(names) >= pipes
    parse_spec = _parse_spec(spec)
    files = tf.data.Dataset.from_tensor_slices(
        (paths_t, comps, tf.range(len(names), dtype=tf.int64)))
    if by_file:
        files = files.shard(pipes, pipe_id)
    stride = pipes if (pipes > 1 and not by_file) else 1
    skip = bad_rows == "skip"

    def one_file(path, comp, index):
        records = tf.data.TFRecordDataset(path, comp, buffer_size=1 << 20)
        base = tf.bitwise.left_shift(index, LINE_BITS)
        if not skip:
            return records.batch(chunk).enumerate().map(
                lambda i, r: (base + i * chunk + 1 + tf.range(tf.size(r, tf.int64)), r))
        # skip: one record at a time, plus a sentinel so that the bad
        # records at the end of a file are counted too.
        tagged = records.map(lambda r: (r, False)).concatenate(
            tf.data.Dataset.from_tensors((tf.constant(b""), True)))
        tagged = tagged.enumerate().map(lambda i, e: (base + i + 1, e[0], e[1]))
        if stride > 1:
            tagged = tagged.filter(lambda k, r, end: end | (
                (tf.bitwise.bitwise_and(k, _MASK) - 1) % stride == pipe_id))
        return tagged

    data = files.interleave(one_file, cycle_length=1)
    if skip:
        data = data.map(lambda k, r, end: _validate_one(spec, parse_spec, paths_t, k, r, end),
                        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        # TF's warning gives each record's reason (every record, not the
        # first few): only when logging is on at all.
        data = data.ignore_errors(log_warning=log_limit > 0)
        data = data.batch(chunk)
        data = data.scan((tf.constant(-1, tf.int64), tf.constant(0, tf.int64)),
                         lambda state, e: _count_gaps(state, e, paths_t, stride,
                                                      stats, pipe_id, log_limit))
    elif stride > 1:
        data = data.rebatch(chunk).shard(pipes, pipe_id)
    if shuffle_buffer > 0:
        data = _rows._window_shuffle(data, int(shuffle_buffer), seed, chunk)
    if num_epochs is None or num_epochs == -1:
        data = data.repeat()
    elif num_epochs > 1:
        data = data.repeat(num_epochs)

    def parse(keys, records):
        rec_names = _record_names(paths_t, keys)
        columns = tf.io.parse_example(records, parse_spec, example_names=rec_names)
        deps = [] if skip else _assert_values(spec, columns, rec_names)
        if stats is not None and not skip:
            n = tf.size(keys, out_type=tf.int64)
            deps += stats._update(n, n, tf.constant(0, tf.int64))
        with tf.control_dependencies(deps):
            columns = {k: tf.identity(v) for k, v in columns.items()}
        return _element(spec, columns, with_group)

    if not skip:
        # Exact batches of records, then parse: a rebatch of parsed id lists
        # (RaggedTensors) measured ~36 ms CPU per SPARSE-HEAVY batch of
        # 4096, one of serialized records a few ms.
        data = data.rebatch(batch_size, drop_remainder=drop_remainder)
    data = data.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if skip:
        data = data.rebatch(batch_size, drop_remainder=drop_remainder)
    return data.prefetch(tf.data.AUTOTUNE)


def _validate_one(spec, parse_spec, paths_t, key, record, end):
    """Skip mode: parse one record; an error drops it (ignore_errors logs
    the reason with the record's file:record name)."""
    def check():
        name = _record_names(paths_t, key[None])
        columns = tf.io.parse_example(record[None], parse_spec, example_names=name)
        with tf.control_dependencies(_assert_values(spec, columns, name)):
            return tf.constant(True)

    ok = tf.cond(end, lambda: tf.constant(True), check)
    with tf.control_dependencies([ok]):
        return tf.identity(key), tf.identity(record), end


def _count_gaps(state, element, paths_t, stride, stats, pipe_id, log_limit):
    """Skip mode, sequential: record numbers missing between consecutive
    survivors (per file, `stride` apart) are the dropped records."""
    prev, seen = state
    keys, records, end = element
    file_of = tf.bitwise.right_shift(keys, LINE_BITS)
    prev_keys = tf.concat([prev[None], keys[:-1]], 0)
    same_file = tf.equal(tf.bitwise.right_shift(prev_keys, LINE_BITS), file_of) & (prev_keys >= 0)
    first_no = tf.cast(pipe_id if stride > 1 else 0, tf.int64) + 1
    start = tf.where(same_file, prev_keys,
                     tf.bitwise.left_shift(file_of, LINE_BITS) + first_no - stride)
    missing = tf.maximum((keys - start + stride - 1) // stride - 1, 0)
    n_bad = tf.reduce_sum(missing)
    good = tf.logical_not(end)
    n_good = tf.reduce_sum(tf.cast(good, tf.int64))
    deps = []
    # Name the first dropped record of this chunk in the log (once per
    # chunk; ignore_errors already logged every reason).
    first = tf.argmax(tf.cast(missing > 0, tf.int32), output_type=tf.int32)
    described = tf.strings.join([_record_names(paths_t, start[first:first + 1] + stride),
                                 ": not a tf.Example matching the feature spec "
                                 "(reason in the warning above)"])
    described = tf.cond(n_bad > 0, lambda: described, lambda: tf.zeros([0], tf.string))
    if stats is not None:
        deps += stats._update(n_good + n_bad, n_good, n_bad, described)
    printed = tf.cond(
        (n_bad > 0) & (seen < log_limit),
        lambda: _print_skip(described, n_bad),
        lambda: tf.constant(False))
    deps.append(printed)
    # Once, in the chunk that crosses the limit (not only in one that logs).
    if log_limit > 0:
        with tf.control_dependencies([printed]):
            deps.append(tf.cond((seen <= log_limit) & (seen + n_bad > log_limit),
                                _print_more, lambda: tf.constant(False)))
    with tf.control_dependencies(deps):
        good = tf.identity(good)
    return ((keys[-1], seen + n_bad),
            (tf.boolean_mask(keys, good), tf.boolean_mask(records, good)))


def _print_more():
    op = tf.print("W tnet.data: more bad tf.Example records are skipped without "
                  "logging (count them with tnet.data.ReadStats)", output_stream=sys.stderr)
    with tf.control_dependencies([op]):
        return tf.constant(True)


def _print_skip(described, n_bad):
    op = tf.print(tf.strings.join(["W tnet.data: skipped ", tf.strings.as_string(n_bad),
                                   " bad tf.Example record(s), first ", described[0]]),
                  output_stream=sys.stderr)
    with tf.control_dependencies([op]):
        return tf.constant(True)


# ------------------------------------------------------------- csv / tsv
_INT = r"-?[0-9]{1,18}"
_NUM = r"-?(?:[0-9]{1,18}(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]{1,2})?"
_UNIT = r"(?:0(?:\.[0-9]*)?|1(?:\.0*)?|\.[0-9]+)"


def _field_for(f: Optional[Feature], column: str, delim: str) -> Field:
    any_cell = rf"[^{re.escape(delim)}\r\n]*"
    if f is None:
        return Field(column, any_cell, "a cell")
    if f.kind == "label":
        if f.dtype == "int64":
            return Field(column, "[01]", "a label 0 or 1")
        return Field(column, _UNIT, "a label in [0, 1]")
    if f.kind in ("dense", "weight"):
        pat = _INT if f.dtype == "int64" else _NUM
        what = "an integer" if f.dtype == "int64" else "a number"
        if f.kind == "weight":
            pat, what = pat.replace("-?", ""), what + " >= 0"
        return Field(column, f"(?:{pat})?", f"{what} or empty")
    if f.dtype == "string":
        return Field(column, any_cell, "a cell")
    if f.multi:
        sep = re.escape(f.separator)
        return Field(column, f"(?:{_INT}(?:{sep}{_INT})*)?",
                     f"int64 ids separated by {f.separator!r}, or empty")
    return Field(column, f"(?:{_INT})?", "an int64 id or empty")


def _placeholder(field: Field, f: Optional[Feature]) -> str:
    return "0" if f is not None and f.kind == "label" else ""


def _read_header(path: str) -> str:
    with tf.io.gfile.GFile(path, "rb") as fh:
        line = fh.readline()
    return line.decode("utf-8", "replace").rstrip("\r\n")


def _delimited_format(spec: FeatureSpec, first_file: str, delim: str,
                      with_group: bool) -> RowFormat:
    header = _read_header(first_file)
    columns = header.split(delim)
    by_column = {f.column: f for f in spec.features}
    missing = [f"{f.name} (column {f.column!r})" if f.column != f.name else f.name
               for f in spec.features if f.column not in columns]
    if missing:
        raise BadDataError(
            f"{first_file}:1: the header has no column for feature(s) "
            f"{', '.join(missing)} of spec {spec.source}; header: {header[:300]!r}. "
            "Rename the column or set the feature's 'column'.")
    if len(set(columns)) != len(columns):
        raise BadDataError(f"{first_file}:1: the header names a column twice: {header[:300]!r}")
    fields = tuple(_field_for(by_column.get(c), c, delim) for c in columns)
    index = {c: i for i, c in enumerate(columns)}

    def decode(cells: tf.Tensor):
        parsed = {}
        for f in spec.features:
            if f.column in parsed:
                continue
            text = cells[:, index[f.column]]
            parsed[f.column] = _decode_cell(f, text)
        return _element(spec, parsed, with_group)

    placeholder = delim.join(_placeholder(fd, by_column.get(c))
                             for fd, c in zip(fields, columns))
    name = "TSV" if delim == "\t" else "CSV"
    return RowFormat(name=f"{name} ({spec.source})", delimiter=delim,
                     fields=fields, decode=decode, placeholder=placeholder,
                     header=header,
                     decode_lines=_row_decoder(spec, columns, fields, delim,
                                               with_group))


# TnetDecodeRows' column kinds (tnet_ops/kernels/decode_rows_kernels.cc).
_SKIP, _LABEL01, _LABEL_UNIT, _DENSE_INT, _DENSE_NUM = 0, 1, 2, 3, 4
_WEIGHT_INT, _WEIGHT_NUM, _ID_INT, _STRING, _IDS_INT = 5, 6, 7, 8, 9


def _row_kind(f: Optional[Feature]) -> int:
    if f is None:
        return _SKIP
    if f.kind == "label":
        return _LABEL01 if f.dtype == "int64" else _LABEL_UNIT
    if f.kind in ("dense", "weight"):
        return {("dense", True): _DENSE_INT, ("dense", False): _DENSE_NUM,
                ("weight", True): _WEIGHT_INT, ("weight", False): _WEIGHT_NUM
                }[(f.kind, f.dtype == "int64")]
    if f.dtype == "string":
        return _STRING
    return _IDS_INT if f.multi else _ID_INT


def _kind_pattern(kind: int, delim: str, sep: str) -> str:
    """The RE2 pattern TnetDecodeRows checks for a column of `kind`."""
    unsigned_int, unsigned_num = _INT.replace("-?", ""), _NUM.replace("-?", "")
    return {
        _SKIP: rf"[^{re.escape(delim)}\r\n]*", _STRING: rf"[^{re.escape(delim)}\r\n]*",
        _LABEL01: "[01]", _LABEL_UNIT: _UNIT,
        _DENSE_INT: f"(?:{_INT})?", _DENSE_NUM: f"(?:{_NUM})?",
        _WEIGHT_INT: f"(?:{unsigned_int})?", _WEIGHT_NUM: f"(?:{unsigned_num})?",
        _ID_INT: f"(?:{_INT})?",
        _IDS_INT: f"(?:{_INT}(?:{re.escape(sep)}{_INT})*)?",
    }[kind]


def _row_decoder(spec: FeatureSpec, columns: List[str], fields, delim: str,
                 with_group: bool):
    """lines -> (ok, element) through one TnetDecodeRows, or None when a
    column's check is not one the kernel knows (then the row regex and the
    per-column ops run, as before).

    Each column is decoded as its first spec feature reads it (as `decode`
    does) and checked against `fields`' pattern; the kernel is used only
    if, for every column, the pattern of the kind it checks is that very
    pattern, so ok is the regex's answer by construction (and by
    tests/test_decode_rows.py, which compares both on hostile lines).
    """
    first: Dict[str, Feature] = {}
    for f in spec.features:
        first.setdefault(f.column, f)
    kinds, seps, pads = [], [], []
    for column, field in zip(columns, fields):
        f = first.get(column)
        kind = _row_kind(f)
        sep = f.separator if f is not None and f.multi and f.separator else ""
        if kind == _IDS_INT and len(sep) != 1:
            return None
        if _kind_pattern(kind, delim, sep) != field.pattern:
            return None
        if kind in (_DENSE_INT, _DENSE_NUM, _WEIGHT_INT, _WEIGHT_NUM):
            pad = struct.unpack("<q", struct.pack("<d", float(f.padding)))[0]
        elif kind == _ID_INT:
            pad = int(f.padding)
        else:
            pad = 0
        kinds.append(kind)
        seps.append(sep)
        pads.append(pad)
    counts = {"num_floats": sum(k not in (_SKIP, _ID_INT, _STRING, _IDS_INT) for k in kinds),
              "num_ints": kinds.count(_ID_INT), "num_strings": kinds.count(_STRING),
              "num_lists": kinds.count(_IDS_INT)}

    def decode_lines(lines: tf.Tensor):
        ok, floats, ints, strings, values, splits = _ops.tnet_decode_rows(
            lines, delimiter=delim, kinds=kinds, separators=seps, pads=pads, **counts)
        out = {"f": iter(floats), "i": iter(ints), "s": iter(strings),
               "l": iter(zip(values, splits))}
        parsed = {}
        for column, kind in zip(columns, kinds):
            if kind == _SKIP:
                continue
            f = first[column]
            if kind == _ID_INT:
                parsed[column] = next(out["i"])
            elif kind == _IDS_INT:
                v, sp = next(out["l"])
                parsed[column] = tf.RaggedTensor.from_row_splits(v, sp, validate=False)
            elif kind == _STRING:
                parsed[column] = _string_cell(f, next(out["s"]))
            else:
                parsed[column] = next(out["f"])
        return ok, _element(spec, parsed, with_group)

    return decode_lines


def _string_cell(f: Feature, text: tf.Tensor):
    """A string column's cells as `_decode_cell` gives them."""
    if f.multi:
        parts = tf.strings.split(text, f.separator)
        return tf.ragged.boolean_mask(parts, tf.strings.length(parts) > 0)
    if f.default is not None:
        return tf.where(tf.strings.length(text) == 0, f.padding, text)
    return text


def _decode_cell(f: Feature, text: tf.Tensor):
    empty = tf.strings.length(text) == 0
    if f.multi:
        if f.dtype == "int64":
            # One pass over the bytes (TnetDecodeIdLists): the result of
            # split -> drop empty parts -> to_number, at ~1/3 of its CPU.
            values, splits = _ops.tnet_decode_id_lists(text,
                                                       separator=f.separator)
            return tf.RaggedTensor.from_row_splits(values, splits,
                                                   validate=False)
        return _string_cell(f, text)
    if f.kind == "label":
        return tf.strings.to_number(text, tf.float64)
    if f.dtype == "string":
        return _string_cell(f, text)
    if f.kind in ("dense", "weight"):
        x = tf.strings.to_number(tf.where(empty, "0", text), tf.float64)
        return tf.where(empty, tf.constant(float(f.padding), tf.float64), x)
    x = tf.strings.to_number(tf.where(empty, "0", text), tf.int64)
    return tf.where(empty, tf.constant(int(f.padding), tf.int64), x)


def _delimited(spec, paths, fmt, batch_size, *, bad_rows, shuffle_buffer, log_limit,
               num_epochs, seed, drop_remainder, input_context, stats,
               with_group, compression):
    if compression:
        raise ValueError("compressed CSV/TSV is not supported; decompress it "
                         "or write TFRecord (gzip) instead")
    names = _rows._expand_paths(paths)
    row_format = _delimited_format(spec, names[0], "\t" if fmt == "tsv" else ",",
                                   with_group)
    return read_rows(row_format, names, batch_size, bad_rows=bad_rows,
                     shuffle_buffer=shuffle_buffer, num_epochs=num_epochs,
                     seed=seed, drop_remainder=drop_remainder,
                     input_context=input_context, stats=stats, log_limit=log_limit)


# ---------------------------------------------------------------- parquet
def _pyarrow():
    try:
        import pyarrow  # noqa: PLC0415
        import pyarrow.parquet  # noqa: F401, PLC0415
    except ImportError:
        raise ImportError("reading Parquet needs pyarrow: `pip install "
                          "pyarrow` (pinned in requirements.txt), or convert "
                          "the files to TFRecord or CSV") from None
    return pyarrow


def _damaged_parquet(name: str, error: BaseException, row: int = 0):
    """A BadDataError for a Parquet file pyarrow cannot read (no footer: a
    copy cut short; a corrupted page), naming the file, and the 1-based
    row where reading stopped when it got that far."""
    where = f"{name}:{row}" if row else name
    what = " ".join(str(error).split())
    return BadDataError(
        f"{where}: unreadable Parquet file ({type(error).__name__}: {what}); "
        "the file is corrupted or truncated. Rewrite or remove the file: "
        "--bad_rows=skip drops bad rows but cannot read past a damaged file")


def _open_parquet(name: str):
    """pq.ParquetFile(name), a damaged file raising BadDataError."""
    pa = _pyarrow()
    import pyarrow.parquet as pq  # noqa: PLC0415
    try:
        return pq.ParquetFile(name)
    except (pa.ArrowException, OSError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise _damaged_parquet(name, e) from None


def _element_signature(spec: FeatureSpec, with_group: bool):
    columns = {}
    for f in spec.features:
        if f.multi:
            columns[f.column] = tf.RaggedTensorSpec([None, None], f.tf_dtype, 1, tf.int64)
        elif f.kind in ("label", "dense", "weight"):
            columns[f.column] = tf.TensorSpec([None], tf.float64)
        else:
            columns[f.column] = tf.TensorSpec([None], f.tf_dtype)
    return columns


def _arrow_column(pa, f: Feature, array, where: str):
    """One pyarrow column -> numpy (single) or (values, row_splits) (multi);
    raises ValueError naming the file and feature on a type mismatch."""
    import pyarrow.compute as pc  # noqa: PLC0415
    t = array.type
    if f.multi:
        if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
            raise BadDataError(f"{where}: feature {f.name!r} (column {f.column!r}) "
                             f"is {t}, expected a list of {f.dtype} ids")
        t = t.value_type
    want_string = f.dtype == "string" and f.kind in ("id", "ids", "sequence", "group")
    if want_string and not (pa.types.is_string(t) or pa.types.is_large_string(t)
                            or pa.types.is_binary(t)):
        raise BadDataError(f"{where}: feature {f.name!r} (column {f.column!r}) "
                         f"holds {t}, the spec says string ids")
    if not want_string and not (pa.types.is_integer(t) or pa.types.is_floating(t)
                                or pa.types.is_boolean(t)):
        raise BadDataError(f"{where}: feature {f.name!r} (column {f.column!r}) "
                         f"holds {t}, the spec says {f.dtype}")
    if f.is_id and not want_string and pa.types.is_floating(t):
        raise BadDataError(f"{where}: feature {f.name!r} (column {f.column!r}) "
                         f"holds {t}: ids must be integers or strings")
    if f.multi:
        array = array.combine_chunks() if hasattr(array, "combine_chunks") else array
        array = pc.fill_null(array, pa.scalar([], array.type))
        splits = np.asarray(array.offsets, np.int64)
        splits = splits - splits[0]
        values = array.flatten()
        values = values.to_numpy(zero_copy_only=False)
        return (values.astype(object) if want_string else values.astype(np.int64)), splits
    nulls = np.asarray(array.is_null())
    if f.kind != "label":
        array = pc.fill_null(array, f.padding if not want_string else str(f.padding))
    values = array.to_numpy(zero_copy_only=False)
    if want_string:
        return values.astype(object), nulls
    if f.kind in ("label", "dense", "weight"):
        return values.astype(np.float64), nulls
    return values.astype(np.int64), nulls


def _parquet_batches(spec: FeatureSpec, names: List[str], batch_rows: int,
                     pipes: int, pipe_id: int, bad_rows: str, stats,
                     log_limit: int = 5):
    """Yields dicts of numpy columns (file column -> array / ragged parts)."""
    pa = _pyarrow()
    by_file = pipes > 1 and len(names) >= pipes
    wanted = spec.columns_read()
    features = {f.column: f for f in spec.features}
    logged = 0
    for fi, name in enumerate(names):
        if by_file and fi % pipes != pipe_id:
            continue
        pf = _open_parquet(name)
        have = set(pf.schema_arrow.names)
        missing = [f.name for f in spec.features if f.column not in have]
        if missing:
            raise BadDataError(f"{name}: no column for feature(s) {missing} of spec "
                             f"{spec.source}; columns: {sorted(have)[:50]}")
        groups = range(pf.num_row_groups)
        if pipes > 1 and not by_file:
            groups = [g for g in groups if g % pipes == pipe_id]
        row0 = {g: sum(pf.metadata.row_group(i).num_rows for i in range(g))
                for g in groups}
        for g in groups:
            offset = row0[g]
            for batch in _parquet_group(pa, pf, name, g, offset, batch_rows,
                                        wanted):
                n = batch.num_rows
                out, bad = {}, np.zeros(n, bool)
                reasons = {}
                for column in wanted:
                    f = features[column]
                    where = f"{name}"
                    parsed = _arrow_column(pa, f, batch.column(column), where)
                    out[column] = parsed
                    for ff in spec.features:
                        if ff.column != column:
                            continue
                        if ff.kind == "label":
                            values, nulls = parsed
                            b = nulls | ~((values >= 0) & (values <= 1))
                            _note(reasons, b & ~bad, ff.name, "a label in [0, 1] (null or out of range)")
                            bad |= b
                        elif ff.kind in ("dense", "weight"):
                            values, _ = parsed
                            b = ~np.isfinite(values)
                            if ff.kind == "weight":
                                b |= values < 0
                            _note(reasons, b & ~bad, ff.name, "a finite number" +
                                  (" >= 0" if ff.kind == "weight" else ""))
                            bad |= b
                if bad.any():
                    first = int(np.argmax(bad))
                    feature, what = reasons[first]
                    text = (f"{name}:{offset + first + 1}: feature {feature!r} is not "
                            f"{what} (row numbers are 1-based, spec {spec.source})")
                    if bad_rows == "fail":
                        raise BadDataError(text + ". Fix the data, or pass "
                                         "bad_rows=skip to drop and count bad rows.")
                    n_bad = int(bad.sum())
                    if logged < log_limit:
                        _log.warning(f"W tnet.data: skipping {n_bad} bad "
                                     f"Parquet row(s), first {text}")
                    if 0 < log_limit and logged <= log_limit < logged + n_bad:
                        _log.warning("W tnet.data: more bad Parquet rows are "
                                     "skipped without logging (count them "
                                     "with tnet.data.ReadStats)")
                    logged += n_bad
                    if stats is not None:
                        _add_stats(stats, n, n - int(bad.sum()), int(bad.sum()), text)
                    out = _keep_rows(out, ~bad)
                elif stats is not None:
                    _add_stats(stats, n, n, 0, None)
                offset += n
                yield out


def _parquet_group(pa, pf, name, group, offset, batch_rows, columns):
    """pf's record batches of one row group; a page pyarrow cannot read
    raises BadDataError naming the file and the first row it could not
    read."""
    batches = pf.iter_batches(batch_size=batch_rows, row_groups=[group],
                              columns=columns, use_threads=False)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except (pa.ArrowException, OSError) as e:
            raise _damaged_parquet(name, e, offset + 1) from None
        offset += batch.num_rows
        yield batch


def _note(reasons, rows, feature, what):
    for i in np.flatnonzero(rows):
        reasons.setdefault(int(i), (feature, what))


def _add_stats(stats, lines, rows, skipped, text):
    stats._lines.assign_add(lines)
    stats._rows.assign_add(rows)
    stats._skipped.assign_add(skipped)
    n = int(stats._num_examples.numpy())
    if text is not None and n < stats.max_examples:
        ex = stats._examples.numpy()
        ex[n] = text.encode()
        stats._examples.assign(ex)
        stats._num_examples.assign_add(1)


def _keep_rows(out, keep):
    kept = {}
    for column, parsed in out.items():
        a, b = parsed
        if b.dtype == np.int64 and b.shape[0] == keep.shape[0] + 1:  # ragged
            lengths = np.diff(b)[keep]
            starts = b[:-1][keep]
            idx = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, lengths)]
                                 ) if lengths.size else np.zeros(0, np.int64)
            kept[column] = (a[idx.astype(np.int64)],
                            np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
        else:
            kept[column] = (a[keep], b[keep])
    return kept


def _parquet(spec, paths, fmt, batch_size, *, bad_rows, shuffle_buffer, log_limit,
             num_epochs, seed, drop_remainder, input_context, stats,
             with_group, compression):
    _pyarrow()
    names = _rows._expand_paths(paths)
    pipes, pipe_id = _pipes(input_context)
    chunk = max(batch_size, 1024)
    signature = _element_signature(spec, with_group)
    multi = {f.column for f in spec.features if f.multi}

    def gen():
        for out in _parquet_batches(spec, names, chunk, pipes, pipe_id, bad_rows, stats,
                                    log_limit):
            yield {c: (tf.RaggedTensor.from_row_splits(v[0], v[1], validate=False)
                       if c in multi else v[0]) for c, v in out.items()}

    data = tf.data.Dataset.from_generator(gen, output_signature=signature)
    if shuffle_buffer > 0:
        data = data.rebatch(int(shuffle_buffer)).map(
            lambda cols: _shuffle_columns(cols, seed))
    if num_epochs is None or num_epochs == -1:
        data = data.repeat()
    elif num_epochs > 1:
        data = data.repeat(num_epochs)
    data = data.map(lambda cols: _element(spec, cols, with_group),
                    num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    data = data.rebatch(batch_size, drop_remainder=drop_remainder)
    return data.prefetch(tf.data.AUTOTUNE)


def _shuffle_columns(cols, seed):
    first = next(iter(cols.values()))
    n = first.nrows() if isinstance(first, tf.RaggedTensor) else tf.shape(first)[0]
    order = tf.random.shuffle(tf.range(n), seed=seed)
    return {k: tf.gather(v, order) for k, v in cols.items()}


def count_records(paths, format: str, compression: Optional[str] = None) -> int:
    """Examples in the files (for steps per epoch under
    ParameterServerStrategy): TFRecord records, CSV/TSV data lines (header
    excluded), Parquet rows from the metadata.

    Args:
      paths: files or globs.
      format: "tfrecord", "csv", "tsv" or "parquet".
      compression: "GZIP" or None (from the name).

    Example:
        ```python
        n = tn.data.count_records("data/*.tfrecord.gz", "tfrecord")
        ```
    """
    names = _rows._expand_paths(paths)
    if format == "parquet":
        return sum(_open_parquet(n).metadata.num_rows for n in names)
    if format == "tfrecord":
        total = 0
        for n in names:
            comp = _compression(n, compression)
            ds = tf.data.TFRecordDataset(n, comp, buffer_size=1 << 20).batch(4096)
            try:
                records, size = (int(v) for v in ds.reduce(
                    (tf.constant(0, tf.int64), tf.constant(0, tf.int64)),
                    lambda acc, r: (acc[0] + tf.size(r, tf.int64),
                                    acc[1] + _framed_bytes(r))))
            except tf.errors.DataLossError as e:
                raise _unreadable(n, compression, e) from None
            if comp == "GZIP" and _gzip_cut(n, size):
                raise tf.errors.DataLossError(None, None, _damaged_text(
                    n, records, _GZIP_CUT))
            total += records
        return total
    total = 0
    for n in names:
        with tf.io.gfile.GFile(n, "rb") as fh:
            data = fh.read()
        total += data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1) - 1
    return total


_GZIP_CUT = "the gzip stream ends before its end marker"


def _framed_bytes(records: tf.Tensor) -> tf.Tensor:
    """Bytes the TFRecord framing of `records` takes (length, its crc,
    payload, payload crc)."""
    return tf.reduce_sum(tf.cast(tf.strings.length(records), tf.int64) + 16)


def _gzip_cut(name: str, size: int) -> bool:
    """Whether the gzip file `name` ends before its end marker. TF's reader
    does not check: a file cut where what zlib can still inflate ends at a
    record boundary reads as fewer, intact records (measured: 182 of 400,
    no error). Fast path: the trailer's size field equals `size`, the bytes
    TF read (a single-member file, as TF and tools write); otherwise the
    whole file is inflated here, member after member."""
    with tf.io.gfile.GFile(name, "rb") as fh:
        if fh.size() >= 18:
            fh.seek(fh.size() - 4)
            if int.from_bytes(fh.read(4), "little") == size % (1 << 32):
                return False
            fh.seek(0)
        inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
        started = False
        while True:
            chunk = fh.read(1 << 22)
            if not chunk:
                return started and not inflate.eof
            while chunk:
                try:
                    inflate.decompress(chunk)
                except zlib.error:
                    return True
                started = True
                chunk = inflate.unused_data if inflate.eof else b""
                if inflate.eof and chunk:  # the next member
                    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)


def _tf_text(error: BaseException) -> str:
    """The gist of a TF error message, on one line (no op names, no raw
    record bytes)."""
    text = str(error).strip().replace("\n", " ")
    text = re.sub(r"\{\{[^}]*\}\}\s*", "", text)
    text = re.sub(r"\s*\[Op:[^\]]*\]", "", text)
    text = re.sub(r"Name: [^,]*, ", "", text)
    text = re.sub(r"\s*\[\[.*?\]\]", "", text)
    text = re.sub(r"\s*name:\s*$", "", text)
    return re.sub(r"\s+", " ", text).strip()[:300]


def _unreadable(name: str, compression: Optional[str],
                error: tf.errors.DataLossError) -> tf.errors.DataLossError:
    """The DataLossError of a damaged TFRecord file (TF's message names
    neither the file nor the record), naming both."""
    good = 0
    try:
        for _ in tf.data.TFRecordDataset(name, _compression(name, compression)):
            good += 1
    except tf.errors.DataLossError:
        pass
    return tf.errors.DataLossError(None, None, _damaged_text(name, good, error))


def _damaged_text(name: str, good: int, error: BaseException | str) -> str:
    return (f"{name}:{good + 1}: unreadable TFRecord record ({_tf_text(error)}); "
            f"the file is corrupted or truncated after {good:,} records. "
            "Rewrite or remove the file: --bad_rows=skip drops bad records "
            "but cannot read past a damaged file")


class FileScan:
    """What `scan_files` found in one file.

    records: records (TFRecord) or data lines (CSV/TSV) or rows (Parquet)
      read; skipped: the bad ones among them; rows: the good ones;
      first: "file:record: reason" of its first bad ones (file order);
      damaged: "file:record: why" when the file cannot be read to its end
      (a damaged or truncated TFRecord, a CSV header that does not match,
      a Parquet column of the wrong type); then `records` stops there.

    Args:
      path: the file scanned.

    Example:
        ```python
        for scan in tn.data.scan_files(spec, "data/*.csv", "csv"):
            print(scan.path, scan.rows, scan.skipped, scan.damaged)
        ```
    """

    def __init__(self, path: str):
        self.path = path
        self.records = 0
        self.skipped = 0
        self.first: List[str] = []
        self.damaged: Optional[str] = None

    @property
    def rows(self) -> int:
        """The good rows: records read minus those skipped."""
        return self.records - self.skipped

    def __repr__(self) -> str:
        return (f"FileScan({self.path}: {self.records} read, {self.skipped} bad"
                + (f", damaged: {self.damaged}" if self.damaged else "") + ")")


def scan_files(spec: FeatureSpec, paths, format: str,
               compression: Optional[str] = None, max_examples: int = 5,
               stop_at_first: bool = False) -> List[FileScan]:
    """Reads `paths` once, in file order and without shuffling, and counts
    per file the records the spec rejects (as bad_rows="skip" would drop
    them), keeping the first `max_examples` of each as "file:record:
    reason". `stop_at_first`: return as soon as one bad record or damaged
    file is found (what `tnet.train` does after a failure, to name the first
    bad record in file order). Eager Python over the readers' own checks:
    for the CLI's counts and messages, not a training pipeline.

    Args:
      spec: the `FeatureSpec`.
      paths: files or globs.
      format: "tfrecord", "csv", "tsv" or "parquet".
      compression: "GZIP" or None (from the name).
      max_examples: bad rows described per file.
      stop_at_first: stop at the first bad row.

    Returns:
      One `FileScan` per file.

    Example:
        ```python
        bad = [s for s in tn.data.scan_files(spec, "data/*.csv", "csv")
           if s.skipped or s.damaged]
        ```
    """
    if format not in FORMATS:
        raise ValueError(f"format must be one of {list(FORMATS)}, got {format!r}")
    names = _rows._expand_paths(paths)
    out: List[FileScan] = []
    scan = {"tfrecord": _scan_tfrecord, "parquet": _scan_parquet}.get(
        format, _scan_delimited)
    first_format = None
    for name in names:
        if scan is _scan_delimited:
            found, first_format = scan(spec, name, format, first_format,
                                       max_examples, stop_at_first)
        else:
            found = scan(spec, name, compression, max_examples, stop_at_first)
        out.append(found)
        if stop_at_first and (found.skipped or found.damaged):
            break
    return out


def _scan_tfrecord(spec, name, compression, max_examples, stop):
    found = FileScan(name)
    parse_spec = _parse_spec(spec)
    comp = _compression(name, compression)
    batches = iter(tf.data.TFRecordDataset(name, comp, buffer_size=1 << 20).batch(4096))
    size = 0
    while not (stop and found.skipped):
        try:
            batch = next(batches)
        except StopIteration:
            if comp == "GZIP" and _gzip_cut(name, size):
                found.damaged = _damaged_text(name, found.records, _GZIP_CUT)
            break
        except tf.errors.DataLossError:
            # The damaged batch again, one record at a time up to the damage.
            rest = iter(tf.data.TFRecordDataset(name, comp).skip(found.records))
            while True:
                try:
                    record = next(rest)
                except StopIteration:  # pragma: no cover - read it this time
                    break
                except tf.errors.DataLossError as e:
                    found.damaged = _damaged_text(name, found.records, e)
                    break
                _scan_records(spec, parse_spec, name, record[None], found, max_examples)
            break
        size += int(_framed_bytes(batch))
        _scan_records(spec, parse_spec, name, batch, found, max_examples)
    return found


def _scan_records(spec, parse_spec, name, records, found, max_examples):
    n = int(records.shape[0])
    bad: Dict[int, str] = {}
    try:
        _value_reasons(spec, tf.io.parse_example(records, parse_spec), 0, bad)
    except (tf.errors.InvalidArgumentError, UnicodeDecodeError):
        for i in range(n):  # which ones, and why
            try:
                columns = tf.io.parse_example(records[i:i + 1], parse_spec)
            except (tf.errors.InvalidArgumentError, UnicodeDecodeError) as e:
                bad[i] = _parse_reason(spec, records[i].numpy(), e)
                continue
            _value_reasons(spec, columns, i, bad)
    for i in sorted(bad):
        if len(found.first) < max_examples:
            found.first.append(f"{name}:{found.records + i + 1}: {bad[i]}")
    found.records += n
    found.skipped += len(bad)


def _value_reasons(spec, columns, offset, bad):
    for feature, ok, what in _value_checks(spec, columns):
        values = tf.cast(columns[spec_feature(spec, feature).column], tf.float64).numpy()
        for i in np.flatnonzero(~ok.numpy()):
            bad.setdefault(offset + int(i), f"feature {feature!r} value {float(values[i])!r} "
                           f"is not {what}")


def _parse_reason(spec, record: bytes, error: BaseException) -> str:
    text = "" if isinstance(error, UnicodeDecodeError) else _tf_text(error)
    if not text or "Could not parse example" in text:
        return (f"not a serialized tf.Example ({len(record)} bytes, starting "
                f"{record[:16]!r})")
    by_column = {}
    for f in spec.features:
        by_column.setdefault(f.column, f.name)
    m = re.search(r"Key: ([^,]+), Index: \d+\.\s*(.*)", text)
    if m:
        return f"feature {by_column.get(m.group(1), m.group(1))!r}: {m.group(2)}"
    m = re.search(r"Feature: (\S+) \(data type: (\w+)\) is required", text)
    if m:
        return (f"feature {by_column.get(m.group(1), m.group(1))!r} ({m.group(2)}) "
                "is missing, and it has no default")
    return text


def _scan_delimited(spec, name, format, first_format, max_examples, stop):
    found = FileScan(name)
    delim = "\t" if format == "tsv" else ","
    try:
        row_format = first_format or _delimited_format(spec, name, delim, False)
    except ValueError as e:
        found.damaged = str(e)
        return found, None
    stats = ReadStats(max_examples=max_examples)
    try:
        for _ in read_rows(row_format, [name], 4096, bad_rows="skip", stats=stats,
                           log_limit=0):
            if stop and stats.skipped:
                break
    except tf.errors.InvalidArgumentError as e:  # the header check
        text = _tf_text(e)
        m = re.search(r"\[(.*)\]", text)
        found.damaged = (m.group(1) if m else text) + (
            " (every file must have the first file's header)")
    found.records, found.skipped = stats.lines_read, stats.skipped
    found.first = stats.examples
    return found, row_format


def _scan_parquet(spec, name, compression, max_examples, stop):
    found = FileScan(name)
    stats = ReadStats(max_examples=max_examples)
    try:
        for _ in _parquet_batches(spec, [name], 4096, 1, 0, "skip", stats, log_limit=0):
            if stop and stats.skipped:
                break
    except ValueError as e:
        found.damaged = str(e)
    found.records, found.skipped = stats.lines_read, stats.skipped
    found.first = stats.examples
    return found


def find_bad_records(spec: FeatureSpec, paths, format: str,
                     compression: Optional[str] = None,
                     max_examples: int = 5) -> List[str]:
    """Reads `paths` in file order and returns where their first bad rows
    are, as "file:record: reason" (at most `max_examples`): a damaged file
    (named with the record where reading stops) or rows the spec rejects.

    Why: TensorFlow's own errors for an unparseable tf.Example or a damaged
    TFRecord name neither the file nor the record, and a shuffled pipeline
    meets bad rows out of order; `tnet.train` calls `scan_files` after such
    a failure to name the first one in file order.

    Args:
      spec: the `FeatureSpec`.
      paths: files or globs.
      format: "tfrecord", "csv", "tsv" or "parquet".
      compression: "GZIP" or None (from the name).
      max_examples: lines returned at most.

    Example:
        ```python
        for line in tn.data.find_bad_records(spec, "data/*.csv", "csv"):
            print(line)       # file:record: feature: what is wrong
        ```
    """
    out: List[str] = []
    for found in scan_files(spec, paths, format, compression, max_examples):
        out += found.first
        if found.damaged:
            out.append(found.damaged)
    return out[:max_examples]


def parquet_to_tfrecord(spec: FeatureSpec, paths, out_dir: str,
                        bad_rows: str = "fail", log_limit: int = 5) -> List[str]:
    """Writes each Parquet file as a gzip TFRecord of tf.Examples (the
    spec's columns), once, so ParameterServerStrategy workers can read pure
    tf.data. Returns the TFRecord paths (same order).

    Args:
      spec: the `FeatureSpec`.
      paths: Parquet files or globs.
      out_dir: where the TFRecord files go.
      bad_rows: "fail" or "skip".
      log_limit: bad rows logged one by one at most.

    Returns:
      The TFRecord files written.

    Example:
        ```python
        files = tn.data.parquet_to_tfrecord(spec, "data/*.parquet", "/cache/tfr")
        ds = tn.data.spec_dataset(spec, files, "tfrecord", 512)
        ```
    """
    names = _rows._expand_paths(paths)
    os.makedirs(out_dir, exist_ok=True)
    out = []
    multi = {f.column: f for f in spec.features}
    for name in names:
        st = os.stat(name)
        target = os.path.join(out_dir, f"{os.path.basename(name)}-{st.st_size}-"
                              f"{int(st.st_mtime)}.tfrecord.gz")
        out.append(target)
        if os.path.exists(target):
            continue
        tmp = f"{target}.tmp{os.getpid()}"
        with tf.io.TFRecordWriter(tmp, "GZIP") as w:
            for cols in _parquet_batches(spec, [name], 4096, 1, 0, bad_rows, None,
                                         log_limit):
                column = next(iter(cols))
                a0, b0 = cols[column]
                n = len(b0) - 1 if multi[column].multi else len(a0)
                for i in range(n):
                    feats = {}
                    for c, (a, b) in cols.items():
                        f = multi[c]
                        if f.multi:
                            v = a[b[i]:b[i + 1]]
                        else:
                            v = a[i:i + 1]
                        feats[c] = _tf_feature(f, v)
                    w.write(tf.train.Example(features=tf.train.Features(
                        feature=feats)).SerializeToString())
        os.replace(tmp, target)
    return out


def _tf_feature(f: Feature, values) -> tf.train.Feature:
    if f.dtype == "string":
        return tf.train.Feature(bytes_list=tf.train.BytesList(
            value=[v if isinstance(v, bytes) else str(v).encode() for v in values]))
    if f.dtype == "float32":
        return tf.train.Feature(float_list=tf.train.FloatList(value=list(values)))
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in values]))
