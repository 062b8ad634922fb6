"""Chief program of tools/bench_pss.py: one timed ParameterServerStrategy run.

    python tools/launch_local.py --ps 2 --workers 2 -- \
        python tools/_pss_chief.py --impl tnet --train T.tsv --holdout H.tsv

Run as the chief of a local cluster (TF_CONFIG from tools/launch_local.py).
Builds WD-400 (deep dim 8, wide dim 1, DNN 400-400-400) in the strategy's
scope, either

- `tnet`: tn.models.WideDeep + tn.optimizer.Adagrad under
  tn.distribute.ParameterServerStrategy() (one table shard per ps task), or
- `stock`: tnet.models.stock.stock_wide_deep (2**20 hash bins per column and
  per table) + tf_keras Adagrad (sparse row updates) under
  tf.distribute.ParameterServerStrategy with a MinSizePartitioner
  (max_shards = number of ps tasks): every hashed embedding is split over
  the ps tasks, the small dense layers are not,

then trains with `fit` on per-worker `criteo_dataset` pipelines
(DatasetCreator; each worker reads its own chunks of the TSV file):

1. warm-up: a `fit` of one epoch of --warmup_steps steps (traces the step
   function, creates the rows of the frequent ids), untimed;
2. measured: a second `fit` of 1 + --epochs epochs of --steps steps. Its
   first epoch is untimed too: it absorbs the start of the new per-worker
   datasets (measured here: 1.6 s against 0.8 s for the next epoch of 8
   steps). Epoch hooks take the wall time from the end of that epoch to the
   end of the last (fit joins all workers before an epoch ends under PSS);
   examples/s = epochs * steps * batch / seconds;
3. exact hold-out AUC of the first --eval_rows rows on the chief (tnet:
   model.evaluate_exact; stock: a tf.function forward pass per batch and
   tnet.data.metrics.auc over all scores).

Bytes per step: TCP byte counters (`ss -tinp`) of every established socket
owned by the ps task processes (and likewise the workers' and the chief's),
read before and after the measured epochs, divided by the steps: what the
ps tasks received (dense gradients, pushed rows, requests) and sent
(variables, pulled rows) per step, gRPC framing included, whichever side
opened the connection (TensorFlow's runtime pulls tensors with RecvTensor
RPCs, so a ps also opens connections to the workers). Loopback
connections of this cluster only; RPC counts are not measured.
CPU per step: user + system CPU time of the ps, worker and chief processes
(/proc/<pid>/stat) over the timed epochs, divided by the steps: where the
machine's cores go.

`--config sparse_heavy` runs the protocol's SPARSE-HEAVY instead
(tools/_sparse_heavy.py: 26 columns + M1..M4 multi-valued, dim 16, DNN
128-64; --embedding_dim and --hidden are then ignored) on files written by
`SyntheticCriteo(multi_valued=4).write_tsv`, read with
`tnet.data.synthetic.read_tsv` (tnet.data.spec_dataset), M1..M4 as the
reader's `tf.RaggedTensor` for tnet and for stock unless
`--stock_form padded|masked` ([B, 50] padded with -1).

Prints one line `PSS_RESULT {json}` on success.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tnet as tn  # noqa: E402  (first: selects tf_keras)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

from tnet import data as tn_data  # noqa: E402
from tnet.data.metrics import auc  # noqa: E402
from tnet.data.synthetic import read_tsv  # noqa: E402
from tools import _sparse_heavy as sh  # noqa: E402
from tools import procfs  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--impl", choices=("tnet", "stock"), required=True)
    p.add_argument("--config", choices=("wd400", "sparse_heavy"),
                   default="wd400")
    p.add_argument("--stock_form", choices=sh.STOCK_FORMS, default="ragged",
                   help="sparse_heavy, stock: how M1..M4 arrive and are pooled")
    p.add_argument("--train", required=True, help="training TSV (Criteo)")
    p.add_argument("--holdout", required=True, help="hold-out TSV (Criteo)")
    p.add_argument("--batch", type=int, default=4096,
                   help="examples per step (each step runs on one worker)")
    p.add_argument("--steps", type=int, default=40,
                   help="steps per measured epoch")
    p.add_argument("--epochs", type=int, default=2, help="measured epochs")
    p.add_argument("--warmup_steps", type=int, default=10,
                   help="steps of the untimed warm-up epoch")
    p.add_argument("--eval_rows", type=int, default=2**17,
                   help="hold-out rows scored for AUC (0: no evaluation)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--embedding_dim", type=int, default=8)
    p.add_argument("--hidden", default="400,400,400")
    p.add_argument("--bins", type=int, default=2**20,
                   help="stock: hash bins per column and per table")
    p.add_argument("--min_shard_bytes", type=int, default=1 << 20,
                   help="stock: MinSizePartitioner min_shard_bytes")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


# ------------------------------------------------------- cluster counters
def cluster_config():
    return tn.distribute.parse_tf_config()


def _ports(config, job):
    return [int(a.rpartition(":")[2]) for a in config["cluster"].get(job, [])]


_SS_FIELDS = {k: re.compile(rf"\b{k}:(\d+)") for k in
              ("bytes_received", "bytes_acked", "segs_in", "segs_out")}


def tcp_sockets():
    """{(pid, local, peer): {bytes_received, bytes_acked, segs_in,
    segs_out}} for every established TCP socket (`ss -tinp`), or None if
    ss is not available."""
    try:
        text = subprocess.run(["ss", "-tinpH", "state", "established"],
                              capture_output=True, text=True, timeout=20,
                              check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    out, key = {}, None
    # Each socket: an address line (Recv-Q Send-Q Local Peer users:(...)),
    # then an indented tcp_info line (or both on one line).
    for line in text.splitlines():
        if not line.startswith((" ", "\t")):
            fields = line.split()
            m = re.search(r"pid=(\d+)", line)
            key = ((int(m.group(1)), fields[2], fields[3])
                   if m and len(fields) >= 4 else None)
            if key is not None:
                out[key] = {k: 0 for k in _SS_FIELDS}
        if key is not None:
            for name, rx in _SS_FIELDS.items():
                found = rx.search(line)
                if found:
                    out[key][name] = int(found.group(1))
    return out


def traffic(before, after, pids):
    """Bytes and segments the processes `pids` received / sent between two
    `tcp_sockets()` snapshots (sockets opened in between count in full;
    sockets closed in between are lost: gRPC keeps its channels open)."""
    if before is None or after is None:
        return None
    pids = set(pids)
    total = {k: 0 for k in _SS_FIELDS}
    for key, now in after.items():
        if key[0] not in pids:
            continue
        then = before.get(key, {})
        for k in total:
            total[k] += now[k] - then.get(k, 0)
    return total


def task_pids(config):
    """{"ps:0": pid, ...} for this cluster's ps/worker tasks (listening
    sockets of `ss -tlnp`), or {} if that is not available."""
    try:
        text = subprocess.run(["ss", "-tlnpH"], capture_output=True, text=True,
                              timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    by_port = {}
    for line in text.splitlines():
        fields = line.split()
        addr = [f for f in fields if ":" in f and not f.startswith("users:")]
        m = re.search(r"pid=(\d+)", line)
        if addr and m:
            try:
                by_port[int(addr[0].rpartition(":")[2])] = int(m.group(1))
            except ValueError:
                pass
    pids = {}
    for job in ("ps", "worker"):
        for i, port in enumerate(_ports(config, job)):
            if port in by_port:
                pids[f"{job}:{i}"] = by_port[port]
    return pids


def cpu_seconds(pids):
    """{pid: user + system CPU seconds} from /proc/<pid>/stat (threads
    included); missing processes are left out."""
    out = {}
    for pid in pids:
        seconds = procfs.cpu_seconds(pid)
        if seconds is not None:
            out[pid] = seconds
    return out


def peak_rss(pid):
    """VmHWM (peak RSS) of a process in bytes, or None."""
    return procfs.status_bytes("VmHWM", pid)


# ----------------------------------------------------------------- models
def build(args, num_ps):
    hidden = tuple(int(u) for u in args.hidden.split(","))
    cats, ints = tn_data.CRITEO_CAT_COLUMNS, tn_data.CRITEO_INT_COLUMNS
    sparse_heavy = args.config == "sparse_heavy"
    if args.impl == "tnet" and sparse_heavy:
        strategy = tn.distribute.ParameterServerStrategy()
        with strategy.scope():
            model = sh.build_tnet(args.lr)
        return strategy, model
    if args.impl == "tnet":
        strategy = tn.distribute.ParameterServerStrategy()
        with strategy.scope():
            model = tn.models.WideDeep(cats, ints,
                                       embedding_dim=args.embedding_dim,
                                       hidden_units=hidden,
                                       train_metrics=False)
            model.compile(tn.optimizer.Adagrad(args.lr))
        return strategy, model
    from tnet.models.stock import stock_wide_deep  # noqa: PLC0415
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=args.min_shard_bytes, max_shards=num_ps)
    strategy = tf.distribute.ParameterServerStrategy(
        resolver, variable_partitioner=partitioner)
    with strategy.scope():
        if sparse_heavy:
            return strategy, sh.build_stock(args.lr, args.bins, args.stock_form)
        model = stock_wide_deep(cats, ints, embedding_dim=args.embedding_dim,
                                num_bins=args.bins, hidden_units=hidden)
        model.compile(tf_keras.optimizers.Adagrad(args.lr),
                      tf_keras.losses.BinaryCrossentropy(from_logits=True))
    return strategy, model


class EpochClock(tf_keras.callbacks.Callback):
    """Epoch-level timing (PSS refuses batch-level callbacks). Under PSS fit
    joins all workers before on_epoch_end, so an epoch's time covers all its
    steps. Epoch 0 is not timed; the clock runs from the end of epoch 0 to
    the end of the last epoch, with a TCP snapshot at both ends (taken
    outside the timed span) and the CPU time of the cluster's processes."""

    def __init__(self, pids):
        super().__init__()
        self.pids = pids
        self.begin, self.end, self.logs = [], [], []
        self.snapshots = []

    def on_epoch_begin(self, epoch, logs=None):
        self.begin.append(time.perf_counter())

    def on_epoch_end(self, epoch, logs=None):
        now = time.perf_counter()
        self.end.append(now)
        self.logs.append({k: float(v) for k, v in (logs or {}).items()})
        if epoch == 0:
            self.snapshots.append((tcp_sockets(), cpu_seconds(self.pids)))
            self.start = time.perf_counter()
        elif epoch == self.params["epochs"] - 1:
            self.stop = now
            self.snapshots.append((tcp_sockets(), cpu_seconds(self.pids)))


