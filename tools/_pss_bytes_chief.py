"""Chief program of tools/bench_pss_bytes.py: what one PSS step moves.

    python tools/launch_local.py --ps 2 --workers 1 -- \
        python tools/_pss_bytes_chief.py --data D.tsv --batches 4

Run as the chief of a local cluster (TF_CONFIG from tools/launch_local.py).
Builds the SPARSE-HEAVY model (tools/_sparse_heavy.py: tn.models.WideDeep,
deep table "embedding" dim 16 + wide table "wide" dim 1, one shard of each
per ps) under tn.distribute.ParameterServerStrategy() and trains it with
`fit` on the first --batches batches of --data, cached on the worker and
repeated, so every pass over them is the same --batches steps in the same
order:

1. warm-up: a `fit` of one epoch of --batches steps (traces the step
   function, creates the rows of every key those batches hold);
2. measured: a `fit` of 1 + --epochs epochs of --batches steps each. At
   the end of its first epoch and of its last one (fit joins the worker
   before an epoch ends under PSS) the chief takes a snapshot of every
   established TCP socket (`ss -tinp`, tools/_pss_chief.tcp_sockets) and
   prints a `PSS_BYTES_MARK <name> <unix time>` line; between the two
   marks ran exactly --epochs passes over the --batches batches (and the
   epoch-end bookkeeping of fit: one read of the loss per epoch).

The minimum each step must move (issue 29): for each table and each ps,
U_ps = the unique keys of the batch that the table routes to that ps, and
U_ps x (8 + 4 x dim) bytes each way. The chief computes U_ps from the same
batches (read here with the same reader) with numpy: keys = id XOR the
column's salt (tnet.feature_column.keys_of / column_salt, what the layers
use), padding dropped, np.unique, then the table's own `_route` (floormod
by the number of shards). As a check, the rows each shard holds after the
run must equal the distinct keys routed to it over the batches (training
inserts every key it pulls).

Prints one line `PSS_BYTES_RESULT {json}` on success.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tnet as tn  # noqa: E402  (first: selects tf_keras)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

from tnet import feature_column as fc  # noqa: E402
from tnet.data.synthetic import read_tsv  # noqa: E402
from tools import _pss_chief as pc  # noqa: E402
from tools import _sparse_heavy as sh  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True,
                   help="SyntheticCriteo(multi_valued=4).write_tsv file")
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--batches", type=int, default=4,
                   help="distinct batches, cycled (steps per epoch)")
    p.add_argument("--epochs", type=int, default=2,
                   help="measured passes over the batches")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def dataset(args, batch_size, **kwargs):
    return read_tsv(args.data, batch_size, sh.MULTI_VALUED, ragged=True,
                    **kwargs).take(args.batches)


# ------------------------------------------------------- the minimum
def layer_keys(layer, features) -> np.ndarray:
    """Every (non-padding) key one batch sends to `layer`'s single table,
    as the layer derives them: id XOR column salt (columns share the
    table, so keys are salted), -1 padding dropped."""
    groups = layer._groups
    if len(groups) != 1:
        raise ValueError(f"{layer.name}: expected one table, got {list(groups)}")
    (_, cols), = groups.items()
    salted = len(cols) > 1
    out = []
    for _, col in cols:
        cat = col.categorical_column
        ids = features[cat.key]
        if isinstance(ids, tf.RaggedTensor):
            ids = ids.flat_values
        ids = tf.reshape(tf.convert_to_tensor(ids), [-1])
        keep = fc.not_padding(ids)
        salt = fc.column_salt(cat.name) if salted else None
        out.append(tf.boolean_mask(fc.keys_of(ids, salt), keep).numpy())
    return np.concatenate(out)


def minimum(args, model):
    """Per table: dim, U per batch per shard, and the distinct keys per
    shard over all the batches (the rows each shard should hold)."""
    layers = {"embedding": model.embeddings, "wide": model.wide}
    tables = model.tables()
    out = {}
    for name, layer in layers.items():
        table = tables[name]
        per_batch, union = [], [set() for _ in range(table.num_shards)]
        for features, _ in dataset(args, args.batch):
            uniq = np.unique(layer_keys(layer, features))
            shard = table._route(tf.constant(uniq, tf.int64)).numpy()
            per_batch.append([int(np.sum(shard == s))
                              for s in range(table.num_shards)])
            for s in range(table.num_shards):
                union[s].update(uniq[shard == s].tolist())
        out[name] = {"dim": table.dim, "shards": table.num_shards,
                     "optimizer": type(table.optimizer).__name__,
                     "unique_per_batch_per_shard": per_batch,
                     "distinct_per_shard": [len(u) for u in union]}
    return out


class Marks(tf_keras.callbacks.Callback):
    """TCP snapshots and a printed wall-clock mark at the end of the first
    and of the last epoch (outside the span they delimit)."""

    def __init__(self):
        super().__init__()
        self.snapshots = []

    def on_epoch_end(self, epoch, logs=None):
        if epoch in (0, self.params["epochs"] - 1):
            name = "begin" if epoch == 0 else "end"
            snap = pc.tcp_sockets()
            t = time.time()
            self.snapshots.append((name, t, snap))
            print(f"PSS_BYTES_MARK {name} {t:.6f}", flush=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    config = pc.cluster_config()
    if config is None:
        print("_pss_bytes_chief: TF_CONFIG is not set; run me under "
              "tools/launch_local.py", file=sys.stderr)
        return 2
    tf_keras.utils.set_random_seed(args.seed)
    strategy = tn.distribute.ParameterServerStrategy()
    with strategy.scope():
        model = sh.build_tnet(args.lr)

    def dataset_fn(ctx):
        bs = ctx.get_per_replica_batch_size(args.batch)
        return dataset(args, bs, input_context=ctx).cache().repeat()

    data = tf_keras.utils.experimental.DatasetCreator(dataset_fn)
    model.fit(data, epochs=1, steps_per_epoch=args.batches, verbose=0)
    print("PSS_BYTES_WARM", flush=True)
    marks = Marks()
    model.fit(data, epochs=1 + args.epochs, steps_per_epoch=args.batches,
              callbacks=[marks], verbose=0)
    (_, t0, before), (_, t1, after) = marks.snapshots
    pids = pc.task_pids(config)
    pids["chief"] = os.getpid()
    ports = {}
    for job in ("chief", "worker", "ps"):
        for i, addr in enumerate(config["cluster"].get(job, [])):
            ports[int(addr.rpartition(":")[2])] = f"{job}:{i}"
    # Per socket: the task that owns it and the task at the other end
    # (by the peer's listening port, or by the pid owning the peer socket).
    owner = {pid: task for task, pid in pids.items()}
    by_local = {k[1]: owner.get(k[0]) for k in after}
    sockets = []
    for key, now in after.items():
        task = owner.get(key[0])
        if task is None:
            continue
        then = before.get(key, {})
        delta = {k: now[k] - then.get(k, 0) for k in now}
        peer_port = int(key[2].rpartition(":")[2])
        peer = ports.get(peer_port) or by_local.get(key[2]) or key[2]
        local_port = int(key[1].rpartition(":")[2])
        sockets.append({"task": task, "peer": peer, "local": key[1],
                        "remote": key[2],
                        "serving": ports.get(local_port) == task,
                        **delta})
    result = {"batch": args.batch, "batches": args.batches,
              "epochs": args.epochs, "steps": args.batches * args.epochs,
              "pids": pids, "mark_times": [t0, t1],
              "seconds": t1 - t0, "sockets": sockets}
    result["minimum"] = minimum(args, model)
    # The dense tensors a step may move: a trainable variable's value (to
    # the worker) and its gradient (to the ps); optimizer and metric
    # variables are read where they live.
    trainable = {id(v) for v in model.trainable_variables}
    opt_vars = model.optimizer.variables
    opt_vars = list(opt_vars() if callable(opt_vars) else opt_vars)
    optimizer = {id(v) for v in opt_vars}
    seen, variables = set(), []
    metric_vars = [v for m in model.metrics for v in m.variables]
    task = getattr(model, "task", None)
    for m in getattr(task, "_ranking_metrics", []) or []:
        metric_vars += list(m.variables)
    metric = {id(v) for v in metric_vars}
    for v in list(model.variables) + opt_vars + metric_vars:
        if id(v) in seen:
            continue
        seen.add(id(v))
        kind = ("trainable" if id(v) in trainable else
                "optimizer" if id(v) in optimizer else
                "metric" if id(v) in metric else "other")
        variables.append({"name": v.name, "device": v.device, "kind": kind,
                          "bytes": int(np.prod(v.shape)) * v.dtype.size})
    result["variables"] = variables
    result["rows_per_shard"] = {name: [int(x) for x in t.shard_sizes()]
                                for name, t in model.tables().items()}
    print("PSS_BYTES_RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
