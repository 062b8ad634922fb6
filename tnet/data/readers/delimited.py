"""CSV / TSV: the header names the columns; the block reader and RE2 row
check of tnet/data/_rows.py, with a row format built from the spec."""
from __future__ import annotations

import re
import struct
from typing import TYPE_CHECKING, Dict, List, Optional

import tensorflow as tf

from tnet import _ops
from tnet.data import _rows
from tnet.data._rows import Field, RowFormat, read_rows
from tnet.data.readers._common import BadDataError, _element

if TYPE_CHECKING:  # annotations only: the spec imports the readers
    from tnet.data.spec import Feature, FeatureSpec


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
