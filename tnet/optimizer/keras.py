"""tnet optimizers: one object for the dense variables and the tables.

Each class is the `tf_keras` optimizer of the same name for dense variables
and carries `sparse_rule`, the matching in-table rule with the same
hyperparameters. `tn.Model` applies the dense half with Keras and pushes the
embedding gradients to the tables, which run the sparse half on the ps; both
use the optimizer's current learning rate (schedules included) and step.
"""
from __future__ import annotations

import tf_keras

from tnet.optimizer import sparse


_BY_RULE: dict[str, type] = {}


class _TnetOptimizer:
    """Registers each tnet Keras optimizer under its in-table rule's name."""

    sparse_rule: sparse.SparseRule
    rule_class: type = sparse.SparseRule

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "rule_class" in cls.__dict__:
            _BY_RULE[cls.rule_class.name] = cls

    def _attach_rule(self, learning_rate, **row_hparams):
        """sparse_rule: rule_class with this optimizer's hyperparameters;
        `row_hparams` (not None) override them for the table rows."""
        config = dict(self.get_config())
        config.update({k: v for k, v in row_hparams.items()
                       if v is not None and v is not _UNSET})
        # _UNSET: not chosen, so the rule's row default (not Keras' value
        # in the config, which is the dense variables').
        for k in [k for k, v in row_hparams.items() if v is _UNSET]:
            config.pop(k, None)
        # A hyperparameter Keras' optimizer lacks (tnet's own, rows only)
        # keeps the rule's default unless given in row_hparams.
        self.sparse_rule = self.rule_class(
            _float_or_schedule(learning_rate),
            **{k: config[k] for k in self.rule_class.hparams()
               if k in config})


# Marks an argument the caller did not pass.
_UNSET = object()


def _reference_batch(value):
    """start_reference_batch as _attach_rule takes it: _UNSET (the rule's
    default, 256), or the caller's value with None (off) as 0."""
    if value is _UNSET:
        return _UNSET
    return 0 if value is None else value


def _rule_reference_batch(optimizer, config):
    """Adds the rows' start_reference_batch (Keras has none) to a config."""
    rule = getattr(optimizer, "sparse_rule", None)
    if rule is not None and "start_reference_batch" in rule.hparams():
        config["start_reference_batch"] = rule.start_reference_batch
    return config


def _row_accumulator(initial_accumulator_value, row_initial_accumulator_value):
    """(dense start, rows' start) of an Adagrad accumulator.

    Not passing either: Keras' 0.1 for dense variables, and for table rows
    _UNSET: not chosen, so the rule's row default
    (sparse.ROW_INITIAL_ACCUMULATOR_VALUE, or a model's own for its layers,
    e.g. tn.models.DeepFM's). Passing `initial_accumulator_value` sets
    both, as in Keras; `row_initial_accumulator_value` sets the rows'
    alone, None their default (what get_config writes when it was not
    chosen).
    """
    dense = (sparse.KERAS_INITIAL_ACCUMULATOR_VALUE
             if initial_accumulator_value is _UNSET
             else initial_accumulator_value)
    if row_initial_accumulator_value is None:
        rows = _UNSET
    elif row_initial_accumulator_value is not _UNSET:
        rows = row_initial_accumulator_value
    else:
        rows = initial_accumulator_value
    return dense, rows


def by_name(name: str):
    """The tnet Keras optimizer class whose in-table rule is `name`.

    Args:
      name: a rule name: "sgd", "adagrad", "rowwise_adagrad", "adam", "ftrl".

    Example:
        ```python
        opt = tn.optimizer.by_name("adagrad")(0.05)     # tn.optimizer.Adagrad
        ```
    """
    if name not in _BY_RULE:
        raise ValueError(f"no tnet optimizer for rule {name!r}; use one of "
                         f"{names()}")
    return _BY_RULE[name]


def names() -> list[str]:
    """Rule names that have a tnet Keras optimizer (tnet.train's --optimizer).

    Example:
        ```python
        print(tn.optimizer.names())   # ['sgd', 'adagrad', 'rowwise_adagrad', 'adam', 'ftrl']
        ```
    """
    return list(_BY_RULE)


