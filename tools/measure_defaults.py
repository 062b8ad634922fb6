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

The row-accumulator study (issue 25) runs one model per invocation, so a
long study can be split into short runs (each under the shared lock) and
nothing is lost when one dies; every run appends a JSON line to --jsonl:

    python tools/measure_defaults.py --one criteo,tnet,adagrad,1e-6,0 \
        --jsonl bench/results/defaults-2026-11-24.jsonl
    python tools/measure_defaults.py --summarize \
        bench/results/defaults-2026-11-24.jsonl

`--one case,side,optimizer,accumulator,seed[,initializer[,epochs[,batches
[,wide_ftrl_accumulator]]]]`: case criteo|multi_valued|avazu (user
models vs stock, tests/programs/user_models.py), sparse_heavy (tnet's
SPARSE-HEAVY Wide&Deep, `batches` of 4096, default 64), or
criteo_wd|avazu_wd (tnet's own tn.models.WideDeep, as the CLI builds it,
on the same real rows as criteo|avazu; batches ignored), tfrecord_mv
(a TensorNet-style model on generated tf.Example TFRecords vs stock,
tests/programs/tfrecord_mv.py; hold-out AUC) or two_tower (tnet's
TwoTower vs a stock tfrs two-tower on generated interactions,
tests/programs/two_tower.py; hold-out recall@50 in "score", with
"metric" naming it, and recall@10 beside it);
side tnet|stock; accumulator "-" for the side's default, else Adagrad's
start (tnet: the rows' only, dense keeps Keras' 0.1; stock: every
variable's); initializer "-" for the default or a CANDIDATES key (tnet's
tables; on two_tower also the stock side's Embeddings).
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

from tests.programs import tfrecord_mv, two_tower, user_models  # noqa: E402
from tools import _bench_common as bc  # noqa: E402

CANDIDATES = {
    "default": None,   # whatever the library's default is at this commit
    "truncated_normal(1/sqrt(dim))": "truncated_normal",
    "uniform(+-0.05)": "uniform",
    "normal(0.01)": {"name": "normal", "stddev": 0.01},
    "zeros": "zeros",
}


SPARSE_HEAVY_BATCH = 4096
RECALL_K = 50      # two_tower's score (recall@10 is recorded beside it)


def sparse_heavy_auc(seed: int, accumulator: float | None, init,
                     epochs: int, batches: int, wide_ftrl_acc: float | None,
                     holdout_batches: int = 16) -> float:
    """tnet's SPARSE-HEAVY Wide&Deep (tools/_sparse_heavy.py: 26 + 4
    multi-valued columns, dim 16, Adagrad 0.05, wide part in-table FTRL)
    on `batches` batches of 4096 for `epochs` epochs; hold-out AUC.
    `accumulator`: the Adagrad rows' start (None: tnet's default);
    `init`: the embedding columns' initializer (None: default);
    `wide_ftrl_acc`: the wide FTRL rows' start (None: its default)."""
    import tf_keras

    import tnet as tn
    from tnet import feature_column as fc
    from tnet.data import SyntheticCriteo
    from tools import _sparse_heavy as sh
    from tools.bench_train import sparse_heavy_dataset
    cats, multi, ints = sh.columns()
    gen = SyntheticCriteo(seed=0, scale=1, multi_valued=sh.MULTI_VALUED)
    train_f, train_y, _ = gen.batch(batches * SPARSE_HEAVY_BATCH, "train")
    hold_f, hold_y, _ = gen.batch(holdout_batches * SPARSE_HEAVY_BATCH,
                                  "holdout")
    train = sparse_heavy_dataset(train_f, train_y, SPARSE_HEAVY_BATCH, multi)
    hold = sparse_heavy_dataset(hold_f, hold_y, SPARSE_HEAVY_BATCH, multi)
    tf_keras.utils.set_random_seed(seed)
    kw = {} if init is None else {"initializer": init}
    cols = [fc.embedding_column(fc.category_column(n), sh.EMBEDDING_DIM,
                                combiner="mean", table="embedding", **kw)
            for n in cats + multi]
    wide_opt = (None if wide_ftrl_acc is None else tn.optimizer.sparse.Ftrl(
        0.2, initial_accumulator_value=wide_ftrl_acc))
    model = tn.models.WideDeep(cols, ints, embedding_dim=sh.EMBEDDING_DIM,
                               hidden_units=sh.HIDDEN, train_metrics=False,
                               wide_optimizer=wide_opt)
    okw = ({} if accumulator is None
           else {"row_initial_accumulator_value": accumulator})
    model.compile(tn.optimizer.Adagrad(0.05, **okw))
    # Shuffle the batch order per seed (the examples are fixed).
    model.fit(train.shuffle(batches, seed=seed), epochs=epochs, verbose=0)
    return _holdout_auc(model, hold)


def _holdout_auc(model, data) -> float:
    """Exact AUC of a tnet model's logits over (features, label) batches."""
    import numpy as np

    from tnet.data.metrics import auc as auc_of
    labels, scores = [], []
    for features, y in data:
        scores.append(np.asarray(model.logits(features, training=False))
                      .reshape(-1))
        labels.append(np.asarray(y).reshape(-1))
    return float(auc_of(np.concatenate(labels), np.concatenate(scores)))


def library_wide_deep_auc(case: str, seed: int, accumulator: float | None,
                          epochs: int, wide_ftrl_acc: float | None,
                          data_dir: str) -> float:
    """tnet's own `tn.models.WideDeep` (what `python -m tnet.train` builds:
    deep dim 8, wide part `LinearFeatures`, in-table FTRL lr 0.2) on the
    real rows of tests/programs/user_models.py ("criteo_wd": Criteo,
    "avazu_wd": Avazu), tn Adagrad 0.05; hold-out AUC."""
    import tf_keras

    import tnet as tn
    from tnet import data as tn_data
    tf_keras.utils.set_random_seed(seed)
    if case == "criteo_wd":
        train, evals = user_models.criteo_data(pathlib.Path(data_dir), seed)
        cats, dense = tn_data.CRITEO_CAT_COLUMNS, tn_data.CRITEO_INT_COLUMNS
    else:
        train, evals = user_models.avazu_data(pathlib.Path(data_dir), seed)
        cats, dense = list(train.element_spec[0]), []
    wide_opt = (None if wide_ftrl_acc is None else tn.optimizer.sparse.Ftrl(
        0.2, initial_accumulator_value=wide_ftrl_acc))
    model = tn.models.WideDeep(cats, dense, embedding_dim=8,
                               hidden_units=user_models.HIDDEN,
                               train_metrics=False, wide_optimizer=wide_opt,
                               string_ids=case == "avazu_wd")
    okw = ({} if accumulator is None
           else {"row_initial_accumulator_value": accumulator})
    model.compile(tn.optimizer.Adagrad(0.05, **okw))
    model.fit(train, epochs=epochs, verbose=0)
    return _holdout_auc(model, evals)


def one(spec: str, jsonl: str, data_dir: str, curve: bool = False) -> None:
    """Trains one model (see --one) and appends its result to `jsonl`."""
    import math
    import time
    parts = spec.split(",")
    case, side, kind, acc, seed = parts[:5]
    init = parts[5] if len(parts) > 5 else "-"
    epochs = int(parts[6]) if len(parts) > 6 else 2
    batches = int(parts[7]) if len(parts) > 7 else 64
    wide_ftrl = parts[8] if len(parts) > 8 else "-"
    start = time.time()
    extra = {}
    if case == "sparse_heavy":
        if side != "tnet" or kind != "adagrad":
            raise SystemExit("sparse_heavy: tnet with Adagrad only")
        auc = sparse_heavy_auc(int(seed), None if acc == "-" else float(acc),
                               None if init == "-" else CANDIDATES[init],
                               epochs, batches,
                               None if wide_ftrl == "-" else float(wide_ftrl))
    elif case in ("tfrecord_mv", "two_tower"):
        if kind != "adagrad" or (init != "-" and side != "tnet"
                                 and case != "two_tower"):
            raise SystemExit(f"{case}: Adagrad; an initializer for tnet only "
                             "(two_tower: for either side)")
        by_epoch = [] if curve else None
        extra = (tfrecord_mv.run if case == "tfrecord_mv" else two_tower.run)(
            side, int(seed), epochs, None if acc == "-" else float(acc),
            None if init == "-" else CANDIDATES[init], by_epoch)
        if case == "tfrecord_mv":
            auc, extra = extra, {}
        else:
            auc = extra[f"recall_at_{RECALL_K}"]
            extra = {"metric": f"recall@{RECALL_K}", "score": auc, **extra}
        if curve:   # the score after every epoch (not read by --summarize)
            extra = {**({"auc": auc} if case == "tfrecord_mv" else {}),
                     **extra, "by_epoch": by_epoch}
    elif case in ("criteo_wd", "avazu_wd"):
        if side != "tnet" or kind != "adagrad" or init != "-":
            raise SystemExit(f"{case}: tnet with Adagrad only")
        auc = library_wide_deep_auc(
            case, int(seed), None if acc == "-" else float(acc), epochs,
            None if wide_ftrl == "-" else float(wide_ftrl), data_dir)
    else:
        auc = user_models.run(case, side, int(seed), kind,
                              None if init == "-" else CANDIDATES[init],
                              epochs, pathlib.Path(data_dir),
                              accumulator=None if acc == "-" else float(acc))
    row = {"case": case, "side": side, "optimizer": kind, "accumulator": acc,
           "initializer": init, "epochs": epochs, "seed": int(seed),
           **({"batches": batches, "wide_ftrl_accumulator": wide_ftrl}
              if case == "sparse_heavy" else
              {"wide_ftrl_accumulator": wide_ftrl}
              if case in ("criteo_wd", "avazu_wd") else {}),
           **({"auc": auc} if not extra else extra),
           "finite": math.isfinite(auc),
           "seconds": round(time.time() - start, 1),
           "commit": bc.run_info()["git_commit"],
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with open(jsonl, "a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)


def summarize(jsonl: str) -> str:
    """Markdown table of a --one study: mean, per-seed AUC (or the case's
    own metric, named beside the case), difference to stock with Keras'
    defaults of the same case, optimizer and epochs."""
    rows = []
    for line in open(jsonl):
        if not line.strip():
            continue
        r = json.loads(line)
        if "metric" not in r:
            rows.append(r)
            continue
        # A score other than AUC names its metric beside the case;
        # two_tower's recall@10 gets rows of its own.
        rows.append({**r, "auc": r["score"],
                     "case": f"{r['case']} ({r['metric']})"})
        if "recall_at_10" in r and r["metric"] != "recall@10":
            rows.append({**r, "auc": r["recall_at_10"],
                         "case": f"{r['case']} (recall@10)"})
    groups: dict = {}
    for r in rows:
        key = (r["case"], r["optimizer"], r["epochs"], r["side"],
               r["accumulator"], r["initializer"]
               + ("" if r.get("wide_ftrl_accumulator", "-") == "-" else
                  f", wide FTRL acc {r['wide_ftrl_accumulator']}"))
        groups.setdefault(key, []).append(r)
    lines = ["| case | optimizer | epochs | model | row accumulator | "
             "initializer | seeds | mean AUC | - stock (Keras defaults) | "
             "per seed |", "|---|---|---:|---|---|---|---:|---:|---:|---|"]
    for key in sorted(groups):
        case, kind, epochs, side, acc, init = key
        runs = sorted(groups[key], key=lambda r: r["seed"])
        mean = statistics.fmean(r["auc"] for r in runs)
        base = groups.get((case, kind, epochs, "stock", "-", "-"))
        diff = (f"{mean - statistics.fmean(r['auc'] for r in base):+.4f}"
                if base else "")
        label = {"-": "default"}.get(acc, acc)
        per_seed = " ".join(f"{r['auc']:.4f}" for r in runs)
        lines.append(
            f"| {case} | {kind} | {epochs} | {side} | {label} | "
            f"{'default' if init == '-' else init} | {len(runs)} | "
            f"{mean:.4f} | {diff} | "
            f"{per_seed} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--one", help="case,side,optimizer,accumulator,seed"
                   "[,initializer[,epochs]]: one run appended to --jsonl")
    p.add_argument("--jsonl", help="where --one appends its result")
    p.add_argument("--curve", action="store_true",
                   help="with --one, tfrecord_mv|two_tower: also record the "
                   "score after every epoch (by_epoch)")
    p.add_argument("--summarize", metavar="JSONL",
                   help="print the markdown table of a --one study")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--optimizers", default="adam,adagrad")
    p.add_argument("--cases", default="criteo,multi_valued")
    p.add_argument("--candidates", default=",".join(CANDIDATES))
    p.add_argument("--data_dir", default=str(
        pathlib.Path(bc.REPO_ROOT).parent / "shared" / "data"))
    p.add_argument("--out", default=bc.default_out_path("defaults"))
    args = p.parse_args()
    if args.summarize:
        print(summarize(args.summarize))
        return
    if args.one:
        one(args.one, args.jsonl, args.data_dir, args.curve)
        return
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
