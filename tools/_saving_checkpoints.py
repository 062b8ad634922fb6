"""tools/bench_saving.py part 1: full and incremental checkpoints, restore."""
from __future__ import annotations

import gc
import os
import shutil
import statistics
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

import tnet as tn  # noqa: E402  (first: selects tf_keras)
import numpy as np  # noqa: E402

from tools import _bench_common as bc  # noqa: E402

from tools._saving_common import (  # noqa: E402
    MB,
    build_table_model,
    fill_table,
    log,
    push_changed,
    same_rows,
    table_keys,
    timed_restore,
    timed_save)


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
