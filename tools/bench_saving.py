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
import os
import shutil
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

import tnet as tn  # noqa: E402  (first: selects tf_keras)

from tools import _bench_common as bc  # noqa: E402
from tools._saving_checkpoints import bench_checkpoints  # noqa: E402
from tools._saving_common import (build_table_model, fill_table,  # noqa: E402
                                  log, table_keys)
from tools._saving_export import bench_export  # noqa: E402
from tools._saving_serving import bench_serving  # noqa: E402

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
