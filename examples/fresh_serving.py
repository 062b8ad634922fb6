"""Fresh models in serving: an updatable export, deltas published while
training goes on, and the follower applying them to a served model.

    python examples/fresh_serving.py                  # 3 rounds of 1,024 clicks
    python examples/fresh_serving.py --rounds 10 --rows 100000
    python examples/fresh_serving.py --target grpc://localhost:8500/ranker

What happens, as in production:

1. train a ranker, export it once with `updatable=True` (the base, with its
   update key written beside it, `<workdir>/models/ranker.update_key`);
2. load the base with stock TensorFlow, as TF Serving does;
3. each round trains on more clicks (new users appear),
   `tn.callbacks.PublishDeltas` publishes the changed rows and dense
   weights as `deltas/delta-00000N`, and `tnet.serving.follow.Follower`
   applies them to the served model (in this process; with `--target`, also
   to a TF Serving that serves `<workdir>/models/ranker`), the same
   follower `python -m tnet.serving.follow` runs.

After every round it checks that the served model predicts what the
trainer predicts, that it reports the round's delta as its
`serving_version`, and that a user the base never saw is served a new
prediction. Exit status 1 if a check fails.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

import numpy as np

import tnet as tn                 # before tensorflow: it selects Keras 2
import tensorflow as tf
from tnet import feature_column as fc
from tnet.serving import follow


class Ranker(tn.Model):
    def __init__(self):
        super().__init__()
        self.embed = tn.layers.EmbeddingFeatures(
            [fc.embedding_column(fc.category_column("user_id"), 8),
             fc.embedding_column(fc.category_column("ad", tf.string), 4)])
        self.mlp = tf.keras.Sequential([tf.keras.layers.Dense(16, "relu"),
                                        tf.keras.layers.Dense(1, "sigmoid")])

    def call(self, features, training=False):
        return self.mlp(self.embed(features, training=training))


def clicks(round_: int, rows: int):
    """Round r has users 0..100(r+1)-1: every round brings new users."""
    rng = np.random.default_rng(round_)
    users = rng.integers(0, 100 * (round_ + 1), rows)
    ads = rng.choice(["shoes", "cars", "tea"], rows)
    label = ((users % 3 == 0) | (ads == "tea")).astype("float32")
    return {"user_id": users, "ad": ads}, label


def batches(round_: int, rows: int):
    return tf.data.Dataset.from_tensor_slices(clicks(round_, rows)).batch(64)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rows", type=int, default=1024, help="clicks per round")
    p.add_argument("--target", action="append", default=[],
                   help="also follow this TF Serving model "
                        "(grpc://HOST:PORT/MODEL), serving <workdir>/models/ranker")
    p.add_argument("--workdir", default=None,
                   help="where the export goes (default: a temporary dir)")
    a = p.parse_args(argv)
    work = a.workdir or tempfile.mkdtemp(prefix="tnet_fresh_")
    base_path = os.path.join(work, "models", "ranker")   # TF Serving's model base path
    shutil.rmtree(base_path, ignore_errors=True)

    tf.keras.utils.set_random_seed(0)
    model = Ranker()
    model.compile(tn.optimizer.Adagrad(0.1), loss="binary_crossentropy")
    model.fit(batches(0, a.rows), verbose=0)
    export = os.path.join(base_path, "1")
    tn.serving.export_for_serving(model, export, updatable=True)
    print("base exported:", export)

    served = tf.saved_model.load(export)       # what a replica loads
    serve = served.signatures["serving_default"]
    targets = [follow.InProcessTarget(served)]
    targets += [follow.parse_target(t) for t in a.target]
    follower = follow.Follower(export, targets)

    last_users = clicks(a.rounds, a.rows)[0]["user_id"]
    newcomer = int(last_users[last_users >= 100][0])   # not in the base
    probe = {"user_id": tf.constant([3, 4, newcomer], tf.int64),
             "ad": tf.constant(["cars", "cars", "shoes"])}
    first = serve(**probe)["prediction"].numpy().ravel()
    print("served by the base:", first.round(4))

    failed = []
    for r in range(1, a.rounds + 1):
        publish = tn.callbacks.PublishDeltas(export, every_n_steps=8,
                                             compact_at=None)
        model.fit(batches(r, a.rows), verbose=0, callbacks=[publish])
        versions = follower.step()           # one poll of the follower
        now = serve(**probe)["prediction"].numpy().ravel()
        trainer = model(probe).numpy().ravel()
        version, _ = follow.serving_version(targets[0])
        print(f"round {r}: {len(publish.published)} delta(s) published, "
              f"replica at delta {version}; served {now.round(4)}, "
              f"trainer {trainer.round(4)}")
        if not np.allclose(now, trainer, atol=1e-5):
            failed.append(f"round {r}: the served model is not the trainer's")
        if version != int(os.path.basename(publish.published[-1]).split("-")[-1]):
            failed.append(f"round {r}: serving_version {version} is not the "
                          f"newest delta {publish.published[-1]}")
        if any(v != version for v in versions.values()):
            failed.append(f"round {r}: targets at {versions}")
    # The newcomer's row exists only in the deltas: the served prediction
    # equals the trainer's above only if a delta carried it.
    row = model.embed({"user_id": tf.constant([newcomer], tf.int64),
                       "ad": tf.constant([""])})[:, :8]
    if not np.any(row.numpy() != 0) or np.isclose(now[2], first[2], atol=1e-6):
        failed.append(f"user {newcomer}, new since the base, has no row or "
                      "still gets the base's prediction")
    for f in failed:
        print("FAILED:", f)
    if not failed:
        print(f"OK: {a.rounds} round(s) of deltas reached the served model")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
