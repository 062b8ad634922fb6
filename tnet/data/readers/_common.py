"""The readers' shared parts: the element every format yields, the value
checks of a spec, record names (file:record) and compression by name."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Optional

import tensorflow as tf

from tnet.data._rows import LINE_BITS

if TYPE_CHECKING:  # annotations only: the spec imports the readers
    from tnet.data.spec import Feature, FeatureSpec

FORMATS = ("tfrecord", "csv", "tsv", "parquet")
_MASK = (1 << LINE_BITS) - 1


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
    # Dense features read at full precision (float64): a stream's event
    # time (unix seconds: float32 steps 128 s there).
    exact = getattr(spec, "float64_features", ())
    for f in spec.features:
        value = columns[f.column]
        if f.is_id:
            features[f.name] = _ids(f, value)
        elif f.kind == "dense":
            features[f.name] = tf.cast(value, tf.float64 if f.name in exact
                                       else tf.float32)
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



def _record_names(paths_t: tf.Tensor, keys: tf.Tensor) -> tf.Tensor:
    return tf.strings.join([
        tf.gather(paths_t, tf.bitwise.right_shift(keys, LINE_BITS)), ":",
        tf.strings.as_string(tf.bitwise.bitwise_and(keys, _MASK))])


def _compression(name: str, compression: Optional[str]) -> str:
    if compression is not None:
        return compression
    return "GZIP" if name.endswith(".gz") else ""
