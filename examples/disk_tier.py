"""Tables larger than memory: the disk tier keeps hot rows in memory and
the rest in a file on local disk, and trains exactly as in memory.

    python examples/disk_tier.py                      # 50,000 ids, 16,384 clicks
    python examples/disk_tier.py --ids 5000000 --rows 2000000 \\
        --memory_budget_bytes $((64 << 20)) --storage_dir /mnt/nvme/tier

Two copies of the same model train on the same Zipf-distributed clicks:
one with its item table in memory, one with the table tiered
(`memory_budget_bytes`, `storage_dir` on the embedding column; the same
keywords work on `tn.layers.EmbeddingFeatures`, `tn.SparseTable`, in a
feature spec and on the CLI). The budget here holds a small fraction of
the rows, so most rows live on disk.

It ends by checking that the tiered model predicts exactly what the
in-memory one predicts, that both tables hold the same rows, that rows
really went to disk (`tier_on_disk` in `table.stats()`), and that the
tiered model's checkpoint restores into an in-memory model. Exit status 1
if a check fails.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np

import tnet as tn                 # before tensorflow: it selects Keras 2
import tensorflow as tf
from tnet import feature_column as fc


def clicks(rows: int, ids: int, seed: int = 0):
    """Zipf-skewed item ids (a few hot, most rare) and a user segment."""
    rng = np.random.default_rng(seed)
    items = (rng.zipf(1.2, rows) % ids).astype("int64")
    segments = rng.integers(0, 20, rows)
    label = ((items % 7 == 0) ^ (segments < 5)).astype("float32")
    return {"item_id": items, "segment": segments}, label


class Ranker(tn.Model):
    def __init__(self, **tier):
        super().__init__()
        self.embed = tn.layers.EmbeddingFeatures([
            fc.embedding_column(fc.category_column("item_id"), 16, **tier),
            fc.embedding_column(fc.category_column("segment"), 4)])
        self.mlp = tf.keras.Sequential([tf.keras.layers.Dense(32, "relu"),
                                        tf.keras.layers.Dense(1, "sigmoid")])

    def call(self, features, training=False):
        return self.mlp(self.embed(features, training=training))


def train(features, labels, epochs, **tier) -> Ranker:
    tf.keras.utils.set_random_seed(0)     # the same dense start for both
    model = Ranker(**tier)
    model.compile(tn.optimizer.Adagrad(0.05), loss="binary_crossentropy")
    data = tf.data.Dataset.from_tensor_slices((features, labels)).batch(256)
    model.fit(data, epochs=epochs, verbose=0)
    return model


def table_rows(model):
    keys, weights, _, _ = (t.numpy() for t in
                           model.embed.tables["item_id"].export())
    order = np.argsort(keys)
    return keys[order], weights[order]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ids", type=int, default=50_000)
    p.add_argument("--rows", type=int, default=16_384)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--memory_budget_bytes", type=int, default=64 << 10,
                   help="memory for the item table's rows (default 64 KiB)")
    p.add_argument("--storage_dir", default=None,
                   help="local disk for the tier (default: under --workdir)")
    p.add_argument("--workdir", default=None,
                   help="where the tier and checkpoint go (default: a temporary dir)")
    a = p.parse_args(argv)
    work = a.workdir or tempfile.mkdtemp(prefix="tnet_tier_")
    storage = a.storage_dir or os.path.join(work, "tier")
    os.makedirs(storage, exist_ok=True)

    features, labels = clicks(a.rows, a.ids)
    in_memory = train(features, labels, a.epochs)
    tiered = train(features, labels, a.epochs,
                   memory_budget_bytes=a.memory_budget_bytes,
                   storage_dir=storage)
    stats = tiered.embed.tables["item_id"].stats()
    hits = 1 - int(stats["tier_misses"]) / max(int(stats["tier_lookups"]), 1)
    print(f"tiered item table: {int(stats['rows']):,} rows, "
          f"{int(stats['tier_resident']):,} in memory, "
          f"{int(stats['tier_on_disk']):,} on disk, cache hit rate {hits:.3f}")

    probe, _ = clicks(2048, a.ids, seed=1)
    failed = []
    a_pred = in_memory.predict(probe, batch_size=512, verbose=0)
    b_pred = tiered.predict(probe, batch_size=512, verbose=0)
    if not np.array_equal(a_pred, b_pred):
        failed.append("the tiered model does not predict what the in-memory "
                      f"one does (max diff {np.abs(a_pred - b_pred).max()})")
    (ka, wa), (kb, wb) = table_rows(in_memory), table_rows(tiered)
    if not (np.array_equal(ka, kb) and np.array_equal(wa, wb)):
        failed.append("the tables differ")
    if not int(stats["tier_on_disk"]) > 0:
        failed.append("no row went to disk: raise --ids or lower the budget")

    # A tiered table's checkpoint restores into an in-memory table.
    path = tn.saving.save(tiered, os.path.join(work, "checkpoints"))
    restored = Ranker()
    restored.compile(tn.optimizer.Adagrad(0.05), loss="binary_crossentropy")
    restored({k: v[:1] for k, v in probe.items()})    # build it
    tn.saving.restore(restored, path)
    if not np.array_equal(restored.predict(probe, batch_size=512, verbose=0),
                          b_pred):
        failed.append("the checkpoint does not restore into memory")
    for f in failed:
        print("FAILED:", f)
    if not failed:
        print(f"OK: {len(ka):,} rows, tiered and in memory, train to the "
              "same bits")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
