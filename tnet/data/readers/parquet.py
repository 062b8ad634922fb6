"""Parquet through pyarrow in record batches (one process only), and its
conversion to gzip TFRecord for ParameterServerStrategy workers."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, List

import numpy as np
import tensorflow as tf

from tnet.data import _rows
from tnet.data.readers._common import BadDataError, _element, _pipes
from tnet.log import get as _get_logger

if TYPE_CHECKING:  # annotations only: the spec imports the readers
    from tnet.data.spec import Feature, FeatureSpec

_log = _get_logger("data")


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