class SGD(tf_keras.optimizers.SGD, _TnetOptimizer):
    """Keras SGD for dense variables, SGD inside the tables.

    Args:
      learning_rate: for both (a float or a Keras schedule; the tables use
        the optimizer's current rate at each step).
      momentum: dense variables only (table rows keep no slot).
      nesterov: dense variables only.
      **kwargs: Keras optimizer arguments (`clipnorm`, ...).

    Example:
        ```python
        model.compile(tn.optimizer.SGD(0.1), loss="binary_crossentropy")
        ```
    """
    rule_class = sparse.SGD

    def __init__(self, learning_rate=0.01, momentum=0.0, nesterov=False,
                 **kwargs):
        super().__init__(learning_rate=learning_rate, momentum=momentum,
                         nesterov=nesterov, **kwargs)
        self._attach_rule(learning_rate)


class Adagrad(tf_keras.optimizers.Adagrad, _TnetOptimizer):
    """Keras Adagrad for dense variables, Adagrad inside the tables.

    Dense accumulators start at Keras' 0.1. Table rows start theirs at
    `row_initial_accumulator_value`, by default 1e-6
    (tn.optimizer.sparse.ROW_INITIAL_ACCUMULATOR_VALUE): from Keras' 0.1 a
    new row's first steps are small, and rare ids, most of a table, learn
    little in one pass (measured: BENCHMARKS.md "Defaults for one pass and
    early stopping"). A model may give its own layers' rows another
    default where the start is not chosen here: tn.models.DeepFM's rows
    start at 3e-3 (sparse.DEEPFM_ROW_INITIAL_ACCUMULATOR_VALUE). Passing
    `initial_accumulator_value` sets both, as in Keras;
    `row_initial_accumulator_value=0.1` gives Keras' behaviour back for
    the rows alone. A start given either way is kept in every model.

    Args:
      learning_rate: for both (a float or a Keras schedule).
      initial_accumulator_value: as in Keras; when given, it sets the
        table rows' start too.
      epsilon: as in Keras.
      row_initial_accumulator_value: the table rows' accumulator start
        alone (default, or None: 1e-6, DeepFM's rows 3e-3).
      accumulator_floor: table rows only: after each update of a row its
        accumulator is raised to at least this, so a row's first update
        starts from `row_initial_accumulator_value` and every later one
        from at least the floor (see tn.optimizer.sparse.Adagrad).
        Default (None): 0 (off), 3e-5 in tables of width-1 rows (a wide
        part's weights); 0 turns it off there too.
      start_reference_batch: table rows only (default 256): the batch
        size the rows' start is meant for. A row inserted by a step of B
        examples starts at row_initial_accumulator_value * (256 / B)^2, so
        the start acts the same at every batch size (a batch-mean loss
        makes gradients 1 / B as large). None: the start as given.
      **kwargs: Keras optimizer arguments (`clipnorm`, ...).

    Example:
        ```python
        model.compile(tn.optimizer.Adagrad(0.05), loss="binary_crossentropy")
        keras_rows = tn.optimizer.Adagrad(0.05, row_initial_accumulator_value=0.1)
        ```
    """

    rule_class = sparse.Adagrad

    def __init__(self, learning_rate=0.001, initial_accumulator_value=_UNSET,
                 epsilon=1e-7, row_initial_accumulator_value=_UNSET,
                 accumulator_floor=None, start_reference_batch=_UNSET,
                 **kwargs):
        dense, rows = _row_accumulator(initial_accumulator_value,
                                       row_initial_accumulator_value)
        super().__init__(learning_rate=learning_rate,
                         initial_accumulator_value=dense,
                         epsilon=epsilon, **kwargs)
        self._attach_rule(learning_rate, initial_accumulator_value=rows,
                          accumulator_floor=accumulator_floor,
                          start_reference_batch=_reference_batch(
                              start_reference_batch))
        # The rows' start (the row default when not chosen).
        self.row_initial_accumulator_value = (
            self.sparse_rule.initial_accumulator_value)
        self._rows_chosen = rows is not _UNSET

    def get_config(self):
        config = super().get_config()
        if hasattr(self, "row_initial_accumulator_value"):
            # None when not chosen: a model's own row default still applies
            # to the optimizer from_config makes.
            config["row_initial_accumulator_value"] = (
                self.row_initial_accumulator_value if self._rows_chosen
                else None)
        rule = getattr(self, "sparse_rule", None)
        if rule is not None:  # the rows' own setting (Keras has none);
            # None when not chosen: width-1 rows keep their own default.
            config["accumulator_floor"] = (
                rule.accumulator_floor
                if "accumulator_floor" in rule._chosen else None)  # noqa: SLF001
        return _rule_reference_batch(self, config)


