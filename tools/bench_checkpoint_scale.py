"""Checkpoint scale: delta cursor and restore speed (BENCHMARKS.md).

One process, one table of --rows rows (dim --dim, Adagrad). Each
repetition, in a new directory:

  1. full save (incremental=True: it also sets the change marks);
  2. restore of that full checkpoint with the previous restore loop (kept
     here as `legacy_restore`: 64K-row chunks read in the calling thread,
     `import_rows` per chunk) -- the "before";
  3. restore of the same checkpoint with tn.saving.restore -- the "after";
  4. a push to --changed of the rows (distinct keys, one step later);
  5. a delta save (only the changed rows are exported), checked to hold
     exactly the changed keys;
  6. restore of full + delta with tn.saving.restore.

Every restore is into the same live table (restore clears it first) and is
checked bit-exact against a digest of the live table (keys, weights, slots,
meta). Reported: seconds, MB/s of checkpoint, ratios, peak RSS (VmHWM).

    python tools/bench_checkpoint_scale.py --rows 10000000 --dim 8 --reps 3

--save_restore_only: each repetition is only 1 and 3 (a full save, then
its restore, alternating), the digest checked in the first repetition
only (at 200M rows a digest takes minutes):

    python tools/bench_checkpoint_scale.py --rows 200000000 --dim 8 \
        --optimizer rowwise_adagrad --reps 3 --save_restore_only
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

from tools import _saving_common as sc  # noqa: E402  (imports tnet first)
from tools import _bench_common as bc  # noqa: E402
from tools import procfs  # noqa: E402

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import tnet as tn  # noqa: E402

log = sc.log


def digest(table) -> int:
    """Order-independent 64-bit digest of every live row (key and bytes)."""
    total = np.uint64(0)
    rng = np.random.default_rng(7)
    mult = None
    for shard in range(table.num_shards):
        cursor = 0
        while cursor != -1:
            k, w, s, m, cursor = table.export_shard(shard, cursor, 1 << 20)
            cursor = int(cursor)
            k, w, s, m = k.numpy(), w.numpy(), s.numpy(), m.numpy()
            words = np.concatenate(
                [k.view(np.uint32).reshape(len(k), 2), w.view(np.uint32),
                 s.view(np.uint32), m.view(np.uint32)], axis=1).astype(
                     np.uint64)
            if mult is None:
                mult = (rng.integers(0, 2**63, words.shape[1],
                                     dtype=np.uint64) | np.uint64(1))
            h = words @ mult
            h ^= h >> np.uint64(29)
            h *= np.uint64(0xBF58476D1CE4E5B9)
            total += np.add.reduce(h, dtype=np.uint64)
    return int(total) ^ int(table.size())


def legacy_restore(table, path, chunk_rows=1 << 16):
    """The restore loop before this change (full checkpoint only)."""
    manifest = tn.saving.read_manifest(path)
    info = next(iter(manifest["tables"].values()))
    table.evict(show_decay_rate=0.0, show_threshold=1.0, ttl_steps=0,
                current_step=0)
    for part in info["parts"]:
        with h5py.File(os.path.join(path, part["file"]), "r") as f:
            n = part["rows"]
            for a in range(0, n, chunk_rows):
                b = min(n, a + chunk_rows)
                table.import_rows(f["keys"][a:b], f["weights"][a:b],
                                  f["slots"][a:b], f["meta"][a:b])


PEAKS = []  # VmHWM at the end of each timed block (PeakRss resets it)


def timed(fn):
    with sc.PeakRss() as mem:
        t0 = time.perf_counter()
        out = fn()
        seconds = time.perf_counter() - t0
    PEAKS.append(mem.peak)
    return out, seconds, mem.growth


def save_restore(model, table, d, step, check):
    """One full save, then its restore; bit-exact checked if `check`."""
    live = digest(table) if check else None
    full, t_full, m_full = timed(lambda: tn.saving.save(
        model, d, step=step, progress=lambda _: 0))
    full_bytes = sc.dir_bytes(full)
    _, t_restore, m_restore = timed(lambda: tn.saving.restore(
        model, full, progress=lambda _: 0))
    ok = (digest(table) == live) if check else None
    r = {"full_save_seconds": t_full, "full_bytes": full_bytes,
         "full_save_mb_s": full_bytes / 1e6 / t_full,
         "restore_seconds": t_restore, "restore_mb_s": full_bytes / 1e6 / t_restore,
         "restore_over_save_throughput": t_full / t_restore, "bit_exact": ok,
         "rss_growth_bytes": {"full_save": m_full, "restore": m_restore}}
    log(f"save {t_full:.1f}s ({r['full_save_mb_s']:.0f} MB/s), restore "
        f"{t_restore:.1f}s ({r['restore_mb_s']:.0f} MB/s): restore/save "
        f"throughput {r['restore_over_save_throughput']:.2f}x; bit-exact {ok}")
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=8)
    ap.add_argument("--changed", type=float, default=0.01)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", default=None, help="scratch directory")
    ap.add_argument("--out", default=None)
    ap.add_argument("--optimizer", default="adagrad",
                    choices=["adagrad", "rowwise_adagrad"])
    ap.add_argument("--save_restore_only", action="store_true")
    args = ap.parse_args()
    out = args.out or bc.default_out_path(
        f"bench_checkpoint_scale-{args.rows // 1_000_000}M")
    scratch = tempfile.mkdtemp(prefix="tnet-ckpt-scale-", dir=args.dir)
    model = sc.build_table_model(args.dim, args.optimizer)
    keys = sc.table_keys(args.rows)
    fill = sc.fill_table(model, keys, args.dim)
    table = sc.table_of(model)
    log(f"filled {fill['rows']:,} rows in "
        f"{fill['pull_seconds'] + fill['push_seconds']:.1f}s")
    rng = np.random.default_rng(0)
    n_changed = int(args.rows * args.changed)
    reps = []
    try:
        for rep in range(args.reps):
            d = os.path.join(scratch, f"rep{rep}")
            step = int(model.optimizer.iterations.numpy())
            if args.save_restore_only:
                reps.append(save_restore(model, table, d, step, check=rep == 0))
                shutil.rmtree(d, ignore_errors=True)
                continue
            live = digest(table)
            full, t_full, m_full = timed(lambda: tn.saving.save(
                model, d, step=step, incremental=True, progress=lambda _: 0))
            full_bytes = sc.dir_bytes(full)
            _, t_legacy, m_legacy = timed(lambda: legacy_restore(table, full))
            ok_legacy = digest(table) == live
            _, t_restore, m_restore = timed(lambda: tn.saving.restore(
                model, full, track_changes=True, progress=lambda _: 0))
            ok_restore = digest(table) == live
            changed, step2 = sc.push_changed(model, keys, n_changed,
                                             args.dim, rng)
            live2 = digest(table)
            delta, t_delta, m_delta = timed(lambda: tn.saving.save(
                model, d, step=step2, incremental=True,
                progress=lambda _: 0))
            man = tn.saving.read_manifest(delta)
            info = man["tables"]["id"] if "id" in man["tables"] else next(
                iter(man["tables"].values()))
            written = np.concatenate([
                h5py.File(os.path.join(delta, p["file"]), "r")["keys"][:]
                for p in info["parts"]])
            exact_keys = (man["kind"] == "delta" and np.array_equal(
                np.sort(written), np.sort(changed)))
            _, t_chain, m_chain = timed(lambda: tn.saving.restore(
                model, delta, track_changes=True, progress=lambda _: 0))
            ok_chain = digest(table) == live2
            r = {
                "full_save_seconds": t_full, "full_bytes": full_bytes,
                "full_save_mb_s": full_bytes / 1e6 / t_full,
                "delta_save_seconds": t_delta,
                "delta_kind": man["kind"],
                "delta_rows_written": int(info["rows_written"]),
                "delta_bytes": sc.dir_bytes(delta),
                "delta_over_full": t_delta / t_full,
                "delta_holds_exactly_the_changed_keys": bool(exact_keys),
                "legacy_restore_seconds": t_legacy,
                "legacy_restore_mb_s": full_bytes / 1e6 / t_legacy,
                "restore_seconds": t_restore,
                "restore_mb_s": full_bytes / 1e6 / t_restore,
                "restore_over_save_throughput": t_full / t_restore,
                "legacy_restore_over_save_throughput": t_full / t_legacy,
                "chain_restore_seconds": t_chain,
                "bit_exact": {"legacy": ok_legacy, "restore": ok_restore,
                              "full_plus_delta": ok_chain},
                "rss_growth_bytes": {"full_save": m_full, "delta_save": m_delta,
                                     "legacy_restore": m_legacy,
                                     "restore": m_restore,
                                     "chain_restore": m_chain},
            }
            reps.append(r)
            log(f"rep {rep}: full save {t_full:.2f}s "
                f"({r['full_save_mb_s']:.0f} MB/s), delta "
                f"{t_delta:.3f}s ({r['delta_over_full']:.3f}x, "
                f"{r['delta_rows_written']:,} rows, exact keys {exact_keys}); "
                f"restore legacy {t_legacy:.2f}s "
                f"({r['legacy_restore_mb_s']:.0f} MB/s) new {t_restore:.2f}s "
                f"({r['restore_mb_s']:.0f} MB/s, "
                f"{r['restore_over_save_throughput']:.2f}x save); chain "
                f"{t_chain:.2f}s; bit-exact {r['bit_exact']}")
            shutil.rmtree(d, ignore_errors=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    def med(key):
        return float(np.median([r[key] for r in reps]))
    if args.save_restore_only:
        summary = {k: med(k) for k in (
            "full_save_seconds", "restore_seconds", "full_save_mb_s",
            "restore_mb_s", "restore_over_save_throughput")}
        summary["bit_exact_first_rep"] = reps[0]["bit_exact"]
        summary["peak_rss_bytes_VmHWM"] = max(PEAKS + [procfs.status_bytes("VmHWM")])
        result = {"bench": "checkpoint_scale_save_restore", **bc.run_info(),
                  "args": vars(args), "fill": fill, "reps": reps, "summary": summary}
        _write(out, result)
        return
    summary = {k: med(k) for k in (
        "full_save_seconds", "delta_save_seconds", "delta_over_full",
        "legacy_restore_seconds", "restore_seconds", "full_save_mb_s",
        "legacy_restore_mb_s", "restore_mb_s",
        "restore_over_save_throughput",
        "legacy_restore_over_save_throughput", "chain_restore_seconds")}
    summary["all_bit_exact"] = all(all(r["bit_exact"].values()) for r in reps)
    summary["all_deltas_exact_keys"] = all(
        r["delta_holds_exactly_the_changed_keys"] for r in reps)
    summary["peak_rss_bytes_VmHWM"] = max(PEAKS + [
        procfs.status_bytes("VmHWM")])
    result = {"bench": "checkpoint_scale", **bc.run_info(),
              "args": vars(args), "fill": fill, "reps": reps,
              "summary": summary}
    _write(out, result)


def _write(out, result):
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=1, default=str)
    log(json.dumps(result["summary"], indent=1))
    log(f"wrote {out}")


if __name__ == "__main__":
    main()
