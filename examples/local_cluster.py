"""Your own model on a local ParameterServerStrategy cluster: ps tasks
hold the tables' shards, workers run the steps, this program is the chief.

    python examples/local_cluster.py                  # 2 ps, 1 worker on 127.0.0.1
    python examples/local_cluster.py --ps 2 --workers 2 --rows 500000

Run without `TF_CONFIG`, it starts the cluster itself, the same as

    python -m tnet.launch --ps 2 --workers 2 -- python examples/local_cluster.py

(`tnet.launch` picks free ports, writes each task's `TF_CONFIG`, runs
`python -m tnet.server` for every ps and worker and this program as the
chief, and stops them all when it ends). On a real cluster every task gets
its `TF_CONFIG` and this program runs unchanged on the chief.

The chief builds and compiles the model inside `strategy.scope()`, trains
with a `DatasetCreator` (each worker reads its own shard of the data),
checkpoints with `tn.callbacks.Checkpoint` and exports. It ends by
checking that every ps holds a shard of the user table (a row lives on
ps `key mod num_ps`), and that the export, loaded with
stock TensorFlow, predicts what the trained model predicts. Exit status 1
if a check fails.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ps", type=int, default=2)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--rows", type=int, default=8192, help="examples per epoch")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch_size", type=int, default=256)
    p.add_argument("--workdir", default=None,
                   help="checkpoints and export (default: a temporary dir)")
    return p.parse_args(argv)


def launch(a, argv) -> int:
    """Not in a cluster yet: run this file as the chief of a local one."""
    work = a.workdir or tempfile.mkdtemp(prefix="tnet_cluster_")
    cmd = [sys.executable, "-m", "tnet.launch", "--ps", str(a.ps),
           "--workers", str(a.workers), "--",
           sys.executable, os.path.abspath(__file__), *argv, "--workdir", work]
    print("$", " ".join(cmd[2:]), flush=True)
    return subprocess.run(cmd).returncode


USERS = 5000


def chief(a) -> int:
    import numpy as np
    import tnet as tn                 # before tensorflow: it selects Keras 2
    import tensorflow as tf
    from tnet import feature_column as fc

    def dataset_fn(input_context=None):
        """Endless clicks; each worker reads its own shard."""
        users = tf.data.Dataset.range(a.rows * a.epochs * 2).map(
            lambda i: (i * 7919) % USERS)
        ds = users.map(lambda u: ({"user_id": u,
                                   "hour": tf.strings.as_string(u % 24)},
                                  tf.cast(u % 3 == 0, tf.float32)))
        if input_context is not None:
            ds = ds.shard(input_context.num_input_pipelines,
                          input_context.input_pipeline_id)
        return ds.repeat().batch(a.batch_size)

    work = a.workdir or tempfile.mkdtemp(prefix="tnet_cluster_")
    strategy = tn.distribute.ParameterServerStrategy()   # from TF_CONFIG
    print(f"chief of a cluster with {tn.distribute.num_ps(strategy)} ps", flush=True)
    with strategy.scope():
        inputs = {"user_id": tf.keras.Input(shape=(), dtype=tf.int64, name="user_id"),
                  "hour": tf.keras.Input(shape=(), dtype=tf.string, name="hour")}
        x = tn.layers.EmbeddingFeatures([
            fc.embedding_column(fc.category_column("user_id"), 16),
            fc.embedding_column(fc.category_column("hour", tf.string), 4)])(inputs)
        x = tf.keras.layers.Dense(32, "relu")(x)
        model = tn.Model(inputs, tf.keras.layers.Dense(1, "sigmoid")(x))
        model.compile(tn.optimizer.Adagrad(0.1), loss="binary_crossentropy",
                      metrics=[tf.keras.metrics.AUC(name="auc")])
    steps = a.rows // a.batch_size
    model.fit(tf.keras.utils.experimental.DatasetCreator(dataset_fn),
              epochs=a.epochs, steps_per_epoch=steps, verbose=2,
              callbacks=[tn.callbacks.Checkpoint(os.path.join(work, "ckpt"))])

    failed = []
    table = model.tables()["user_id"]
    per_shard = [int(n) for n in table.shard_sizes()]
    print(f"user_id rows per ps: {per_shard} of {int(table.size())}", flush=True)
    if (len(per_shard) != a.ps or min(per_shard) == 0
            or sum(per_shard) != int(table.size()) or sum(per_shard) > USERS):
        failed.append(f"rows per ps {per_shard}: expected rows on each of "
                      f"{a.ps} ps, at most one per user ({USERS})")

    probe = {"user_id": tf.constant([3, 4, 9, 10], tf.int64),
             "hour": tf.constant(["3", "4", "9", "10"])}
    trained = model(probe, training=False).numpy()   # on the chief, rows from the ps
    export = os.path.join(work, "export", "1")
    shutil.rmtree(export, ignore_errors=True)        # a rerun exports again
    tn.serving.export_for_serving(model, export)
    served = tf.saved_model.load(export).signatures["serving_default"](**probe)
    served = served["prediction"].numpy()
    print("trained:", trained.ravel().round(4), "served:", served.ravel().round(4))
    if not np.allclose(trained, served, atol=1e-5):
        failed.append("the export does not predict what the model predicts")
    if not (trained[0] > trained[1] and trained[2] > trained[3]):
        failed.append("clickers (3, 9) do not score above others (4, 10)")
    for f in failed:
        print("FAILED:", f, flush=True)
    if not failed:
        print("OK: the cluster's model is served as trained", flush=True)
    # Everything is written: end at once rather than wait on the teardown
    # of the remote tasks.
    tn.distribute.exit_now(1 if failed else 0)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    a = parse(argv)
    if "TF_CONFIG" not in os.environ:
        return launch(a, argv)
    from tnet import bind
    bind.ensure()         # before any server starts: listen on TF_CONFIG's host only
    return chief(a)


if __name__ == "__main__":
    sys.exit(main())
