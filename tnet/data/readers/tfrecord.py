"""TFRecord of tf.Example: parsed in batches; in skip mode each record is
validated alone and the dropped ones counted by the gaps they leave."""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Dict

import tensorflow as tf

from tnet.data import _rows
from tnet.data._rows import LINE_BITS
from tnet.data.readers._common import (_MASK, _assert_values, _compression,
                                       _element, _pipes, _record_names)

if TYPE_CHECKING:  # annotations only: the spec imports the readers
    from tnet.data.spec import FeatureSpec


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
