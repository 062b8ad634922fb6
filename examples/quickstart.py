"""The quick start as a program: a subclassed ranking model on clicks it
makes up, trained, exported and served with stock TensorFlow.

    python examples/quickstart.py                 # 8,192 impressions, 3 epochs
    python examples/quickstart.py --rows 100000 --epochs 5

1,000 users; the users whose id is divisible by 3 click. The user id is an
int64 feature with a table of its own; the city is a string feature.

It ends by loading the export with `tf.saved_model.load` (as TF Serving
loads it: no tnet op in it) and checking that the served predictions equal
the trained model's, that clickers score above non-clickers, and that an
id never seen reads a zero row. It exits with status 1 if a check fails.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile

import numpy as np

import tnet as tn                 # import tnet before tensorflow: it selects Keras 2
import tensorflow as tf
from tnet import feature_column as fc


def clicks(rows: int, seed: int = 0):
    """`rows` impressions of 1,000 users in three cities."""
    rng = np.random.default_rng(seed)
    users = rng.permutation(np.arange(rows) % 1000)
    cities = rng.choice(["paris", "lima", "oslo"], rows)
    labels = (users % 3 == 0).astype("float32")
    return {"user_id": users, "city": cities}, labels


COLUMNS = [fc.embedding_column(fc.category_column("user_id"), 16),   # int64 ids
           fc.embedding_column(fc.category_column("city", dtype=tf.string), 4)]


class Ranker(tn.Model):
    """Embeddings of the user and the city, then an MLP: P(click)."""

    def __init__(self):
        super().__init__()
        self.embed = tn.layers.EmbeddingFeatures(COLUMNS)  # one fused lookup per table
        self.mlp = tf.keras.Sequential([tf.keras.layers.Dense(32, "relu"),
                                        tf.keras.layers.Dense(1, "sigmoid")])

    def call(self, features, training=False):
        return self.mlp(self.embed(features, training=training))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=8192)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--workdir", default=None,
                   help="where the export goes (default: a temporary dir)")
    a = p.parse_args(argv)
    work = a.workdir or tempfile.mkdtemp(prefix="tnet_quickstart_")

    tf.keras.utils.set_random_seed(0)
    features, labels = clicks(a.rows)
    data = tf.data.Dataset.from_tensor_slices((features, labels)).batch(256)
    model = Ranker()
    model.compile(tn.optimizer.Adagrad(0.5), loss="binary_crossentropy",
                  metrics=[tf.keras.metrics.AUC(name="auc")])
    model.fit(data, epochs=a.epochs, verbose=2)
    print("rows in the user table:", int(model.embed.tables["user_id"].size()))

    export = f"{work}/export/1"          # TF Serving's <base>/<version>
    shutil.rmtree(export, ignore_errors=True)
    tn.serving.export_for_serving(model, export)

    # Serve it: stock TensorFlow, the model's inputs by name.
    serve = tf.saved_model.load(export).signatures["serving_default"]
    probe = {"user_id": np.array([3, 4, 300, 301, 123456789], np.int64),
             "city": np.array(["paris", "oslo", "lima", "lima", "new"])}
    served = serve(user_id=tf.constant(probe["user_id"]),
                   city=tf.constant(probe["city"]))["prediction"].numpy()
    trained = model.predict(probe, verbose=0)
    print("served: ", served.ravel().round(4))
    print("trained:", trained.ravel().round(4))

    failed = []
    if not np.allclose(served, trained, atol=1e-5):
        failed.append("the export does not predict what the model predicts")
    if not (served[0] > served[1] and served[2] > served[3]):
        failed.append("clickers (3, 300) do not score above others (4, 301)")
    unseen = model.embed({"user_id": tf.constant([123456789], tf.int64),
                          "city": tf.constant(["new"])})
    if np.any(unseen.numpy() != 0):
        failed.append("an id never seen does not read a zero row")
    for f in failed:
        print("FAILED:", f)
    if not failed:
        print("OK: the served model predicts what the trained model predicts")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