class RowwiseAdagrad(Adagrad):
    """Adagrad for dense variables; one accumulator per row in tables
    (instead of one per weight: dim - 1 fewer floats per row).

    Takes Adagrad's arguments.

    Example:
        ```python
        model.compile(tn.optimizer.RowwiseAdagrad(0.05), loss="binary_crossentropy")
        ```

    Args:
      learning_rate: for both (a float or a Keras schedule).
      initial_accumulator_value: dense accumulators' start (Keras' 0.1).
      epsilon: as in Keras.
      row_initial_accumulator_value: table rows' start (see Adagrad).
      start_reference_batch: the batch the rows' start is meant for
        (see Adagrad; default 256).
      **kwargs: Keras optimizer arguments.
    """

    rule_class = sparse.RowwiseAdagrad


class Adam(tf_keras.optimizers.Adam, _TnetOptimizer):
    """Keras Adam for dense variables; in tables each row keeps its own
    update count for bias correction (see tn.optimizer.sparse.Adam).

    Args:
      learning_rate: for both (a float or a Keras schedule).
      *args: tf_keras.optimizers.Adam's other arguments, in its order.
      **kwargs: tf_keras.optimizers.Adam's arguments by name; its
        hyperparameters (`beta_1`, `beta_2`, `epsilon`) apply to both, the
        others (`amsgrad`, `clipnorm`, ...) to dense variables.

    Example:
        ```python
        model.compile(tn.optimizer.Adam(1e-3), loss="binary_crossentropy")
        ```
    """

    rule_class = sparse.Adam

    def __init__(self, learning_rate=0.001, *args, **kwargs):
        super().__init__(learning_rate, *args, **kwargs)
        self._attach_rule(learning_rate)


class Ftrl(tf_keras.optimizers.Ftrl, _TnetOptimizer):
    """Keras FTRL for dense variables, FTRL inside the tables (the classic
    rule for sparse linear models; `tn.layers.LinearFeatures` uses it by
    default).

    Args:
      learning_rate: for both.
      *args: tf_keras.optimizers.Ftrl's other arguments, in its order.
      **kwargs: tf_keras.optimizers.Ftrl's arguments by name; its
        hyperparameters (`learning_rate_power`,
        `initial_accumulator_value`, the l1, l2 and l2-shrinkage
        regularization strengths, `beta`) apply to both;
        `start_reference_batch` (table rows only, default 256) makes a
        new row's accumulator start initial_accumulator_value *
        (256 / B)^2 at a batch of B examples (Keras' start at batch 256;
        None: fixed).

    Example:
        ```python
        wide = tn.layers.LinearFeatures(columns, optimizer=tn.optimizer.Ftrl(0.2))
        ```
    """
    rule_class = sparse.Ftrl

    def __init__(self, learning_rate=0.001, *args, **kwargs):
        reference = _reference_batch(
            kwargs.pop("start_reference_batch", _UNSET))
        super().__init__(learning_rate, *args, **kwargs)
        self._attach_rule(learning_rate, start_reference_batch=reference)

    def get_config(self):
        return _rule_reference_batch(self, super().get_config())


def _float_or_schedule(learning_rate):
    if callable(learning_rate):
        return learning_rate
    return float(learning_rate)


def sparse_rule_of(optimizer) -> sparse.SparseRule:
    """The in-table rule for a tnet optimizer, a rule, a name, or a stock
    tf_keras optimizer (mapped by type with its hyperparameters).

    Args:
      optimizer: a tnet optimizer, a `tn.optimizer.sparse` rule, a rule name,
        or a stock `tf_keras` optimizer.

    Returns:
      A `tn.optimizer.sparse.SparseRule`.

    Example:
        ```python
        rule = tn.optimizer.sparse_rule_of(tf.keras.optimizers.Adagrad(0.05))
        print(type(rule).__name__)     # Adagrad: the in-table rule it maps to
        ```
    """
    if optimizer is None or isinstance(optimizer, (str, sparse.SparseRule)):
        return sparse.get(optimizer)
    rule = getattr(optimizer, "sparse_rule", None)
    if isinstance(rule, sparse.SparseRule):
        return rule
    if isinstance(optimizer, tf_keras.optimizers.Optimizer):
        rule = sparse.by_keras_name(type(optimizer).__name__.lower())
        if rule is not None:
            lr = float(tf_keras.backend.get_value(optimizer.learning_rate))
            return rule.from_keras_config(lr, optimizer.get_config())
    raise ValueError(
        f"no in-table rule for optimizer {optimizer!r}: use tn.optimizer.SGD, "
        "Adagrad, RowwiseAdagrad, Adam or Ftrl (or stock tf_keras SGD, "
        "Adagrad, Adam, Ftrl), or give the tnet layers their own optimizer")
