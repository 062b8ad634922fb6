"""Sparse update rules: configuration objects turned into table op attrs.

A rule's arithmetic lives in C++ (tnet_ops/optimizers/<rule>.h), and the
registration table tnet_ops/optimizers/rules.h lists the rules, the
hyperparameters each reads (Keras names) and their defaults; Python reads
that table through the op library (the TnetSparseRules op). A rule's Python
class here names it, says which stock tf_keras optimizer it mirrors and
which defaults it gives table rows instead of the table's; subclasses
register themselves by `name`. Nothing here lists a rule's hyperparameters
or its slot count.
"""
from __future__ import annotations

import copy
import functools
import math
from typing import Any, Callable, Optional, Union

LearningRate = Union[float, Callable[[Any], Any]]

# Marks an argument the caller did not pass.
_UNSET = object()


class SparseRule:
    """Base class: an update rule and its hyperparameters.

    Subclasses set `name` (the C++ rule's kName), `default_learning_rate`,
    `keras_name` (when a stock tf_keras optimizer has the same update, its
    lower-case class name) and optionally `row_defaults` (hyperparameter
    defaults for table rows that differ from rules.h's). The constructor
    takes the learning rate, then the rule's hyperparameters (rules.h's
    names, in its order; positional or by keyword); `table_attrs()`
    returns the SparseTableHandle attrs.
    """

    name: str = ""
    keras_name: str = ""
    default_learning_rate: float = 0.001
    row_defaults: dict[str, float] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__ and cls.name:
            _BY_NAME[cls.name] = cls

    def __init__(self, learning_rate: LearningRate = _UNSET, *args: float,
                 **hparams: float):
        if learning_rate is _UNSET:
            learning_rate = self.default_learning_rate
        if not callable(learning_rate):
            _check_number("learning_rate", learning_rate, minimum=0.0)
        self.learning_rate = learning_rate
        names = self.hparams()
        cls_name = type(self).__name__
        if len(args) > len(names):
            raise TypeError(f"{cls_name}() takes at most {len(names) + 1} "
                            f"positional arguments (learning_rate"
                            + "".join(f", {n}" for n in names) + ")")
        given = dict(zip(names, args))
        for key, value in hparams.items():
            if key not in names:
                raise TypeError(
                    f"{cls_name}() got an unexpected keyword argument {key!r}"
                    f"; its hyperparameters: {', '.join(names) or 'none'}")
            if key in given:
                raise TypeError(
                    f"{cls_name}() got multiple values for argument {key!r}")
            given[key] = value
        # What the caller chose (a model's row defaults never replace it:
        # with_row_defaults).
        self._chosen = frozenset(given)
        for key, default in self.defaults().items():
            value = given.get(key, default)
            if key == "start_reference_batch":
                setattr(self, key, _reference_batch(value))
                continue
            _check_number(key, value)
            setattr(self, key, float(value))

    @classmethod
    def hparams(cls) -> tuple[str, ...]:
        """The rule's hyperparameters (Keras names), from rules.h."""
        return _rule_table()[0][cls.name]

    @classmethod
    def defaults(cls) -> dict[str, float]:
        """Each hyperparameter's default for table rows: rules.h's, unless
        `row_defaults` gives another."""
        table = _rule_table()[1]
        out = {}
        for k in cls.hparams():
            value = cls.row_defaults.get(k, table[k])
            out[k] = value if value is None else float(value)
        return out

    def table_attrs(self) -> dict[str, Any]:
        attrs: dict[str, Any] = {"optimizer": self.name}
        for key in self.hparams():
            value = getattr(self, key)
            # start_reference_batch None (off) is the attr's 0.
            attrs[key] = 0.0 if value is None else float(value)
        return attrs

    def num_slots(self, dim: int) -> int:
        """Floats of optimizer state per row at width `dim` (from C++)."""
        return _slots_from_op(self.name, int(dim))

    def with_row_defaults(self, **values: float) -> "SparseRule":
        """This rule with other row defaults: each hyperparameter in
        `values` for which the rule gives table rows a default of tnet's
        own (`row_defaults`, e.g. Adagrad's accumulator start) and which
        its caller did not choose takes the value given. A value the user
        chose, Keras' defaults (FTRL's start) and hyperparameters the
        rule lacks stay as they are. How a model gives its own layers
        another default than the library's (tn.models.DeepFM's rows)."""
        own = {k: v for k, v in values.items()
               if k in self.row_defaults and k not in self._chosen
               and k in self.hparams()}
        if all(getattr(self, k) == float(v) for k, v in own.items()):
            return self
        out = copy.copy(self)
        for key, value in own.items():
            _check_number(key, value)
            setattr(out, key, float(value))
        return out

    @classmethod
    def from_keras_config(cls, learning_rate: float,
                          config: dict[str, Any]) -> "SparseRule":
        """The rule with a stock Keras optimizer's hyperparameters.

        A Keras config always holds initial_accumulator_value (0.1 unless
        set), so Keras' own default there means "not chosen": the rows get
        the rule's row default. Any other value is the user's and is kept.
        """
        hparams = {k: config[k] for k in cls.hparams() if k in config}
        if hparams.get("initial_accumulator_value") == \
                KERAS_INITIAL_ACCUMULATOR_VALUE:
            del hparams["initial_accumulator_value"]
        return cls(learning_rate, **hparams)

    def get_config(self) -> dict[str, Any]:
        config = {"class_name": type(self).__name__,
                  "learning_rate": self.learning_rate}
        config.update({k: getattr(self, k) for k in self.hparams()})
        return config

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items()
                         if k != "class_name")
        return f"{type(self).__name__}({args})"


