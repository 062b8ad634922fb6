"""Shared pieces of tools/bench_saving.py: constants, memory probes and the
one-table model whose checkpoints and exports it measures."""
from __future__ import annotations

import os
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

import tnet as tn  # noqa: E402  (first: selects tf_keras)
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

from tools import _bench_common as bc  # noqa: E402
from tools import procfs  # noqa: E402

MB = 1e6
CHUNK = 1 << 20
HIDDEN = (400, 400, 400)
SERVE_SCRIPT = os.path.join(REPO_ROOT, "tools", "_serve_latency.py")
QUANTIZE = (None, "float16", "int8")


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
def build_table_model(dim, optimizer="adagrad"):
    col = tn.feature_column.embedding_column(
        tn.feature_column.category_column("id"), dim)
    inputs = {"id": tf_keras.Input((), dtype=tf.int64, name="id")}
    emb = tn.layers.EmbeddingFeatures([col], name="emb")(inputs)
    out = tf_keras.layers.Dense(1, name="out")(emb)
    model = tn.Model(inputs, out)
    opt = {"adagrad": tn.optimizer.Adagrad,
           "rowwise_adagrad": tn.optimizer.RowwiseAdagrad}[optimizer](0.05)
    model.compile(opt, tf_keras.losses.BinaryCrossentropy(from_logits=True))
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
