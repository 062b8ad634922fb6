"""The whole life of one big table, each stage in its own process.

    python tools/bench_scale.py --rows 200000000      # make bench-scale
    python tools/bench_scale.py --rows 1000000 --out /tmp/s.json  # quick

Stages (one table, dim 8, RowwiseAdagrad, a `tn.Model` with one
`EmbeddingFeatures` and a Dense head, one process per stage):

1. `train_save`: creates every row with training pulls (keys spread over
   int64), pushes one gradient to each, then `tn.saving.save`.
2. `restore_export`: a fresh process restores the checkpoint (checked
   bit-exact on a sample against the training process's predictions), then
   `tn.serving.export_for_serving`.
3. `serve`: a fresh process that never imports tnet loads the export with
   `tf.saved_model.load`, checks the sample's predictions and times
   requests at batch 1, 64 and 512 (p50 / p99 of single calls).

For each stage: wall time of its step, the process's peak RSS (VmHWM),
RSS growth over the step (VmHWM after a reset minus RSS before), disk
bytes. Results: bench/results/scale-<date>.json and .md (or --out).
Needs ~(70 B x rows) of RAM for the table and the same again of disk for
the checkpoint, plus ~40 B x rows for the export.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

from tools import procfs  # noqa: E402  (stdlib only)

GiB = float(1 << 30)
DIM = 8
CHUNK = 1 << 20
SAMPLE = 4096


def log(msg):
    print(msg, flush=True)


def status(field):
    value = procfs.status_bytes(field)
    return -1 if value is None else value


class Step:
    """Wall time and RSS growth of a block (VmHWM reset at the start)."""

    def __enter__(self):
        import ctypes
        import gc
        gc.collect()
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass
        procfs.reset_peak()
        self.rss_before = status("VmRSS")
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.t0
        self.peak = status("VmHWM")
        self.growth = self.peak - self.rss_before
        return False

    def json(self):
        return {"seconds": self.seconds, "rss_before": self.rss_before,
                "peak_rss": self.peak, "rss_growth": self.growth}


def dir_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f))
               for d, _, files in os.walk(path) for f in files)


# ------------------------------------------------------------- tnet side
def build_model(args=None):
    """The model; with --budget_gb, its table has a disk tier (files in
    --storage_dir, a cache of --budget_gb)."""
    import tnet as tn  # noqa: PLC0415  (first: selects tf_keras)
    import tensorflow as tf  # noqa: PLC0415
    import tf_keras  # noqa: PLC0415
    tier = {}
    if args is not None and args.budget_gb:
        os.makedirs(args.storage_dir, exist_ok=True)
        tier = {"memory_budget_bytes": int(args.budget_gb * GiB),
                "storage_dir": args.storage_dir}
    col = tn.feature_column.embedding_column(
        tn.feature_column.category_column("id"), DIM, table="ids", **tier)
    inputs = {"id": tf_keras.Input((), dtype=tf.int64, name="id")}
    emb = tn.layers.EmbeddingFeatures([col], name="emb")(inputs)
    out = tf_keras.layers.Dense(1, name="out")(emb)
    model = tn.Model(inputs, out)
    model.compile(tn.optimizer.RowwiseAdagrad(0.05),
                  tf_keras.losses.BinaryCrossentropy(from_logits=True))
    return model


def table_of(model):
    """tools/_saving_common.table_of (imported here: that module imports
    tnet, which the serve stages must not)."""
    from tools._saving_common import table_of as shared  # noqa: PLC0415
    return shared(model)


def ids(start, stop):
    """Distinct ids spread over int64 (an odd multiplier mod 2^62)."""
    import numpy as np  # noqa: PLC0415
    return ids_at(np.arange(start, stop, dtype=np.uint64))


def ids_at(positions):
    """ids(0, n)[positions] without building ids(0, n) (4 GB at 500M)."""
    import numpy as np  # noqa: PLC0415
    k = positions.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15 >> 2 | 1)
    return (k & np.uint64((1 << 62) - 1)).astype(np.int64)


def sample_ids(rows):
    """Half known ids, half never seen (they must read the zero row)."""
    import numpy as np  # noqa: PLC0415
    rng = np.random.default_rng(7)
    known = ids_at(rng.integers(0, rows, SAMPLE // 2)) if rows else \
        np.zeros(0, np.int64)
    unknown = ids(rows, rows + SAMPLE - known.size)
    return np.concatenate([known, unknown])


def stage_train_save(args):
    import numpy as np  # noqa: PLC0415
    import tnet as tn  # noqa: PLC0415
    model = build_model(args)
    out = {"rss_start": status("VmRSS")}
    model.fit({"id": ids(0, 256)}, np.zeros(256, np.float32),
              batch_size=256, epochs=1, verbose=0)
    table = table_of(model)
    step = int(model.optimizer.iterations.numpy())
    rng = np.random.default_rng(1)
    with Step() as create:
        for a in range(0, args.rows, CHUNK):
            k = ids(a, min(a + CHUNK, args.rows))
            table.pull(k, training=True)
            g = rng.normal(0, 0.1, (k.size, DIM)).astype(np.float32)
            table.push(k, g, step=step, shows=np.ones(k.size, np.float32))
            if a and a % (CHUNK * 20) == 0:
                log(f"  created {a:,} rows, RSS {status('VmRSS') / GiB:.1f}"
                    " GiB")
    out["create"] = create.json()
    out["rows"] = int(table.size())
    out["table_bytes"] = int(table.memory_bytes())
    out["table_stats"] = table.stats()
    sample = sample_ids(args.rows)
    np.savez(os.path.join(args.work, "sample.npz"), id=sample,
             __expected__=model.predict({"id": sample}, batch_size=SAMPLE,
                                        verbose=0))
    ckpt = os.path.join(args.work, "ckpt")
    shutil.rmtree(ckpt, ignore_errors=True)   # an earlier run's, if kept
    with Step() as save:
        path = tn.saving.save(model, ckpt, progress=lambda _: None)
    out["save"] = {**save.json(), "bytes": dir_bytes(path), "path": path}
    return out


def stage_restore_export(args):
    import numpy as np  # noqa: PLC0415
    import tnet as tn  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415
    out = {"rss_start": status("VmRSS")}
    model = build_model(args)
    table_of(model)
    with Step() as restore:
        tn.saving.restore(model, os.path.join(args.work, "ckpt"),
                          progress=lambda _: None)
    sample = np.load(os.path.join(args.work, "sample.npz"))
    got = model.predict({"id": sample["id"]}, batch_size=SAMPLE, verbose=0)
    out["restore"] = {**restore.json(),
                      "bit_exact": bool(np.array_equal(
                          got, sample["__expected__"]))}
    out["rows"] = int(table_of(model).size())
    out["table_bytes"] = int(table_of(model).memory_bytes())
    out["table_stats"] = table_of(model).stats()
    if args.drop_checkpoint:
        # Disk: with a tier, the tier's file, the checkpoint and the export
        # together may not fit; the table is restored, the checkpoint goes.
        shutil.rmtree(os.path.join(args.work, "ckpt"), ignore_errors=True)
    export = os.path.join(args.work, "export", "1")
    shutil.rmtree(os.path.dirname(export), ignore_errors=True)
    with Step() as exp:
        tn.serving.export_for_serving(
            model, export, quantize=args.quantize,
            input_signature={"id": tf.TensorSpec([None], tf.int64)})
    with open(os.path.join(export, "export_info.json")) as f:
        info = json.load(f)
    (entry,) = info["tables"].values()
    out["export"] = {**exp.json(), "bytes": dir_bytes(export),
                     "payload_bytes": entry["matrix_bytes"]
                     + entry["scale_bytes"] + entry["index_bytes"],
                     "quantize": args.quantize}
    return out


def stage_restore_save(args):
    """Restore the newest checkpoint in a fresh process, check it, save it
    again as the next step and drop the older one: run N times after
    train_save (`--alternate N`), restore and save alternate on the same
    table and disk, each timed."""
    import numpy as np  # noqa: PLC0415
    import tnet as tn  # noqa: PLC0415
    out = {"rss_start": status("VmRSS")}
    model = build_model(args)
    table_of(model)
    ckpt = os.path.join(args.work, "ckpt")
    with Step() as restore:
        step = tn.saving.restore(model, ckpt, progress=lambda _: None)
    sample = np.load(os.path.join(args.work, "sample.npz"))
    got = model.predict({"id": sample["id"]}, batch_size=SAMPLE, verbose=0)
    out["restore"] = {**restore.json(), "step": int(step),
                      "bit_exact": bool(np.array_equal(
                          got, sample["__expected__"]))}
    old = [os.path.join(ckpt, d) for d in os.listdir(ckpt)]
    with Step() as save:
        path = tn.saving.save(model, ckpt, step=int(step) + 1,
                              progress=lambda _: None)
    out["save"] = {**save.json(), "bytes": dir_bytes(path), "path": path}
    for d in old:
        if os.path.abspath(d) != os.path.abspath(path):
            shutil.rmtree(d, ignore_errors=True)
    return out


# ------------------------------------------------------------ stock side
def stage_serve(args):
    import numpy as np  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415
    out = {"tnet_imported": "tnet" in sys.modules}
    export = os.path.join(args.work, "export", "1")
    with open(os.path.join(export, "export_info.json")) as f:
        info = json.load(f)
    (entry,) = info["tables"].values()
    payload = (entry["matrix_bytes"] + entry["scale_bytes"]
               + entry["index_bytes"])
    tf.constant(0)  # TF's own start-up is not the model's load
    with Step() as load:
        loaded = tf.saved_model.load(export)
        serve = loaded.signatures["serving_default"]
    out["load"] = {**load.json(), "payload_bytes": payload,
                   "rss_after": status("VmRSS")}
    sample = np.load(os.path.join(args.work, "sample.npz"))
    got = serve(id=tf.constant(sample["id"]))["prediction"].numpy()
    diff = float(np.max(np.abs(got - sample["__expected__"])))
    out["max_abs_diff"] = diff
    rng = np.random.default_rng(3)
    latency = {}
    for batch in (1, 64, 512):
        times = []
        for i in range(args.calls + 20):
            x = tf.constant(sample["id"][rng.integers(0, SAMPLE, batch)])
            t0 = time.perf_counter()
            serve(id=x)["prediction"].numpy()
            if i >= 20:
                times.append(time.perf_counter() - t0)
        times.sort()
        latency[str(batch)] = {"p50_ms": 1e3 * times[len(times) // 2],
                               "p99_ms": 1e3 * times[int(len(times) * 0.99)]}
    out["latency"] = latency
    out["peak_rss"] = status("VmHWM")
    return out


# ---------------------------------------------- serving structure choice
def stage_structures(args):
    """Writes the same table (--structure_rows rows) as two serving
    structures, each a SavedModel with signature lookup(keys) -> rows:
    `hash`: a MutableHashTable key -> row number + a matrix variable (the
    export format 1); `sorted`: tnet's streamed sorted mixed keys +
    searchsorted (format 2)."""
    import numpy as np  # noqa: PLC0415
    import tnet as tn  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415
    from tnet.serving import serving_table as st  # noqa: PLC0415
    rows = args.structure_rows
    table = tn.SparseTable("structures", DIM, num_shards=4)
    rng = np.random.default_rng(5)
    for a in range(0, rows, CHUNK):
        k = ids(a, min(a + CHUNK, rows))
        table.import_rows(k, rng.normal(size=(k.size, DIM)).astype(
            np.float32), np.zeros((k.size, table.num_slots), np.float32),
            np.zeros((k.size, 3)))
    spec = [tf.TensorSpec([None], tf.int64)]
    out = {}
    base = os.path.join(args.work, "structures")
    shutil.rmtree(base, ignore_errors=True)
    # format 2
    with Step() as write:
        module = tf.Module()
        serving = st.ServingTable("t", DIM, None)
        module.table = serving
        module.streamed_variables = serving.placeholders()
        module.lookup = tf.function(serving.lookup, input_signature=spec)
        path = os.path.join(base, "sorted")
        tf.saved_model.save(module, path)
        st.write_sliced(path, module, [(serving, table)],
                        os.path.join(base, "scratch"))
        shutil.rmtree(os.path.join(base, "scratch"))
    out["sorted"] = {**write.json(), "bytes": dir_bytes(path)}
    # format 1
    with Step() as write:
        keys, weights, _, _ = table.export()
        n = int(keys.shape[0])
        module = tf.Module()
        module.index = tf.lookup.experimental.MutableHashTable(
            tf.int64, tf.int32, default_value=n)
        module.index.insert(keys, tf.range(n, dtype=tf.int32))
        module.matrix = tf.Variable(tf.concat(
            [weights, tf.zeros([1, DIM])], 0), trainable=False)
        del keys, weights

        def lookup(k):
            i = module.index.lookup(k)
            return tf.gather(module.matrix, i)
        module.lookup = tf.function(lookup, input_signature=spec)
        path = os.path.join(base, "hash")
        tf.saved_model.save(module, path)
    out["hash"] = {**write.json(), "bytes": dir_bytes(path)}
    out["rows"] = rows
    out["payload_bytes"] = (rows + 1) * (8 + 4 * DIM)
    return out


def stage_serve_structure(args):
    """Loads structures/<--structure> without tnet; RSS and latency."""
    import numpy as np  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415
    path = os.path.join(args.work, "structures", args.structure)
    tf.constant(0)
    with Step() as load:
        loaded = tf.saved_model.load(path)
    rows = args.structure_rows
    rng = np.random.default_rng(9)
    known = ids(0, rows)
    latency = {}
    for batch in (1, 64, 512):
        times = []
        for i in range(args.calls + 20):
            x = tf.constant(known[rng.integers(0, rows, batch)])
            t0 = time.perf_counter()
            loaded.lookup(x).numpy()
            if i >= 20:
                times.append(time.perf_counter() - t0)
        times.sort()
        latency[str(batch)] = {"p50_ms": 1e3 * times[len(times) // 2],
                               "p99_ms": 1e3 * times[int(len(times) * 0.99)]}
    return {"load": load.json(), "latency": latency,
            "tnet_imported": "tnet" in sys.modules}


# ------------------------------------------- ParameterServerStrategy
def _marker(name, what, payload=None):
    print(f"SCALE_STAGE {name} {what} {json.dumps(payload or {})}",
          flush=True)


def stage_pss_chief(args):
    """The chief of a 2-ps local cluster: create, save, restore into a
    second model, export. Prints SCALE_STAGE markers the bench samples
    every process's RSS between."""
    import numpy as np  # noqa: PLC0415
    import tnet as tn  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415
    import tf_keras  # noqa: PLC0415
    strategy = tn.distribute.ParameterServerStrategy()
    with strategy.scope():  # tables too: one shard per ps task
        model = build_model()
        table = table_of(model)

    def data(ctx):
        x = tf.data.Dataset.from_tensor_slices(
            ({"id": ids(0, 256)}, np.zeros(256, np.float32)))
        return x.repeat().batch(64)
    model.fit(tf_keras.utils.experimental.DatasetCreator(data), epochs=1,
              steps_per_epoch=2, verbose=0)
    rows = args.pss_rows
    _marker("create", "begin")
    t0 = time.perf_counter()
    for a in range(0, rows, CHUNK):
        table.pull(ids(a, min(a + CHUNK, rows)), training=True)
    _marker("create", "end", {"seconds": time.perf_counter() - t0,
                              "rows": int(table.size()),
                              "table_bytes": int(table.memory_bytes()),
                              "shards": table.num_shards,
                              "devices": sorted({
                                  s.resource_handle.device
                                  for s in table.shards})})
    ckpt = os.path.join(args.work, "pss_ckpt")
    _marker("save", "begin")
    t0 = time.perf_counter()
    path = tn.saving.save(model, ckpt, progress=lambda _: None)
    _marker("save", "end", {"seconds": time.perf_counter() - t0,
                            "bytes": dir_bytes(path)})
    with strategy.scope():
        fresh = build_model()
        table_of(fresh)
    _marker("restore", "begin")
    t0 = time.perf_counter()
    tn.saving.restore(fresh, ckpt, progress=lambda _: None)
    sample = sample_ids(rows)
    same = bool(np.array_equal(
        table.pull(sample, training=False).numpy(),
        table_of(fresh).pull(sample, training=False).numpy()))
    _marker("restore", "end", {"seconds": time.perf_counter() - t0,
                               "bit_exact": same})
    export = os.path.join(args.work, "pss_export", "1")
    shutil.rmtree(os.path.dirname(export), ignore_errors=True)
    _marker("export", "begin")
    t0 = time.perf_counter()
    tn.serving.export_for_serving(
        fresh, export, input_signature={"id": tf.TensorSpec([None],
                                                            tf.int64)})
    _marker("export", "end", {"seconds": time.perf_counter() - t0,
                              "bytes": dir_bytes(export)})
    return {"ok": True}


