"""tools/bench_ops.py sections 3+4: filling a big table (rows/s, bytes per
row, RSS) per optimizer rule."""
from __future__ import annotations

import os
import sys
import time

import tnet as tn  # before tensorflow: selects Keras 2

import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _bench_common as bc  # noqa: E402
from _ops_common import KEY_BYTES, LR, META_BYTES, distinct_keys, log  # noqa: E402


# --------------------------------------------------------------- section 3+4
def fill_big(args, dim: int, optimizer, label: str) -> dict:
    """Inserts args.big_rows new keys; returns rate, memory and RSS."""
    keys = distinct_keys(1 << 44, args.big_rows)
    bc.release_free_memory()
    rss0 = bc.rss_bytes()
    t = tn.SparseTable(f"bench_big_{label}", dim=dim, optimizer=optimizer)
    fn = tf.function(lambda k: t.pull(k, training=True),
                     input_signature=[tf.TensorSpec([None], tf.int64)]
                     ).get_concrete_function()
    # Batches are converted inside the timed loop: numpy -> tensor of 100k
    # int64 is a copy of 0.8 MB, small next to the insert itself.
    start = time.perf_counter()
    for s in range(0, args.big_rows, args.big_batch):
        fn(tf.constant(keys[s:s + args.big_batch]))
    seconds = time.perf_counter() - start
    size = int(t.size())
    mem = int(t.memory_bytes())
    slots = t.num_slots
    rss1 = bc.rss_bytes()
    del fn, t
    bc.release_free_memory()
    rss2 = bc.rss_bytes()
    payload = KEY_BYTES + 4 * dim + 4 * slots + META_BYTES
    res = {"config": label, "dim": dim, "optimizer": type(optimizer).__name__,
           "num_slots": slots, "rows": size, "seconds": seconds,
           "rows_per_sec": size / seconds, "memory_bytes": mem,
           "bytes_per_row": mem / size, "payload_bytes_per_row": payload,
           "rss_before": rss0, "rss_after_fill": rss1,
           "rss_after_delete": rss2,
           "rss_growth_per_row": (rss1 - rss0) / size}
    log(f"  {label}: {size:,} rows in {seconds:.1f}s "
        f"({size / seconds / 1e6:.2f}M rows/s), {mem / size:.1f} B/row "
        f"(payload {payload}), RSS +{(rss1 - rss0) / 2**20:.0f} MiB, "
        f"{(rss1 - rss2) / 2**20:.0f} MiB returned on delete")
    assert size == args.big_rows, f"{label}: expected {args.big_rows} rows"
    return res


def bench_big(args) -> tuple[list[bc.Measurement], list[dict]]:
    def adagrad():
        return tn.optimizer.Adagrad(learning_rate=LR)

    configs = [("dim8_adagrad", 8, adagrad, args.big_repeats),
               ("dim16_adagrad", 16, adagrad, 1),
               ("dim8_rowwise_adagrad", 8,
                lambda: tn.optimizer.RowwiseAdagrad(learning_rate=LR), 1)]
    log(f"insert {args.big_rows:,} new keys in batches of {args.big_batch:,}; "
        "memory per row")
    raw, out = [], []
    for label, dim, make_opt, reps in configs:
        runs = [fill_big(args, dim, make_opt(), label) for _ in range(reps)]
        raw.extend(runs)
        payload = runs[0]["payload_bytes_per_row"]
        sec = f"{args.big_rows:,} rows, {label}"
        out.append(bc.Measurement(
            sec, "insert rate, pull(training=True)", "rows/s",
            [r["rows_per_sec"] for r in runs]))
        bpr = [r["bytes_per_row"] for r in runs]
        out.append(bc.Measurement(
            sec, "memory_bytes()/row", "bytes", bpr,
            baseline=f"payload {payload} B", ratios=[b / payload for b in bpr],
            target=1.3, higher_is_better=False))
        growth = [r["rss_growth_per_row"] for r in runs]
        out.append(bc.Measurement(
            sec, "RSS growth/row", "bytes", growth,
            baseline=f"payload {payload} B",
            ratios=[g / payload for g in growth]))
    return out, raw
