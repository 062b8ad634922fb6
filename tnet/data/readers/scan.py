"""Counting and scanning files in file order: `count_records` (steps per
epoch), `scan_files` / `find_bad_records` (every bad row counted per file,
the first named; a damaged file named with the record where reading
stops). Eager Python over the readers' own checks."""
from __future__ import annotations

import re
import zlib
from typing import TYPE_CHECKING, Dict, List, Optional

import numpy as np
import tensorflow as tf

from tnet.data import _rows
from tnet.data._rows import ReadStats, read_rows
from tnet.data.readers._common import (FORMATS, _compression, _value_checks,
                                       spec_feature)
from tnet.data.readers.delimited import _delimited_format
from tnet.data.readers.parquet import _open_parquet, _parquet_batches
from tnet.data.readers.tfrecord import _parse_spec

if TYPE_CHECKING:  # annotations only: the spec imports the readers
    from tnet.data.spec import FeatureSpec


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
