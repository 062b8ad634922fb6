"""tnet's defaults in one pass over the data (every example seen once, as
a stream or the daily loop trains), against the stock tf_keras model a
competent user writes (ids reduced with floormod, Keras' defaults) and
against tnet's former row default.

- Real Criteo rows, README-style Wide&Deep, and the multi-valued
  (TensorNet-style, SparseTensor ids) model on generated data: tnet at its
  defaults >= stock, same data, same optimizer (Adagrad), same seed.
- The multi-valued model, whose ids follow a power law (most rows rare):
  the default row start must beat the former default (rows from 0.03) by
  FORMER_DEFAULT_GAIN, so the gain cannot silently vanish.

The models and data are tests/programs/user_models.py; the defaults were
chosen with `tools/measure_defaults.py --one_pass` and `--early_stopping`
(BENCHMARKS.md "Defaults for one pass and early stopping").
"""
from __future__ import annotations

import functools

from tests.conftest import SHARED_DATA, data_file
from tests.programs import user_models

SEED = 0
FORMER_ROW_START = 0.03
# About half the gain measured on the multi-valued model in one pass, 3
# seeds: 1e-6 0.7337 against 0.03 0.6684, +0.0653 (+0.0639 to +0.0681 per
# seed; bench/results/measure_defaults-one_pass-user-2026-11-28.md).
FORMER_DEFAULT_GAIN = 0.03


@functools.lru_cache(maxsize=None)
def _one_pass_auc(case, side, accumulator=None):
    return user_models.run(case, side, SEED, "adagrad", epochs=1,
                           data_dir=SHARED_DATA, accumulator=accumulator)


def test_criteo_one_pass_defaults_at_least_stock():
    data_file("criteo/dev_head10k.tsv")
    data_file("criteo/train_extra_nonhead.tsv")
    tnet, stock = (_one_pass_auc("criteo", s) for s in ("tnet", "stock"))
    print(f"criteo, one pass: tnet defaults {tnet:.4f}, stock {stock:.4f}")
    assert tnet >= stock, (tnet, stock)


def test_multi_valued_one_pass_defaults_at_least_stock():
    tnet, stock = (_one_pass_auc("multi_valued", s)
                   for s in ("tnet", "stock"))
    print(f"multi_valued, one pass: tnet defaults {tnet:.4f}, "
          f"stock {stock:.4f}")
    assert tnet >= stock, (tnet, stock)


def test_multi_valued_one_pass_default_beats_former_default():
    new = _one_pass_auc("multi_valued", "tnet")
    old = _one_pass_auc("multi_valued", "tnet", FORMER_ROW_START)
    print(f"multi_valued, one pass: rows at the default {new:.4f}, "
          f"from {FORMER_ROW_START} {old:.4f}")
    assert new >= old + FORMER_DEFAULT_GAIN, (new, old)
