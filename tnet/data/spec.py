"""Feature specs: a user's data described in one JSON (or YAML) file.

    spec = tn.data.spec.load("spec.json")
    columns = spec.embedding_columns()          # for EmbeddingFeatures / models
    ds = spec.dataset("data/2026-11-01/*", "tfrecord", batch_size=1024)

A spec lists every feature the job reads (see docs/guides/data-and-cli.md
for each field):

    {"defaults": {"dim": 8, "table": "embedding"},
     "features": [
       {"name": "click", "kind": "label", "dtype": "int64"},
       {"name": "user_id", "kind": "id", "dtype": "int64", "dim": 16,
        "table": "user", "min_count": 2},
       {"name": "tags", "kind": "ids", "dtype": "string", "combiner": "sum"},
       {"name": "history", "kind": "sequence", "dtype": "int64",
        "max_length": 20},
       {"name": "price", "kind": "dense", "dtype": "float32", "default": 0},
       {"name": "w", "kind": "weight"},
       {"name": "user", "kind": "group", "column": "user_id"}]}

Why one file: the same description gives the models their columns, the
readers their parsing (TFRecord, CSV/TSV, Parquet), and the daily loop
what to evaluate per group. A mistake in it fails at load time with the
file and the feature's name; a data file that does not match it fails
with the file, the record (or line) and the feature.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Dict, List, Optional, Sequence

import tensorflow as tf

from tnet.data.readers import spec_dataset

KINDS = ("id", "ids", "sequence", "dense", "label", "weight", "group")
ID_KINDS = ("id", "ids", "sequence")
_DTYPES = {"id": ("int64", "string"), "ids": ("int64", "string"),
           "sequence": ("int64", "string"), "group": ("int64", "string"),
           "dense": ("float32", "int64"), "label": ("int64", "float32"),
           "weight": ("float32", "int64")}
_DEFAULT_DTYPE = {"id": "int64", "ids": "int64", "sequence": "int64",
                  "group": "int64", "dense": "float32", "label": "int64",
                  "weight": "float32"}
_COMBINERS = ("mean", "sum", "sqrtn")
_FIELDS = {"name", "kind", "dtype", "column", "default", "table", "dim",
           "combiner", "min_count", "max_rows", "max_length", "separator",
           "memory_budget_bytes", "storage_dir"}
_ID_ONLY = {"table", "dim", "combiner", "min_count", "max_rows",
            "memory_budget_bytes", "storage_dir"}
_DEFAULTABLE = {"dim", "table", "combiner", "min_count", "max_rows",
                "separator", "memory_budget_bytes", "storage_dir"}


class SpecError(ValueError):
    """A feature spec is invalid; the message names the file and feature.

    Example:
        ```python
        try:
            tn.data.spec.load("spec.json")
        except tn.data.spec.SpecError as e:
            print(e)       # spec.json: feature 'user_id': what is wrong, the fix
        ```
    """


@dataclasses.dataclass(frozen=True)
class Feature:
    """One feature of a spec (see the module docstring and docs/guides/data-and-cli.md).

    name: the key in the features dict the models get.
    kind: id (one id per example), ids (a set of ids), sequence (ids in
      order, most recent last, the last `max_length` kept), dense (one
      float), label, weight (per-example loss weight), group (a key to
      group examples by for group AUC; not a model input).
    dtype: how the value is stored in the files (int64 or string ids;
      float32 or int64 numbers); the model gets int64/string ids and
      float32 numbers.
    column: the name in the files (default `name`): two features may read
      the same column (e.g. `user_id` as an id and as the group key).
    default: value for a missing or empty single id / number (ids: the
      padding, -1 or "", which the model ignores; dense: 0.0).
    table, dim, combiner, min_count, max_rows, memory_budget_bytes,
      storage_dir: the embedding (see tn.feature_column.embedding_column).
    max_length: ids / sequence: most ids kept per example (None: all).
    separator: CSV/TSV: what separates the ids of a multi-valued cell.

    Args:
      name: the key in the features dict.
      kind: "id", "ids", "sequence", "dense", "label", "weight" or "group".
      dtype: "int64", "string" or "float32".
      column: the name in the files.
      default: the value of a missing cell.
      table: the embedding's table.
      dim: the embedding's width.
      combiner: "mean", "sum" or "sqrtn".
      min_count: the table's admission threshold.
      max_rows: the table's row cap.
      max_length: ids kept per example.
      memory_budget_bytes: the table's disk tier budget.
      storage_dir: the table's disk tier directory.
      separator: CSV/TSV separator of the ids in one cell.

    Example:
        ```python
        spec = tn.data.spec.load("spec.json")
        print([(f.name, f.kind, f.dtype) for f in spec.features])
        ```
    """

    name: str
    kind: str
    dtype: str
    column: str
    default: Any = None
    table: Optional[str] = None
    dim: Optional[int] = None
    combiner: str = "mean"
    min_count: Optional[float] = None
    max_rows: Optional[int] = None
    max_length: Optional[int] = None
    memory_budget_bytes: Optional[int] = None
    storage_dir: Optional[str] = None
    separator: str = "|"

    @property
    def is_id(self) -> bool:
        """True for "id", "ids" and "sequence" features."""
        return self.kind in ID_KINDS

    @property
    def multi(self) -> bool:
        """True for "ids" and "sequence" features (several ids per example)."""
        return self.kind in ("ids", "sequence")

    @property
    def tf_dtype(self) -> tf.DType:
        """The TensorFlow dtype the readers produce for it."""
        return {"int64": tf.int64, "string": tf.string,
                "float32": tf.float32}[self.dtype]

    @property
    def padding(self) -> Any:
        """The value of a missing single id or number (see `default`)."""
        if self.default is not None:
            return self.default
        if self.kind in ("dense", "weight"):
            return 1.0 if self.kind == "weight" else 0.0
        return "" if self.dtype == "string" else -1


class FeatureSpec:
    """A parsed spec: its features, the model columns and the readers.

    Args:
      features: the `Feature`s, in the file's order.
      source: where the spec came from (named in errors).

    Example:
        ```python
        spec = tn.data.spec.load("spec.json")
        model = tn.models.WideDeep(spec.embedding_columns(), spec.dense)
        ds = spec.dataset("data/*.csv", "csv", 256)
        ```
    """

    def __init__(self, features: Sequence[Feature], source: str = "<spec>"):
        self.features = tuple(features)
        self.source = source

    def _of(self, *kinds) -> List[Feature]:
        return [f for f in self.features if f.kind in kinds]

    @property
    def id_features(self) -> List[Feature]:
        """The id, ids and sequence features."""
        return self._of(*ID_KINDS)

    @property
    def dense_features(self) -> List[Feature]:
        """The dense features."""
        return self._of("dense")

    @property
    def label(self) -> Feature:
        """The label feature."""
        return self._of("label")[0]

    @property
    def weight(self) -> Optional[Feature]:
        """The weight feature, or None."""
        found = self._of("weight")
        return found[0] if found else None

    @property
    def group_key(self) -> Optional[str]:
        """The name of the group feature (for group AUC), or None."""
        found = self._of("group")
        return found[0].name if found else None

    @property
    def categorical(self) -> List[str]:
        """The names of the id features."""
        return [f.name for f in self.id_features]

    @property
    def dense(self) -> List[str]:
        """The names of the dense features."""
        return [f.name for f in self.dense_features]

    @property
    def string_ids(self) -> bool:
        """True when every id feature holds strings (for the stock models)."""
        return all(f.dtype == "string" for f in self.id_features)

    def category_columns(self) -> list:
        """One `tn.feature_column` category (or sequence) column per id feature."""
        from tnet import feature_column as fc  # noqa: PLC0415
        return [fc.category_column(f.name, f.tf_dtype) for f in self.id_features]

    def embedding_columns(self, default_dim: int = 8) -> list:
        """One tn.feature_column.embedding_column per id feature, with the
        spec's table, dim, combiner, min_count and max_rows.

        Args:
          default_dim: the width of features without a `dim`.
        """
        from tnet import feature_column as fc  # noqa: PLC0415
        return [fc.embedding_column(c, f.dim or default_dim,
                                    combiner=f.combiner, table=f.table,
                                    min_count=f.min_count,
                                    max_rows=f.max_rows,
                                    memory_budget_bytes=f.memory_budget_bytes,
                                    storage_dir=f.storage_dir)
                for f, c in zip(self.id_features, self.category_columns())]

    def columns_read(self) -> List[str]:
        """The file columns the spec reads (each once, in spec order)."""
        out: List[str] = []
        for f in self.features:
            if f.column not in out:
                out.append(f.column)
        return out

    def dataset(self, paths, format: str, batch_size: int, **kwargs
                ) -> tf.data.Dataset:
        """A reader of `paths` in `format` ("tfrecord", "csv", "tsv",
        "parquet"); see tnet.data.readers.spec_dataset for the options.

        Args:
          paths: files or globs.
          format: "tfrecord", "csv", "tsv" or "parquet".
          batch_size: examples per batch.
          **kwargs: `spec_dataset`'s options (bad_rows, shuffle_buffer, ...).
        """
        return spec_dataset(self, paths, format, batch_size, **kwargs)

    def to_dict(self) -> Dict[str, Any]:
        """The spec as the JSON it loads from (`from_dict` reads it back)."""
        return {"features": [
            {k: v for k, v in dataclasses.asdict(f).items() if v is not None}
            for f in self.features]}

    def __repr__(self) -> str:
        return (f"FeatureSpec({self.source}: {len(self.id_features)} id, "
                f"{len(self.dense_features)} dense, label {self.label.name!r})")


# ------------------------------------------------------------------ loading
def load(path: str | os.PathLike) -> FeatureSpec:
    """Reads and checks a spec file (.json; .yaml/.yml when PyYAML is
    installed). Raises SpecError naming the file and the feature.

    Args:
      path: a .json file (.yaml / .yml with PyYAML installed).

    Example:
        ```python
        spec = tn.data.spec.load("spec.json")
        ```
    """
    path = os.fspath(path)
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise SpecError(f"feature spec {path}: cannot read it: {e}") from None
    if path.endswith((".yaml", ".yml")):
        try:
            import yaml  # noqa: PLC0415
        except ImportError:
            raise SpecError(
                f"feature spec {path}: YAML needs PyYAML, which is not "
                "installed; `pip install pyyaml`, or write the spec as JSON "
                "(same fields)") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise SpecError(f"feature spec {path}: not valid YAML: {e}") from None
    else:
        try:
            data = json.loads(text)
        except ValueError as e:
            raise SpecError(f"feature spec {path}: not valid JSON: {e}") from None
    return from_dict(data, source=path)


def from_dict(data: Any, source: str = "<spec>") -> FeatureSpec:
    """A FeatureSpec from the parsed file content (see `load`).

    Args:
      data: the parsed spec: {"defaults": {...}, "features": [...]}.
      source: named in errors.

    Example:
        ```python
        spec = tn.data.spec.from_dict({"features": [
            {"name": "click", "kind": "label"}, {"name": "user_id", "kind": "id"}]})
        ```
    """
    def fail(msg: str):
        raise SpecError(f"feature spec {source}: {msg}")

    if not isinstance(data, dict):
        fail(f"expected an object with a 'features' list, got {type(data).__name__}")
    unknown = set(data) - {"features", "defaults"}
    if unknown:
        fail(f"unknown top-level fields {sorted(unknown)} (expected "
             "'features' and optionally 'defaults')")
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict) or set(defaults) - _DEFAULTABLE:
        fail(f"'defaults' may set {sorted(_DEFAULTABLE)}; got {defaults!r}")
    items = data.get("features")
    if not isinstance(items, list) or not items:
        fail("'features' must be a non-empty list of feature objects")
    features, names = [], set()
    for i, item in enumerate(items):
        feature = _feature(item, i, defaults, fail)
        if feature.name in names:
            fail(f"feature {feature.name!r} is listed twice")
        names.add(feature.name)
        features.append(feature)
    spec = FeatureSpec(features, source)
    _check_spec(spec, fail)
    return spec


def _feature(item: Any, index: int, defaults: dict, fail) -> Feature:
    if not isinstance(item, dict):
        fail(f"features[{index}] must be an object, got {item!r}")
    name = item.get("name")
    if not isinstance(name, str) or not name:
        fail(f"features[{index}] needs a non-empty 'name'")
    where = f"feature {name!r}"
    unknown = set(item) - _FIELDS
    if unknown:
        fail(f"{where}: unknown fields {sorted(unknown)}; known: {sorted(_FIELDS)}")
    kind = item.get("kind")
    if kind not in KINDS:
        fail(f"{where}: kind must be one of {list(KINDS)}, got {kind!r}")
    dtype = item.get("dtype", _DEFAULT_DTYPE[kind])
    if dtype not in _DTYPES[kind]:
        fail(f"{where}: a {kind} feature's dtype must be one of "
             f"{list(_DTYPES[kind])}, got {dtype!r}")
    if kind not in ID_KINDS:
        extra = _ID_ONLY & set(item)
        if extra:
            fail(f"{where}: {sorted(extra)} apply to id features only "
                 f"(kind id, ids, sequence), not to kind {kind!r}")
    opts = {k: v for k, v in defaults.items()} if kind in ID_KINDS else {}
    if kind not in ID_KINDS:
        opts.pop("separator", None)
    opts.update({k: v for k, v in item.items() if k not in ("name", "kind", "dtype")})
    column = opts.pop("column", name)
    if not isinstance(column, str) or not column:
        fail(f"{where}: column must be a non-empty string, got {column!r}")
    dim = opts.get("dim")
    if dim is not None and (isinstance(dim, bool) or not isinstance(dim, int) or dim < 1):
        fail(f"{where}: dim must be a positive integer, got {dim!r}")
    combiner = opts.get("combiner", "mean")
    if combiner not in _COMBINERS:
        fail(f"{where}: combiner must be one of {list(_COMBINERS)}, got {combiner!r}")
    table = opts.get("table")
    if table is not None and (not isinstance(table, str) or not table):
        fail(f"{where}: table must be a non-empty string, got {table!r}")
    min_count = opts.get("min_count")
    if min_count is not None and (isinstance(min_count, bool) or
                                  not isinstance(min_count, (int, float)) or
                                  min_count < 0):
        fail(f"{where}: min_count must be a number >= 0, got {min_count!r}")
    max_rows = opts.get("max_rows")
    if max_rows is not None and (isinstance(max_rows, bool) or
                                 not isinstance(max_rows, int) or max_rows < 1):
        fail(f"{where}: max_rows must be a positive integer, got {max_rows!r}")
    budget = opts.get("memory_budget_bytes")
    if budget is not None and (isinstance(budget, bool) or
                               not isinstance(budget, int) or budget < 1):
        fail(f"{where}: memory_budget_bytes must be a positive integer, "
             f"got {budget!r}")
    storage_dir = opts.get("storage_dir")
    if storage_dir is not None and (not isinstance(storage_dir, str)
                                    or not storage_dir):
        fail(f"{where}: storage_dir must be a directory path, got "
             f"{storage_dir!r}")
    if (budget is None) != (storage_dir is None):
        fail(f"{where}: memory_budget_bytes and storage_dir go together "
             "(the disk tier needs both)")
    max_length = opts.get("max_length")
    if max_length is not None:
        if kind not in ("ids", "sequence"):
            fail(f"{where}: max_length applies to kind ids or sequence only")
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
            fail(f"{where}: max_length must be a positive integer, got {max_length!r}")
    separator = opts.get("separator", "|")
    if not isinstance(separator, str) or len(separator) != 1 or separator in "\n\r":
        fail(f"{where}: separator must be one character, got {separator!r}")
    default = opts.get("default")
    if default is not None:
        if kind in ("ids", "sequence", "label"):
            fail(f"{where}: a {kind} feature has no default (a missing "
                 + ("label is a bad record)" if kind == "label" else
                    "ids cell is an empty list)"))
        numeric = dtype in ("float32",) or kind in ("dense", "weight")
        if numeric and (isinstance(default, bool) or not isinstance(default, (int, float))):
            fail(f"{where}: default must be a number, got {default!r}")
        if not numeric and dtype == "int64" and (isinstance(default, bool) or
                                                 not isinstance(default, int)):
            fail(f"{where}: default must be an integer id, got {default!r}")
        if not numeric and dtype == "string" and not isinstance(default, str):
            fail(f"{where}: default must be a string id, got {default!r}")
    return Feature(name=name, kind=kind, dtype=dtype, column=column,
                   default=default, table=table, dim=dim, combiner=combiner,
                   min_count=min_count, max_rows=max_rows,
                   max_length=max_length, separator=separator,
                   memory_budget_bytes=budget, storage_dir=storage_dir)


def _check_spec(spec: FeatureSpec, fail) -> None:
    counts = {k: len(spec._of(k)) for k in KINDS}
    if counts["label"] != 1:
        fail(f"needs exactly one feature of kind 'label', found {counts['label']}")
    for kind in ("weight", "group"):
        if counts[kind] > 1:
            fail(f"at most one feature of kind {kind!r}, found {counts[kind]}")
    if not spec.id_features:
        fail("needs at least one id feature (kind id, ids or sequence)")
    # A column read by two features must be read the same way.
    by_column: Dict[str, Feature] = {}
    for f in spec.features:
        other = by_column.setdefault(f.column, f)
        if other.dtype != f.dtype or other.multi != f.multi:
            fail(f"features {other.name!r} and {f.name!r} read column "
                 f"{f.column!r} differently ({other.kind}/{other.dtype} vs "
                 f"{f.kind}/{f.dtype})")
    # Columns sharing a table must agree (one table, one row layout).
    tables: Dict[str, Feature] = {}
    for f in spec.id_features:
        if f.table is None:
            continue
        first = tables.setdefault(f.table, f)
        for key in ("dim", "min_count", "max_rows"):
            if getattr(first, key) != getattr(f, key):
                fail(f"features {first.name!r} and {f.name!r} share table "
                     f"{f.table!r} but differ in {key} ({getattr(first, key)!r} "
                     f"vs {getattr(f, key)!r}); give them the same {key} or "
                     "separate tables")
