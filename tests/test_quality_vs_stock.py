"""User-written models with tnet defaults against the stock tf_keras model
a competent user writes instead (ids reduced with floormod, Keras
defaults), same data, same optimizer, same seeds: tnet's mean hold-out AUC
over 3 seeds must be at least stock's - 0.002.

- Criteo: real rows from ../shared/data (train on train_extra_nonhead.tsv +
  8,000 dev rows, score the other 1,999 dev rows).
- Multi-valued: SparseTensor (VarLen) inputs on generated data whose label
  follows a known logistic model of the ids.

The models and data are tests/programs/user_models.py; the defaults were
chosen with tools/measure_defaults.py (BENCHMARKS.md "Defaults").

The table rows' Adagrad accumulator default (1e-6, not Keras' 0.1) must
keep its gain: on the multi-valued model (rare ids, as in most tables) the
default must beat the same model with Keras' 0.1 for the rows by
ROW_ACCUMULATOR_GAIN (measured: BENCHMARKS.md "Defaults: the row
accumulator").
"""
from __future__ import annotations

import functools
import statistics

import pytest

from tests.conftest import SHARED_DATA, data_file
from tests.programs import user_models

SEEDS = (0, 1, 2)
MARGIN = 0.002
# Half the gain measured at the former default 0.03 (+0.0082 mean, +0.0075
# to +0.0088 per seed, BENCHMARKS.md); the default 1e-6 gains far more
# (+0.07 at 2 epochs), and tests/test_defaults_one_pass.py holds its gain
# over 0.03 in one pass.
ROW_ACCUMULATOR_GAIN = 0.004


@functools.lru_cache(maxsize=None)
def _auc(case, side, seed, kind, accumulator=None):
    """One run's hold-out AUC (cached: tests share the default's runs)."""
    return user_models.run(case, side, seed, kind, data_dir=SHARED_DATA,
                           accumulator=accumulator)


# Three seeds a side, two epochs: minutes each, so all of this file is
# `make test-long`. `make test` keeps the same promises in one pass, one
# seed: tests/test_defaults_one_pass.py's
# test_criteo_one_pass_defaults_at_least_stock and
# test_multi_valued_one_pass_defaults_at_least_stock (tnet's defaults >=
# stock, Adagrad, on both data kinds) and
# test_multi_valued_one_pass_default_beats_former_default (the row
# accumulator default's gain over a former start).
pytestmark = pytest.mark.long


@pytest.mark.parametrize("case,kind", [
    ("criteo", "adagrad"),
    ("multi_valued", "adagrad"),
    ("criteo", "adam"),
    ("multi_valued", "adam"),
])
def test_user_model_with_defaults_at_least_stock(case, kind):
    if case == "criteo":
        data_file("criteo/dev_head10k.tsv")
        data_file("criteo/train_extra_nonhead.tsv")
    runs = {side: [_auc(case, side, seed, kind) for seed in SEEDS]
            for side in ("tnet", "stock")}
    tnet, stock = (statistics.fmean(runs[s]) for s in ("tnet", "stock"))
    print(f"{case} {kind}: tnet AUC {tnet:.4f} {runs['tnet']}, stock "
          f"{stock:.4f} {runs['stock']}")
    assert tnet >= stock - MARGIN, runs
    assert tnet > 0.6, runs   # both learned something


def test_row_accumulator_default_beats_keras_start():
    """tnet's default rows (Adagrad accumulator from 1e-6) against the same
    model with Keras' 0.1 for the rows (row_initial_accumulator_value=0.1),
    multi-valued model, 3 seeds: the mean gain must
    stay >= ROW_ACCUMULATOR_GAIN and every seed must gain."""
    new = [_auc("multi_valued", "tnet", seed, "adagrad") for seed in SEEDS]
    old = [_auc("multi_valued", "tnet", seed, "adagrad", 0.1)
           for seed in SEEDS]
    print(f"multi_valued adagrad: rows at the default {new}, from 0.1 {old}")
    assert statistics.fmean(new) >= statistics.fmean(old) + \
        ROW_ACCUMULATOR_GAIN, (new, old)
    assert all(n > o for n, o in zip(new, old)), (new, old)
