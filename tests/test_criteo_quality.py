"""Wide&Deep on real Criteo rows: tnet against the same architecture in
stock tf_keras with hashed Embedding layers, both trained in this test
(2 epochs, 400-400-400, Adam; `make test-long`: the stock side's dense
Adam over 26 x 65536 hashed rows is ~16 s of CPU). In `make test`:
tnet's defaults >= stock on these rows in one pass
(test_defaults_one_pass.py), evaluate_exact counting every example and
growing no table on unseen rows (test_byod.py
test_model_reports_calibration_and_gauc)."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import tnet as tn
from tests.conftest import data_file
from tnet import data as tn_data
from tnet.data.metrics import auc
from tnet.models import WideDeep
from tnet.models.stock import stock_wide_deep

TRAIN_ROWS, BATCH, EPOCHS, LR = 8000, 256, 2, 1e-3
HIDDEN = (400, 400, 400)


def _data(path):
    train = tn_data.criteo_dataset(path, BATCH, take=TRAIN_ROWS,
                                   shuffle_buffer=10_000, seed=0)
    evals = tn_data.criteo_dataset(path, 1024, skip=TRAIN_ROWS)
    return train, evals


def _stock_auc(train, evals):
    tf_keras.utils.set_random_seed(0)
    model = stock_wide_deep(tn_data.CRITEO_CAT_COLUMNS,
                            tn_data.CRITEO_INT_COLUMNS, num_bins=2**16,
                            hidden_units=HIDDEN)
    model.compile(tf_keras.optimizers.Adam(LR),
                  tf_keras.losses.BinaryCrossentropy(from_logits=True))
    model.fit(train, epochs=EPOCHS, verbose=0)
    labels, scores = [], []
    for features, y in evals:
        scores.append(model(features, training=False).numpy().reshape(-1))
        labels.append(y.numpy())
    return auc(np.concatenate(labels), np.concatenate(scores))


@pytest.mark.long
def test_wide_deep_auc_at_least_stock_hashed_minus_001():
    path = data_file("criteo/dev_head10k.tsv")
    train, evals = _data(path)
    tf_keras.utils.set_random_seed(0)
    model = WideDeep(tn_data.CRITEO_CAT_COLUMNS, tn_data.CRITEO_INT_COLUMNS,
                     hidden_units=HIDDEN)
    model.compile(tn.optimizer.Adam(LR))
    model.fit(train, epochs=EPOCHS, verbose=0)
    sizes = {n: int(t.size()) for n, t in model.tables().items()}
    ours = model.evaluate_exact(evals)
    assert ours["examples"] == 1999
    # Evaluation pulled in inference mode: no new rows for unseen ids.
    assert {n: int(t.size()) for n, t in model.tables().items()} == sizes
    stock = _stock_auc(train, evals)
    print(f"Criteo dev rows 8000/1999: tnet AUC {ours['auc']:.4f}, stock "
          f"hashed AUC {stock:.4f}")
    assert ours["auc"] >= stock - 0.01, (ours, stock)
    assert ours["auc"] > 0.70
