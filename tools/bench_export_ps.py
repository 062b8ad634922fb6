"""What the serving export moves off the ps: the export cursor with and
without `weights_only`, and `export_for_serving` over it (issue 29).

    python tools/bench_export_ps.py [--rows 10000000] [--ps 2] [--repeats 3]

A local ParameterServerStrategy cluster on 127.0.0.1 (1 chief, --ps ps
tasks, 1 idle worker). The chief builds a minimal model over one table
(dim 16, tn Adagrad: 16 accumulators per row), fills it with --rows rows
(`import_rows`, random weights, accumulators and last_step), then
alternates, --repeats times:

* cursor, full: every shard streamed through `export_shard` in 1M-row
  chunks, keys + weights + slots + meta (what the export read before);
* cursor, weights only: the same with `weights_only=True`;
* export: `export_for_serving` as it is now (weights only), and the same
  with the cursor forced to full rows (the export before this change).

One warm-up of each first (traces, page cache), then the order alternates.

Bytes are what the cursor's outputs hold per chunk (they cross from the
ps to the chief as they are); times are wall seconds on the chief. Writes
JSON (command, machine, date) to bench/results/bench_export_ps-<date>.json
or --out.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

DIM = 16
CHUNK = 1 << 20


def _chief(args) -> None:
    import numpy as np  # noqa: PLC0415

    import tnet as tn  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415
    import tf_keras  # noqa: PLC0415

    from tnet import feature_column as fc  # noqa: PLC0415
    from tools import _bench_common as common  # noqa: PLC0415

    class One(tn.Model):
        def __init__(self):
            super().__init__()
            self.embed = tn.layers.EmbeddingFeatures(
                [fc.embedding_column(fc.category_column("id"), DIM)])
            self.out = tf_keras.layers.Dense(1)

        def call(self, features, training=False):
            return self.out(self.embed(features, training=training))

    strategy = tn.distribute.ParameterServerStrategy()
    with strategy.scope():
        model = One()
        model.compile(tn.optimizer.Adagrad(0.05))
        model({"id": tf.constant([0], tf.int64)})
    table = model.tables()["id"]
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    for s in range(0, args.rows, 1 << 19):
        e = min(args.rows, s + (1 << 19))
        n = e - s
        meta = np.zeros((n, 3), np.float64)
        meta[:, 0] = 1.0
        meta[:, 2] = rng.integers(1, 1000, n)
        table.import_rows(np.arange(s, e, dtype=np.int64) * 7919 + 1,
                          rng.normal(size=(n, DIM)).astype(np.float32),
                          rng.random((n, table.num_slots)).astype(np.float32),
                          meta)
    fill_s = time.perf_counter() - start
    rows = int(table.size())
    print(f"filled {rows:,} rows in {fill_s:.1f} s", flush=True)

    def cursor(weights_only: bool) -> dict:
        t = time.perf_counter()
        nbytes = got = 0
        for shard in range(table.num_shards):
            c = 0
            while c != -1:
                k, w, s, m, c = table.export_shard(shard, c, CHUNK,
                                                   weights_only=weights_only)
                c = int(c)
                got += int(k.shape[0])
                nbytes += sum(int(np.prod(x.shape)) * x.dtype.size
                              for x in (k, w, s, m))
        assert got == rows, (got, rows)
        return {"s": time.perf_counter() - t, "bytes": nbytes}

    original = tn.SparseTable.export_shard
    work = tempfile.mkdtemp(prefix="bench_export_ps-", dir=os.environ.get(
        "BENCH_TMP", tempfile.gettempdir()))

    def export(full_rows: bool) -> dict:
        if full_rows:  # the cursor as the export read it before
            def patched(self, *a, weights_only=False, **kw):
                return original(self, *a, **kw)
            tn.SparseTable.export_shard = patched
        try:
            path = os.path.join(work, "full" if full_rows else "wonly")
            t = time.perf_counter()
            tn.serving.export_for_serving(model, path)
            out = {"s": time.perf_counter() - t}
            shutil.rmtree(path)
            return out
        finally:
            tn.SparseTable.export_shard = original

    cursor(True), export(False), export(True)  # warm-up: traces, caches
    runs = []
    for r in range(args.repeats):
        order = (False, True) if r % 2 == 0 else (True, False)
        run = {}
        for only in order:
            run["cursor_weights_only" if only else "cursor_full"] = cursor(only)
        for full in (not order[0], order[0]):
            run["export_full_rows" if full else "export_weights_only"] = \
                export(full)
        runs.append(run)
        print(json.dumps({"repeat": r, **run}), flush=True)
    shutil.rmtree(work, ignore_errors=True)

    def med(key, field):
        return float(np.median([x[key][field] for x in runs]))

    res = {"rows": rows, "dim": DIM, "optimizer": "adagrad",
           "num_slots": table.num_slots, "ps": args.ps, "fill_s": fill_s,
           "runs": runs,
           "median": {k: med(k, "s") for k in runs[0]},
           "bytes_per_row": {
               "cursor_full": runs[0]["cursor_full"]["bytes"] / rows,
               "cursor_weights_only":
                   runs[0]["cursor_weights_only"]["bytes"] / rows},
           "ratio_per_repeat": {
               "cursor": [x["cursor_weights_only"]["s"] / x["cursor_full"]["s"]
                          for x in runs],
               "export": [x["export_weights_only"]["s"]
                          / x["export_full_rows"]["s"] for x in runs]},
           "command": " ".join(["tools/bench_export_ps.py"] + args.argv),
           "run": common.run_info()}
    out = args.out or common.default_out_path("bench_export_ps")
    with open(out, "w") as f:
        json.dump(res, f, indent=2)
    print(json.dumps({k: v for k, v in res.items() if k not in ("run", "runs")},
                     indent=1))
    print(f"wrote {out}", flush=True)
    tn.distribute.exit_now(0)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--ps", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=None)
    p.add_argument("--chief", action="store_true", help=argparse.SUPPRESS)
    argv = sys.argv[1:]
    args = p.parse_args(argv)
    args.argv = [a for a in argv if a != "--chief"]
    if args.chief:
        _chief(args)
        return 0
    from tnet.launch import LocalCluster  # noqa: PLC0415
    c = LocalCluster(args.ps, 1, [sys.executable, os.path.abspath(__file__),
                                  "--chief", *argv], timeout=3600,
                     cwd=os.path.dirname(HERE),
                     pythonpath=os.path.dirname(HERE),
                     on_line=lambda line: print(line, end="", flush=True))
    return c.wait()


if __name__ == "__main__":
    sys.exit(main())
