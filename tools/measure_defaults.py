"""Chooses tnet's default embedding initializer by measurement.

A user-written Wide&Deep (README style) and a TensorNet-style multi-valued
model are trained with each candidate initializer and compared with the
stock tf_keras model a competent user writes (floormod ids, Keras
defaults), same data, same optimizer, same seeds (see
tests/programs/user_models.py for the models and data). Prints hold-out
AUC per seed and the mean difference to stock; writes JSON + markdown to
bench/results/defaults-<date>.{json,md}.

    python tools/measure_defaults.py                 # 3 seeds, adam + adagrad
    python tools/measure_defaults.py --seeds 1 --optimizers adam   # quick
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tnet  # noqa: E402,F401  (selects tf_keras before TensorFlow loads)

from tests.programs import user_models  # noqa: E402
from tools import _bench_common as bc  # noqa: E402

CANDIDATES = {
    "default": None,   # whatever the library's default is at this commit
    "truncated_normal(1/sqrt(dim))": "truncated_normal",
    "uniform(+-0.05)": "uniform",
    "normal(0.01)": {"name": "normal", "stddev": 0.01},
    "zeros": "zeros",
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--optimizers", default="adam,adagrad")
    p.add_argument("--cases", default="criteo,multi_valued")
    p.add_argument("--candidates", default=",".join(CANDIDATES))
    p.add_argument("--data_dir", default=str(
        pathlib.Path(bc.REPO_ROOT).parent / "shared" / "data"))
    p.add_argument("--out", default=bc.default_out_path("defaults"))
    args = p.parse_args()
    info = bc.run_info()
    results = []
    for case in args.cases.split(","):
        for kind in args.optimizers.split(","):
            sides = [("stock", "stock", None)] + [
                ("tnet", c, CANDIDATES[c]) for c in args.candidates.split(",")]
            for side, label, init in sides:
                aucs = [user_models.run(case, side, seed, kind, init,
                                        args.epochs, pathlib.Path(args.data_dir))
                        for seed in range(args.seeds)]
                results.append({"case": case, "optimizer": kind,
                                "model": label, "aucs": aucs,
                                "mean": statistics.fmean(aucs)})
                print(f"{case:13s} {kind:8s} {label:30s} mean AUC "
                      f"{results[-1]['mean']:.4f}  "
                      f"{' '.join(f'{a:.4f}' for a in aucs)}", flush=True)
    lines = [bc.header_markdown(info, "Default initializer: user models vs "
                                "stock tf_keras"), "",
             f"{args.seeds} seeds, {args.epochs} epochs; hold-out AUC "
             "(mean, per seed) and the mean difference to stock.", "",
             "| case | optimizer | model | mean AUC | - stock | per seed |",
             "|---|---|---|---:|---:|---|"]
    for r in results:
        stock = next(s["mean"] for s in results if s["case"] == r["case"]
                     and s["optimizer"] == r["optimizer"]
                     and s["model"] == "stock")
        lines.append(f"| {r['case']} | {r['optimizer']} | {r['model']} | "
                     f"{r['mean']:.4f} | {r['mean'] - stock:+.4f} | "
                     f"{' '.join(f'{a:.4f}' for a in r['aucs'])} |")
    markdown = "\n".join(lines)
    md = bc.write_results(args.out, info, [], markdown, {"results": results})
    print(markdown)
    print(f"wrote {args.out} and {md}")


if __name__ == "__main__":
    main()
