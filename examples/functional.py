"""A functional `tn.Model` whose inputs take ids in every form Keras feeds.

    python examples/functional.py                   # 8,192 examples
    python examples/functional.py --rows 200000 --epochs 3

| input       | form                                  |
|-------------|---------------------------------------|
| `user_id`   | int64 `[B]`                           |
| `item_id`   | int64 `[B, 1]`                        |
| `tags`      | strings `[B, L]` padded with ""       |
| `history`   | int64 `tf.RaggedTensor`               |
| `category`  | int64 `tf.SparseTensor`               |
| `price`     | a dense float `[B, 1]`                |

Every id feature goes through one `tn.layers.EmbeddingFeatures`; `user_id`
and `history` share the "items" table with `item_id` (the column is mixed
into the key, so the same id in two columns is two rows).

It ends by exporting the model and serving it with stock TensorFlow: the
ragged and sparse inputs are served as dense `[B, L]` tensors padded with
-1 (`export_info.json` says which), and the served predictions must equal
the trained model's. Exit status 1 if they do not.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np

import tnet as tn                 # before tensorflow: it selects Keras 2
import tensorflow as tf
from tnet import feature_column as fc

TAGS = np.array(["new", "sale", "eco", "kids", "gift", ""])


def examples(rows: int, seed: int = 0):
    """A dict of every id form, and labels from a known rule of the ids."""
    rng = np.random.default_rng(seed)
    users = rng.integers(0, 3000, rows)
    items = rng.integers(0, 800, rows)
    tags = TAGS[rng.integers(0, len(TAGS), (rows, 3))]       # "" is padding
    lengths = rng.integers(0, 6, rows)                       # 0: no history
    history = tf.RaggedTensor.from_row_lengths(
        rng.integers(0, 800, lengths.sum()), lengths)
    cat_len = rng.integers(1, 3, rows)
    rows_idx = np.repeat(np.arange(rows), cat_len)
    cols_idx = np.concatenate([np.arange(n) for n in cat_len])
    category = tf.SparseTensor(np.stack([rows_idx, cols_idx], 1),
                               rng.integers(0, 40, cat_len.sum()), [rows, 2])
    price = rng.random((rows, 1)).astype("float32")
    label = ((users % 4 == 0) | (items % 5 == 0)
             | (tags == "sale").any(axis=1)).astype("float32")
    features = {"user_id": users, "item_id": items[:, None], "tags": tags,
                "history": history, "category": category, "price": price}
    return features, label


def build_model() -> tn.Model:
    inputs = {
        "user_id": tf.keras.Input(shape=(), dtype=tf.int64, name="user_id"),
        "item_id": tf.keras.Input(shape=(1,), dtype=tf.int64, name="item_id"),
        "tags": tf.keras.Input(shape=(None,), dtype=tf.string, name="tags"),
        "history": tf.keras.Input(shape=(None,), dtype=tf.int64,
                                  ragged=True, name="history"),
        "category": tf.keras.Input(shape=(None,), dtype=tf.int64,
                                   sparse=True, name="category"),
        "price": tf.keras.Input(shape=(1,), dtype=tf.float32, name="price"),
    }
    columns = [
        fc.embedding_column(fc.category_column("user_id"), 16, table="items"),
        fc.embedding_column(fc.category_column("item_id"), 16, table="items"),
        fc.embedding_column(fc.category_column("history"), 16, table="items"),
        fc.embedding_column(fc.category_column("tags", tf.string), 4,
                            combiner="sum"),
        fc.embedding_column(fc.category_column("category"), 4),
    ]
    ids = {k: v for k, v in inputs.items() if k != "price"}
    x = tn.layers.EmbeddingFeatures(columns)(ids)
    x = tf.keras.layers.Concatenate()([x, inputs["price"]])
    x = tf.keras.layers.Dense(32, "relu")(x)
    output = tf.keras.layers.Dense(1, "sigmoid", name="click")(x)
    return tn.Model(inputs, output)


def to_padded(features):
    """The serving form: ragged and sparse ids as dense [B, L], -1 padded."""
    out = dict(features)
    out["history"] = features["history"].to_tensor(default_value=-1)
    out["category"] = tf.sparse.to_dense(features["category"], default_value=-1)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=8192)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--workdir", default=None,
                   help="where the export goes (default: a temporary dir)")
    a = p.parse_args(argv)
    work = a.workdir or tempfile.mkdtemp(prefix="tnet_functional_")

    tf.keras.utils.set_random_seed(0)
    features, labels = examples(a.rows)
    data = tf.data.Dataset.from_tensor_slices((features, labels)).batch(256)
    model = build_model()
    model.compile(tn.optimizer.Adagrad(0.1), loss="binary_crossentropy",
                  metrics=[tf.keras.metrics.AUC(name="auc")])
    model.fit(data, epochs=a.epochs, verbose=2)

    export = os.path.join(work, "export", "1")
    shutil.rmtree(export, ignore_errors=True)
    tn.serving.export_for_serving(model, export)
    info = json.load(open(os.path.join(export, "export_info.json")))
    print("serving inputs:", json.dumps(info["inputs"]))

    probe, _ = examples(64, seed=1)
    served = tf.saved_model.load(export).signatures["serving_default"](
        **{k: tf.constant(v) for k, v in to_padded(probe).items()})["prediction"]
    trained = model.predict(tf.data.Dataset.from_tensor_slices(probe).batch(64),
                            verbose=0)
    diff = float(np.abs(served.numpy() - trained).max())
    if diff > 1e-5:
        print(f"FAILED: the export differs from the model by up to {diff}")
        return 1
    print(f"OK: 64 served predictions equal the trained model's (max diff {diff:.1e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
