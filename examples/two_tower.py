"""Two-tower retrieval: a query tower (user, user features, recent
history) and a candidate tower (item, genres), every id in a tnet table,
trained with `tfrs.tasks.Retrieval` and exported with its candidates for
top-k serving.

    python examples/two_tower.py                      # MovieLens 100k if found
    python examples/two_tower.py --data_dir ~/ml-100k --epochs 10
    python examples/two_tower.py --generated          # made-up interactions

The MovieLens files (`ml-100k_ua.base`, `ml-100k_ua.test` and the RecBole
`.user` / `.item` files) are read from `--data_dir`, by default
`../shared/data/movielens` beside the checkout; without them the example
makes up interactions of users with a taste for a cluster of items.
`--train_rows` trains on the first N training interactions only (a quick
run).

It reports recall@10/50/100 of the held-out interactions among all items
beside a popularity baseline, exports a retrieval SavedModel
(`serving_default(user features, history) -> ids, scores`), serves it with
stock TensorFlow and checks that its top-k ids are the in-process top-k,
and that the model beats popularity at recall@100. Exit status 1 if a
check fails.
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
from tnet.data import movielens

DEFAULT_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                            "..", "..", "shared", "data", "movielens")


def generated(users: int = 600, items: int = 400, per_user: int = 30,
              history: int = 10, clusters: int = 8) -> movielens.MovieLens:
    """Users of cluster c watch mostly items of cluster c (item % clusters);
    each user's last 2 interactions are held out. Same layout as
    `tn.data.load_movielens`: histories left-aligned, -1 padded, built
    from earlier training interactions only."""
    rng = np.random.default_rng(0)
    item_ids = np.arange(items, dtype=np.int64)
    genres = np.array([[f"g{i % clusters}", f"g{(i * 7) % clusters}"]
                       for i in item_ids], dtype=object)
    by_cluster = [item_ids[item_ids % clusters == c] for c in range(clusters)]
    rows = {"train": [], "test": []}
    for u in range(users):
        own = by_cluster[u % clusters]
        watched = np.where(rng.random(per_user) < 0.8,
                           own[np.minimum(rng.zipf(1.5, per_user) - 1, len(own) - 1)],
                           rng.integers(0, items, per_user))
        for t, item in enumerate(watched):
            past = [i for i in watched[:min(t, per_user - 2)]][-history:]
            split = "test" if t >= per_user - 2 else "train"
            rows[split].append((u, item, past))
    counts = np.bincount([r[1] for r in rows["train"]], minlength=items)
    probs = (counts / counts.sum()).astype(np.float32)

    def examples(part):
        hist = np.full((len(part), history), -1, np.int64)
        for j, (_, _, past) in enumerate(part):
            hist[j, :len(past)] = past
        u = np.array([r[0] for r in part], np.int64)
        i = np.array([r[1] for r in part], np.int64)
        return {"user_id": u,
                "segment": np.array([f"s{x % clusters}" for x in u], dtype=object),
                "history": hist, "item_id": i, "genres": genres[i],
                "item_prob": probs[i]}

    return movielens.MovieLens(
        train=examples(rows["train"]), test=examples(rows["test"]),
        items={"item_id": item_ids, "genres": genres, "item_prob": probs},
        item_counts={int(i): int(c) for i, c in enumerate(counts) if c},
        history_max_length=history)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data_dir", default=DEFAULT_DATA)
    p.add_argument("--generated", action="store_true",
                   help="made-up interactions even if MovieLens is there")
    p.add_argument("--train_rows", type=int, default=0, help="0: all")
    p.add_argument("--test_rows", type=int, default=0, help="0: all")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--history", type=int, default=20)
    p.add_argument("--workdir", default=None,
                   help="where the export goes (default: a temporary dir)")
    a = p.parse_args(argv)
    work = a.workdir or tempfile.mkdtemp(prefix="tnet_two_tower_")

    real = not a.generated and os.path.exists(
        os.path.join(a.data_dir, movielens.BASE_FILE))
    if real:
        data = movielens.load_movielens(a.data_dir, a.history)
        user_features = movielens.USER_FEATURES
        print(f"MovieLens 100k from {os.path.abspath(a.data_dir)}")
    else:
        data = generated(history=min(a.history, 10))
        user_features = ("segment",)
        print("generated interactions (no MovieLens in --data_dir)")
    train, test = data.train, data.test
    if a.train_rows:
        train = {k: v[:a.train_rows] for k, v in train.items()}
    if a.test_rows:
        test = {k: v[:a.test_rows] for k, v in test.items()}
    print(f"{len(train['item_id']):,} training and {len(test['item_id']):,} "
          f"held-out interactions, {len(data.items['item_id']):,} items")

    tf.keras.utils.set_random_seed(0)
    model = tn.models.TwoTower(user_features=user_features,
                               history_max_length=data.history_max_length,
                               sampling_probability_key="item_prob",
                               embedding_dim=32, hidden_units=(64,))
    model.compile(tn.optimizer.Adagrad(0.1))
    model.fit(movielens.movielens_dataset(train, 512, shuffle_buffer=100_000,
                                          seed=0),
              epochs=a.epochs, verbose=2)
    recall = model.evaluate_exact(movielens.movielens_dataset(test, 1024),
                                  data.items)
    popular = movielens.popularity_recall(data.item_counts, test["item_id"])
    for k in model.ks:
        print(f"recall@{k}: {recall[f'recall_at_{k}']:.4f}  "
              f"(popularity {popular[f'recall_at_{k}']:.4f})")

    export = os.path.join(work, "export", "1")
    shutil.rmtree(export, ignore_errors=True)
    k = 10
    tn.serving.export_for_serving(model, export, candidates=data.items, k=k)
    serve = tf.saved_model.load(export).signatures["serving_default"]
    query = {n: test[n][:64] for n in model.serving_input_signature()}
    served = serve(**{n: tf.constant(v.astype("S") if v.dtype == object else v)
                      for n, v in query.items()})
    _, in_process = model.candidate_index(data.items)(
        model.query_embedding({n: tf.constant(v) for n, v in query.items()}), k=k)

    failed = []
    if not np.array_equal(served["ids"].numpy(), in_process.numpy()):
        failed.append("the export's top-k ids are not the in-process top-k")
    if not recall["recall_at_100"] > popular["recall_at_100"]:
        failed.append("recall@100 does not beat popularity")
    for f in failed:
        print("FAILED:", f)
    if not failed:
        print(f"OK: the export serves the in-process top-{k}; "
              "the model beats popularity")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
