"""A TFRS-style ranking model: subclass `tn.Model` (it extends
`tfrs.models.Model`), build layers in `__init__`, write `compute_loss`.

    python examples/ranking_tfrs.py                    # 20,000 ratings
    python examples/ranking_tfrs.py --rows 500000 --epochs 3

Made-up (user, movie, genre) -> click data from a known logistic model of
the ids. The model embeds the user and the movie (a table each) and the
genre (a string feature), and trains on `tfrs.tasks.Ranking` with its AUC
metric; `evaluate` scores a held-out set without creating rows.

It ends by checkpointing with `tn.saving.save`, restoring into a new
model and checking that it predicts exactly what the trained one
predicts, and that the held-out AUC is above chance. Exit status 1 if a
check fails.
"""
from __future__ import annotations

import argparse
import sys
import tempfile

import numpy as np

import tnet as tn                 # before tensorflow: it selects Keras 2
import tensorflow as tf
import tensorflow_recommenders as tfrs
from tnet import feature_column as fc

USERS, MOVIES = 2000, 500
GENRES = np.array(["drama", "comedy", "horror", "sci-fi", "romance"])


def ratings(rows: int, seed: int):
    """(features, clicks): P(click) = sigmoid(user + movie + genre taste)."""
    truth = np.random.default_rng(1)                 # the same model always
    user_bias = truth.normal(0, 1.5, USERS)
    movie_bias = truth.normal(0, 1.5, MOVIES)
    movie_genre = truth.integers(0, len(GENRES), MOVIES)
    rng = np.random.default_rng(seed)
    users = rng.integers(0, USERS, rows)
    movies = np.minimum(rng.zipf(1.3, rows) - 1, MOVIES - 1)   # popular first
    logit = user_bias[users] + movie_bias[movies] - 0.5 * (movie_genre[movies] == 2)
    click = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype("float32")
    features = {"user_id": users.astype("int64"),
                "movie_id": movies.astype("int64"),
                "genre": GENRES[movie_genre[movies]]}
    return features, click


class RankingModel(tn.Model):
    def __init__(self, embedding_dim: int = 16):
        super().__init__()
        self.embed = tn.layers.EmbeddingFeatures([
            fc.embedding_column(fc.category_column("user_id"), embedding_dim),
            fc.embedding_column(fc.category_column("movie_id"), embedding_dim),
            fc.embedding_column(fc.category_column("genre", tf.string), 4)])
        self.mlp = tf.keras.Sequential([tf.keras.layers.Dense(64, "relu"),
                                        tf.keras.layers.Dense(32, "relu"),
                                        tf.keras.layers.Dense(1)])
        self.task = tfrs.tasks.Ranking(
            loss=tf.keras.losses.BinaryCrossentropy(from_logits=True),
            metrics=[tf.keras.metrics.AUC(from_logits=True, name="auc")])

    def call(self, features, training=False):
        """[B, 1] click logits from the feature dict."""
        return self.mlp(self.embed(features, training=training))

    def compute_loss(self, inputs, training=False):
        features, labels = inputs
        return self.task(labels=labels, predictions=self(features, training))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch_size", type=int, default=256)
    p.add_argument("--workdir", default=None,
                   help="where the checkpoint goes (default: a temporary dir)")
    a = p.parse_args(argv)
    work = a.workdir or tempfile.mkdtemp(prefix="tnet_ranking_")

    tf.keras.utils.set_random_seed(0)
    train = tf.data.Dataset.from_tensor_slices(ratings(a.rows, seed=0))
    held_out_features, held_out_clicks = ratings(max(a.rows // 5, 1000), seed=1)
    test = tf.data.Dataset.from_tensor_slices((held_out_features, held_out_clicks))

    model = RankingModel()
    model.compile(tn.optimizer.Adagrad(0.1))
    model.fit(train.shuffle(10_000, seed=0).batch(a.batch_size),
              epochs=a.epochs, verbose=2)
    metrics = model.evaluate(test.batch(1024), return_dict=True, verbose=0)
    print(f"held out: AUC {metrics['auc']:.4f}, loss {metrics['loss']:.4f}")

    # Checkpoint, restore into a new model, predict the same.
    path = tn.saving.save(model, f"{work}/checkpoints", step=a.epochs)
    restored = RankingModel()
    restored.compile(tn.optimizer.Adagrad(0.1))
    restored({k: v[:1] for k, v in held_out_features.items()})   # build it
    tn.saving.restore(restored, path)
    before = model.predict(held_out_features, batch_size=1024, verbose=0)
    after = restored.predict(held_out_features, batch_size=1024, verbose=0)

    failed = []
    if not np.array_equal(before, after):
        failed.append("the restored model does not predict what the trained "
                      f"one does (max difference {np.abs(before - after).max()})")
    if not metrics["auc"] > 0.6:
        failed.append(f"held-out AUC {metrics['auc']:.4f} is not above 0.6")
    for f in failed:
        print("FAILED:", f)
    if not failed:
        print(f"OK: {path} restores to the same predictions")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
