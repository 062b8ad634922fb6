"""Feature lifecycle benchmark (issue 6): table size vs AUC, and admission's
cost on push throughput.

Data: `SyntheticCriteo(seed=0, scale=--scale, zipf=--zipf)`, a power law
over --scale * 5M ids (26 columns; ids made distinct across columns by a
per-column offset). The default (scale 8, zipf 0.9, 8M examples) holds
over 10M distinct keys. It is generated once and held in memory (uint32
keys).

Model: logistic regression on the ids (one weight per id plus a bias key)
in tnet tables (dim 1, Adagrad lr --lr, zeros init), trained for one pass
with direct pull / push calls. The generator's labels are logistic in
per-id weights plus dense terms, so this model family matches the hidden
one on the ids; the dense terms are left out (oracle AUC with them is
printed for context). All table configurations train in lockstep on the
same batches (each batch's unique / inverse is computed once):

- min_count in {1, 2, 3, 5} (admission; unbounded rows);
- max_rows at 50% and 25% of the distinct keys of the training data (the
  size of the unbounded min_count=1 table), min_count 1.

Reported per configuration: rows, memory_bytes, admitted / rejected /
evicted counters, and the exact hold-out AUC (pull in inference mode:
unknown or evicted ids read 0). A PNG plots AUC against rows.

Push cost: fresh tables push the same stream of per-batch unique keys
(with gradients and shows) for min_count 1 (baseline), 2, 5 and for a cap
at 50% of that stream's distinct keys; cases alternate A, B, ... for --repeats repeats; keys/s medians
and paired ratios to the baseline.

  python tools/bench_lifecycle.py           # full: ~6 min on 2 cores, ~6 GB
  python tools/bench_lifecycle.py --quick   # small: ~1 min
  python tools/bench_lifecycle.py --push_cost_only --repeats 7
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import tnet as tn  # before tensorflow: selects Keras 2

import numpy as np  # noqa: E402

from tnet.data.metrics import auc  # noqa: E402
from tnet.data.synthetic import SyntheticCriteo  # noqa: E402
from tnet.data.criteo import CRITEO_CAT_COLUMNS  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _bench_common as bc  # noqa: E402


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def make_data(gen: SyntheticCriteo, n: int, stream: str, chunk: int = 1 << 20):
    """(keys uint32 [n, 26], labels float32 [n]); keys distinct per column."""
    offsets = np.cumsum([0] + list(gen.cardinalities[:-1]))
    keys = np.empty((n, len(CRITEO_CAT_COLUMNS)), np.uint32)
    labels = np.empty(n, np.float32)
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        feats, y, _ = gen.batch(m, stream, start)
        for c, name in enumerate(CRITEO_CAT_COLUMNS):
            keys[start:start + m, c] = feats[name] + offsets[c]
        labels[start:start + m] = y
    return keys, labels


class Config:
    def __init__(self, name: str, min_count: float = 1,
                 max_rows: int | None = None):
        self.name, self.min_count, self.max_rows = name, min_count, max_rows
        self.table = tn.SparseTable(
            "lr_" + "".join(ch if ch.isalnum() else "_" for ch in name), 1, optimizer=tn.optimizer.Adagrad(ARGS.lr),
            initializer="zeros", min_count=min_count, max_rows=max_rows,
            admission_capacity=ARGS.admission_capacity)


def train_step(cfg: Config, uniq, inverse, shape, labels) -> None:
    w = cfg.table.pull(uniq, training=True).numpy()[:, 0]
    logits = w[inverse].reshape(shape).sum(axis=1)
    p = 1.0 / (1.0 + np.exp(-logits))
    g = (p - labels).astype(np.float32) * ARGS.grad_scale  # sum loss
    per_key = np.bincount(inverse, weights=np.repeat(g, shape[1]),
                          minlength=len(uniq)).astype(np.float32)
    shows = np.bincount(inverse, minlength=len(uniq)).astype(np.float32)
    cfg.table.push(uniq, per_key[:, None], step=STEP[0], shows=shows)


def evaluate(cfg: Config, keys, labels, chunk: int = 1 << 18) -> float:
    logits = []
    for start in range(0, len(labels), chunk):
        k = with_bias(keys[start:start + chunk])
        uniq, inverse = np.unique(k, return_inverse=True)
        w = cfg.table.pull(uniq, training=False).numpy()[:, 0]
        logits.append(w[inverse.reshape(-1)].reshape(k.shape).sum(axis=1))
    return auc(labels, np.concatenate(logits))


BIAS_KEY = np.int64(1) << 40


def with_bias(keys: np.ndarray) -> np.ndarray:
    k = keys.astype(np.int64)
    return np.concatenate([k, np.full((len(k), 1), BIAS_KEY)], axis=1)


def push_cost(train_keys, repeats: int):
    """keys/s of push over the first --cost_batches batches, fresh tables."""
    batches = []
    for b in range(ARGS.cost_batches):
        k = with_bias(train_keys[b * ARGS.batch:(b + 1) * ARGS.batch])
        uniq, inverse = np.unique(k, return_inverse=True)
        shows = np.bincount(inverse.reshape(-1)).astype(np.float32)
        grads = np.full((len(uniq), 1), 0.01, np.float32)
        batches.append((uniq, grads, shows))
    total_keys = sum(len(u) for u, _, _ in batches)
    # Half the distinct keys of this stream, so the cap really evicts.
    stream_distinct = len(np.unique(np.concatenate([u for u, _, _ in batches])))
    cap = max(64, stream_distinct // 2)

    def case(min_count, max_rows=None):
        def run():
            table = tn.SparseTable("cost", 1, optimizer=tn.optimizer.Adagrad(
                ARGS.lr), initializer="zeros", min_count=min_count,
                max_rows=max_rows, admission_capacity=ARGS.admission_capacity)
            # Warm the op (kernel construction) outside the timing.
            table.push(batches[0][0][:1], batches[0][1][:1], step=0)
            start = time.perf_counter()
            for i, (u, g, s) in enumerate(batches):
                table.push(u, g, step=i + 1, shows=s)
            seconds = time.perf_counter() - start
            del table
            bc.release_free_memory()
            return total_keys / seconds
        return run

    cases = {"min_count=1": case(1), "min_count=2": case(2),
             "min_count=5": case(5), "max_rows=50%": case(1, cap)}
    values = bc.alternate(cases, repeats, log=log)
    out = []
    base = values["min_count=1"]
    for name, v in values.items():
        out.append(bc.Measurement(
            "push cost", f"push {name}", "keys/s", v,
            baseline=None if name == "min_count=1" else "min_count=1",
            ratios=None if name == "min_count=1" else bc.paired_ratios(v, base),
            note=f"{ARGS.cost_batches} batches of {ARGS.batch} examples "
                 f"({total_keys} unique keys pushed, {stream_distinct} "
                 f"distinct; cap {cap})"))
    return out


def plot(results, path: str, title: str) -> None:
    import matplotlib  # noqa: PLC0415
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, label in ((axes[0], "rows", "live rows (M)"),
                           (axes[1], "bytes", "table memory (MB)")):
        for r in results:
            x = r[key] / (1e6 if key == "rows" else 2**20)
            marker = "o" if r["max_rows"] is None else "s"
            ax.scatter(x, r["auc"], marker=marker, s=50)
            ax.annotate(r["name"], (x, r["auc"]), textcoords="offset points",
                        xytext=(5, 4), fontsize=8)
        ax.set_xlabel(label)
        ax.set_ylabel("hold-out AUC")
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    info = bc.run_info()
    gen = SyntheticCriteo(seed=0, scale=ARGS.scale, zipf=ARGS.zipf)
    log(f"generating {ARGS.train_examples} train + {ARGS.eval_examples} "
        f"hold-out examples (scale {ARGS.scale}, zipf {ARGS.zipf}, "
        f"{gen.total_ids} ids)")
    if ARGS.push_cost_only:
        # Only the batches the push-cost section reads.
        n = min(ARGS.train_examples, ARGS.cost_batches * ARGS.batch)
        train_keys, _ = make_data(gen, n, "train")
        cost = push_cost(train_keys, ARGS.repeats)
        suffix = "-quick" if ARGS.quick else ""
        out = ARGS.out or bc.default_out_path(f"bench_lifecycle-pushcost{suffix}")
        md = "\n".join([bc.header_markdown(
            info, "Feature lifecycle: push cost (tools/bench_lifecycle.py "
            "--push_cost_only)"), "", "Push cost: " + cost[0].note + ".", "",
            bc.markdown_table(cost)])
        bc.write_results(out, info, cost, md, extra={"args": vars(ARGS)})
        print(md)
        return
    train_keys, train_labels = make_data(gen, ARGS.train_examples, "train")
    eval_keys, eval_labels = make_data(gen, ARGS.eval_examples, "holdout")
    oracle = gen.oracle_auc("holdout", ARGS.eval_examples)
    seen = np.zeros(gen.total_ids, bool)
    seen[train_keys.reshape(-1)] = True
    counts = np.bincount(train_keys.reshape(-1), minlength=gen.total_ids)
    distinct = int(seen.sum()) + 1  # + the bias key
    by_count = {m: int((counts >= m).sum()) + 1 for m in (2, 3, 5)}
    del seen, counts
    log(f"distinct training keys {distinct} (keys with >= 2/3/5 "
        f"occurrences: {by_count}); oracle AUC {oracle:.4f}")

    configs = [Config("min_count=1"), Config("min_count=2", 2),
               Config("min_count=3", 3), Config("min_count=5", 5),
               Config("max_rows=50%", max_rows=distinct // 2),
               Config("max_rows=25%", max_rows=distinct // 4)]
    n_batches = -(-ARGS.train_examples // ARGS.batch)
    start = time.perf_counter()
    for b in range(n_batches):
        STEP[0] = b
        k = with_bias(train_keys[b * ARGS.batch:(b + 1) * ARGS.batch])
        y = train_labels[b * ARGS.batch:(b + 1) * ARGS.batch]
        uniq, inverse = np.unique(k, return_inverse=True)
        inverse = inverse.reshape(-1)
        for cfg in configs:
            train_step(cfg, uniq, inverse, k.shape, y)
        if (b + 1) % max(1, n_batches // 10) == 0:
            log(f"  batch {b + 1}/{n_batches}: " + ", ".join(
                f"{c.name} {int(c.table.size())}" for c in configs))
    train_seconds = time.perf_counter() - start

    results = []
    for cfg in configs:
        stats = cfg.table.stats()
        row = {"name": cfg.name, "min_count": cfg.min_count,
               "max_rows": cfg.max_rows,
               "auc": evaluate(cfg, eval_keys, eval_labels), **stats}
        row["bytes_per_row"] = stats["bytes"] / max(1, stats["rows"])
        # The same table at dim 16 (Adagrad): every row 2 * 15 floats wider
        # (weights + accumulators), index and pending map unchanged.
        row["bytes_dim16"] = stats["bytes"] + stats["rows"] * 4 * 2 * 15
        results.append(row)
        log(f"{cfg.name}: rows {stats['rows']} bytes {stats['bytes']} "
            f"auc {row['auc']:.4f} admitted {stats['admitted']} rejected "
            f"{stats['rejected']} evicted {stats['evicted']} pending "
            f"{stats['pending']} dropped {stats['pending_dropped']}")
    for cfg in configs:
        del cfg.table
    bc.release_free_memory()

    log("push cost of admission / cap")
    cost = push_cost(train_keys, ARGS.repeats)

    base = results[0]
    lines = ["| config | rows | rows vs min_count=1 | memory | bytes/row | "
             "memory at dim 16 (derived) | "
             "AUC | AUC - base | admitted | rejected | evicted |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(
            f"| {r['name']} | {r['rows']:,} | {r['rows'] / base['rows']:.2f} "
            f"| {r['bytes'] / 2**20:.0f} MB | {r['bytes_per_row']:.0f} | "
            f"{r['bytes_dim16'] / 2**20:.0f} MB | "
            f"{r['auc']:.4f} | {r['auc'] - base['auc']:+.4f} | "
            f"{r['admitted']:,} | {r['rejected']:,} | {r['evicted']:,} |")
    suffix = "-quick" if ARGS.quick else ""
    out = ARGS.out or bc.default_out_path(f"bench_lifecycle{suffix}")
    png = os.path.splitext(out)[0] + ".png"
    title = (f"tnet lifecycle: {ARGS.train_examples / 1e6:g}M examples, "
             f"{distinct / 1e6:.2f}M distinct keys, logistic regression "
             f"(oracle AUC {oracle:.3f})")
    plot(results, png, title)
    md = "\n".join([
        bc.header_markdown(info, "Feature lifecycle (tools/bench_lifecycle.py)"
                           + (" — quick" if ARGS.quick else "")),
        "",
        f"Data: SyntheticCriteo scale {ARGS.scale}, zipf {ARGS.zipf}: "
        f"{ARGS.train_examples:,} training examples with {distinct:,} "
        f"distinct keys (>= 2 / 3 / 5 occurrences: "
        f"{by_count[2]:,} / {by_count[3]:,} / {by_count[5]:,}), "
        f"{ARGS.eval_examples:,} hold-out examples, oracle AUC "
        f"{oracle:.4f}. One pass, batch {ARGS.batch}, Adagrad lr {ARGS.lr}; "
        f"all tables trained in lockstep in {train_seconds:.0f} s. "
        "memory = `memory_bytes()` (rows, index, admission map); at dim 1 "
        "a row is 32 bytes, so the admission map (16 bytes a slot) eats "
        "much of what admission saves; the derived column adds the 120 "
        "bytes a row would grow at dim 16 with Adagrad.",
        "",
        "\n".join(lines),
        "",
        f"Plot: `{os.path.relpath(png, bc.REPO_ROOT)}`",
        "",
        "Push cost: " + cost[0].note + ".",
        "",
        bc.markdown_table(cost),
    ])
    bc.write_results(out, info, cost, md, extra={
        "args": vars(ARGS), "distinct_keys": distinct,
        "keys_with_min_count": by_count, "oracle_auc": oracle,
        "train_seconds": train_seconds, "configs": results, "plot": png})
    print(md)
    log(f"wrote {out} and {png}")


STEP = [0]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--scale", type=float, default=8.0)
    p.add_argument("--zipf", type=float, default=0.9)
    p.add_argument("--train_examples", type=int, default=8_000_000)
    p.add_argument("--eval_examples", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=65_536)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--grad_scale", type=float, default=1.0,
                   help="multiplies the (summed log loss) gradient")
    p.add_argument("--admission_capacity", type=int, default=1 << 24,
                   help="pending keys per table")
    p.add_argument("--cost_batches", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--push_cost_only", action="store_true",
                   help="only the push-cost section (own results file)")
    p.add_argument("--out", default="")
    args = p.parse_args(argv)
    if args.quick:
        args.scale, args.train_examples, args.eval_examples = 0.5, 400_000, 100_000
        args.batch, args.cost_batches = 16_384, 10
    return args


if __name__ == "__main__":
    ARGS = parse_args()
    main()
