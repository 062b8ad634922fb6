"""Chief of tests/test_fresh.py's 2-ps test: an updatable export trained
under ParameterServerStrategy, deltas published by tn.callbacks.PublishDeltas
at each epoch end, applied by the follower to the export loaded in this
process; after each apply the served predictions must equal the model's on
a probe set. Prints FRESH_PSS epoch=N version=V diff=D per epoch and
FRESH_PSS_DONE."""
import sys

import numpy as np

import tnet as tn
import tensorflow as tf
import tensorflow_recommenders as tfrs
import tf_keras

from tnet import feature_column as fc
from tnet.serving import follow


class Ranker(tn.Model):
    def __init__(self):
        super().__init__()
        user = fc.category_column("user_id")
        city = fc.category_column("city", dtype=tf.string)
        self.embed = tn.layers.EmbeddingFeatures(
            [fc.embedding_column(user, 8), fc.embedding_column(city, 8)])
        self.mlp = tf_keras.Sequential([tf_keras.layers.Dense(16, "relu"),
                                        tf_keras.layers.Dense(1)])
        self.task = tfrs.tasks.Ranking(
            loss=tf_keras.losses.BinaryCrossentropy(from_logits=True))

    def call(self, features, training=False):
        return self.mlp(self.embed(features, training=training))

    def compute_loss(self, inputs, training=False):
        features, labels = inputs
        return self.task(labels=labels, predictions=self(features, training))


def data(seed, n, hi):
    rng = np.random.default_rng(seed)
    feats = {"user_id": rng.integers(0, hi, n).astype(np.int64),
             "city": np.array([f"c{v}".encode() for v in
                               rng.integers(0, 30, n)], dtype=object)}
    return feats, (rng.random(n) < 0.3).astype(np.float32)


class Check(tf_keras.callbacks.Callback):
    def __init__(self, follower, loaded, probe):
        super().__init__()
        self.follower, self.loaded, self.probe = follower, loaded, probe

    def on_epoch_end(self, epoch, logs=None):
        version = list(self.follower.step().values())[0]
        served = self.loaded.signatures["serving_default"](
            **{k: tf.constant(v) for k, v in self.probe.items()})
        got = served["prediction"].numpy().reshape(-1)
        want = self.model({k: tf.constant(v) for k, v in self.probe.items()},
                          training=False).numpy().reshape(-1)
        print(f"FRESH_PSS epoch={epoch} version={version} "
              f"diff={float(np.max(np.abs(got - want))):.3e}", flush=True)


def fit(model, strategy, seed, hi, epochs, callbacks):
    feats, labels = data(seed, 512, hi)

    def dataset_fn(ctx):
        return tf.data.Dataset.from_tensor_slices((feats, labels)).repeat(
        ).batch(32)
    model.fit(tf_keras.utils.experimental.DatasetCreator(dataset_fn),
              epochs=epochs, steps_per_epoch=4, callbacks=callbacks,
              verbose=0)


def main():
    export = sys.argv[1]
    tf_keras.utils.set_random_seed(0)
    strategy = tn.distribute.ParameterServerStrategy()
    assert tn.distribute.is_parameter_server_strategy(strategy)
    with strategy.scope():
        model = Ranker()
        model.compile(tn.optimizer.Adagrad(0.1))
    fit(model, strategy, 0, 100, 1, [])
    tn.serving.export_for_serving(model, export, updatable=True)
    loaded = tf.saved_model.load(export)
    follower = follow.Follower(export, [follow.InProcessTarget(loaded)],
                               say=lambda m: None)
    probe = {"user_id": np.arange(0, 300, 3, dtype=np.int64),
             "city": np.array([f"c{i % 33}".encode() for i in range(100)],
                              dtype=object)}
    fit(model, strategy, 1, 300, 3,
        [tn.callbacks.PublishDeltas(export, every_n_steps=4, compact_at=None,
                                    at_train_end=False),
         Check(follower, loaded, probe)])
    print("FRESH_PSS_DONE", flush=True)


if __name__ == "__main__":
    main()
