"""Chief program for tests/test_batch_start.py's cluster test: one step of
BATCH examples (two ragged ids each, all distinct) under the cluster's
ParameterServerStrategy; every row's accumulator must start from the
start scaled for the worker's batch (examples, not ids). Prints one JSON
line starting with BATCH_START."""
import json

import numpy as np

import tnet as tn
import tensorflow as tf
import tf_keras

from tnet import feature_column as fc

BATCH, START, LR = 1024, 1e-3, 0.1


class Sum(tn.Model):
    def __init__(self):
        super().__init__()
        self.ids = tn.layers.EmbeddingFeatures(
            [fc.embedding_column(fc.category_column("ids"), 1,
                                 combiner="sum", initializer="zeros")])
        self.bias = tf.Variable(0.0)

    def call(self, features, training=False):
        return self.ids(features, training=training) + self.bias


def batches(_ctx):
    first = np.arange(BATCH, dtype=np.int64) * 2
    ids = tf.RaggedTensor.from_tensor(np.stack([first, first + 1], 1))
    return tf.data.Dataset.from_tensors(
        ({"ids": ids}, tf.ones([BATCH, 1]))).repeat()


strategy = tn.distribute.ParameterServerStrategy()
with strategy.scope():
    model = Sum()
    model.compile(tn.optimizer.Adagrad(LR, row_initial_accumulator_value=START),
                  loss="mse")
model.fit(tf_keras.utils.experimental.DatasetCreator(batches), epochs=1,
          steps_per_epoch=1, verbose=0)
(table,) = model.tables().values()
keys, weights, slots, _ = (t.numpy() for t in table.export())
f32 = np.float32
g = f32(-2.0) / f32(BATCH)
acc = f32(f32(START) * f32((256 / BATCH) ** 2)) + g * g
w = -f32(LR) * g / (np.sqrt(acc) + f32(1e-7))
print("BATCH_START " + json.dumps({
    "rows": int(len(keys)), "shards": table.num_shards,
    "acc_rel_err": float(np.max(np.abs(slots[:, 0] / acc - 1))),
    "w_rel_err": float(np.max(np.abs(weights[:, 0] / w - 1)))}), flush=True)