def run_pss(args):
    """Runs stage_pss_chief as the chief of 2 ps x 1 worker on 127.0.0.1,
    sampling every task's RSS (VmRSS, 0.5 s) per stage."""
    import threading  # noqa: PLC0415
    from tools._bench_common import local_cluster  # noqa: PLC0415
    cmd = [sys.executable, os.path.abspath(__file__), "--stage",
           "pss_chief", "--pss_rows", str(args.pss_rows), "--work",
           args.work]
    stages, current = {}, {"name": None}
    lock = threading.Lock()

    def on_line(line):
        if "SCALE_STAGE " in line:  # launch.py prefixes "[chief] "
            name, what, payload = line.split("SCALE_STAGE ", 1)[1].strip(
            ).split(" ", 2)
            with lock:
                entry = stages.setdefault(name, {"peak_rss": {}})
                if what == "begin":
                    current["name"] = name
                    entry["rss_begin"] = {
                        t: procfs.status_bytes("VmRSS", pid)
                        for t, pid in list(cluster_pids.items())}
                else:
                    entry.update(json.loads(payload))
                    current["name"] = None
        elif "Traceback" in line or "Error" in line:
            log("  " + line.rstrip())

    env = dict(os.environ, PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2")
    log(f"[pss] 2 ps x 1 worker, chief: {' '.join(cmd[1:])}")
    cluster_pids = {}
    cluster = local_cluster(2, 1, cmd, timeout=7200, env=env,
                            on_line=on_line)
    cluster_pids = cluster.pids  # the same dict, filled by its reader
    peaks = {}
    while cluster.proc.poll() is None:
        with lock:
            name = current["name"]
        for task, pid in list(cluster.pids.items()):
            rss = procfs.status_bytes("VmRSS", pid)
            if rss is None:
                continue
            peaks[task] = max(peaks.get(task, 0), rss)
            if name:
                with lock:
                    slot = stages[name]["peak_rss"]
                    slot[task] = max(slot.get(task, 0), rss)
        time.sleep(0.5)
    code = cluster.wait(60)
    return {"returncode": code, "failed": code != 0, "stages": stages,
            "peak_rss": peaks, "rows": args.pss_rows}


STAGES = {"train_save": stage_train_save,
          "restore_export": stage_restore_export, "serve": stage_serve}
EXTRA_STAGES = {"structures": stage_structures, "pss_chief": stage_pss_chief,
                "restore_save": stage_restore_save,
                "serve_structure": stage_serve_structure}


def run_stage(args, name):
    name, _, structure = name.partition(":")
    cmd = [sys.executable, os.path.abspath(__file__), "--stage", name,
           "--rows", str(args.rows), "--work", args.work,
           "--calls", str(args.calls),
           "--structure_rows", str(args.structure_rows)]
    if structure:
        cmd += ["--structure", structure]
    if args.quantize:
        cmd += ["--quantize", args.quantize]
    if args.budget_gb:
        cmd += ["--budget_gb", str(args.budget_gb), "--storage_dir",
                args.storage_dir]
    if args.drop_checkpoint:
        cmd += ["--drop_checkpoint"]
    env = dict(os.environ)
    if name.startswith("serve"):  # a plain TF process, as a server is
        env.pop("TF_USE_LEGACY_KERAS", None)
    log(f"[{name}] {' '.join(cmd[1:])}")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    for ln in proc.stdout.splitlines():
        if not ln.startswith("{"):
            log("  " + ln)
    if proc.returncode != 0 or not lines:
        return {"failed": True, "returncode": proc.returncode,
                "process_seconds": wall}
    result = json.loads(lines[-1])
    result["process_seconds"] = wall
    return result


def markdown(info, args, res):
    from tools import _bench_common as bc  # noqa: PLC0415
    rows = args.rows
    tier = (f", disk tier: {args.budget_gb:g} GiB cache, files in "
            f"{args.storage_dir}" if args.budget_gb else "")
    lines = [bc.header_markdown(info, f"Scale: one table of {rows:,} rows "
                                f"(dim {DIM}, RowwiseAdagrad{tier})"), "",
             "| stage | time | process peak RSS | RSS growth in the step | "
             "disk | result |", "|---|---|---|---|---|---|"]

    def row(stage, step, result, disk=None):
        if step is None:
            lines.append(f"| {stage} | - | - | - | - | {result} |")
            return
        lines.append(
            f"| {stage} | {step['seconds']:.1f} s | "
            f"{step['peak_rss'] / GiB:.2f} GiB | "
            f"{step['rss_growth'] / GiB:.2f} GiB | "
            f"{'-' if disk is None else f'{disk / 1e9:.2f} GB'} | {result} |")

    ts, re_, sv = (res.get(s, {}) for s in STAGES)
    if ts.get("failed"):
        row("create + save", None, f"failed (exit {ts['returncode']})")
    elif ts:
        row(f"create {ts['rows']:,} rows", ts["create"],
            f"table {ts['table_bytes'] / GiB:.2f} GiB "
            f"({ts['table_bytes'] / max(ts['rows'], 1):.0f} B/row)")
        row("`tn.saving.save`", ts["save"], "ok", ts["save"]["bytes"])
        st = ts.get("table_stats", {})
        if st.get("tier_disk_bytes"):
            lines.append(
                f"| tier after create | | | | "
                f"{st['tier_disk_bytes'] / 1e9:.2f} GB | "
                f"{st.get('tier_resident', 0):,} rows resident, "
                f"{st.get('tier_on_disk', 0):,} on disk; "
                f"{st['tier_disk_bytes'] / max(ts['rows'], 1):.0f} B/row on "
                "disk |")
    if re_.get("failed"):
        row("restore + export", None, f"failed (exit {re_['returncode']})")
    elif re_:
        row("`tn.saving.restore`, fresh process", re_["restore"],
            "bit-exact" if re_["restore"]["bit_exact"] else "**differs**")
        e = re_["export"]
        row(f"`export_for_serving` (quantize={e['quantize']})", e,
            f"payload {e['payload_bytes'] / GiB:.2f} GiB; growth / table "
            f"= {e['rss_growth'] / max(re_['table_bytes'], 1):.2f}",
            e["bytes"])
    if sv.get("failed"):
        row("load + serve without tnet", None,
            f"failed (exit {sv['returncode']})")
    elif sv:
        ld = sv["load"]
        lat = sv["latency"]
        row("load without tnet", ld,
            f"growth / payload = {ld['rss_growth'] / ld['payload_bytes']:.2f}"
            f"; max |diff| {sv['max_abs_diff']:.1e}")
        lines.append("")
        lines.append("Serving latency (single calls, ms): " + ", ".join(
            f"batch {b}: p50 {v['p50_ms']:.2f} / p99 {v['p99_ms']:.2f}"
            for b, v in lat.items()) + ".")
    rounds = [res[f"restore_save_{i}"] for i in range(1, len(res) + 1)
              if f"restore_save_{i}" in res]
    if rounds:
        lines += ["", "Restore and save alternating on the same table and "
                  "disk (each round a fresh process: restore the newest "
                  "checkpoint, check it, save it as the next step):", "",
                  "| round | restore | save | checkpoint | restore / save "
                  "throughput | restore result |", "|---|---|---|---|---|---|"]
        for i, r in enumerate(rounds, 1):
            if r.get("failed"):
                lines.append(f"| {i} | failed (exit {r['returncode']}) | | | | |")
                continue
            rs, sv_ = r["restore"], r["save"]
            lines.append(
                f"| {i} | {rs['seconds']:.1f} s | {sv_['seconds']:.1f} s | "
                f"{sv_['bytes'] / 1e9:.2f} GB | "
                f"{sv_['seconds'] / rs['seconds']:.2f}x | "
                + ("bit-exact" if rs["bit_exact"] else "**differs**") + " |")
    st = res.get("structures")
    if st and not st.get("failed"):
        payload = st["payload_bytes"]
        lines += ["", f"Serving structure, {st['rows']:,} rows of dim {DIM} "
                  f"(payload {payload / GiB:.2f} GiB: key + float32 row), "
                  "each written by the export process and loaded in a "
                  "fresh process without tnet:", "",
                  "| structure | export step growth | export bytes | "
                  "load time | load RSS growth / payload | p50 / p99 ms "
                  "b1 | b64 | b512 |", "|---|---|---|---|---|---|---|---|"]
        for kind, label in (("hash", "MutableHashTable + matrix (format 1)"),
                            ("sorted", "sorted mixed keys + searchsorted "
                             "(format 2)")):
            sv = res.get(f"serve_{kind}", {})
            if sv.get("failed") or not sv:
                lines.append(f"| {label} | - | - | failed | | | | |")
                continue
            w, ld, lat = st[kind], sv["load"], sv["latency"]
            lines.append(
                f"| {label} | {w['rss_growth'] / GiB:.2f} GiB | "
                f"{w['bytes'] / 1e9:.2f} GB | {ld['seconds']:.1f} s | "
                f"{ld['rss_growth'] / payload:.2f} | " + " | ".join(
                    f"{lat[b]['p50_ms']:.2f} / {lat[b]['p99_ms']:.2f}"
                    for b in ("1", "64", "512")) + " |")
    pss = res.get("pss")
    if pss and pss.get("failed"):
        lines += ["", f"ParameterServerStrategy: failed (exit "
                  f"{pss['returncode']})"]
    elif pss:
        st = pss["stages"]
        tasks = ["chief", "ps:0", "ps:1"]
        c = st.get("create", {})
        lines += ["", f"ParameterServerStrategy, 2 ps x 1 worker on "
                  f"127.0.0.1: one table of {c.get('rows', 0):,} rows "
                  f"sharded over {c.get('shards')} ps tasks "
                  f"({c.get('table_bytes', 0) / GiB:.2f} GiB of table; "
                  "rows created by pulls from the chief). Peak RSS of each "
                  "process during the stage (sampled every 0.5 s), and its "
                  "growth over the RSS at the stage's start:", "",
                  "| stage | time | " + " | ".join(tasks) + " | result |",
                  "|---|---|" + "---|" * len(tasks) + "---|"]
        for name in ("save", "restore", "export"):
            e = st.get(name)
            if not e:
                continue
            cells = []
            for t in tasks:
                peak = e["peak_rss"].get(t)
                begin = (e.get("rss_begin") or {}).get(t)
                cells.append("-" if peak is None else
                             f"{peak / GiB:.2f} GiB (+{(peak - begin) / GiB:.2f})"
                             if begin else f"{peak / GiB:.2f} GiB")
            result = ("bit-exact" if e.get("bit_exact") else "**differs**") \
                if "bit_exact" in e else f"{e.get('bytes', 0) / 1e9:.2f} GB"
            lines.append(f"| {name} | {e['seconds']:.1f} s | "
                         + " | ".join(cells) + f" | {result} |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=200_000_000)
    p.add_argument("--work", default="/tmp/tnet-bench-scale")
    p.add_argument("--quantize", default=None,
                   choices=[None, "float16", "int8"])
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--stage", choices=sorted({**STAGES, **EXTRA_STAGES}))
    p.add_argument("--structure_rows", type=int, default=0,
                   help="also compare the serving structures (MutableHashTable"
                   " vs sorted keys) at this many rows (0: skip)")
    p.add_argument("--structure", default=None)
    p.add_argument("--pss_rows", type=int, default=0,
                   help="also run save / restore / export of a table sharded "
                   "over 2 ps tasks (local cluster) at this many rows")
    p.add_argument("--stages", default=",".join(STAGES),
                   help="comma-separated stages to run (default: all)")
    p.add_argument("--budget_gb", type=float, default=0,
                   help="give the table a disk tier whose cache holds this "
                   "many GiB (0: all in memory)")
    p.add_argument("--storage_dir", default="/var/tmp/tnet-scale-tier",
                   help="the tier's files (with --budget_gb)")
    p.add_argument("--drop_checkpoint", action="store_true",
                   help="delete the checkpoint once restored, before the "
                   "export (disk: tier file + checkpoint + export)")
    p.add_argument("--alternate", type=int, default=0, metavar="N",
                   help="after the stages, N rounds of restore then save "
                   "(each in a fresh process) of the newest checkpoint: "
                   "restore and save throughput in one run")
    p.add_argument("--out", default=None)
    p.add_argument("--keep", action="store_true",
                   help="keep the checkpoint and export in --work")
    args = p.parse_args()
    if args.stage:
        fn = {**STAGES, **EXTRA_STAGES}[args.stage]
        print(json.dumps(fn(args)), flush=True)
        return 0
    from tools import _bench_common as bc  # noqa: PLC0415
    info = bc.run_info()
    info["command"] = " ".join([os.path.basename(sys.executable)]
                               + sys.argv)
    os.makedirs(args.work, exist_ok=True)
    res = {}
    for name in filter(None, args.stages.split(",")):
        res[name] = run_stage(args, name)
        if res[name].get("failed"):
            break
    for i in range(args.alternate):
        res[f"restore_save_{i + 1}"] = r = run_stage(args, "restore_save")
        if r.get("failed"):
            break
        log(f"  round {i + 1}: restore {r['restore']['seconds']:.1f} s "
            f"(bit-exact {r['restore']['bit_exact']}), save "
            f"{r['save']['seconds']:.1f} s: restore / save throughput "
            f"{r['save']['seconds'] / r['restore']['seconds']:.2f}x")
    if args.pss_rows:
        res["pss"] = run_pss(args)
    if args.structure_rows:
        res["structures"] = run_stage(args, "structures")
        for kind in ("hash", "sorted"):
            res[f"serve_{kind}"] = run_stage(args, f"serve_structure:{kind}")
    md = markdown(info, args, res)
    log(md)
    out = args.out or bc.default_out_path("scale")
    bc.write_results(out, info, [], md, extra={"rows": args.rows,
                                               "dim": DIM, "stages": res})
    if not args.keep:
        shutil.rmtree(args.work, ignore_errors=True)
    log(f"wrote {out}")
    return 1 if any(r.get("failed") for r in res.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
