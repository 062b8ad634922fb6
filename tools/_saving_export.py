"""tools/bench_saving.py part 2: export size and time per quantize mode."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

import tnet as tn  # noqa: E402  (first: selects tf_keras)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tools import _bench_common as bc  # noqa: E402

from tools._saving_common import (  # noqa: E402
    MB,
    PeakRss,
    QUANTIZE,
    SERVE_SCRIPT,
    dir_bytes,
    log,
    table_keys,
    table_of)


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
            tn.serving.export_for_serving(model, d, quantize=q,
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
