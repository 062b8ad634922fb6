"""Tables larger than memory: the disk tier against the in-memory table
(issue 30).

    python tools/bench_tier.py [--rows 200000000] [--mem_rows 50000000]
        [--budget_gb 4] [--dim 16] [--steps 40] [--batch 131072]
        [--zipf 1.1] [--storage_dir /var/tmp/tnet-tier] [--out ...]

One process, one table (tn Adagrad, --dim). Two configurations, each in
its own child process, one after the other:

* tier: --rows rows, a disk tier whose cache holds --budget_gb of rows,
  files in --storage_dir;
* memory: --mem_rows rows, all in memory (the same workload at a size that
  fits, the baseline the issue names).

Each child fills its table with `import_rows` in 1M-row chunks (random
weights and accumulators: the same work as a restore, which imports a
checkpoint's chunks), then runs --warmup + --steps training steps: a batch
of --batch Zipf(--zipf) ids over the table's keys, a training pull and an
Adagrad push of random gradients. Reported per configuration: fill rate
(rows/s), step throughput (ids/s, pull + push), pull p50/p99 per batch,
the tier's hit rate over the timed steps (1 - misses / lookups, where a
pull looks up every id and a push every unique key), misses per step and
the unique-key hit rate (1 - misses / unique keys pulled), disk bytes
per row, memory (RSS) per row, and the export cursor's rate over the whole
table (full rows: what a checkpoint reads; weights only: the serving
export's read). Results (command, machine, date) go to --out
(default bench/results/bench_tier-<date>.json).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _child(args) -> dict:
    import numpy as np  # noqa: PLC0415

    import tnet as tn  # noqa: PLC0415

    rows = args.rows
    opts = {}
    if args.budget_gb:
        os.makedirs(args.storage_dir, exist_ok=True)
        opts = {"memory_budget_bytes": int(args.budget_gb * 2**30),
                "storage_dir": args.storage_dir}
    rss0 = _rss_bytes()
    table = tn.SparseTable("bench", args.dim,
                           tn.optimizer.Adagrad(learning_rate=0.05), **opts)
    rng = np.random.default_rng(0)
    out = {"rows": rows, "dim": args.dim, "tier": bool(opts), **opts}

    chunk = 1 << 20
    t0 = time.perf_counter()
    last = t0
    for s in range(0, rows, chunk):
        e = min(rows, s + chunk)
        n = e - s
        keys = np.arange(s, e, dtype=np.int64)
        table.import_rows(
            keys, rng.normal(0, 0.01, (n, args.dim)).astype(np.float32),
            np.full((n, table.num_slots), 0.1, np.float32),
            np.stack([np.ones(n), np.zeros(n), np.zeros(n)], 1))
        now = time.perf_counter()
        if now - last > 30:
            print(f"fill {e / 1e6:.0f}M rows, {e / (now - t0) / 1e6:.2f}M "
                  "rows/s", file=sys.stderr, flush=True)
            last = now
    fill_s = time.perf_counter() - t0
    out["fill_s"] = fill_s
    out["fill_rows_per_s"] = rows / fill_s

    def batch():
        return (rng.zipf(args.zipf, args.batch) % rows).astype(np.int64)

    grads = rng.normal(0, 0.01, (args.batch, args.dim)).astype(np.float32)
    step = 0
    for _ in range(args.warmup):
        step += 1
        k = batch()
        table.pull(k, training=True)
        table.push(k, grads, step=step)
    before = table.stats()
    pulls, pushes = [], []
    uniques = 0
    for _ in range(args.steps):
        step += 1
        k = batch()
        uniques += len(np.unique(k))
        t = time.perf_counter()
        table.pull(k, training=True).numpy()
        pulls.append(time.perf_counter() - t)
        t = time.perf_counter()
        table.push(k, grads, step=step)
        pushes.append(time.perf_counter() - t)
    after = table.stats()
    total = sum(pulls) + sum(pushes)
    out.update({
        "steps": args.steps, "batch": args.batch, "zipf": args.zipf,
        "unique_per_batch": uniques / args.steps,
        "ids_per_s": args.steps * args.batch / total,
        "step_ms_mean": 1000 * total / args.steps,
        "pull_ms_p50": 1000 * float(np.percentile(pulls, 50)),
        "pull_ms_p99": 1000 * float(np.percentile(pulls, 99)),
        "push_ms_p50": 1000 * float(np.percentile(pushes, 50)),
        "push_ms_p99": 1000 * float(np.percentile(pushes, 99)),
        "rss_bytes": _rss_bytes(), "rss_per_row": (_rss_bytes() - rss0) / rows,
        "table_memory_bytes": int(table.memory_bytes()),
        "stats": after,
    })
    lookups = after["tier_lookups"] - before["tier_lookups"]
    misses = after["tier_misses"] - before["tier_misses"]
    if lookups:
        # lookups count a pull's ids (duplicates too) and a push's unique
        # keys; misses are rows read from the file.
        out["hit_rate"] = 1 - misses / lookups
        out["misses_per_step"] = misses / args.steps
        out["unique_hit_rate"] = 1 - misses / uniques
        out["disk_bytes_per_row"] = after["tier_disk_bytes"] / rows
    for name, weights_only in (("export_full", False),
                               ("export_weights_only", True)):
        t = time.perf_counter()
        n = 0
        for k, *_ in table.export_chunks(chunk_rows=chunk,
                                         weights_only=weights_only):
            n += int(k.shape[0])
        sec = time.perf_counter() - t
        out[f"{name}_s"] = sec
        out[f"{name}_rows_per_s"] = n / sec
        assert n == rows, (name, n, rows)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=200_000_000)
    p.add_argument("--mem_rows", type=int, default=50_000_000)
    p.add_argument("--budget_gb", type=float, default=4.0)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--batch", type=int, default=131072)
    p.add_argument("--zipf", type=float, default=1.1)
    p.add_argument("--storage_dir", default="/var/tmp/tnet-tier")
    p.add_argument("--only", choices=["tier", "memory"], default=None)
    p.add_argument("--out", default=None)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print("RESULT " + json.dumps(_child(args)), flush=True)
        return

    from tools import _bench_common as common  # noqa: PLC0415

    info = common.run_info()
    results = {}
    configs = [("tier", args.rows, args.budget_gb),
               ("memory", args.mem_rows, 0)]
    for name, rows, budget in configs:
        if args.only and name != args.only:
            continue
        cmd = [sys.executable, os.path.abspath(__file__), "--child",
               "--rows", str(rows), "--budget_gb", str(budget),
               "--dim", str(args.dim), "--steps", str(args.steps),
               "--warmup", str(args.warmup), "--batch", str(args.batch),
               "--zipf", str(args.zipf), "--storage_dir", args.storage_dir]
        print(f"== {name}: {' '.join(cmd)}", file=sys.stderr, flush=True)
        r = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True,
                           env=dict(os.environ, PYTHONPATH=ROOT))
        line = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
        if r.returncode != 0 or not line:
            raise SystemExit(f"{name} child failed (exit {r.returncode})")
        results[name] = json.loads(line[0][len("RESULT "):])
        print(json.dumps({k: v for k, v in results[name].items()
                          if k != "stats"}, indent=1), file=sys.stderr)
    if "tier" in results and "memory" in results:
        results["throughput_ratio_tier_vs_memory"] = (
            results["tier"]["ids_per_s"] / results["memory"]["ids_per_s"])
        results["rows_in_memory_fraction"] = (
            args.budget_gb * 2**30 / (results["tier"]["rows"] * (
                8 + 4 * 2 * args.dim + 16)))
    out = args.out or common.default_out_path("bench_tier")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump({**info, "results": results}, f, indent=1)
        f.write("\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
