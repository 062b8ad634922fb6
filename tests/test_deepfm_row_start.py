"""tn.models.DeepFM's own row start: its embedding rows start their
Adagrad accumulators at sparse.DEEPFM_ROW_INITIAL_ACCUMULATOR_VALUE where
the compiled optimizer leaves the rows' start at tnet's default; a start
the user gives is kept, the users' own models and WideDeep keep the
shared default, and a checkpoint written with another start restores
unchanged (the start is read only when a row is inserted).

Why the value: BENCHMARKS.md "Defaults", DeepFM; its one-pass gain on the
real Criteo rows is tests/test_defaults_one_pass.py's.
"""
from __future__ import annotations

import logging

import numpy as np
import pytest

import tnet as tn  # noqa: I001  (before tensorflow: selects tf_keras)
import tensorflow as tf
import tf_keras

from tests.programs.ckpt_train import CATS
from tests.support.ckpt import (assert_same_tables, dataset, quiet,
                                snapshot)
from tnet.optimizer import sparse

DEEPFM_START = sparse.DEEPFM_ROW_INITIAL_ACCUMULATOR_VALUE
SHARED_START = sparse.ROW_INITIAL_ACCUMULATOR_VALUE


def _deepfm(optimizer=None):
    model = tn.models.DeepFM(CATS, ["d0"], embedding_dim=4, hidden_units=[8])
    model.compile(optimizer or tn.optimizer.Adagrad(0.05))
    return model


def _new_row_start(layer, key=987_654_321):
    """The accumulator a row of `layer`'s table starts with: inserted by a
    pull (no batch size, so the start unscaled), read back."""
    (table,) = layer.tables.values() if layer.tables else (None,)
    if table is None:
        layer._create_tables()  # noqa: SLF001
        (table,) = layer.tables.values()
    keys = tf.constant([key], tf.int64)
    table.pull(keys, training=True)
    found_keys, _, slots, _ = (np.asarray(t) for t in table.export())
    return slots[list(found_keys).index(key)]


def test_deepfm_rows_start_at_their_own_default():
    assert SHARED_START == 1e-6 and DEEPFM_START == 3e-3
    model = _deepfm()
    np.testing.assert_allclose(_new_row_start(model.embeddings),
                               [DEEPFM_START] * 4, rtol=1e-6)
    # The first-order term keeps its own FTRL; the dense part Keras' 0.1.
    assert model.first_order._rule.initial_accumulator_value == (
        sparse.WIDE_FTRL_INITIAL_ACCUMULATOR_VALUE)
    assert model.optimizer.get_config()["initial_accumulator_value"] == 0.1
    # Also before compile (tables built first are created with it) and
    # under row-wise Adagrad and stock Keras Adagrad at Keras' start.
    uncompiled = tn.models.DeepFM(CATS, ["d0"], embedding_dim=4,
                                  hidden_units=[8])
    np.testing.assert_allclose(_new_row_start(uncompiled.embeddings),
                               [DEEPFM_START] * 4, rtol=1e-6)
    for opt in (tn.optimizer.RowwiseAdagrad(0.05),
                tf_keras.optimizers.Adagrad(0.05),
                tn.optimizer.Adagrad.from_config(
                    tn.optimizer.Adagrad(0.05).get_config())):
        rule = _deepfm(opt).embeddings._rule  # noqa: SLF001
        assert rule.initial_accumulator_value == DEEPFM_START, opt


@pytest.mark.parametrize("optimizer, start", [
    (lambda: tn.optimizer.Adagrad(
        0.05, row_initial_accumulator_value=1e-6), 1e-6),
    (lambda: tn.optimizer.Adagrad(
        0.05, row_initial_accumulator_value=0.1), 0.1),
    (lambda: tn.optimizer.Adagrad(0.05, initial_accumulator_value=0.3), 0.3),
    (lambda: tn.optimizer.Adagrad.from_config(tn.optimizer.Adagrad(
        0.05, row_initial_accumulator_value=1e-6).get_config()), 1e-6),
    (lambda: tf_keras.optimizers.Adagrad(
        0.05, initial_accumulator_value=0.3), 0.3),
    # FTRL keeps Keras' start (DeepFM's default is for Adagrad's rows).
    (lambda: tn.optimizer.Ftrl(0.05), 0.1),
])
def test_a_start_the_user_gives_wins(optimizer, start):
    model = _deepfm(optimizer())
    rule = model.embeddings._rule  # noqa: SLF001
    assert rule.initial_accumulator_value == pytest.approx(start)
    got = _new_row_start(model.embeddings)
    np.testing.assert_allclose(got[:4] if got.size > 4 else got,
                               [start] * min(got.size, 4), rtol=1e-6)


def test_other_models_keep_the_shared_row_default():
    wide_deep = tn.models.WideDeep(CATS, ["d0"], embedding_dim=4,
                                   hidden_units=[8])
    wide_deep.compile(tn.optimizer.Adagrad(0.05))
    np.testing.assert_allclose(_new_row_start(wide_deep.embeddings),
                               [SHARED_START] * 4, rtol=1e-6)
    layer = tn.layers.EmbeddingFeatures(
        [tn.feature_column.embedding_column(
            tn.feature_column.category_column("c0"), 4)])
    layer.attach_model_optimizer(tn.optimizer.Adagrad(0.05))
    np.testing.assert_allclose(_new_row_start(layer), [SHARED_START] * 4,
                               rtol=1e-6)


def test_checkpoint_with_the_shared_start_restores_unchanged(tmp_path,
                                                             caplog):
    """A DeepFM checkpoint whose rows started at 1e-6 (what DeepFM wrote
    before it had a start of its own) restores into today's DeepFM
    bit for bit with no warning; rows inserted afterwards start at
    DeepFM's start."""
    old = _deepfm(tn.optimizer.Adagrad(
        0.05, row_initial_accumulator_value=SHARED_START))
    old.fit(dataset(256, 0), verbose=0)
    tn.saving.save(old, tmp_path, progress=quiet)
    caplog.set_level(logging.INFO)
    restored = _deepfm()
    tn.saving.restore(restored, tmp_path, progress=quiet)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING
                and "optimizer attrs" in r.getMessage()]
    assert [r for r in caplog.records if "rows inserted from now on"
            in r.getMessage()]
    assert_same_tables(snapshot(old), snapshot(restored))
    np.testing.assert_allclose(_new_row_start(restored.embeddings),
                               [DEEPFM_START] * 4, rtol=1e-6)
    # A difference in the update itself still warns.
    other = _deepfm(tn.optimizer.Adagrad(0.05, epsilon=1e-3))
    tn.saving.restore(other, tmp_path, progress=quiet)
    assert [r for r in caplog.records if "optimizer attrs" in r.getMessage()
            and "differ" in r.getMessage()]
