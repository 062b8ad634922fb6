"""Streaming reader for delimited text rows, shared by the Criteo and Avazu readers.

Why pure `tf.data` ops: under ParameterServerStrategy the input pipeline is
built by a `dataset_fn` that is traced on the chief and run on every worker;
only graph ops survive that trip (`from_generator` / `py_function` do not).
So reading, validation, error messages and skipping are all TF ops:

* Each file is read in 1 MiB blocks (`FixedLengthRecordDataset`) that one
  op (TnetSplitLines) splits into lines; a `scan` carries the partial last
  line into the next block. Every line gets a 64-bit key `file_index << 40 | line_number`
  so that errors name the file and the 1-based line. (A per-line
  `TextLineDataset` element costs ~1.3 us; this costs ~0.3 us per line.)
* One RE2 full match of each line against the format's row pattern decides
  good or bad. The pattern is exact (field count, label, number and hex
  syntax, digit limits), so the decoding ops behind it cannot fail. A
  format with `decode_lines` (the feature-spec CSV/TSV reader) does the
  check and the decoding in one kernel, TnetDecodeRows, whose check is the
  pattern's; its lines are rebatched to the batch size before decoding.
* Bad lines are replaced by a known-good placeholder before decoding. Then
  either an `Assert` reports the first bad line (`bad_rows="fail"`), or the
  bad rows are dropped, their first few logged to stderr with file:line and
  reason, and counted in an optional `ReadStats` (`bad_rows="skip"`).
* A final `rebatch` gives exact batch sizes, so good rows come out in the
  same batches as they would from a clean file.

The reason for a bad line (non-text bytes, field count, which field and what
it should be) is worked out only for the lines that are reported, never on
the fast path.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import sys
from typing import Any, Callable, Sequence, Union

import tensorflow as tf

from tnet import _ops

PathLike = Union[str, os.PathLike]
LINE_BITS = 40  # key = file_index << LINE_BITS | line_number (1-based)
_LINE_MASK = (1 << LINE_BITS) - 1
_SHOW_CHARS = 40  # a reported field value is cut after this many bytes
_logger = logging.getLogger("tnet.data")


@dataclasses.dataclass(frozen=True)
class Field:
    """One column of a row format: its name, RE2 syntax and a description."""

    name: str
    pattern: str  # RE2, full match, non-capturing groups only
    expected: str  # completes "<name> `<value>` is not ..."


@dataclasses.dataclass(frozen=True)
class RowFormat:
    """A delimited text format: fields, optional header line, row decoder.

    `decode` gets the split fields of good rows as a string tensor
    `[B, len(fields)]` and returns the dataset element.
    `placeholder` is any line that matches the row pattern; it stands in for
    bad lines so that decoding never sees them.
    """

    name: str
    delimiter: str
    fields: tuple[Field, ...]
    decode: Callable[[tf.Tensor], Any]
    placeholder: str
    header: str | None = None
    # Optional: lines [n] -> (ok [n], element) in one step, ok exactly the
    # row pattern's full match (the feature-spec reader's TnetDecodeRows);
    # then neither the regex nor `decode` runs.
    decode_lines: Callable[[tf.Tensor], tuple[tf.Tensor, Any]] | None = None

    @property
    def row_pattern(self) -> str:
        return self.delimiter.join(f.pattern for f in self.fields)


class ReadStats:
    """Counts of lines read, rows yielded and rows skipped by a reader.

    Pass one to a reader (`stats=`) and read it during or after iteration::

        stats = tn.data.ReadStats()
        ds = tn.data.criteo_dataset(path, 1024, bad_rows="skip", stats=stats)
        model.fit(ds)
        print(stats.skipped, stats.examples)  # examples: "file:line: reason"

    Why tf.Variables: the reader is a pure tf.data graph (it must work inside
    a ParameterServerStrategy `dataset_fn`), so the pipeline itself updates
    the counts. Create the object in the same process that iterates the
    dataset, outside any strategy scope and outside a `dataset_fn` (TF does
    not allow creating variables there). Under ParameterServerStrategy leave
    `stats=None`: each worker still logs its first malformed rows to stderr.
    Counts are per read: a bad row read in two epochs is counted twice.

    Args:
      max_examples: bad rows kept as examples for the log.

    Example:
        ```python
        stats = tn.data.ReadStats()
        ds = spec.dataset("data/*.csv", "csv", 256, bad_rows="skip", stats=stats)
        model.fit(ds)
        stats.log()          # how many rows each file skipped
        ```
    """

    def __init__(self, max_examples: int = 5):
        if tf.distribute.has_strategy():
            raise ValueError(
                "ReadStats must be created outside strategy.scope(): its "
                "counters live in the process that iterates the dataset.")
        self.max_examples = int(max_examples)
        with tf.init_scope(), tf.device("/cpu:0"):
            def counter(name: str) -> tf.Variable:
                return tf.Variable(tf.constant(0, tf.int64), trainable=False, name=name)

            self._lines = counter("lines_read")
            self._rows = counter("rows")
            self._skipped = counter("skipped")
            self._num_examples = counter("num_examples")
            self._examples = tf.Variable(
                tf.constant([""] * self.max_examples, tf.string),
                trainable=False, name="examples")

    @property
    def lines_read(self) -> int:
        """Data lines read (good and bad; header lines not included)."""
        return int(self._lines.numpy())

    @property
    def rows(self) -> int:
        """Good rows yielded."""
        return int(self._rows.numpy())

    @property
    def skipped(self) -> int:
        """Malformed rows dropped (`bad_rows="skip"`)."""
        return int(self._skipped.numpy())

    @property
    def examples(self) -> list[str]:
        """`"file:line: reason"` for the first `max_examples` skipped rows."""
        n = int(self._num_examples.numpy())
        return [s.decode("utf-8", "replace") for s in self._examples.numpy()[:n]]

    def reset(self) -> None:
        """Forgets every count and example (for a new pass)."""
        for v in (self._lines, self._rows, self._skipped, self._num_examples):
            v.assign(0)
        self._examples.assign(tf.constant([""] * self.max_examples, tf.string))

    def summary(self) -> str:
        text = (f"read {self.lines_read} lines: {self.rows} rows, "
                f"{self.skipped} malformed rows skipped")
        if self.examples:
            text += "; first: " + "; ".join(self.examples)
        return text

    def log(self, logger: logging.Logger = _logger) -> None:
        """Log `summary()` as a warning if rows were skipped, else as info.

        Args:
          logger: where the lines go (default: the "tnet.data" logger).
        """
        level = logging.WARNING if self.skipped else logging.INFO
        logger.log(level, "%s", self.summary())

    def __repr__(self) -> str:
        return f"ReadStats({self.summary()})"

    # Called from the (sequential) accounting stage of the pipeline.
    def _update(self, lines: tf.Tensor, rows: tf.Tensor, skipped: tf.Tensor,
                described: tf.Tensor | None = None) -> list:
        counts = [self._lines.assign_add(lines), self._rows.assign_add(rows),
                  self._skipped.assign_add(skipped)]
        if described is None:
            return counts
        have = self._num_examples.read_value()
        room = tf.maximum(tf.constant(self.max_examples, tf.int64) - have, 0)
        add = tf.minimum(room, tf.size(described, out_type=tf.int64))
        merged = tf.concat([self._examples.read_value()[:have], described[:add],
                            tf.fill([self.max_examples], "")], 0)[:self.max_examples]
        return counts + [self._examples.assign(merged), self._num_examples.assign_add(add)]


def printable(values: tf.Tensor, limit: int = _SHOW_CHARS) -> tf.Tensor:
    """Bytes -> short printable ASCII for messages (tabs shown as <tab>)."""
    cut = tf.strings.substr(values, 0, limit)
    text = tf.strings.unicode_transcode(cut, "UTF-8", "UTF-8", errors="replace",
                                        replacement_char=ord("?"))
    text = tf.strings.regex_replace(text, "\t", "<tab>")
    text = tf.strings.regex_replace(text, r"[^ -~]", "?")
    more = tf.where(tf.strings.length(values) > limit, "...", "")
    return tf.strings.join(["`", text, more, "`"])


def describe(fmt: RowFormat, paths: tf.Tensor, keys: tf.Tensor,
             lines: tf.Tensor) -> tf.Tensor:
    """`"file:line: reason"` for each (bad) line; only run on reported lines."""
    nf = len(fmt.fields)
    delim = {"\t": "tabs", ",": "commas"}.get(fmt.delimiter, repr(fmt.delimiter))
    parts = tf.strings.split(lines, fmt.delimiter)
    counts = parts.row_lengths()
    fields = parts.to_tensor("", shape=[None, nf])
    valid = tf.stack([tf.strings.regex_full_match(fields[:, j], f.pattern)
                      for j, f in enumerate(fmt.fields)], axis=1)
    first = tf.argmin(tf.cast(valid, tf.int32), axis=1, output_type=tf.int32)
    field_reason = tf.strings.join([
        tf.gather(tf.constant([f.name for f in fmt.fields]), first), " ",
        printable(tf.gather(fields, first, batch_dims=1)), " is not ",
        tf.gather(tf.constant([f.expected for f in fmt.fields]), first)])
    reason = tf.where(tf.reduce_all(valid, axis=1),
                      f"does not match the {fmt.name} row format", field_reason)
    reason = tf.where(
        counts != nf,
        tf.strings.join([f"expected {nf} fields separated by {delim}, found ",
                         tf.strings.as_string(counts)]),
        reason)
    reason = tf.where(tf.strings.length(lines) == 0, "empty line", reason)
    reason = tf.where(
        tf.strings.regex_full_match(lines, r"[\t -~]*"), reason,
        tf.strings.join(["contains bytes that are not printable ASCII (binary "
                         "data or another encoding?): ", printable(lines)]))
    file_index = tf.bitwise.right_shift(keys, LINE_BITS)
    line_no = tf.bitwise.bitwise_and(keys, _LINE_MASK)
    return tf.strings.join([tf.gather(paths, file_index), ":",
                            tf.strings.as_string(line_no), ": ", reason])


def _expand_paths(paths: PathLike | Sequence[PathLike]) -> list[str]:
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not items:
        raise ValueError("no input files given")
    out: list[str] = []
    for item in items:
        name = os.fspath(item)
        if any(c in name for c in "*?["):
            matched = sorted(tf.io.gfile.glob(name))
            if not matched:
                raise FileNotFoundError(f"no file matches {name!r}")
            out.extend(matched)
        elif not tf.io.gfile.exists(name):
            raise FileNotFoundError(f"input file not found: {name!r}")
        else:
            out.append(name)
    if len(out) >= 1 << (63 - LINE_BITS):
        raise ValueError(f"too many input files ({len(out)})")
    return out


def _file_chunks(fmt: RowFormat, path: tf.Tensor, index: tf.Tensor, size: tf.Tensor,
                 block_bytes: int) -> tf.data.Dataset:
    """(keys [n], lines [n]) per block of one file; checks its header.

    Why blocks, not TextLineDataset: a per-line dataset element costs ~1.3 us
    (measured); reading fixed-size blocks and splitting them on newlines in
    one op costs ~0.3 us per line. A `scan` carries the partial last line of
    each block into the next, and the line counter for the keys. The file
    size (taken when the pipeline is built) splits the file into whole blocks
    and a tail, because FixedLengthRecordDataset rejects a partial record.
    """
    n_full = size // block_bytes
    tail = size % block_bytes
    blocks = tf.data.FixedLengthRecordDataset(path, block_bytes, footer_bytes=tail)
    blocks = blocks.concatenate(tf.data.FixedLengthRecordDataset(
        path, tf.maximum(tail, 1), header_bytes=n_full * block_bytes))
    last_block = n_full + tf.cast(tail > 0, tf.int64) - 1
    base = tf.bitwise.left_shift(index, LINE_BITS)

    def split_lines(state, element):
        carry, next_line = state
        i, block = element
        # carry + block split on LF, one trailing CR dropped per line; the
        # partial last line is carried (each line copied once: joining and
        # splitting with string ops copied the block three times).
        lines, rest = _ops.tnet_split_lines(carry, block, tf.equal(i, last_block))
        n = tf.size(lines, out_type=tf.int64)
        keys = base + next_line + tf.range(n)
        return (rest, next_line + n), (keys, lines)

    chunks = blocks.enumerate().scan((tf.constant(""), tf.constant(1, tf.int64)), split_lines)
    if fmt.header is None:
        return chunks
    expected = fmt.header

    def check_header(keys, lines):
        first = tf.logical_and(tf.size(keys) > 0,
                               tf.equal(tf.bitwise.bitwise_and(keys[:1], _LINE_MASK), 1))
        first = tf.reduce_any(first)

        def check():
            msg = tf.strings.join([
                path, f":1: header does not match the {fmt.name} format: "
                f"expected `{expected}`, found ", printable(lines[0], 400)])
            ok = tf.debugging.Assert(tf.equal(lines[0], expected), [msg], summarize=1)
            with tf.control_dependencies([ok]):
                return tf.constant(1)

        drop = tf.cond(first, check, lambda: tf.constant(0))
        return keys[drop:], lines[drop:]

    return chunks.map(check_header)


def _decode_good(fmt: RowFormat, lines: tf.Tensor, ok: tf.Tensor) -> Any:
    # The placeholder copy of every line is skipped when all lines are good.
    safe = tf.cond(tf.reduce_all(ok), lambda: lines,
                   lambda: tf.where(ok, lines, fmt.placeholder))
    split = tf.strings.split(safe, fmt.delimiter).flat_values
    return fmt.decode(tf.reshape(split, [-1, len(fmt.fields)]))


def read_rows(fmt: RowFormat, paths: PathLike | Sequence[PathLike], batch_size: int, *,
              bad_rows: str = "fail", shuffle_buffer: int = 0,
              num_epochs: int | None = 1, skip: int = 0, take: int = -1,
              seed: int | None = None, drop_remainder: bool = False,
              input_context: tf.distribute.InputContext | None = None,
              stats: ReadStats | None = None, log_limit: int = 5,
              block_bytes: int = 1 << 20) -> tf.data.Dataset:
    """The shared pipeline; see `criteo_dataset` for the argument semantics."""
    if bad_rows not in ("fail", "skip"):
        raise ValueError(f"bad_rows must be 'fail' or 'skip', got {bad_rows!r}")
    if int(batch_size) < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if num_epochs is not None and num_epochs != -1 and num_epochs < 1:
        raise ValueError(f"num_epochs must be >= 1, or None/-1 for forever; got {num_epochs}")
    if skip < 0:
        raise ValueError(f"skip must be >= 0, got {skip}")
    batch_size = int(batch_size)
    names = _expand_paths(paths)
    paths_t = tf.constant(names)
    chunk = max(batch_size, 1024)
    pipes, pipe_id = 1, 0
    if input_context is not None:
        pipes, pipe_id = input_context.num_input_pipelines, input_context.input_pipeline_id
    by_file = pipes > 1 and len(names) >= pipes and skip == 0 and take < 0

    sizes = [tf.io.gfile.stat(name).length for name in names]
    files = tf.data.Dataset.from_tensor_slices(
        (paths_t, tf.range(len(names), dtype=tf.int64), tf.constant(sizes, tf.int64)))
    if by_file:
        files = files.shard(pipes, pipe_id)
    data = files.flat_map(lambda p, i, n: _file_chunks(fmt, p, i, n, block_bytes))
    if skip > 0 or take >= 0:  # by position over the concatenated data lines
        data = data.unbatch().skip(skip).take(take).batch(chunk)
    if pipes > 1 and not by_file:  # rows, in chunks of `chunk` lines
        data = data.rebatch(chunk).shard(pipes, pipe_id)
    if shuffle_buffer > 0:
        data = _window_shuffle(data, int(shuffle_buffer), seed, chunk)
    if num_epochs is None or num_epochs == -1:
        data = data.repeat()
    elif num_epochs > 1:
        data = data.repeat(num_epochs)
    if bad_rows == "fail" and fmt.decode_lines is not None:
        # One kernel decodes the lines: batch the lines, then decode each
        # batch (a rebatch of decoded id lists, RaggedTensors, measured
        # ~8 ms per list column per 4096 rows; of lines, ~1 ms in all).
        data = data.rebatch(batch_size, drop_remainder=drop_remainder)
        data = data.map(lambda k, l: _parse_or_raise(fmt, paths_t, k, l, stats),
                        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        return data.prefetch(tf.data.AUTOTUNE)
    # Parse whole chunks (blocks of ~1 MiB of lines); exact batches come from
    # the final rebatch, which copies parsed numbers, cheaper than copying lines.
    if bad_rows == "fail":
        data = data.map(lambda k, l: _parse_or_raise(fmt, paths_t, k, l, stats),
                        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    else:
        data = data.map(lambda k, l: _parse_flagged(fmt, k, l),
                        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        data = data.scan(tf.constant(0, tf.int64),
                         lambda seen, e: _account(fmt, paths_t, seen, e, stats, log_limit))
    data = data.rebatch(batch_size, drop_remainder=drop_remainder)
    return data.prefetch(tf.data.AUTOTUNE)


def _window_shuffle(data: tf.data.Dataset, window: int, seed: int | None,
                    chunk: int) -> tf.data.Dataset:
    """Uniform random permutation of each run of `window` consecutive lines.

    Why not `Dataset.shuffle`: it moves one element at a time, and per-line
    elements cost ~13 us per row here (measured), which would make shuffling
    the bottleneck of training. Permuting whole windows is one gather. Rows
    move at most `window` positions, as with a shuffle buffer of that size,
    but never across window borders. A new permutation on every iteration
    (epoch), deterministic given `seed`.
    """
    seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True)

    def permute(element, r):
        keys, lines = element
        noise = tf.random.stateless_uniform(tf.shape(keys), seed=tf.stack([r, r // 7 + 1]))
        order = tf.argsort(noise)
        return tf.gather(keys, order), tf.gather(lines, order)

    data = tf.data.Dataset.zip((data.rebatch(window), seeds)).map(permute)
    return data.rebatch(chunk) if window > chunk else data


def _valid(fmt: RowFormat, lines: tf.Tensor) -> tf.Tensor:
    return tf.strings.regex_full_match(lines, fmt.row_pattern)


def _parse_or_raise(fmt, paths_t, keys, lines, stats):
    if fmt.decode_lines is not None:
        ok, decoded = fmt.decode_lines(lines)
    else:
        ok, decoded = _valid(fmt, lines), None

    def raise_first_bad():
        i = tf.argmin(tf.cast(ok, tf.int32), output_type=tf.int32)
        where = describe(fmt, paths_t, keys[i:i + 1], lines[i:i + 1])[0]
        msg = tf.strings.join([
            where, f" (malformed {fmt.name} row). Fix or remove the row, or pass "
            "bad_rows=skip to drop and count malformed rows."])
        with tf.control_dependencies([tf.debugging.Assert(False, [msg], summarize=1)]):
            return tf.constant(False)

    checked = tf.cond(tf.reduce_all(ok), lambda: tf.constant(True), raise_first_bad)
    deps = [checked]
    if stats is not None:
        n = tf.size(lines, out_type=tf.int64)
        deps += stats._update(n, n, tf.constant(0, tf.int64))
    if decoded is not None:
        with tf.control_dependencies(deps):
            return tf.nest.map_structure(tf.identity, decoded, expand_composites=True)
    with tf.control_dependencies(deps):
        lines = tf.identity(lines)
    return _decode_good(fmt, lines, ok)


def _parse_flagged(fmt, keys, lines):
    if fmt.decode_lines is not None:
        ok, decoded = fmt.decode_lines(lines)
        return decoded, ok, keys, lines
    ok = _valid(fmt, lines)
    return _decode_good(fmt, lines, ok), ok, keys, lines


def _account(fmt, paths_t, seen, element, stats, log_limit):
    """Sequential stage of skip mode: log the first bad rows, count, filter."""
    decoded, ok, keys, lines = element
    bad = tf.logical_not(ok)
    n_bad = tf.reduce_sum(tf.cast(bad, tf.int64))
    n_log = tf.clip_by_value(log_limit - seen, 0, n_bad)
    # Rows to describe: the logged ones, and as many as `stats` keeps
    # (its max_examples may exceed log_limit).
    n_keep = 0 if stats is None else stats.max_examples
    n_desc = tf.maximum(n_log, tf.clip_by_value(n_keep - seen, 0, n_bad))

    def report():
        idx = tf.where(bad)[:n_desc, 0]
        text = describe(fmt, paths_t, tf.gather(keys, idx), tf.gather(lines, idx))

        def log():
            op = tf.print(tf.strings.reduce_join(tf.strings.join(
                [f"W tnet.data: skipping malformed {fmt.name} row ", text[:n_log]]),
                separator="\n"), output_stream=sys.stderr)
            with tf.control_dependencies([op]):
                return tf.constant(True)

        printed = tf.cond(n_log > 0, log, lambda: tf.constant(False))
        with tf.control_dependencies([printed]):
            return tf.identity(text)

    def more():
        op = tf.print(f"W tnet.data: more malformed {fmt.name} rows are skipped "
                      "without logging (count them with tnet.data.ReadStats)",
                      output_stream=sys.stderr)
        with tf.control_dependencies([op]):
            return tf.constant(True)

    described = tf.cond(n_desc > 0, report, lambda: tf.zeros([0], tf.string))
    # The notice comes once, in the chunk whose bad rows cross the limit,
    # whether or not that chunk logs any (after the logged rows).
    with tf.control_dependencies([described]):
        noticed = (tf.cond((seen <= log_limit) & (seen + n_bad > log_limit),
                           more, lambda: tf.constant(False))
                   if log_limit > 0 else tf.constant(False))
    deps = [described, noticed]
    if stats is not None:
        n = tf.size(lines, out_type=tf.int64)
        deps += stats._update(n, n - n_bad, n_bad, described)
    with tf.control_dependencies(deps):
        ok = tf.identity(ok)
    kept = tf.nest.map_structure(lambda t: _mask_rows(t, ok), decoded)
    return seen + n_bad, kept


def _mask_rows(t, keep: tf.Tensor):
    """Rows of `t` where `keep` (a RaggedTensor too: multi-valued ids)."""
    if isinstance(t, tf.RaggedTensor):
        return tf.ragged.boolean_mask(t, keep)
    return tf.boolean_mask(t, keep)
