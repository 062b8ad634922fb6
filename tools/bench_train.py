"""Training throughput and quality: tnet Wide&Deep vs stock tf_keras.

    python tools/bench_train.py            # WD-400, docs/BENCHMARK_PROTOCOL.md
    python tools/bench_train.py --quick    # small, checks the script works
    python tools/bench_train.py --config sparse_heavy [--quick]   # SPARSE-HEAVY

(SPARSE-HEAVY: see `main_sparse_heavy` below and tools/_sparse_heavy.py.)

One process, synthetic Criteo-like data (tnet.data.SyntheticCriteo: 26 id
columns, Zipf 1.1, about 5M distinct ids at --scale 1, 13 dense features,
label from a hidden logistic model). Configuration WD-400: deep dim 8, wide
dim 1, DNN 400-400-400, batch 4096.

Compared in the same run, alternating A, B, C, ...:
- tnet: tn.models.WideDeep, tn.optimizer.Adagrad (dense and in-table; the
  wide part uses its default in-table FTRL);
- stock: tf_keras Wide&Deep with 2**20 rows per column and per table, int64
  ids reduced with `tf.math.floormod` (the strongest stock baseline a
  competent user writes for int ids) + Embedding, tf_keras Adagrad (sparse
  row updates: stock's best);
- stock hashed: the same with `Hashing` (int -> string -> hash every step),
  the weaker baseline earlier runs compared against;
- tnet input forms: the same tnet model fed the same ids as `[B, 1]`,
  `[B, 2]` padded with -1, `tf.RaggedTensor` and `tf.SparseTensor`, each
  compared with `[B]` (every form takes the fused path);
- DNN-only: the same DNN fed a constant input of the same width (the
  physical limit of this dense-bound configuration);
- DNN with its input's gradient: the same behind a trainable per-feature
  scale, so that Keras also computes the gradient of the DNN's input, as
  every model that trains embeddings must (no target: tnet against it
  shows what the sparse side costs beyond that dense work).
Throughput: examples/s of the Keras train function over --steps steps
after a warm-up, median of --repeats, from in-memory batches (no parsing);
both models without training metrics. Quality: AUC on a fresh hold-out after --epochs epochs over
--train_examples examples, beside the oracle AUC of the true logits.
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tnet as tn  # noqa: E402  (first: selects tf_keras)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

from tnet.data import CRITEO_CAT_COLUMNS, CRITEO_INT_COLUMNS  # noqa: E402
from tnet.data.metrics import auc  # noqa: E402
from tnet.data.synthetic import SyntheticCriteo  # noqa: E402
from tnet.models import WideDeep  # noqa: E402
from tnet.models.stock import stock_wide_deep  # noqa: E402
from tools import _bench_common as bc  # noqa: E402
from tools import _sparse_heavy as sh  # noqa: E402

HIDDEN = (400, 400, 400)
# Arguments of the SPARSE-HEAVY path only: left out of WD-400's results.
_SPARSE_HEAVY_ARGS = ("config", "stock_forms")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", choices=("wd400", "sparse_heavy"),
                   default="wd400", help="protocol configuration")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--bins", type=int, default=2**20)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--train_examples", type=int, default=2**20)
    p.add_argument("--holdout_examples", type=int, default=2**17)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--no_forms", action="store_true",
                   help="skip the tnet input-form rows")
    p.add_argument("--stock_forms", default="ragged,padded",
                   help="sparse_heavy: stock variants timed, comma-separated "
                        f"from {sh.STOCK_FORMS}; the fastest is the baseline")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    if args.quick:
        args.scale, args.bins, args.steps, args.repeats = 0.05, 2**16, 10, 3
        args.train_examples, args.holdout_examples = 2**16, 2**14
    return args


FORMS = ("B1", "padded", "ragged", "sparse")
FORM_NAMES = {"B1": "[B, 1]", "padded": "[B, 2] padded with -1",
              "ragged": "RaggedTensor", "sparse": "SparseTensor"}


def _as_form(form):
    """Batch map: every [B] id column of a batch -> the given form."""
    def convert(features, labels):
        out = dict(features)
        for name in CRITEO_CAT_COLUMNS:
            ids = features[name]
            if form == "B1":
                ids = ids[:, tf.newaxis]
            elif form == "padded":
                ids = tf.stack([ids, tf.fill(tf.shape(ids), tf.constant(
                    -1, ids.dtype))], axis=1)
            else:
                ids = tf.RaggedTensor.from_tensor(ids[:, tf.newaxis])
                if form == "sparse":
                    ids = ids.to_sparse()
            out[name] = ids
        return out, labels
    return convert


def tf_dataset(features, labels, batch, repeat, form=None):
    """In-memory batches, sliced whole: per-example tf.data work (slicing
    1M rows one by one, then batching 40 columns) would cost more than a
    training step and hide both models behind the input pipeline. Real
    training reads batches from files (tnet.data parses whole batches)."""
    n = (len(labels) // batch) * batch
    ds = tf.data.Dataset.from_tensor_slices(
        ({k: v[:n].reshape(-1, batch) for k, v in features.items()},
         labels[:n].reshape(-1, batch)))
    if form is not None:  # converted once, then served from memory
        ds = ds.map(_as_form(form)).cache()
    if repeat:
        ds = ds.repeat()
    return ds.prefetch(4)


def build_tnet(lr):
    model = WideDeep(CRITEO_CAT_COLUMNS, CRITEO_INT_COLUMNS, embedding_dim=8,
                     hidden_units=HIDDEN, train_metrics=False)
    model.compile(tn.optimizer.Adagrad(lr))
    return model


def build_stock(lr, bins, reduce="floormod"):
    model = stock_wide_deep(CRITEO_CAT_COLUMNS, CRITEO_INT_COLUMNS,
                            embedding_dim=8, num_bins=bins, hidden_units=HIDDEN,
                            reduce=reduce)
    model.compile(tf_keras.optimizers.Adagrad(lr),
                  tf_keras.losses.BinaryCrossentropy(from_logits=True))
    return model


class _InputScale(tf_keras.layers.Layer):
    """A trainable per-feature scale (starts at 1): with it, Keras computes
    the gradient of the DNN's input, as every model that trains embeddings
    must (DNN-only on a constant input skips it)."""

    def build(self, shape):
        self.scale = self.add_weight("scale", shape=[shape[-1]],
                                     initializer="ones")

    def call(self, x):
        return x * self.scale


def build_dnn_only(lr, width, hidden=HIDDEN, input_grad=False):
    """The configuration's DNN on a constant [B, width] input; with
    `input_grad`, behind _InputScale (the DNN with its input's gradient)."""
    inputs = tf_keras.Input((width,))
    x = _InputScale()(inputs) if input_grad else inputs
    for units in hidden:
        x = tf_keras.layers.Dense(units, activation="relu")(x)
    model = tf_keras.Model(inputs, tf_keras.layers.Dense(1)(x))
    model.compile(tf_keras.optimizers.Adagrad(lr),
                  tf_keras.losses.BinaryCrossentropy(from_logits=True))
    return model


def dnn_dx_measurements(section, tnet_figure, values):
    """The DNN with its input's gradient, and tnet against it (no target:
    what the sparse side costs beyond the dense work any embedding model
    has)."""
    return [
        bc.Measurement(section, "DNN with its input's gradient (constant "
                       "input)", "examples/s", values["dnn_dx"], "DNN-only",
                       bc.paired_ratios(values["dnn_dx"], values["dnn_only"])),
        bc.Measurement(section, tnet_figure, "examples/s", values["tnet"],
                       "DNN with its input's gradient",
                       bc.paired_ratios(values["tnet"], values["dnn_dx"]))]


def stock_scores(model, ds):
    labels, scores = [], []
    for f, y in ds:
        scores.append(model(f, training=False).numpy().reshape(-1))
        labels.append(y.numpy())
    return np.concatenate(labels), np.concatenate(scores)


def main() -> int:
    args = parse_args()
    info = bc.run_info()
    if args.config == "sparse_heavy":
        return main_sparse_heavy(args, info)
    gen = SyntheticCriteo(seed=0, scale=args.scale)
    t0 = time.perf_counter()
    train_f, train_y, _ = gen.batch(args.train_examples, "train")
    hold_f, hold_y, hold_logits = gen.batch(args.holdout_examples, "holdout")
    print(f"data: {args.train_examples} train / {args.holdout_examples} "
          f"hold-out examples, {gen.total_ids} distinct ids possible, "
          f"generated in {time.perf_counter() - t0:.1f}s", flush=True)
    width = 26 * 8 + 13
    const = tf.zeros([args.batch, width])
    dnn_ds = tf.data.Dataset.from_tensors(
        (const, tf.zeros([args.batch, 1]))).repeat()

    models = {"tnet": build_tnet(args.lr),
              "stock": build_stock(args.lr, args.bins),
              "stock_hashing": build_stock(args.lr, args.bins, "hashing"),
              "dnn_only": build_dnn_only(args.lr, width),
              "dnn_dx": build_dnn_only(args.lr, width, input_grad=True)}
    data = {"tnet": tf_dataset(train_f, train_y, args.batch, True),
            "stock": tf_dataset(train_f, train_y, args.batch, True),
            "stock_hashing": tf_dataset(train_f, train_y, args.batch, True),
            "dnn_only": dnn_ds, "dnn_dx": dnn_ds}
    forms = () if args.no_forms else FORMS
    for form in forms:
        models[f"tnet_{form}"] = build_tnet(args.lr)
        data[f"tnet_{form}"] = tf_dataset(train_f, train_y, args.batch, True,
                                          form)
    iters = {k: iter(v) for k, v in data.items()}

    def fit_steps(name, steps):
        model = models[name]
        it = iters[name]
        fn = model.make_train_function()
        start = time.perf_counter()
        for _ in range(steps):
            logs = fn(it)
        tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, logs)
        return args.batch * steps / (time.perf_counter() - start)

    for name in models:  # warm-up: trace, create rows for frequent ids
        fit_steps(name, 3)
    print("throughput (examples/s), alternating:", flush=True)
    values = bc.alternate({n: (lambda n=n: fit_steps(n, args.steps))
                           for n in models}, args.repeats)
    measurements = [
        bc.Measurement("WD-400 one process", "DNN-only (constant input)",
                       "examples/s", values["dnn_only"]),
        bc.Measurement("WD-400 one process", "stock floormod WD, Adagrad",
                       "examples/s", values["stock"], "DNN-only",
                       bc.paired_ratios(values["stock"], values["dnn_only"])),
        bc.Measurement("WD-400 one process", "stock hashed WD, Adagrad",
                       "examples/s", values["stock_hashing"], "DNN-only",
                       bc.paired_ratios(values["stock_hashing"],
                                        values["dnn_only"])),
        bc.Measurement("WD-400 one process", "tnet WD, Adagrad", "examples/s",
                       values["tnet"], "DNN-only",
                       bc.paired_ratios(values["tnet"], values["dnn_only"]),
                       target=0.9),
        bc.Measurement("WD-400 one process", "tnet WD, Adagrad", "examples/s",
                       values["tnet"], "stock floormod Adagrad",
                       bc.paired_ratios(values["tnet"], values["stock"]),
                       target=1.5, note="strongest stock baseline"),
        bc.Measurement("WD-400 one process", "tnet WD, Adagrad", "examples/s",
                       values["tnet"], "stock hashed Adagrad",
                       bc.paired_ratios(values["tnet"],
                                        values["stock_hashing"])),
        *dnn_dx_measurements("WD-400 one process", "tnet WD, Adagrad",
                             values),
    ]
    for form in forms:
        measurements.append(bc.Measurement(
            "WD-400 input forms", f"tnet WD, ids as {FORM_NAMES[form]}",
            "examples/s", values[f"tnet_{form}"], "tnet, ids as [B]",
            bc.paired_ratios(values[f"tnet_{form}"], values["tnet"]),
            target=1.0, note="same fused path as [B]"))
    for name in [n for n in models if n != "tnet" and n != "stock"]:
        del models[name]

    # Quality: fresh models, the same examples, in the same order.
    quality = {}
    hold_ds = tf_dataset(hold_f, hold_y, args.batch, False)
    for name, builder in (("tnet", lambda: build_tnet(args.lr)),
                          ("stock", lambda: build_stock(args.lr, args.bins))):
        models.pop(name, None)
        gc.collect()
        tf_keras.utils.set_random_seed(0)
        model = builder()
        start = time.perf_counter()
        model.fit(tf_dataset(train_f, train_y, args.batch, False),
                  epochs=args.epochs, verbose=0)
        seconds = time.perf_counter() - start
        if name == "tnet":
            result = model.evaluate_exact(hold_ds)
            extra = {"rows": {n: int(t.size()) for n, t in model.tables().items()},
                     "table_bytes": {n: int(t.memory_bytes())
                                     for n, t in model.tables().items()}}
        else:
            y, s = stock_scores(model, hold_ds)
            result = {"auc": auc(y, s), "examples": int(y.size)}
            extra = {"parameters": int(model.count_params())}
        quality[name] = {"auc": result["auc"], "train_seconds": seconds, **extra}
        print(f"quality {name}: AUC {result['auc']:.4f} after {args.epochs} "
              f"epochs ({seconds:.0f}s)", flush=True)
        del model
    n_hold = (args.holdout_examples // args.batch) * args.batch
    oracle = auc(hold_y[:n_hold], hold_logits[:n_hold])
    quality["oracle_auc"] = oracle
    measurements.append(bc.Measurement(
        "quality", "hold-out AUC, tnet - stock", "AUC",
        [quality["tnet"]["auc"] - quality["stock"]["auc"]],
        note=f"tnet {quality['tnet']['auc']:.4f}, stock "
             f"{quality['stock']['auc']:.4f}, oracle {oracle:.4f}; target >= +0.01"))
    title = "bench_train: WD-400, one process" + (" (quick)" if args.quick else "")
    md = bc.header_markdown(info, title) + "\n\n" + bc.markdown_table(measurements)
    md += (f"\n\nQuality after {args.epochs} epochs over {args.train_examples} "
           f"examples (hold-out {n_hold}): tnet AUC {quality['tnet']['auc']:.4f}, "
           f"stock {quality['stock']['auc']:.4f}, oracle {oracle:.4f}.")
    out = args.out or bc.default_out_path("bench_train" + ("-quick" if args.quick else ""))
    config = {k: v for k, v in vars(args).items() if k not in _SPARSE_HEAVY_ARGS}
    bc.write_results(out, info, measurements, md,
                     extra={"config": config, "quality": quality})
    print(md)
    return 0


# ------------------------------------------------------------- SPARSE-HEAVY
def sparse_heavy_dataset(features, labels, batch, multi, form="ragged"):
    """Whole in-memory batches (as `tf_dataset`) whose multi-valued columns
    are `tf.RaggedTensor` [B, None] (form "ragged": what tnet.data's list
    readers yield; the values of the padded arrays only) or int64 [B, 50]
    padded with -1 (form "padded"). Not repeated, not prefetched."""
    n = (len(labels) // batch) * batch
    sliced = {}
    for k, v in features.items():
        v = v[:n]
        if k in multi and form == "ragged":
            keep = v >= 0
            rows = tf.RaggedTensor.from_row_lengths(v[keep], keep.sum(axis=1))
            sliced[k] = tf.RaggedTensor.from_uniform_row_length(rows, batch)
        else:
            sliced[k] = v.reshape((-1, batch) + v.shape[1:])
    return tf.data.Dataset.from_tensor_slices(
        (sliced, labels[:n].reshape(-1, batch)))


def main_sparse_heavy(args, info) -> int:
    """SPARSE-HEAVY, one process (tools/_sparse_heavy.py has the models).

    Multi-valued ids reach both models as `tf.RaggedTensor` [B, None] (what
    tnet.data's readers give for list cells). Rows, alternating:
    - tnet: tn.models.WideDeep, tn.optimizer.Adagrad;
    - stock (`--stock_forms`): tf_keras Wide&Deep, floormod into 2**20 bins
      per column and per table, M1..M4 pooled over their real ids
      (ragged input; or [B, 50] padded with -1 and the padding dropped by
      boolean_mask, "padded"; or all 50 slots looked up and masked,
      "masked"), tf_keras Adagrad. The fastest (median) is the baseline of
      the >= 2x target;
    - tnet with M1..M4 as [B, 50] padded with -1 (input form, vs ragged;
      skipped with --no_forms);
    - DNN-only: the 128-64 DNN fed a constant [B, 493] input, and the
      same with its input's gradient (build_dnn_only's input_grad).
    Quality: fresh tnet and stock (ragged) models, the same examples in the
    same order, hold-out AUC beside the oracle's.
    """
    cats, multi, _ = sh.columns()
    forms = [f.strip() for f in args.stock_forms.split(",") if f.strip()]
    bad = [f for f in forms if f not in sh.STOCK_FORMS]
    if bad or not forms:
        raise SystemExit(f"--stock_forms: expected some of {sh.STOCK_FORMS}, "
                         f"got {args.stock_forms!r}")
    gen = SyntheticCriteo(seed=0, scale=args.scale, multi_valued=sh.MULTI_VALUED)
    t0 = time.perf_counter()
    train_f, train_y, _ = gen.batch(args.train_examples, "train")
    hold_f, hold_y, hold_logits = gen.batch(args.holdout_examples, "holdout")
    lengths = np.stack([(train_f[m] >= 0).sum(axis=1) for m in multi])
    print(f"data: {args.train_examples} train / {args.holdout_examples} "
          f"hold-out examples, {gen.total_ids} distinct ids possible, "
          f"{lengths.mean():.1f} ids per multi-valued cell (max "
          f"{lengths.max()}), generated in {time.perf_counter() - t0:.1f}s",
          flush=True)
    ragged = sparse_heavy_dataset(train_f, train_y, args.batch, multi)
    padded = (sparse_heavy_dataset(train_f, train_y, args.batch, multi, "padded")
              if not args.no_forms or forms != ["ragged"] else None)
    del train_f
    hold_ds = sparse_heavy_dataset(hold_f, hold_y, args.batch, multi).prefetch(4)
    width = sh.deep_width()
    dnn_ds = tf.data.Dataset.from_tensors(
        (tf.zeros([args.batch, width]), tf.zeros([args.batch, 1]))).repeat()

    models = {"tnet": sh.build_tnet(args.lr)}
    data = {"tnet": ragged.repeat().prefetch(4)}
    for form in forms:
        models[f"stock_{form}"] = sh.build_stock(args.lr, args.bins, form)
        data[f"stock_{form}"] = (ragged if form == "ragged" else padded
                                 ).repeat().prefetch(4)
    if not args.no_forms:
        models["tnet_padded"] = sh.build_tnet(args.lr)
        data["tnet_padded"] = padded.repeat().prefetch(4)
    for name, dx in (("dnn_only", False), ("dnn_dx", True)):
        models[name] = build_dnn_only(args.lr, width, sh.HIDDEN, dx)
        data[name] = dnn_ds
    iters = {k: iter(v) for k, v in data.items()}

    def fit_steps(name, steps):
        fn = models[name].make_train_function()
        it = iters[name]
        start = time.perf_counter()
        for _ in range(steps):
            logs = fn(it)
        tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, logs)
        return args.batch * steps / (time.perf_counter() - start)

    for name in models:  # warm-up: trace, create rows for frequent ids
        fit_steps(name, 3)
    print("throughput (examples/s), alternating:", flush=True)
    values = bc.alternate({n: (lambda n=n: fit_steps(n, args.steps))
                           for n in models}, args.repeats)
    section = "SPARSE-HEAVY one process"
    best = max(forms, key=lambda f: np.median(values[f"stock_{f}"]))
    form_names = {"ragged": "M as RaggedTensor",
                  "padded": "M as [B, 50] padded, boolean_mask",
                  "masked": "M as [B, 50] padded, masked 50 slots"}
    measurements = [bc.Measurement(section, "DNN-only (constant input)",
                                   "examples/s", values["dnn_only"])]
    for form in forms:
        measurements.append(bc.Measurement(
            section, f"stock floormod WD, Adagrad, {form_names[form]}",
            "examples/s", values[f"stock_{form}"],
            note="fastest stock: the baseline" if form == best else ""))
    measurements.append(bc.Measurement(
        section, "tnet WD, Adagrad, M as RaggedTensor", "examples/s",
        values["tnet"], f"stock floormod Adagrad ({best})",
        bc.paired_ratios(values["tnet"], values[f"stock_{best}"]),
        target=2.0, note="strongest stock baseline"))
    for form in forms:
        if form != best:
            measurements.append(bc.Measurement(
                section, "tnet WD, Adagrad, M as RaggedTensor", "examples/s",
                values["tnet"], f"stock floormod Adagrad ({form})",
                bc.paired_ratios(values["tnet"], values[f"stock_{form}"])))
    measurements.append(bc.Measurement(
        section, "tnet WD, Adagrad, M as RaggedTensor", "examples/s",
        values["tnet"], "DNN-only",
        bc.paired_ratios(values["tnet"], values["dnn_only"])))
    measurements += dnn_dx_measurements(
        section, "tnet WD, Adagrad, M as RaggedTensor", values)
    if not args.no_forms:
        measurements.append(bc.Measurement(
            "SPARSE-HEAVY input forms", "tnet WD, M as [B, 50] padded with -1",
            "examples/s", values["tnet_padded"], "tnet, M as RaggedTensor",
            bc.paired_ratios(values["tnet_padded"], values["tnet"]),
            target=1.0, note="every input form as fast (protocol)"))
    models.clear()
    iters.clear()
    gc.collect()

    # Quality: fresh models, the same examples, in the same order.
    quality = {}
    for name, builder in (("tnet", lambda: sh.build_tnet(args.lr)),
                          ("stock", lambda: sh.build_stock(args.lr, args.bins))):
        gc.collect()
        tf_keras.utils.set_random_seed(0)
        model = builder()
        start = time.perf_counter()
        model.fit(ragged.prefetch(4), epochs=args.epochs, verbose=0)
        seconds = time.perf_counter() - start
        if name == "tnet":
            result = model.evaluate_exact(hold_ds)
            extra = {"rows": {n: int(t.size()) for n, t in model.tables().items()},
                     "table_bytes": {n: int(t.memory_bytes())
                                     for n, t in model.tables().items()}}
        else:
            y, z = stock_scores(model, hold_ds)
            result = {"auc": auc(y, z), "examples": int(y.size)}
            extra = {"parameters": int(model.count_params())}
        quality[name] = {"auc": result["auc"], "train_seconds": seconds, **extra}
        print(f"quality {name}: AUC {result['auc']:.4f} after {args.epochs} "
              f"epochs ({seconds:.0f}s)", flush=True)
        del model
    n_hold = (args.holdout_examples // args.batch) * args.batch
    oracle = auc(hold_y[:n_hold], hold_logits[:n_hold])
    quality["oracle_auc"] = oracle
    measurements.append(bc.Measurement(
        "quality", "hold-out AUC, tnet - stock", "AUC",
        [quality["tnet"]["auc"] - quality["stock"]["auc"]],
        note=f"tnet {quality['tnet']['auc']:.4f}, stock "
             f"{quality['stock']['auc']:.4f}, oracle {oracle:.4f}; target >= 0"))
    title = "bench_train: SPARSE-HEAVY, one process" + (" (quick)" if args.quick else "")
    md = bc.header_markdown(info, title) + "\n\n" + bc.markdown_table(measurements)
    md += (f"\n\nSetup: 26 synthetic Criteo columns + {len(multi)} multi-valued "
           f"(mean {lengths.mean():.1f}, max {lengths.max()} ids per row), dim "
           f"{sh.EMBEDDING_DIM} for every column, DNN {sh.HIDDEN}, batch "
           f"{args.batch}, Adagrad lr {args.lr}; stock {args.bins} floormod "
           "bins per column and per table. Quality after "
           f"{args.epochs} epochs over {args.train_examples} examples (hold-out "
           f"{n_hold}): tnet AUC {quality['tnet']['auc']:.4f}, stock "
           f"{quality['stock']['auc']:.4f}, oracle {oracle:.4f}.")
    out = args.out or bc.default_out_path(
        "bench_train-sparse_heavy" + ("-quick" if args.quick else ""))
    bc.write_results(out, info, measurements, md,
                     extra={"config": vars(args), "quality": quality,
                            "baseline_stock_form": best})
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