_BY_NAME: dict[str, type] = {}


@functools.lru_cache(maxsize=None)
def _slots_from_op(name: str, dim: int) -> int:
    import tensorflow as tf

    from tnet import _ops
    with tf.init_scope(), tf.device("/CPU:0"):
        return int(_ops.tnet_sparse_rule_slots(optimizer=name, dim=dim))


@functools.lru_cache(maxsize=None)
def _rule_table() -> tuple[dict[str, tuple[str, ...]], dict[str, str]]:
    """rules.h as the op library has it: ({rule: its hyperparameters},
    {hyperparameter: its default, the literal written there})."""
    import tensorflow as tf

    from tnet import _ops
    with tf.init_scope(), tf.device("/CPU:0"):
        rules, rule_hparams, names, defaults = (
            [v.decode() for v in t.numpy()] for t in _ops.tnet_sparse_rules())
    return ({r: tuple(h.split()) for r, h in zip(rules, rule_hparams)},
            dict(zip(names, defaults)))


def registered() -> dict[str, tuple[str, ...]]:
    """Every rule of the op library's registration table (rules.h), with its
    hyperparameters (Keras names, in argument order)."""
    return dict(_rule_table()[0])


def hparam_defaults() -> dict[str, float]:
    """Every hyperparameter of the registration table (rules.h) with its
    default there (the SparseTableHandle attr's)."""
    return {k: float(v) for k, v in _rule_table()[1].items()}


def resolve_learning_rate(step, layer: Optional[Callable[[], Any]] = None,
                          model: Any = None,
                          rule: "Optional[SparseRule]" = None):
    """The learning rate of one table push, in order of precedence:

    1. `layer`: a layer given its own optimizer (called with `step`: its
       schedule, if any, follows the model's steps);
    2. `model`: the model optimizer's current rate (tn.Model.train_step
       passes it, schedules already applied by Keras);
    3. `rule`: the table's own rule (a direct `SparseTable.push`), whose
       schedule is called with `step`.
    """
    if layer is not None:
        return layer(step)
    if model is not None:
        return model
    if rule is None:
        raise ValueError("resolve_learning_rate needs a layer, model or rule "
                         "learning rate")
    lr = rule.learning_rate
    return lr(step) if callable(lr) else lr


def by_keras_name(keras_name: str):
    """The rule class mirroring a stock tf_keras optimizer, or None."""
    for cls in _BY_NAME.values():
        if cls.keras_name == keras_name:
            return cls
    return None


def _reference_batch(value: Any) -> Optional[float]:
    """start_reference_batch: None (or 0, the table attr's "off") or a
    batch size >= 1."""
    if value is None or (not isinstance(value, bool)
                         and isinstance(value, (int, float)) and value == 0):
        return None
    _check_number("start_reference_batch", value, minimum=1.0)
    return float(value)


