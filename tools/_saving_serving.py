"""tools/bench_saving.py part 3: serving latency of tnet exports vs stock
Keras SavedModels, in processes that never import tnet."""
from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

import tnet as tn  # noqa: E402  (first: selects tf_keras)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

from tnet.data import CRITEO_CAT_COLUMNS, CRITEO_INT_COLUMNS  # noqa: E402
from tnet.data.synthetic import SyntheticCriteo  # noqa: E402
from tnet.models import WideDeep  # noqa: E402
from tnet.models.stock import stock_wide_deep  # noqa: E402
from tools import _bench_common as bc  # noqa: E402

from tools._saving_common import (  # noqa: E402
    HIDDEN,
    MB,
    QUANTIZE,
    dir_bytes,
    log)
from tools._saving_export import run_serving  # noqa: E402


# ---------------------------------------------------------------- serving
def tf_dataset(features, labels, batch):
    return tf.data.Dataset.from_tensor_slices((features, labels)).batch(
        batch).prefetch(2)


def serving_spec():
    spec = {n: tf.TensorSpec([None], tf.int64, name=n)
            for n in CRITEO_CAT_COLUMNS}
    spec.update({n: tf.TensorSpec([None], tf.float32, name=n)
                 for n in CRITEO_INT_COLUMNS})
    return spec


