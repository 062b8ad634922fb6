"""The plot in BENCHMARKS.md, from the result files it cites:
examples/s of tnet, the stock tf_keras model and TFRA per workload
(median and the range of the repeats), each workload from one result file
so the bars of a group were measured side by side.

    python tools/plot_benchmarks.py [--out bench/results/throughput.png]
"""
from __future__ import annotations

import argparse
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"

# workload -> (result file, {bar label: measurement name prefix})
WORKLOADS = [
    ("WD-400\none process", "bench_train-wd400-2026-11-27-dx.json",
     {"stock": "stock floormod WD", "tnet": "tnet WD"}),
    ("SPARSE-HEAVY\none process", "bench_train-sparse_heavy-2026-11-28-warm.json",
     {"stock": "stock floormod WD, Adagrad, M as RaggedTensor",
      "tnet": "tnet WD"}),
    ("SPARSE-HEAVY\nPSS 2 workers, 2 ps", "bench_pss-sparse_heavy-2026-11-27-late.json",
     {"stock": "stock floormod WD", "tnet": "tnet WD"}),
    ("SPARSE-HEAVY\nvs TFRA 0.8.1", "bench_tfra-sparse_heavy-2026-11-25.json",
     {"stock": "stock floormod WD", "TFRA": "TFRA WD", "tnet": "tnet WD"}),
]
COLORS = {"stock": "#999999", "TFRA": "#e3a33b", "tnet": "#2b6cb0"}


def measurement(path: pathlib.Path, prefix: str) -> dict:
    for m in json.loads(path.read_text())["measurements"]:
        if m["name"].startswith(prefix) and m["unit"] == "examples/s":
            return m
    raise KeyError(f"{path.name}: no examples/s measurement {prefix!r}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=str(RESULTS / "throughput.png"))
    args = parser.parse_args()
    import matplotlib  # noqa: PLC0415
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, axes = plt.subplots(1, len(WORKLOADS), figsize=(12, 3.6))
    for ax, (title, name, bars) in zip(axes, WORKLOADS):
        labels, medians, lows, highs = [], [], [], []
        for label, prefix in bars.items():
            m = measurement(RESULTS / name, prefix)
            labels.append(label)
            medians.append(m["median"] / 1e3)
            lows.append((m["median"] - min(m["values"])) / 1e3)
            highs.append((max(m["values"]) - m["median"]) / 1e3)
        ax.bar(labels, medians, yerr=[lows, highs], capsize=3,
               color=[COLORS[label] for label in labels])
        other = "TFRA" if "TFRA" in labels else "stock"
        ratio = medians[labels.index("tnet")] / medians[labels.index(other)]
        ax.set_title(f"{title}\nmedians: tnet {ratio:.2f}x {other}",
                     fontsize=9)
        ax.tick_params(labelsize=8)
    axes[0].set_ylabel("thousand examples/s (median, range)", fontsize=8)
    fig.suptitle("Training throughput, 2-core machine (BENCHMARKS.md)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(args.out)


if __name__ == "__main__":
    main()