def _check_number(name: str, value: Any, minimum: float | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")


class SGD(SparseRule):
    """w -= lr * g. No hyperparameters, no slots."""

    name = "sgd"
    keras_name = "sgd"
    default_learning_rate = 0.01


# Where a table row's Adagrad accumulator starts (tn.optimizer.Adagrad,
# RowwiseAdagrad). Keras starts every accumulator at 0.1, which makes a new
# row's first steps small; in a table where most ids are rare, most rows
# are seen a few times and then learn almost nothing. From 1e-6 a row's
# first step is about the learning rate whatever its gradient's scale, and
# later steps shrink with the row's own accumulated gradients. Chosen by
# measurement for one pass over the data (the regime of a stream) and for
# early-stopped training (tools/measure_defaults.py --one_pass,
# --early_stopping; BENCHMARKS.md "Defaults for one pass and early
# stopping"): the best start measured in one pass on every data set, and
# not below stock Keras early-stopped. Trained for many epochs without
# early stopping it overfits sooner than 0.1. Keras' value:
# KERAS_INITIAL_ACCUMULATOR_VALUE.
ROW_INITIAL_ACCUMULATOR_VALUE = 1e-6
KERAS_INITIAL_ACCUMULATOR_VALUE = 0.1

# The start of tn.models.DeepFM's embedding rows when the model's
# optimizer leaves them at ROW_INITIAL_ACCUMULATOR_VALUE (a start the user
# chose is kept). Each DeepFM row enters every pairwise product of the FM
# term, so (likely; not measured directly) a first step of about the
# learning rate, which 1e-6 gives, moves the logit more than in
# Wide&Deep. On the real Criteo and Avazu rows DeepFM does about equally
# well from any start from 1e-3 to 3e-2 and better than from 1e-6 under
# both criteria (10 seeds), while the README-style Wide&Deep models and
# the multi-valued model lose 0.011-0.038 in one pass from 1e-3
# (BENCHMARKS.md "Defaults", DeepFM). Applied with
# SparseRule.with_row_defaults through EmbeddingFeatures(row_defaults=).
DEEPFM_ROW_INITIAL_ACCUMULATOR_VALUE = 3e-3
# tn.models.DeepFM's EmbeddingFeatures(row_defaults=...).
DEEPFM_ROW_DEFAULTS = {
    "initial_accumulator_value": DEEPFM_ROW_INITIAL_ACCUMULATOR_VALUE}

# The accumulator floor of Adagrad (and RowwiseAdagrad) rows of width 1
# when the user did not choose one: after its first update, a row's
# accumulator is at least this (see Adagrad's accumulator_floor), scaled
# with the batch like the start. A width-1 row is one id's weight in a
# logit (the wide part of a README-style model); from a start of 1e-6
# every update moves it by about the learning rate, however small its
# gradient, which in one pass over the real Avazu rows costs 0.005 AUC
# against the best setting measured (the wide rows' floor 3e-4). Wider
# rows keep no floor (it slows their deep part; the multi-valued model
# loses 0.008 with a floor on its dim-8 rows). 3e-5 is the largest floor
# measured that keeps every README-style model within 0.003 AUC of its
# best setting in one pass (10 seeds: Criteo +0.0019, Avazu +0.0026 over
# no floor, the multi-valued model -0.0025; BENCHMARKS.md "Defaults").
# Applied by tn.layers.EmbeddingFeatures to its width-1 tables with
# SparseRule.with_row_defaults.
WIDTH1_ACCUMULATOR_FLOOR = 3e-5
WIDTH1_ROW_DEFAULTS = {"accumulator_floor": WIDTH1_ACCUMULATOR_FLOOR}

# The learning rate and accumulator start of tn.layers.LinearFeatures'
# default FTRL (the wide part of tn.models.WideDeep, DeepFM's first-order
# term). From Keras' start 0.1 a rare id's weight barely moves in one
# pass; from ~0 its first step is +-lr, too large for a wide weight. A
# rare id's first step goes as lr / sqrt(start): lr 0.1 from 2.5e-4 takes
# the same first step as lr 0.2 (TensorFlow's canned linear models) from
# 1e-3 (the default before), and half as large later ones, which a wide
# logit summing many ids a row (multi-valued columns) needs. Chosen by
# measurement like ROW_INITIAL_ACCUMULATOR_VALUE (BENCHMARKS.md
# "Defaults"). An Ftrl a user constructs keeps Keras' values.
WIDE_FTRL_LEARNING_RATE = 0.1
WIDE_FTRL_INITIAL_ACCUMULATOR_VALUE = 2.5e-4

# The batch size at which a table row's accumulator start (Adagrad's,
# RowwiseAdagrad's, FTRL's initial_accumulator_value) means what it says.
# The start is in squared-gradient units, and a batch-mean loss (Keras'
# default) scales each row's gradient by 1 / batch, so a start chosen at
# one batch size is too large by (B / 256)^2 at batch B: at batch 4096 the
# wide part's 1e-3 acted like 0.26 at batch 256 and cost 0.02-0.03 AUC
# (BENCHMARKS.md "tnet vs TFRA"). A row inserted by a step of B examples
# starts at initial_accumulator_value * (START_REFERENCE_BATCH / B)^2: its
# first step is then the same for the same per-example gradient at any
# batch size, and at batch 256 nothing changes. The scaling happens once,
# when the row is inserted: accumulators stay plain numbers (checkpoints
# and resume are unchanged). `start_reference_batch=None` keeps the start
# fixed whatever the batch.
START_REFERENCE_BATCH = 256

# Hyperparameters that decide only how rows inserted from now on start,
# not what stored state means: a checkpoint written before one existed
# restores exactly as with it (tnet.saving reads its absence as the
# model's value, so no warning; another value: an info line).
INSERT_ONLY_HPARAMS = ("start_reference_batch",)

# A row's optimizer-state start: read only when a row is inserted, so a
# checkpoint whose rows started from another value restores unchanged
# (tnet.saving says so in one info line); rows inserted afterwards start
# from the model's.
START_HPARAMS = ("initial_accumulator_value",)

# Hyperparameters that change how rows update from now on and nothing of
# what is stored: a checkpoint written with another value restores
# unchanged (tnet.saving says so in one info line).
FORWARD_HPARAMS = ("accumulator_floor",)


class Adagrad(SparseRule):
    """Element-wise Adagrad, row for row as ResourceSparseApplyAdagradV2.

    Hyperparameters as Keras Adagrad's: `initial_accumulator_value`,
    `epsilon` (1e-7). The accumulator of a new row starts at
    `initial_accumulator_value`, by default ROW_INITIAL_ACCUMULATOR_VALUE
    (1e-6), not Keras' 0.1: rare ids learn at full speed from their first
    example. Pass 0.1 for Keras' behaviour.

    `start_reference_batch` (tnet's own, START_REFERENCE_BATCH = 256 by
    default): the batch size the start is meant for. A row inserted by a
    training step of B examples (`tn.Model` counts them, whatever the ids'
    form; a direct `SparseTable.pull`/`push` passes `batch_size`) starts
    its accumulator at initial_accumulator_value * (256 / B)^2, so a
    batch-mean loss's 1 / B on the gradients does not slow new rows at
    large batches (see START_REFERENCE_BATCH). None: the start as given
    at every batch size.

    `accumulator_floor` (tnet's own) makes a row's start depend on its
    update count: after each update of a row, acc = max(acc, floor), so
    its first update runs from initial_accumulator_value and every later
    one from at least the floor (scaled with the batch like the start).
    By default 0 (off), except in tables of width-1 rows, where
    tn.layers.EmbeddingFeatures gives it WIDTH1_ACCUMULATOR_FLOOR (3e-5)
    unless the user chose one: a width-1 row is a weight in a logit and
    learns better in one pass with it; wider rows learn worse
    (BENCHMARKS.md "Defaults"). No extra slot: checkpoints keep it.
    """

    name = "adagrad"
    keras_name = "adagrad"
    row_defaults = {"initial_accumulator_value": ROW_INITIAL_ACCUMULATOR_VALUE,
                    "accumulator_floor": 0.0,
                    "start_reference_batch": START_REFERENCE_BATCH}


class RowwiseAdagrad(Adagrad):
    """Adagrad with one accumulator per row (fed the mean squared gradient).

    Adagrad's hyperparameters and defaults. A third less memory than
    Adagrad at dim 8; TensorNet and FBGEMM use it for embeddings.
    """

    name = "rowwise_adagrad"
    keras_name = ""  # no stock Keras optimizer has this update


class Adam(SparseRule):
    """Adam with bias correction by each row's own update count.

    Hyperparameters and defaults as Keras Adam's (`beta_1`, `beta_2`,
    `epsilon`). A row is updated only on the steps where its key appears,
    so each row counts its own updates (one extra slot) instead of using
    the global step; for a row updated every step this equals Keras Adam.
    """

    name = "adam"
    keras_name = "adam"


class Ftrl(SparseRule):
    """FTRL-proximal, row for row as Keras Ftrl (ResourceSparseApplyFtrlV2).

    Hyperparameters and defaults as Keras Ftrl's (`learning_rate_power`,
    `initial_accumulator_value`, the l1, l2 and l2-shrinkage
    regularization strengths, `beta`), and tnet's `start_reference_batch`
    (256 by default), as Adagrad's: a new row's accumulator starts at
    initial_accumulator_value * (256 / B)^2 at a batch of B examples
    (exactly Keras' start at batch 256); None keeps it fixed.
    """

    name = "ftrl"
    keras_name = "ftrl"
    row_defaults = {"start_reference_batch": START_REFERENCE_BATCH}


def get(identifier: "SparseRule | str | None") -> SparseRule:
    """Returns a rule from an instance, a name ('adagrad', ...) or None (SGD)."""
    if identifier is None:
        return SGD()
    if isinstance(identifier, SparseRule):
        return identifier
    if isinstance(identifier, str) and identifier.lower() in _BY_NAME:
        return _BY_NAME[identifier.lower()]()
    raise ValueError(
        f"unknown sparse optimizer {identifier!r}; use one of "
        f"{sorted(_BY_NAME)} or a tn.optimizer instance")