def bench_serving(args, work, measurements, extra):
    gen = SyntheticCriteo(seed=0, scale=args.scale)
    train_f, train_y, _ = gen.batch(args.train_examples, "train")
    hold_f, _, _ = gen.batch(512, "holdout")
    batches = {"b1": {k: v[:1] for k, v in hold_f.items()},
               "b512": hold_f}

    tf_keras.utils.set_random_seed(0)
    tnet_model = WideDeep(CRITEO_CAT_COLUMNS, CRITEO_INT_COLUMNS,
                          embedding_dim=8, hidden_units=HIDDEN)
    tnet_model.compile(tn.optimizer.Adagrad(0.05))
    t0 = time.perf_counter()
    tnet_model.fit(tf_dataset(train_f, train_y, args.batch), epochs=1,
                   verbose=0)
    tnet_train = time.perf_counter() - t0
    stock = stock_wide_deep(CRITEO_CAT_COLUMNS, CRITEO_INT_COLUMNS,
                            embedding_dim=8, num_bins=args.bins,
                            hidden_units=HIDDEN)
    stock.compile(tf_keras.optimizers.Adagrad(0.05),
                  tf_keras.losses.BinaryCrossentropy(from_logits=True))
    t0 = time.perf_counter()
    stock.fit(tf_dataset(train_f, train_y, args.batch), epochs=1, verbose=0)
    stock_train = time.perf_counter() - t0
    tables = tnet_model.tables()
    table_rows = {n: int(t.size()) for n, t in tables.items()}
    log(f"trained on {args.train_examples} examples: tnet {tnet_train:.0f}s "
        f"(rows {table_rows}), stock {stock_train:.0f}s "
        f"({stock.count_params():,} parameters)")

    dirs, export_info = {}, {}
    for q in QUANTIZE:
        name = "tnet" if q is None else f"tnet_{q}"
        d = os.path.join(work, "serve", name)
        t0 = time.perf_counter()
        tn.serving.export_for_serving(tnet_model, d, quantize=q)
        seconds = time.perf_counter() - t0
        with open(os.path.join(d, "export_info.json")) as f:
            info = json.load(f)
        info["export_seconds"] = seconds
        info["variables_bytes"] = dir_bytes(os.path.join(d, "variables"))
        info["total_bytes"] = dir_bytes(d)
        export_info[name] = info
        dirs[name] = d
    d = os.path.join(work, "serve", "stock")

    @tf.function(input_signature=[serving_spec()])
    def stock_serve(features):
        return {"prediction": tf.sigmoid(stock(features, training=False))}

    t0 = time.perf_counter()
    stock.save(d, save_format="tf", include_optimizer=False,
               signatures={"serving_default":
                           stock_serve.get_concrete_function()})
    export_info["stock"] = {"export_seconds": time.perf_counter() - t0,
                            "variables_bytes": dir_bytes(
                                os.path.join(d, "variables")),
                            "total_bytes": dir_bytes(d)}
    dirs["stock"] = d

    npz = {}
    for bname, feats in batches.items():
        arrays = dict(feats)
        pred = tnet_model(feats, training=False).numpy().reshape(-1)
        for name in dirs:
            if name.startswith("tnet"):
                arrays["__expected__." + name] = pred
        arrays["__expected__.stock"] = tf.sigmoid(
            stock(feats, training=False)).numpy().reshape(-1)
        path = os.path.join(work, "serve", f"{bname}.npz")
        np.savez(path, **arrays)
        npz[bname] = path
    del tnet_model, stock
    gc.collect()
    bc.release_free_memory()

    order = list(dirs)
    runs = []
    for r in range(args.serve_repeats):
        names = order if r % 2 == 0 else order[::-1]
        res = run_serving({n: dirs[n] for n in names}, npz, args.calls)
        runs.append(res)
        log(f"  serving run {r + 1}/{args.serve_repeats}: " + "; ".join(
            f"{b} " + ", ".join(
                f"{m} p50 {v['p50_ms']:.2f} p99 {v['p99_ms']:.2f} ms"
                for m, v in res["inputs"][b]["models"].items())
            for b in res["inputs"]))
    serving_cmd = runs[-1]["command"]

    sec = "serving (fresh process, no tnet)"
    for b in npz:
        batch = runs[0]["inputs"][b]["batch"]
        for stat in ("p50_ms", "p99_ms"):
            vals = {m: [run["inputs"][b]["models"][m][stat] for run in runs]
                    for m in dirs}
            label = stat.split("_")[0]
            measurements.append(bc.Measurement(
                sec, f"stock WD, batch {batch}, {label}", "ms", vals["stock"]))
            measurements.append(bc.Measurement(
                sec, f"tnet WD export, batch {batch}, {label}", "ms",
                vals["tnet"], "stock",
                bc.paired_ratios(vals["tnet"], vals["stock"]),
                higher_is_better=False))
            for q in ("float16", "int8"):
                m = f"tnet_{q}"
                measurements.append(bc.Measurement(
                    sec, f"tnet WD export {q}, batch {batch}, {label}", "ms",
                    vals[m], "tnet float32",
                    bc.paired_ratios(vals[m], vals["tnet"]),
                    higher_is_better=False))
    tol = {"tnet": 1e-5, "tnet_float16": 1e-3, "tnet_int8": 1e-2,
           "stock": 1e-5}
    diffs = {m: max(run["inputs"][b]["models"][m].get("max_abs_diff", 0.0)
                    for run in runs for b in npz) for m in dirs}
    for m, d in diffs.items():
        measurements.append(bc.Measurement(
            sec, f"max abs prediction diff, {m}", "abs", [d], note=(
                f"tolerance {tol[m]:g}: " + ("ok" if d <= tol[m]
                                             else "EXCEEDED"))))
    tnet_payload = sum(
        t["rows"] * (8 + 4 * t["dim"])
        for t in export_info["tnet"]["tables"].values())
    for m in dirs:
        info = export_info[m]
        load = statistics.median(run["models"][m]["load_seconds"]
                                 for run in runs)
        note = (f"variables/ {info['variables_bytes'] / MB:.1f} MB; load "
                f"{load:.1f}s in the serving process")
        ratios = None
        if m.startswith("tnet"):
            # Embedding part only: variables/ minus the dense variables.
            ratios = [(info["variables_bytes"] - info["dense_bytes"])
                      / tnet_payload]
            note += (f"; ratio = (variables/ - {info['dense_bytes'] / MB:.1f}"
                     f" MB dense) / payload {tnet_payload / MB:.1f} MB")
        measurements.append(bc.Measurement(
            sec, f"SavedModel size {m}", "MB", [info["total_bytes"] / MB],
            "payload rows*(8+4*dim)" if ratios else None, ratios,
            higher_is_better=False, note=note))
    extra["serving"] = {
        "train_examples": args.train_examples, "scale": args.scale,
        "bins": args.bins, "tnet_train_seconds": tnet_train,
        "stock_train_seconds": stock_train, "tnet_table_rows": table_rows,
        "exports": export_info, "runs": runs,
        "serving_command": serving_cmd,
        "serving_peak_rss_bytes": [run.get("peak_rss_bytes") for run in runs],
        "tnet_imported_in_serving": any(run["tnet_imported"] for run in runs)}