def read(args, path, batch_size, **kwargs):
    """The (features, label) batches of a data file for this config."""
    if args.config == "wd400":
        return tn_data.criteo_dataset(path, batch_size, **kwargs)
    ragged = args.impl == "tnet" or args.stock_form == "ragged"
    return read_tsv(path, batch_size, sh.MULTI_VALUED, ragged=ragged, **kwargs)


def holdout_scores(args, model):
    ds = read(args, args.holdout, args.batch, take=args.eval_rows)
    if args.impl == "tnet":
        return model.evaluate_exact(ds)
    predict = tf.function(lambda f: model(f, training=False))
    labels, scores = [], []
    for features, y in ds:
        scores.append(predict(features).numpy().reshape(-1))
        labels.append(y.numpy().reshape(-1))
    y = np.concatenate(labels).astype(np.float64)
    z = np.concatenate(scores).astype(np.float64)
    logloss = float(np.mean(np.logaddexp(0.0, z) - y * z))
    return {"auc": auc(y, z), "logloss": logloss, "examples": int(y.size)}


def main(argv=None) -> int:
    args = parse_args(argv)
    config = cluster_config()
    if config is None:
        print("_pss_chief: TF_CONFIG is not set; run me under "
              "tools/launch_local.py", file=sys.stderr)
        return 2
    num_ps = len(config["cluster"]["ps"])
    num_workers = len(config["cluster"]["worker"])
    tf_keras.utils.set_random_seed(args.seed)
    result = {"impl": args.impl, "ps": num_ps, "workers": num_workers,
              **({"config": args.config, "stock_form": args.stock_form}
                 if args.config != "wd400" else {}),
              "batch": args.batch, "steps": args.steps, "epochs": args.epochs,
              "warmup_steps": args.warmup_steps}
    t0 = time.perf_counter()
    strategy, model = build(args, num_ps)
    result["build_seconds"] = time.perf_counter() - t0
    if args.impl == "stock":
        result["parameters"] = int(model.count_params())

    def dataset_fn(ctx):
        return read(args, args.train, ctx.get_per_replica_batch_size(args.batch),
                    num_epochs=None, input_context=ctx)

    data = tf_keras.utils.experimental.DatasetCreator(dataset_fn)
    t0 = time.perf_counter()
    model.fit(data, epochs=1, steps_per_epoch=args.warmup_steps, verbose=0)
    result["warmup_seconds"] = time.perf_counter() - t0

    pids = task_pids(config)
    clock = EpochClock(list(pids.values()) + [os.getpid()])
    model.fit(data, epochs=1 + args.epochs, steps_per_epoch=args.steps,
              callbacks=[clock], verbose=0)
    seconds = clock.stop - clock.start
    (before, cpu0), (after, cpu1) = clock.snapshots
    steps = args.epochs * args.steps
    result["seconds"] = seconds
    result["settle_epoch_seconds"] = clock.end[0] - clock.begin[0]
    result["epoch_seconds"] = [e - b for b, e in zip(clock.begin[1:],
                                                     clock.end[1:])]
    result["examples_per_sec"] = steps * args.batch / seconds
    result["train_loss_last_epoch"] = clock.logs[-1].get("loss")
    groups = {"ps": [v for k, v in pids.items() if k.startswith("ps:")],
              "worker": [v for k, v in pids.items() if k.startswith("worker:")],
              "chief": [os.getpid()]}
    for group, members in groups.items():
        moved = traffic(before, after, members) if members else None
        cpu = [cpu1[p] - cpu0[p] for p in members if p in cpu0 and p in cpu1]
        if cpu:
            result[f"{group}_cpu_ms_per_step"] = 1000 * sum(cpu) / steps
        if moved is not None:
            result[f"{group}_bytes_in_per_step"] = moved["bytes_received"] / steps
            result[f"{group}_bytes_out_per_step"] = moved["bytes_acked"] / steps
            result[f"{group}_segments_per_step"] = (moved["segs_in"]
                                                    + moved["segs_out"]) / steps

    if args.eval_rows > 0:
        t0 = time.perf_counter()
        ev = holdout_scores(args, model)
        result["eval_seconds"] = time.perf_counter() - t0
        result.update({"auc": float(ev["auc"]), "logloss": float(ev["logloss"]),
                       "eval_examples": int(ev["examples"])})
    if args.impl == "tnet":
        result["tables"] = {name: {"rows": int(t.size()),
                                   "rows_per_shard": [int(x) for x in t.shard_sizes()],
                                   "bytes": int(t.memory_bytes())}
                            for name, t in model.tables().items()}
    result["peak_rss_bytes"] = {"chief": peak_rss(os.getpid()),
                                **{k: peak_rss(v) for k, v in pids.items()}}
    print("PSS_RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # noqa: BLE001
        lost = tn.distribute.explain_failure(e)
        if lost is None:
            raise
        print(f"_pss_chief: {lost}", file=sys.stderr, flush=True)
        sys.exit(tn.distribute.EXIT_RESTART)
