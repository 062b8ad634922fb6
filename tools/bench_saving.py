"""Checkpoint, export and serving benchmark (issue 5).

    python tools/bench_saving.py            # 10M-row table, full figures
    python tools/bench_saving.py --quick    # small, checks the script works

One run measures, in this process unless said otherwise:

1. Checkpoints of one table (--rows, default 10M; dim 16; tn Adagrad, so 16
   accumulators per row) inside a minimal tn.Model (EmbeddingFeatures over
   one id column, Dense(1)). The table is filled with `pull(training=True)`
   in 1M-key chunks, then every row gets one `push` (so slots and meta are
   not initial values).
   - full save (`tn.saving.save`): MB/s = bytes of the checkpoint directory
     / seconds, and peak RSS growth while saving (VmHWM after minus VmRSS
     before; VmHWM is reset through /proc/self/clear_refs after
     `release_free_memory`);
   - restore of that checkpoint into a fresh model (MB/s, same bytes), with
     a spot check (weights of 100k keys pulled from both models equal);
   - full save and restore alternate (save, restore, save, restore, ...);
   - incremental: a tracked full save (`incremental=True`, first in its
     directory), then --repeats times: push to 1% of the rows (random keys,
     step = optimizer.iterations + 1), `save(..., incremental=True)`; time,
     bytes and peak RSS of each delta, ratios vs the median full save; then
     one restore of the chain (full + deltas) into a fresh model, checked on
     the changed keys.
2. Export size per quantize mode (None / float16 / int8) of the same table:
   bytes of the SavedModel's `variables/` vs the raw payload rows * (8 key +
   4 * dim), plus export time and peak RSS growth.
3. Serving latency: tn.models.WideDeep (WD-400 shape: deep dim 8, DNN
   400-400-400) trained briefly (--train_examples of SyntheticCriteo, one
   epoch, tn Adagrad 0.05), exported with `export_for_serving` (float32, and
   float16 / int8 as extras), against the stock tf_keras Wide&Deep of the
   benchmark protocol (`stock_wide_deep`, --bins hash bins, tf_keras Adagrad
   0.05, same examples) saved with `model.save(save_format="tf",
   include_optimizer=False)` and a `serving_default` signature over the same
   raw features returning the sigmoid. `tools/_serve_latency.py` loads all
   of them in a fresh process that never imports tnet and times batch 1 and
   batch 512 (hold-out examples) alternately in blocks of 10 calls
   (--calls per model after a warm-up); --serve_repeats such processes, the
   order of models reversed every other run. Ratios are tnet / stock per run
   (lower is better), median over runs.

Outputs bench/results/bench_saving[-quick]-<date>.{json,md}. Checkpoints and
exports go to a temporary directory (--workdir), deleted at the end unless
--keep_files. Disk: about 2 full checkpoints of the table at a time (~1.6 GB
each at 10M rows) plus one export.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
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
from tools import procfs  # noqa: E402

MB = 1e6
CHUNK = 1 << 20
HIDDEN = (400, 400, 400)
SERVE_SCRIPT = os.path.join(REPO_ROOT, "tools", "_serve_latency.py")
QUANTIZE = (None, "float16", "int8")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--changed", type=float, default=0.01,
                   help="fraction of rows pushed before each delta")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--bins", type=int, default=2**20)
    p.add_argument("--train_examples", type=int, default=2**18)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--serve_repeats", type=int, default=3)
    p.add_argument("--workdir", default=None)
    p.add_argument("--keep_files", action="store_true")
    p.add_argument("--skip", default="",
                   help="comma list of parts to skip: ckpt,export,serve")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    if args.quick:
        args.rows, args.scale, args.bins = 500_000, 0.05, 2**16
        args.train_examples, args.calls = 2**15, 50
    args.skip = {s for s in args.skip.split(",") if s}
    return args


def log(msg):
    print(msg, flush=True)


# ----------------------------------------------------------------- memory
def _status_kib(field):
    value = procfs.status_bytes(field)
    return -1 if value is None else value


class PeakRss:
    """Peak RSS growth over a block: VmHWM after - VmRSS before.

    Frees what it can first (gc + malloc_trim), then resets VmHWM to the
    current RSS by writing 5 to /proc/self/clear_refs (Linux >= 4.0). If the
    reset is not allowed, the growth is only a lower bound when an earlier
    peak was higher; `exact` says which.
    """

    def __enter__(self):
        bc.release_free_memory()
        self.exact = procfs.reset_peak()
        self.before = _status_kib("VmRSS")
        self.hwm_before = _status_kib("VmHWM")
        return self

    def __exit__(self, *exc):
        self.peak = _status_kib("VmHWM")
        if not self.exact and self.peak <= self.hwm_before:
            self.growth = None
        else:
            self.growth = self.peak - self.before
        return False


def dir_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f))
               for d, _, files in os.walk(path) for f in files)


# ------------------------------------------------------------ table model
def build_table_model(dim):
    col = tn.feature_column.embedding_column(
        tn.feature_column.category_column("id"), dim)
    inputs = {"id": tf_keras.Input((), dtype=tf.int64, name="id")}
    emb = tn.layers.EmbeddingFeatures([col], name="emb")(inputs)
    out = tf_keras.layers.Dense(1, name="out")(emb)
    model = tn.Model(inputs, out)
    model.compile(tn.optimizer.Adagrad(0.05),
                  tf_keras.losses.BinaryCrossentropy(from_logits=True))
    return model


def table_of(model):
    tables = model.tables()
    if len(tables) != 1:
        # A compiled functional model whose tables were recreated by compile
        # has none until called; build them as restore would.
        for layer in model.tnet_layers():
            layer._create_tables()  # noqa: SLF001
        tables = model.tables()
    (table,) = tables.values()
    return table


def table_keys(rows):
    """`rows` distinct keys spread over int64 (odd multiplier mod 2^62)."""
    k = np.arange(rows, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15 >> 2 | 1)
    return (k & np.uint64((1 << 62) - 1)).astype(np.int64)


def fill_table(model, keys, dim):
    """One training step (builds dense/optimizer state), then `pull` every
    key with training=True and `push` a gradient to every row."""
    x = {"id": keys[:256]}
    model.fit(x, np.zeros(256, np.float32), batch_size=256, epochs=1,
              verbose=0)
    table = table_of(model)
    rng = np.random.default_rng(1)
    step = int(model.optimizer.iterations.numpy())
    t0 = time.perf_counter()
    for a in range(0, len(keys), CHUNK):
        table.pull(keys[a:a + CHUNK], training=True)
    t1 = time.perf_counter()
    for a in range(0, len(keys), CHUNK):
        k = keys[a:a + CHUNK]
        g = rng.normal(0, 0.1, (len(k), dim)).astype(np.float32)
        table.push(k, g, step=step, shows=np.ones(len(k), np.float32))
    t2 = time.perf_counter()
    return {"pull_seconds": t1 - t0, "push_seconds": t2 - t1,
            "rows": int(table.size()), "memory_bytes": int(table.memory_bytes())}


def push_changed(model, keys, n, dim, rng):
    """optimizer.iterations += 1, then one push to n random existing keys
    at that step (a training step's worth of row changes)."""
    model.optimizer.iterations.assign_add(1)
    step = int(model.optimizer.iterations.numpy())
    changed = keys[rng.choice(len(keys), n, replace=False)]
    g = rng.normal(0, 0.1, (n, dim)).astype(np.float32)
    table_of(model).push(changed, g, step=step,
                         shows=np.ones(n, np.float32))
    return changed, step


def same_rows(model_a, model_b, keys):
    a = table_of(model_a).pull(keys, training=False).numpy()
    b = table_of(model_b).pull(keys, training=False).numpy()
    return bool(np.array_equal(a, b))


def timed_save(model, directory, step, incremental):
    lines = []
    with PeakRss() as mem:
        t0 = time.perf_counter()
        path = tn.saving.save(model, directory, step=step,
                              incremental=incremental, progress=lines.append)
        seconds = time.perf_counter() - t0
    manifest = tn.saving.read_manifest(path)
    return {"path": path, "seconds": seconds, "bytes": dir_bytes(path),
            "kind": manifest["kind"],
            "rows_written": sum(t["rows_written"]
                                for t in manifest["tables"].values()),
            "full_reason": manifest.get("full_reason"),
            "rss_growth": mem.growth, "rss_exact": mem.exact}


def timed_restore(path, dim, track=False):
    fresh = build_table_model(dim)
    lines = []
    with PeakRss() as mem:
        t0 = time.perf_counter()
        tn.saving.restore(fresh, path, track_changes=track,
                          progress=lines.append)
        seconds = time.perf_counter() - t0
    return fresh, {"seconds": seconds, "rss_growth": mem.growth}


def bench_checkpoints(args, work, measurements, extra):
    dim = args.dim
    keys = table_keys(args.rows)
    model = build_table_model(dim)
    log(f"filling a {args.rows:,}-row table (dim {dim}, Adagrad) ...")
    fill = fill_table(model, keys, dim)
    payload_row = 8 + 4 * dim + 4 * dim + 24  # key, weights, slots, meta
    fill["checkpoint_payload_bytes"] = fill["rows"] * payload_row
    extra["table"] = fill
    log(f"  {fill['rows']:,} rows, table memory {fill['memory_bytes'] / MB:.0f}"
        f" MB; pull {fill['pull_seconds']:.1f}s, push "
        f"{fill['push_seconds']:.1f}s")
    sample = keys[np.random.default_rng(2).choice(len(keys), 100_000,
                                                  replace=False)]
    step = int(model.optimizer.iterations.numpy())

    # Full save / restore, alternating.
    saves, restores = [], []
    for r in range(args.repeats):
        d = os.path.join(work, f"full-{r}")
        s = timed_save(model, d, step, incremental=False)
        saves.append(s)
        fresh, rs = timed_restore(s["path"], dim)
        rs["exact_sample"] = same_rows(model, fresh, sample)
        restores.append(rs)
        del fresh
        gc.collect()
        shutil.rmtree(d, ignore_errors=True)
        log(f"  repeat {r + 1}/{args.repeats}: full save {s['seconds']:.1f}s "
            f"({s['bytes'] / MB / s['seconds']:.0f} MB/s, {s['bytes'] / MB:.0f}"
            f" MB, RSS +{(s['rss_growth'] or 0) / MB:.0f} MB), restore "
            f"{rs['seconds']:.1f}s ({s['bytes'] / MB / rs['seconds']:.0f} "
            f"MB/s, RSS +{(rs['rss_growth'] or 0) / MB:.0f} MB, sample "
            f"{'exact' if rs['exact_sample'] else 'DIFFERS'}); process RSS "
            f"{bc.rss_bytes() / 2**30:.1f} GiB")
    full_seconds = [s["seconds"] for s in saves]
    full_bytes = statistics.median(s["bytes"] for s in saves)
    sec = "checkpoint 10M x 16 Adagrad" if args.rows == 10_000_000 else (
        f"checkpoint {args.rows:,} x {dim} Adagrad")
    measurements += [
        bc.Measurement(sec, "full save", "MB/s",
                       [s["bytes"] / MB / s["seconds"] for s in saves],
                       note=f"{full_bytes / MB:.0f} MB written (payload "
                            f"{fill['checkpoint_payload_bytes'] / MB:.0f} MB)"),
        bc.Measurement(sec, "full save", "s", full_seconds),
        bc.Measurement(sec, "restore (fresh model)", "MB/s",
                       [s["bytes"] / MB / r["seconds"]
                        for s, r in zip(saves, restores)],
                       note="spot check of 100k keys: " + (
                           "exact" if all(r["exact_sample"] for r in restores)
                           else "DIFFERS")),
        bc.Measurement(sec, "restore (fresh model)", "s",
                       [r["seconds"] for r in restores]),
        bc.Measurement(sec, "peak RSS growth, full save", "MB",
                       [s["rss_growth"] / MB for s in saves],
                       "1 GB (issue 5 limit)",
                       [s["rss_growth"] / 1e9 for s in saves], target=1.0,
                       higher_is_better=False),
        bc.Measurement(sec, "peak RSS growth, restore", "MB",
                       [r["rss_growth"] / MB for r in restores],
                       note="includes the restored table itself (source "
                            f"table {fill['memory_bytes'] / MB:.0f} MB)"),
    ]
    extra["full_saves"] = [{k: v for k, v in s.items() if k != "path"}
                           for s in saves]
    extra["restores"] = restores

    # Incremental: tracked full save, then deltas after 1% changed rows.
    d = os.path.join(work, "incremental")
    base = timed_save(model, d, step, incremental=True)
    log(f"  tracked full save (incremental=True, first): "
        f"{base['seconds']:.1f}s, RSS +{(base['rss_growth'] or 0) / MB:.0f} MB")
    n_changed = max(1, int(args.rows * args.changed))
    rng = np.random.default_rng(3)
    deltas, changed_all = [], []
    for r in range(args.repeats):
        changed, step = push_changed(model, keys, n_changed, dim, rng)
        changed_all.append(changed)
        s = timed_save(model, d, step, incremental=True)
        deltas.append(s)
        log(f"  delta {r + 1}/{args.repeats}: {s['kind']}, "
            f"{s['rows_written']:,} rows written, {s['bytes'] / MB:.1f} MB in "
            f"{s['seconds']:.1f}s, RSS +{(s['rss_growth'] or 0) / MB:.0f} MB"
            + (f" (full because: {s['full_reason']})" if s["kind"] != "delta"
               else ""))
    fresh, chain = timed_restore(deltas[-1]["path"], dim)
    changed_all = np.unique(np.concatenate(changed_all))
    chain["exact_changed"] = same_rows(model, fresh, changed_all)
    chain["exact_sample"] = same_rows(model, fresh, sample)
    del fresh
    gc.collect()
    chain_bytes = base["bytes"] + sum(s["bytes"] for s in deltas)
    log(f"  restore of full + {len(deltas)} deltas: {chain['seconds']:.1f}s "
        f"(changed keys {'exact' if chain['exact_changed'] else 'DIFFER'})")
    kinds = {s["kind"] for s in deltas}
    measurements += [
        bc.Measurement(sec, f"incremental save, {args.changed:.0%} rows "
                       "changed", "s", [s["seconds"] for s in deltas],
                       "full save",
                       [s["seconds"] / f for s, f in zip(deltas, full_seconds)],
                       higher_is_better=False,
                       note=f"kinds {sorted(kinds)}; rows written "
                            f"{[s['rows_written'] for s in deltas]}"),
        bc.Measurement(sec, "incremental save size", "MB",
                       [s["bytes"] / MB for s in deltas], "full save",
                       [s["bytes"] / full_bytes for s in deltas],
                       higher_is_better=False),
        bc.Measurement(sec, "peak RSS growth, incremental save", "MB",
                       [s["rss_growth"] / MB for s in deltas]),
        bc.Measurement(sec, "tracked full save (incremental=True, first)",
                       "s", [base["seconds"]], "full save",
                       [base["seconds"] / statistics.median(full_seconds)],
                       higher_is_better=False,
                       note=f"RSS +{(base['rss_growth'] or 0) / MB:.0f} MB"),
        bc.Measurement(sec, f"restore full + {len(deltas)} deltas", "s",
                       [chain["seconds"]], note=(
                           f"{chain_bytes / MB:.0f} MB read; changed keys "
                           + ("exact" if chain["exact_changed"] else "DIFFER"))),
    ]
    extra["incremental"] = {
        "tracked_full": {k: v for k, v in base.items() if k != "path"},
        "deltas": [{k: v for k, v in s.items() if k != "path"}
                   for s in deltas],
        "chain_restore": chain, "changed_rows_per_delta": n_changed}
    shutil.rmtree(d, ignore_errors=True)
    return model, keys


# ----------------------------------------------------------------- export
def bench_export(args, work, model, measurements, extra):
    dim = args.dim
    rows = int(table_of(model).size())
    payload = rows * (8 + 4 * dim)
    sec = "export (same table)"
    signature = {"id": tf.TensorSpec([None], tf.int64)}
    out = {}
    for q in QUANTIZE:
        d = os.path.join(work, f"export-{q or 'float32'}")
        with PeakRss() as mem:
            t0 = time.perf_counter()
            tn.saving.export_for_serving(model, d, quantize=q,
                                         input_signature=signature)
            seconds = time.perf_counter() - t0
        var_bytes = dir_bytes(os.path.join(d, "variables"))
        total = dir_bytes(d)
        with open(os.path.join(d, "export_info.json")) as f:
            info = json.load(f)
        out[q or "float32"] = {"seconds": seconds, "variables_bytes": var_bytes,
                               "total_bytes": total,
                               "rss_growth": mem.growth, "info": info}
        log(f"  export quantize={q}: variables/ {var_bytes / MB:.0f} MB "
            f"({var_bytes / payload:.2f}x payload {payload / MB:.0f} MB), "
            f"total {total / MB:.0f} MB, {seconds:.1f}s, RSS "
            f"+{(mem.growth or 0) / MB:.0f} MB")
        if q is None:
            out["float32"]["serving_load"] = serve_table_export(
                args, work, model, d)
        measurements.append(bc.Measurement(
            sec, f"variables/ size, quantize={q}", "MB", [var_bytes / MB],
            "payload rows*(8+4*dim)", [var_bytes / payload],
            higher_is_better=False,
            note=f"{seconds:.1f}s, peak RSS +{(mem.growth or 0) / MB:.0f} MB"))
        shutil.rmtree(d, ignore_errors=True)
    load = out["float32"]["serving_load"]
    measurements.append(bc.Measurement(
        sec, "load in a fresh process (float32)", "s",
        [load["models"]["table"]["load_seconds"]], note=(
            f"serving process peak RSS {load['peak_rss_bytes'] / MB:.0f} MB; "
            f"batch 512 p50 {load['inputs']['b512']['models']['table']['p50_ms']:.2f} ms; "
            f"max abs diff {load['inputs']['b512']['models']['table']['max_abs_diff']:.1e}")))
    measurements.append(bc.Measurement(
        sec, "peak RSS growth, export (float32)", "MB",
        [out["float32"]["rss_growth"] / MB], "table memory",
        [out["float32"]["rss_growth"] / extra["table"]["memory_bytes"]],
        higher_is_better=False))
    extra["export"] = {"rows": rows, "payload_bytes": payload, "modes": out}


def serve_env():
    """The environment of a serving process: no tnet-selected Keras."""
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env


def run_serving(models, inputs, calls):
    """Runs tools/_serve_latency.py on {name: dir} x {name: npz}; its JSON."""
    cmd = [sys.executable, SERVE_SCRIPT, "--calls", str(calls)]
    for n, d in models.items():
        cmd += ["--model", f"{n}={d}"]
    for b, path in inputs.items():
        cmd += ["--inputs", f"{b}={path}"]
    proc = subprocess.run(cmd, capture_output=True, text=True,
                          env=serve_env(), cwd="/")
    if proc.returncode != 0:
        raise RuntimeError(f"serving process failed ({proc.returncode}):"
                           f"\n{proc.stderr[-3000:]}")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res["command"] = " ".join(cmd)
    return res


def serve_table_export(args, work, model, export_dir):
    """Loads the table's float32 export in a fresh process (load time and
    memory of a --rows-row lookup table) and checks 512 known ids."""
    keys = table_keys(args.rows)[:: max(1, args.rows // 512)][:512]
    feats = {"id": keys}
    path = os.path.join(work, "table_ids.npz")
    np.savez(path, id=keys, **{"__expected__.table": model(
        feats, training=False).numpy().reshape(-1)})
    res = run_serving({"table": export_dir}, {"b512": path}, 50)
    log(f"  float32 export loaded in a fresh process in "
        f"{res['models']['table']['load_seconds']:.1f}s, peak RSS "
        f"{res['peak_rss_bytes'] / MB:.0f} MB")
    return res


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
        tn.saving.export_for_serving(tnet_model, d, quantize=q)
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


# ------------------------------------------------------------------- main
def main() -> int:
    args = parse_args()
    info = bc.run_info()
    work = args.workdir or tempfile.mkdtemp(prefix="bench_saving-")
    os.makedirs(work, exist_ok=True)
    log(f"work directory: {work}")
    measurements, extra = [], {"config": {k: (sorted(v) if isinstance(v, set)
                                              else v)
                                          for k, v in vars(args).items()}}
    start = time.perf_counter()
    try:
        model = None
        if "ckpt" not in args.skip:
            model, _ = bench_checkpoints(args, work, measurements, extra)
        if "export" not in args.skip:
            if model is None:
                model = build_table_model(args.dim)
                extra["table"] = fill_table(model, table_keys(args.rows),
                                            args.dim)
            bench_export(args, work, model, measurements, extra)
        del model
        gc.collect()
        bc.release_free_memory()
        if "serve" not in args.skip:
            bench_serving(args, work, measurements, extra)
    finally:
        if not args.keep_files:
            shutil.rmtree(work, ignore_errors=True)
    extra["seconds"] = time.perf_counter() - start
    title = "bench_saving: checkpoints, export, serving" + (
        " (quick)" if args.quick else "")
    md = bc.header_markdown(info, title) + "\n\n" + bc.markdown_table(
        measurements)
    md += (f"\n\nPeak RSS of this process: {bc.peak_rss_bytes() / 2**30:.1f} "
           f"GiB; wall time {extra['seconds']:.0f}s.")
    out = args.out or bc.default_out_path(
        "bench_saving" + ("-quick" if args.quick else ""))
    bc.write_results(out, info, measurements, md, extra=extra)
    print(md)
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
