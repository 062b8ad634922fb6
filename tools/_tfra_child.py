"""Child processes of tools/bench_tfra.py: one model, one measurement.

    <python> tools/_tfra_child.py --impl tfra --mode throughput --data D.npz
    <python> tools/_tfra_child.py --impl tnet --mode quality --data D.npz

Runs under two interpreters: tnet's venv (`--impl tnet`, TF 2.21) and the
TFRA venv (`--impl tfra` or `stock`, TF 2.16.2 + TFRA 0.8.1). In the TFRA
venv it never imports tnet (tnet's ops need TF 2.21): only the standard
library, numpy, TensorFlow, tf_keras and TFRA. `--impl tnet` imports tnet
before TensorFlow (tnet selects Keras 2).

Configurations (`--config`, docs/BENCHMARK_PROTOCOL.md):
- wd400: 26 id columns C1..C26, deep dim 8, wide dim 1, DNN 400-400-400.
- sparse_heavy: the same 26 plus 4 multi-valued columns M1..M4 (int64
  [B, 50] padded with -1, 1-50 ids a row), dim 16 for every column, DNN
  128-64; a multi-valued column's deep embedding is the mean of its ids'
  rows, its wide term the sum (tools/_sparse_heavy.py's model).

Models (logits):
- tnet: tn.models.WideDeep(train_metrics=False) + tn.optimizer.Adagrad,
  as tools/bench_train.py builds it (one shared table, the column mixed
  into the key; the wide part's in-table FTRL is tnet's default).
- tfra: TFRA dynamic embeddings (`de.keras.layers.Embedding`, CPU cuckoo
  hash table, TFRA's default). `--tables shared` (default): one deep table
  (dim 8) and one wide table (dim 1) for all 26 columns, keys salted with
  the column (column << 32 | id), so one lookup per table and step, as in
  tnet; `--tables per_column`: 52 tables, one lookup each. SPARSE-HEAVY:
  the multi-valued columns' real ids (padding dropped by boolean_mask)
  go into the same one lookup per table as the single ids, then a
  segment mean (deep) and sum (wide) per row; `per_column` is WD-400's. Deep rows start
  from N(0, 0.05^2) (TFRA's default RandomNormal, as a TF-core
  initializer), wide rows at zero (as stock's wide Embedding). The optimizer is
  `de.DynamicEmbeddingOptimizer(tf_keras Adagrad)`: Adagrad for the dense
  layers and, through TFRA, for the rows (accumulator slots in hash tables
  beside the rows).
- stock: tf_keras floormod(id, 2**20) + Embedding per column and table,
  tf_keras Adagrad (the protocol's strongest stock baseline), as a sanity
  anchor in the TFRA venv; SPARSE-HEAVY's M1..M4 as tools/_sparse_heavy's
  "padded" form (real ids by boolean_mask, looked up, segment mean/sum).
- dnn: DNN-only, the same DNN fed a constant input of the same width
  (26 * 8 + 13; SPARSE-HEAVY 30 * 16 + 13), tf_keras Adagrad: the dense part's limit on the TensorFlow
  of whichever venv runs it (WD-400 is dense-bound, and the two venvs have
  different TensorFlow versions).

Modes (each prints one line `RESULT {json}` at the end):
- throughput: warm-up steps, then examples/s of --steps steps of the Keras
  train function over in-memory batches (no parsing, no metrics).
- quality: a fresh model (seed 0) trained --epochs over the training
  arrays in order, then the hold-out logits -> exact AUC (numpy rank-sum).
- server: a ps or worker task of a local cluster (TF_CONFIG): starts a
  tf.distribute.Server with TFRA's ops loaded and serves until SIGTERM.
- pss_chief: the chief of that cluster: TFRA WD-400 under
  tf.distribute.ParameterServerStrategy (tables placed on the ps tasks),
  Keras fit over per-worker datasets of --pss_batches in-memory batches;
  examples/s of the timed epochs, or the error.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import sys
import threading
import time
import traceback

import numpy as np

CAT = [f"C{i}" for i in range(1, 27)]
INT = [f"I{i}" for i in range(1, 14)]
STOCK_BINS = 2**20
# --config: (multi-valued columns, embedding dim, DNN) of WD-400 and
# SPARSE-HEAVY; set by configure().
CONFIGS = {"wd400": ((), 8, (400, 400, 400)),
           "sparse_heavy": (("M1", "M2", "M3", "M4"), 16, (128, 64))}
MULTI, DIM, HIDDEN = CONFIGS["wd400"]


def configure(config: str) -> None:
    global MULTI, DIM, HIDDEN
    MULTI, DIM, HIDDEN = CONFIGS[config]


def deep_width() -> int:
    return DIM * (len(CAT) + len(MULTI)) + len(INT)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--impl", choices=("tnet", "tfra", "stock", "dnn"),
                   required=True)
    p.add_argument("--config", choices=tuple(CONFIGS), default="wd400")
    p.add_argument("--mode", choices=("throughput", "quality", "server",
                                      "pss_chief"), required=True)
    p.add_argument("--data", help=".npz written by bench_tfra.py")
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--warmup_steps", type=int, default=5)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--tables", choices=("shared", "per_column"),
                   default="shared")
    p.add_argument("--optimizer", choices=("keras", "legacy"),
                   default="keras",
                   help="tf_keras.optimizers.Adagrad or its .legacy twin")
    p.add_argument("--with_unique", type=int, default=1,
                   help="tfra: the Embedding layer's with_unique")
    p.add_argument("--pss_epochs", type=int, default=2)
    p.add_argument("--pss_batches", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tnet_accumulator", type=float, default=None)
    p.add_argument("--tnet_row_accumulator", type=float, default=None)
    p.add_argument("--tnet_wide_accumulator", type=float, default=None)
    # Probes of TFRA's settings in tnet (tools/bench_tfra.py --help):
    p.add_argument("--tnet_row_epsilon", type=float, default=None)
    p.add_argument("--tnet_wide_rule", choices=("ftrl", "adagrad"),
                   default=None)
    p.add_argument("--tnet_wide_lr", type=float, default=None)
    p.add_argument("--tnet_wide_epsilon", type=float, default=None)
    p.add_argument("--tnet_init_stddev", type=float, default=None)
    p.add_argument("--tnet_start_reference_batch", type=float, default=None)
    return p.parse_args(argv)


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def auc(labels, scores) -> float:
    """Exact ROC AUC by the rank-sum statistic, ties at their mean rank."""
    y = np.asarray(labels).reshape(-1).astype(bool)
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    _, inverse, counts = np.unique(s, return_inverse=True, return_counts=True)
    mean_rank = np.cumsum(counts) - (counts - 1) / 2.0
    n_pos = int(y.sum())
    n_neg = y.size - n_pos
    rank_sum = mean_rank[inverse][y].sum()
    return float((rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def emit(result: dict) -> None:
    result["peak_rss_bytes"] = peak_rss_bytes()
    print("RESULT " + json.dumps(result), flush=True)


# -------------------------------------------------------------- imports
def import_stack(impl: str):
    """(tf, tf_keras, module) in the order each venv needs."""
    if impl == "tnet":
        sys.path.insert(0, os.path.dirname(os.path.dirname(
            os.path.abspath(__file__))))
        import tnet as tn  # first: selects tf_keras before TensorFlow
        import tensorflow as tf
        import tf_keras
        return tf, tf_keras, tn
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tensorflow as tf
    import tf_keras
    if impl == "tfra":
        from tensorflow_recommenders_addons import dynamic_embedding as de
        return tf, tf_keras, de
    return tf, tf_keras, None


# --------------------------------------------------------------- models
def dnn(tf_keras, name):
    layers = [tf_keras.layers.Dense(u, activation="relu", name=f"{name}_{i}")
              for i, u in enumerate(HIDDEN)]
    return layers + [tf_keras.layers.Dense(1, name=f"{name}_logit")]


def build_tfra(tf, tf_keras, de, tables="shared", devices=None,
               with_unique=True):
    """TFRA Wide&Deep (subclassed tf_keras model returning logits)."""

    class TfraWideDeep(tf_keras.Model):
        def __init__(self):
            super().__init__(name="tfra_wide_deep")
            kw = dict(devices=devices, with_unique=with_unique)
            zeros = tf_keras.initializers.Zeros()
            # A TF-core initializer: a fresh random draw for the new rows
            # of every step (an unseeded tf_keras one warns that it repeats
            # its values).
            normal = tf.random_normal_initializer(0.0, 0.05)
            if tables == "shared":
                self.deep_emb = de.keras.layers.Embedding(
                    DIM, initializer=normal, name="deep", **kw)
                self.wide_emb = de.keras.layers.Embedding(
                    1, initializer=zeros, name="wide", **kw)
            else:
                if MULTI:
                    raise SystemExit("--tables per_column: WD-400 only")
                self.deep_embs = [de.keras.layers.Embedding(
                    DIM, initializer=normal, name=f"deep_{c}", **kw)
                    for c in CAT]
                self.wide_embs = [de.keras.layers.Embedding(
                    1, initializer=zeros, name=f"wide_{c}", **kw) for c in CAT]
            self.tower = dnn(tf_keras, "dnn")

        def call(self, features, training=False):
            if tables == "shared" and MULTI:
                deep, wide = self.multi_valued(features)
            elif tables == "shared":
                # Column-salted keys: C1=5 and C2=5 are different rows.
                ids = tf.stack([features[c] + (i << 32)
                                for i, c in enumerate(CAT)], axis=1)
                deep = tf.reshape(self.deep_emb(ids), [-1, DIM * len(CAT)])
                wide = tf.reduce_sum(self.wide_emb(ids), axis=1)
            else:
                deep = tf.concat([e(features[c]) for e, c in
                                  zip(self.deep_embs, CAT)], axis=1)
                wide = tf.add_n([e(features[c]) for e, c in
                                 zip(self.wide_embs, CAT)])
            x = tf.concat([deep, tf.stack([features[c] for c in INT], 1)], 1)
            for layer in self.tower:
                x = layer(x)
            return x + wide

        def multi_valued(self, features):
            """SPARSE-HEAVY: the single ids [B, 26] and every multi-valued
            column's real ids, column-salted, in one lookup per table; a
            multi-valued column's rows are averaged (deep) and summed
            (wide) per example."""
            single = tf.stack([features[c] + (i << 32)
                               for i, c in enumerate(CAT)], axis=1)
            batch = tf.shape(single)[0]
            values, segments = [], []
            for j, c in enumerate(MULTI):
                ids = features[c]
                keep = ids >= 0
                values.append(tf.boolean_mask(ids, keep)
                              + ((len(CAT) + j) << 32))
                rows = tf.cast(tf.where(keep)[:, 0], tf.int32)
                segments.append(rows + j * batch)
            flat = tf.concat([tf.reshape(single, [-1])] + values, axis=0)
            n_single = tf.size(single)
            segment = tf.concat(segments, axis=0)
            parts = len(MULTI) * batch
            counts = tf.math.unsorted_segment_sum(
                tf.ones_like(segment, tf.float32), segment, parts)
            counts = tf.reshape(tf.maximum(counts, 1.0), [len(MULTI), -1, 1])

            def pooled(rows, dim):
                multi = tf.math.unsorted_segment_sum(rows[n_single:], segment,
                                                     parts)
                multi = tf.reshape(multi, [len(MULTI), -1, dim])
                first = tf.reshape(rows[:n_single], [batch, len(CAT), dim])
                return first, multi

            first, multi = pooled(self.deep_emb(flat), DIM)
            deep = tf.concat([tf.reshape(first, [batch, -1])]
                             + tf.unstack(multi / counts), axis=1)
            w_first, w_multi = pooled(self.wide_emb(flat), 1)
            wide = (tf.reduce_sum(w_first, axis=1)
                    + tf.reduce_sum(w_multi, axis=0))
            return deep, wide

    return TfraWideDeep()


def build_stock(tf, tf_keras):
    inputs = {c: tf_keras.Input((), dtype=tf.int64, name=c) for c in CAT}
    inputs.update({c: tf_keras.Input((50,), dtype=tf.int64, name=c)
                   for c in MULTI})
    inputs.update({c: tf_keras.Input((), dtype=tf.float32, name=c)
                   for c in INT})
    deep, wide = [], []
    for c in CAT + list(MULTI):
        d = tf_keras.layers.Embedding(STOCK_BINS, DIM, name=f"emb_{c}")
        w = tf_keras.layers.Embedding(
            STOCK_BINS, 1, embeddings_initializer="zeros", name=f"wide_{c}")
        if c in MULTI:
            d_out, w_out = padded_pool(d, w, f"pool_{c}")(inputs[c])
            deep.append(d_out)
            wide.append(w_out)
            continue
        ids = tf_keras.layers.Lambda(lambda t: tf.math.floormod(t, STOCK_BINS),
                                     name=f"floormod_{c}")(inputs[c])
        deep.append(d(ids))
        wide.append(w(ids))
    x = tf_keras.layers.Concatenate()(
        deep + [tf.stack([inputs[c] for c in INT], axis=1)])
    for layer in dnn(tf_keras, "dnn"):
        x = layer(x)
    logits = tf_keras.layers.Add()([x, tf_keras.layers.Add()(wide)])
    return tf_keras.Model(inputs, logits, name="stock_wide_deep")


def padded_pool(deep, wide, name):
    """A layer: [B, 50] ids padded with -1 -> (mean of the real ids' deep
    rows, sum of their wide rows)."""
    import tensorflow as tf
    import tf_keras

    class PaddedPool(tf_keras.layers.Layer):
        """[B, 50] ids padded with -1 -> (mean of the real ids' deep rows,
        sum of their wide rows): the padding dropped by boolean_mask, only
        the real ids looked up (floormod bins)."""

        def __init__(self, deep, wide, **kw):
            super().__init__(**kw)
            self.deep, self.wide = deep, wide

        def call(self, ids):
            keep = ids >= 0
            real = tf.math.floormod(tf.boolean_mask(ids, keep), STOCK_BINS)
            rows = tf.cast(tf.where(keep)[:, 0], tf.int32)
            batch = tf.shape(ids)[0]
            count = tf.maximum(tf.reduce_sum(tf.cast(keep, tf.float32), 1,
                                             keepdims=True), 1.0)
            d = tf.math.unsorted_segment_sum(self.deep(real), rows, batch)
            w = tf.math.unsorted_segment_sum(self.wide(real), rows, batch)
            return d / count, w

    return PaddedPool(deep, wide, name=name)


def build_dnn(tf_keras):
    inputs = tf_keras.Input((deep_width(),))
    x = inputs
    for layer in dnn(tf_keras, "dnn"):
        x = layer(x)
    return tf_keras.Model(inputs, x, name="dnn_only")


def build(args, tf, tf_keras, mod, devices=None):
    """(model, logits_fn) compiled with Adagrad(args.lr)."""
    if args.impl == "tnet":
        wide, initializer, opt = tnet_settings(args, mod)
        if MULTI:
            from tools import _sparse_heavy as sh
            model = sh.build_tnet(args.lr, hidden=HIDDEN, dim=DIM,
                                  initializer=initializer,
                                  wide_optimizer=wide, optimizer=opt)
        else:
            cats = CAT if initializer is None else [
                mod.feature_column.embedding_column(
                    mod.feature_column.category_column(c), DIM,
                    table="embedding", initializer=initializer)
                for c in CAT]
            model = mod.models.WideDeep(cats, INT, embedding_dim=DIM,
                                        hidden_units=HIDDEN,
                                        train_metrics=False,
                                        wide_optimizer=wide)
            model.compile(opt)
        return model, lambda f: model.logits(f, training=False)
    opt_cls = (tf_keras.optimizers.legacy.Adagrad if args.optimizer == "legacy"
               else tf_keras.optimizers.Adagrad)
    loss = tf_keras.losses.BinaryCrossentropy(from_logits=True)
    if args.impl in ("stock", "dnn"):
        model = (build_stock(tf, tf_keras) if args.impl == "stock"
                 else build_dnn(tf_keras))
        model.compile(opt_cls(args.lr), loss)
    else:
        model = build_tfra(tf, tf_keras, mod, args.tables, devices,
                           bool(args.with_unique))
        model.compile(mod.DynamicEmbeddingOptimizer(opt_cls(args.lr)), loss)
    return model, lambda f: model(f, training=False)


def tnet_settings(args, tn):
    """(wide part's rule or None, deep rows' initializer or None, compiled
    optimizer) for tnet: tnet's defaults unless a --tnet_* flag says
    otherwise (each flag is one of TFRA's settings to try in tnet)."""
    wide = None
    reference = args.tnet_start_reference_batch
    if (args.tnet_wide_rule, args.tnet_wide_lr, args.tnet_wide_accumulator,
            args.tnet_wide_epsilon, reference) != (None,) * 5:
        rule = args.tnet_wide_rule or "ftrl"
        kw = {}
        if args.tnet_wide_accumulator is not None:
            kw["initial_accumulator_value"] = args.tnet_wide_accumulator
        elif rule == "ftrl":
            kw["initial_accumulator_value"] = (
                tn.optimizer.sparse.WIDE_FTRL_INITIAL_ACCUMULATOR_VALUE)
        if args.tnet_wide_epsilon is not None:
            kw["epsilon"] = args.tnet_wide_epsilon
        lr = args.tnet_wide_lr or (tn.optimizer.sparse.WIDE_FTRL_LEARNING_RATE
                                   if rule == "ftrl" else args.lr)
        cls = (tn.optimizer.sparse.Ftrl if rule == "ftrl"
               else tn.optimizer.sparse.Adagrad)
        if reference is not None:  # 0: off (the start fixed)
            kw["start_reference_batch"] = reference or None
        wide = cls(learning_rate=lr, **kw)
    initializer = (None if args.tnet_init_stddev is None else
                   {"name": "normal", "stddev": args.tnet_init_stddev})
    kw = ({} if args.tnet_accumulator is None else
          {"initial_accumulator_value": args.tnet_accumulator})
    if args.tnet_row_accumulator is not None:
        kw["row_initial_accumulator_value"] = args.tnet_row_accumulator
    if reference is not None:
        kw["start_reference_batch"] = reference or None
    opt = tn.optimizer.Adagrad(args.lr, **kw)
    if args.tnet_row_epsilon is not None:  # the rows' alone (Keras' shared)
        opt.sparse_rule.epsilon = float(args.tnet_row_epsilon)
    return wide, initializer, opt


def table_rows(args, model):
    """Rows in the id tables after training (tnet and tfra), or None."""
    if args.impl == "tnet":
        return {n: int(t.size()) for n, t in model.tables().items()}
    if args.impl == "tfra":
        layers = ([model.deep_emb, model.wide_emb] if args.tables == "shared"
                  else model.deep_embs + model.wide_embs)
        return {layer.name: int(layer.params.size()) for layer in layers}
    return None


# ----------------------------------------------------------------- data
def load(path):
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def arrays(data, split):
    features = {c: data[f"{split}/{c}"] for c in CAT + list(MULTI) + INT}
    return features, data[f"{split}/label"]


def dataset(tf, features, labels, batch, repeat):
    """Whole in-memory batches (as tools/bench_train.py: slicing example by
    example would cost more than a step)."""
    n = (len(labels) // batch) * batch
    ds = tf.data.Dataset.from_tensor_slices(
        ({k: v[:n].reshape((-1, batch) + v.shape[1:])
          for k, v in features.items()},
         labels[:n].reshape(-1, batch)))
    if repeat:
        ds = ds.repeat()
    return ds.prefetch(4)


# ---------------------------------------------------------------- modes
def run_throughput(args, tf, tf_keras, mod):
    data = load(args.data)
    features, labels = arrays(data, "train")
    tf_keras.utils.set_random_seed(args.seed)
    t0 = time.perf_counter()
    model, _ = build(args, tf, tf_keras, mod)
    if args.impl == "dnn":
        it = iter(tf.data.Dataset.from_tensors(
            (tf.zeros([args.batch, deep_width()]),
             tf.zeros([args.batch, 1]))).repeat())
    else:
        it = iter(dataset(tf, features, labels, args.batch, True))
    fn = model.make_train_function()

    def steps(n):
        start = time.perf_counter()
        for _ in range(n):
            logs = fn(it)
        loss = float(np.asarray(logs["loss"]))
        return time.perf_counter() - start, loss

    warm, _ = steps(args.warmup_steps)
    seconds, loss = steps(args.steps)
    emit({"impl": args.impl, "mode": "throughput",
          "examples_per_sec": args.batch * args.steps / seconds,
          "seconds": seconds, "steps": args.steps,
          "warmup_seconds": warm, "build_and_warmup_seconds":
          time.perf_counter() - t0 - seconds, "loss": loss,
          "table_rows": table_rows(args, model)})


def run_quality(args, tf, tf_keras, mod):
    data = load(args.data)
    features, labels = arrays(data, "train")
    hold_f, hold_y = arrays(data, "holdout")
    tf_keras.utils.set_random_seed(args.seed)
    model, logits_fn = build(args, tf, tf_keras, mod)
    t0 = time.perf_counter()
    history = model.fit(dataset(tf, features, labels, args.batch, False),
                        epochs=args.epochs, verbose=0)
    train_seconds = time.perf_counter() - t0
    predict = tf.function(logits_fn)
    ys, zs = [], []
    for f, y in dataset(tf, hold_f, hold_y, args.batch, False):
        zs.append(predict(f).numpy().reshape(-1))
        ys.append(y.numpy().reshape(-1))
    y, z = np.concatenate(ys), np.concatenate(zs).astype(np.float64)
    logloss = float(np.mean(np.logaddexp(0.0, z) - y * z))
    emit({"impl": args.impl, "mode": "quality", "auc": auc(y, z),
          "logloss": logloss, "holdout_examples": int(y.size),
          "train_seconds": train_seconds,
          "train_examples_per_sec": args.epochs * (len(labels) // args.batch)
          * args.batch / train_seconds,
          "final_train_loss": float(history.history["loss"][-1]),
          "table_rows": table_rows(args, model)})


def run_server(args, tf):
    config = json.loads(os.environ["TF_CONFIG"])
    kind, index = config["task"]["type"], int(config["task"]["index"])
    server = tf.distribute.Server(tf.train.ClusterSpec(config["cluster"]),
                                  job_name=kind, task_index=index,
                                  protocol="grpc", start=True)
    stop = threading.Event()
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, lambda *_: stop.set())
    # join() in a daemon thread: a Python signal handler never runs while
    # the main thread is blocked in it.
    threading.Thread(target=server.join, daemon=True).start()
    print(f"server {kind}:{index} up at {server.target}", flush=True)
    while not stop.wait(1.0):
        pass
    return 0


def run_pss_chief(args, tf, tf_keras, de):
    config = json.loads(os.environ["TF_CONFIG"])
    num_ps = len(config["cluster"]["ps"])
    num_workers = len(config["cluster"]["worker"])
    result = {"impl": args.impl, "mode": "pss_chief", "ps": num_ps,
              "workers": num_workers, "with_unique": bool(args.with_unique),
              "tables": args.tables, "optimizer": args.optimizer}
    data = load(args.data)
    features, labels = arrays(data, "train")
    n = min(len(labels), args.pss_batches * args.batch)
    features = {k: v[:n] for k, v in features.items()}
    labels = labels[:n]
    stage = "build"
    try:
        tf_keras.utils.set_random_seed(args.seed)
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        strategy = tf.distribute.ParameterServerStrategy(resolver)
        devices = [f"/job:ps/replica:0/task:{i}/device:CPU:0"
                   for i in range(num_ps)]
        with strategy.scope():
            model, _ = build(args, tf, tf_keras, de, devices=devices)
        # Where the strategy put the layer's per-step state (the ids and
        # rows of the current batch, TFRA's ShadowVariable): one variable
        # that every worker's steps write.
        emb = model.deep_emb if args.tables == "shared" else model.deep_embs[0]
        try:
            result["shadow_ids_device"] = str(emb.shadow.ids.device)
            result["table_devices"] = [str(d) for d in emb.params.devices]
        except Exception as e:  # noqa: BLE001  (a fact for the report only)
            result["shadow_ids_device"] = f"unknown ({type(e).__name__})"

        def dataset_fn(ctx):
            # The batches are constants of the dataset graph every worker
            # runs (the ids, not a file: workers share nothing else).
            return dataset(tf, features, labels, args.batch, True)

        creator = tf_keras.utils.experimental.DatasetCreator(dataset_fn)
        stage = "warm-up fit"
        t0 = time.perf_counter()
        model.fit(creator, epochs=1, steps_per_epoch=args.warmup_steps,
                  verbose=0)
        result["warmup_seconds"] = time.perf_counter() - t0
        stage = "timed fit"
        times = []

        class Clock(tf_keras.callbacks.Callback):
            def on_epoch_end(self, epoch, logs=None):
                times.append(time.perf_counter())

        model.fit(creator, epochs=1 + args.pss_epochs,
                  steps_per_epoch=args.steps, callbacks=[Clock()], verbose=0)
        seconds = times[-1] - times[0]
        result.update({
            "status": "ran", "seconds": seconds,
            "examples_per_sec": args.pss_epochs * args.steps * args.batch
            / seconds})
    except Exception as e:  # noqa: BLE001  (recorded, not hidden)
        text = f"{type(e).__name__}: {e}"
        result.update({"status": "failed", "stage": stage,
                       "error_type": type(e).__name__,
                       "error": text[:4000],
                       "traceback_tail": traceback.format_exc()[-3000:]})
    emit(result)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    configure(args.config)
    if args.mode in ("server", "pss_chief") and MULTI:
        raise SystemExit("--mode server/pss_chief: WD-400 only")
    if args.mode in ("server", "pss_chief") and args.impl != "tfra":
        raise SystemExit("--mode server/pss_chief are for --impl tfra")
    if args.mode == "quality" and args.impl == "dnn":
        raise SystemExit("--impl dnn has no quality mode (constant input)")
    tf, tf_keras, mod = import_stack(args.impl)
    if args.mode == "server":
        return run_server(args, tf)
    if args.mode == "pss_chief":
        return run_pss_chief(args, tf, tf_keras, mod)
    if args.mode == "throughput":
        run_throughput(args, tf, tf_keras, mod)
    else:
        run_quality(args, tf, tf_keras, mod)
    return 0


if __name__ == "__main__":
    sys.exit(main())
