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
        tn.optimizer.sparse.WIDE_FTRL_LEARNING_RATE,
        initial_accumulator_value=wide_ftrl_acc))
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
    deep dim 8, wide part `LinearFeatures`, its default in-table FTRL) on the
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
        tn.optimizer.sparse.WIDE_FTRL_LEARNING_RATE,
        initial_accumulator_value=wide_ftrl_acc))
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


# ------------------------------------------- issue 54: the two criteria
# Criterion 1 (--one_pass): every training example seen once, then the
# hold-out AUC. Criterion 2 (--early_stopping): up to MAX_EPOCHS epochs
# with EarlyStopping(monitor="val_auc", patience=1,
# restore_best_weights=True) on a validation split taken from the
# training rows (VAL_ROWS / VAL_BATCHES below), then the hold-out AUC.
MAX_EPOCHS = 10
VAL_ROWS = {"criteo": 1000, "avazu": 300, "multi_valued": 2400}
SPARSE_HEAVY_VAL_BATCHES = 6     # of the 64 training batches
SWEEP_CASES = ("criteo", "avazu", "multi_valued", "sparse_heavy",
               "criteo_wd", "avazu_wd", "criteo_deepfm", "avazu_deepfm",
               "tfrecord_mv", "movielens_two_tower")
# The TensorNet-style model on tf.Example TFRecords (tfrecord_mv:
# tests/programs/tfrecord_mv.py, hold-out AUC; criterion 2 validates on
# its last 4,800 training rows) takes the settings stock and default
# only. tools/bench_retrieval.py's two-tower on MovieLens 100k
# (movielens_two_tower: ua split; the score is recall@50 over all items,
# recall@10/100 beside it; criterion 2 stops on the recall@50 of
# TWO_TOWER_VAL_SHARE of the ua.base interactions, a fixed random draw,
# and trains on the rest) also takes A and A>L (its rows' Adagrad start;
# it has no wide part). criteo_deepfm / avazu_deepfm: tn.models.DeepFM
# against user_models.stock_deepfm on the real rows.
STOCK_DEFAULT_ONLY = ("tfrecord_mv",)
TWO_TOWER_VAL_SHARE = 0.1


def parse_setting(setting: str):
    """A sweep setting: "stock" (tf_keras, Keras' defaults), "default"
    (tnet's defaults at this commit), "A" (tnet, Adagrad rows and, where
    the model has one, the wide FTRL rows start at A) or "A/F" (Adagrad
    rows from A, wide FTRL rows from F; "-" for either's default).
    A count-dependent start of the Adagrad rows (tn.optimizer.Adagrad's
    accumulator_floor, see tnet_ops/optimizers/adagrad.h) is written
    after A: "A>L" (rows from A, from their second update on from at
    least L); then "/F" as above. (Commits ebe9c5c and before also read
    "A+I" and "A*W", two variants measured and left out: BENCHMARKS.md
    "Defaults".)
    A suffix "@fixed" keeps the compiled Adagrad's row starts fixed
    whatever the batch (start_reference_batch=None; without it they are
    scaled from batch 256, the default; a wide part's own rule keeps its
    default).
    Returns (side, adagrad_rows_start | None, ftrl_rows_start | None,
    {row-only Adagrad hyperparameters})."""
    if setting.endswith("@fixed"):
        side, acc, ftrl, row = parse_setting(setting[:-len("@fixed")])
        if side != "tnet" or isinstance(ftrl, str):
            raise SystemExit(f"{setting}: @fixed is a tnet setting's")
        return side, acc, ftrl, {**row, "start_reference_batch": None}
    if setting in ("stock", "default"):
        return ("stock" if setting == "stock" else "tnet"), None, None, {}
    acc, _, ftrl = setting.partition("/")
    row = {}
    if ">" in acc:
        acc, _, value = acc.partition(">")
        row["accumulator_floor"] = float(value)
    ftrl = ftrl or acc
    if ":" in ftrl:  # a wide rule spelled out: kept as the string
        return "tnet", None if acc == "-" else float(acc), ftrl, row
    return ("tnet", None if acc == "-" else float(acc),
            None if ftrl == "-" else float(ftrl), row)


def wide_rule(spec):
    """The wide part's in-table rule of a setting's "/F" (None: the
    library's default): a number is FTRL's start at WideDeep's default
    learning rate (sparse.WIDE_FTRL_LEARNING_RATE; 0.2 before 2026-11-29);
    "ftrl:LR:START" or "adagrad:LR:START[:EPSILON]" names the rule,
    its learning rate and accumulator start (Adagrad's epsilon is added
    outside the square root; TFRA's Keras Adagrad adds 1e-7 inside it,
    which is "adagrad:LR:1e-7:0" from a start of 0)."""
    import tnet as tn
    if spec is None:
        return None
    if not isinstance(spec, str):
        return tn.optimizer.sparse.Ftrl(
            tn.optimizer.sparse.WIDE_FTRL_LEARNING_RATE,
            initial_accumulator_value=spec)
    rule, lr, start, *eps = spec.split(":")
    kw = {"initial_accumulator_value": float(start)}
    if rule == "adagrad":
        if eps:
            kw["epsilon"] = float(eps[0])
        return tn.optimizer.sparse.Adagrad(float(lr), **kw)
    if rule == "ftrl":
        return tn.optimizer.sparse.Ftrl(float(lr), **kw)
    raise SystemExit(f"wide rule {spec!r}: ftrl:LR:START or "
                     "adagrad:LR:START[:EPSILON]")


def _early_stopping():
    import tf_keras
    return tf_keras.callbacks.EarlyStopping(
        monitor="val_auc", mode="max", patience=1,
        restore_best_weights=True)


def _sparse_heavy_data(seed: int, batches: int, val_batches: int):
    from tnet.data import SyntheticCriteo
    from tools import _sparse_heavy as sh
    from tools.bench_train import sparse_heavy_dataset
    _, multi, _ = sh.columns()
    gen = SyntheticCriteo(seed=0, scale=1, multi_valued=sh.MULTI_VALUED)
    train_f, train_y, _ = gen.batch(batches * SPARSE_HEAVY_BATCH, "train")
    hold_f, hold_y, _ = gen.batch(16 * SPARSE_HEAVY_BATCH, "holdout")
    n_train = (batches - val_batches) * SPARSE_HEAVY_BATCH
    train = sparse_heavy_dataset({k: v[:n_train] for k, v in train_f.items()},
                                 train_y[:n_train], SPARSE_HEAVY_BATCH, multi)
    val = (sparse_heavy_dataset({k: v[n_train:] for k, v in train_f.items()},
                                train_y[n_train:], SPARSE_HEAVY_BATCH, multi)
           if val_batches else None)
    hold = sparse_heavy_dataset(hold_f, hold_y, SPARSE_HEAVY_BATCH, multi)
    # The batch order is shuffled per seed (the examples are fixed).
    return train.shuffle(batches, seed=seed), val, hold


def criterion_run(case: str, setting: str, seed: int, early: bool,
                  data_dir: str, batches: int = 64,
                  train_batch: int | None = None) -> dict:
    """One model trained under criterion 1 (early=False: one pass) or 2
    (early=True); `train_batch` (criteo, avazu, multi_valued): the
    training rows in batches of this size instead of 256; returns
    {"auc": hold-out AUC, "epochs": epochs run,
    "best_epoch": (criterion 2) the epoch whose weights were kept}."""
    import numpy as np
    import tf_keras

    import tnet as tn
    from tnet.data.metrics import auc as auc_of
    layer_opts, kind, init = None, "adagrad", None
    if setting in ("adam", "stock-adam") or setting.startswith("init:"):
        # "adam" / "stock-adam": Adam at Keras' defaults for the whole
        # model (tnet: tn.optimizer.Adam, rows corrected by their own
        # update count); "init:KEY": tnet at its defaults with the tables'
        # initializer CANDIDATES[KEY] (criteo, avazu, multi_valued).
        if case not in ("criteo", "avazu", "multi_valued"):
            raise SystemExit(f"{setting}: criteo, avazu, multi_valued only")
        if setting.startswith("init:"):
            if setting[5:] not in CANDIDATES:
                raise SystemExit(f"{setting}: one of "
                                 f"{sorted(CANDIDATES)} after init:")
            init = CANDIDATES[setting[5:]]
        else:
            kind = "adam"
        setting = "stock" if setting == "stock-adam" else "default"
    if setting.startswith(("wide:", "deep:")):
        # "wide:A>L" / "deep:A>L" (criteo, avazu, multi_valued): only that
        # layer's tables get Adagrad rows from A with the floor L (its own
        # optimizer, lr 0.05); the other layer and the dense part keep
        # the defaults.
        if case not in ("criteo", "avazu", "multi_valued"):
            raise SystemExit(f"{setting}: criteo, avazu, multi_valued only")
        layer, _, inner = setting.partition(":")
        _, lacc, _, lrow = parse_setting(inner)
        layer_opts = {layer: tn.optimizer.Adagrad(0.05, **(
            {} if lacc is None else
            {"row_initial_accumulator_value": lacc}), **lrow)}
        setting = "default"
    side, acc, ftrl, row = parse_setting(setting)
    if case == "movielens_two_tower":
        if ftrl != acc or (acc is None and setting not in ("stock",
                                                            "default")):
            raise SystemExit(f"{case}: the settings stock, default, A or "
                             "A>L (no wide part)")
        from tools import bench_retrieval  # noqa: PLC0415
        return bench_retrieval.study_run(
            side, seed, data_dir, early,
            {**({} if acc is None else
                {"row_initial_accumulator_value": acc}), **row},
            MAX_EPOCHS, TWO_TOWER_VAL_SHARE)
    if case in STOCK_DEFAULT_ONLY:   # tfrecord_mv
        if setting not in ("stock", "default"):
            raise SystemExit(f"{case}: the settings stock and default only")
        return (tfrecord_mv.early_stopped_run(side, seed, MAX_EPOCHS)
                if early else
                {"auc": tfrecord_mv.run(side, seed, 1), "epochs": 1})
    tf_keras.utils.set_random_seed(seed)
    callbacks = [_early_stopping()] if early else []
    epochs = MAX_EPOCHS if early else 1
    if case == "sparse_heavy":
        from tools import _sparse_heavy as sh
        train, val, hold = _sparse_heavy_data(
            seed, batches, SPARSE_HEAVY_VAL_BATCHES if early else 0)
        if side == "stock":
            model = sh.build_stock(0.05, 2**20)
            model.compile(tf_keras.optimizers.Adagrad(0.05),
                          tf_keras.losses.BinaryCrossentropy(from_logits=True),
                          metrics=[tf_keras.metrics.AUC(from_logits=True,
                                                        name="auc")])
        else:
            from tnet import feature_column as fc
            cats, multi, ints = sh.columns()
            cols = [fc.embedding_column(fc.category_column(n),
                                        sh.EMBEDDING_DIM, combiner="mean",
                                        table="embedding")
                    for n in cats + multi]
            wide_opt = wide_rule(ftrl)
            model = tn.models.WideDeep(cols, ints,
                                       embedding_dim=sh.EMBEDDING_DIM,
                                       hidden_units=sh.HIDDEN,
                                       train_metrics=False,
                                       wide_optimizer=wide_opt)
            okw = {} if acc is None else {"row_initial_accumulator_value": acc}
            model.compile(tn.optimizer.Adagrad(0.05, **okw, **row))
        score = ((lambda f: model.logits(f, training=False)) if side == "tnet"
                 else (lambda f: model(f, training=False)))
    else:
        dd = pathlib.Path(data_dir)
        vr = (VAL_ROWS[case.removesuffix("_wd").removesuffix("_deepfm")]
              if early else 0)
        if case == "criteo":
            data = user_models.criteo_data(dd, seed, val_rows=vr)
            model = (user_models.criteo_user_wide_deep(
                init, layer_optimizers=layer_opts) if side == "tnet"
                     else user_models.criteo_stock_wide_deep())
        elif case == "avazu":
            data = user_models.avazu_data(dd, seed, val_rows=vr)
            model = (user_models.avazu_user_wide_deep(
                init, layer_optimizers=layer_opts) if side == "tnet"
                     else user_models.avazu_stock_wide_deep())
        elif case in ("criteo_wd", "avazu_wd"):
            # tnet's own tn.models.WideDeep (as the CLI builds it: deep
            # dim 8, wide part its default in-table FTRL) on the rows; its
            # stock counterpart is the user-model case's stock model.
            from tnet import data as tn_data
            is_criteo = case == "criteo_wd"
            data = (user_models.criteo_data if is_criteo
                    else user_models.avazu_data)(dd, seed, val_rows=vr)
            if side == "stock":
                model = (user_models.criteo_stock_wide_deep() if is_criteo
                         else user_models.avazu_stock_wide_deep())
            else:
                wide_opt = wide_rule(ftrl)
                model = tn.models.WideDeep(
                    tn_data.CRITEO_CAT_COLUMNS if is_criteo
                    else tn_data.AVAZU_CAT_COLUMNS,
                    tn_data.CRITEO_INT_COLUMNS if is_criteo else [],
                    embedding_dim=8, hidden_units=user_models.HIDDEN,
                    train_metrics=False, wide_optimizer=wide_opt,
                    string_ids=not is_criteo)
        elif case in ("criteo_deepfm", "avazu_deepfm"):
            # tnet's tn.models.DeepFM (as the CLI builds it, deep dim 8;
            # its first-order term LinearFeatures with its default FTRL,
            # or the setting's "/RULE:LR:START") against the same model
            # in stock tf_keras (user_models.stock_deepfm).
            from tnet import data as tn_data
            is_criteo = case == "criteo_deepfm"
            data = (user_models.criteo_data if is_criteo
                    else user_models.avazu_data)(dd, seed, val_rows=vr)
            cats = (tn_data.CRITEO_CAT_COLUMNS if is_criteo
                    else tn_data.AVAZU_CAT_COLUMNS)
            dense = tn_data.CRITEO_INT_COLUMNS if is_criteo else []
            if side == "stock":
                model = user_models.stock_deepfm(cats, dense,
                                                 string_ids=not is_criteo)
            else:
                model = tn.models.DeepFM(cats, dense, embedding_dim=8,
                                         hidden_units=user_models.HIDDEN,
                                         train_metrics=False,
                                         string_ids=not is_criteo)
                if ftrl is not None:  # DeepFM takes no rule: swap the
                    # unbuilt first-order layer for one with the setting's
                    model.first_order = tn.layers.LinearFeatures(
                        model.category_columns, optimizer=wide_rule(ftrl),
                        name="first_order")
        elif case == "multi_valued":
            data = user_models.multi_valued_data(seed, val_rows=vr)
            model = (user_models.multi_valued_user_model(
                init, layer_optimizers=layer_opts) if side == "tnet"
                     else user_models.multi_valued_stock_model())
        else:
            raise SystemExit(f"unknown case {case!r}; one of {SWEEP_CASES}")
        train, val, hold = (data if early else (data[0], None, data[1]))
        if train_batch:
            train = train.unbatch().batch(train_batch)
        opt = user_models.optimizer(kind, side == "stock",
                                    accumulator=acc, row=row)
        if case.endswith(("_wd", "_deepfm")) and side == "tnet":
            model.compile(opt)    # its own loss and AUC metric
            score = lambda f: model.logits(f, training=False)  # noqa: E731
        else:
            model.compile(opt, loss=tf_keras.losses.BinaryCrossentropy(
                from_logits=True), metrics=[tf_keras.metrics.AUC(
                    from_logits=True, name="auc")] if early else None)
            score = lambda f: model(f, training=False)  # noqa: E731
    hist = model.fit(train, epochs=epochs, validation_data=val,
                     callbacks=callbacks, verbose=0)
    labels, scores = [], []
    for features, y in hold:
        scores.append(np.asarray(score(features)).reshape(-1))
        labels.append(np.asarray(y).reshape(-1))
    out = {"auc": float(auc_of(np.concatenate(labels),
                               np.concatenate(scores))),
           "epochs": len(hist.epoch)}
    if early:
        val_auc = hist.history["val_auc"]
        out["val_auc"] = [round(v, 5) for v in val_auc]
        out["best_epoch"] = int(np.argmax(val_auc)) + 1
    return out


def sweep(what: str, early: bool, cases, settings, seeds, jsonl: str,
          data_dir: str, train_batch: int | None = None) -> None:
    """Every (case, setting, seed) in this one process; each result is
    appended to `jsonl` as it finishes (a rerun skips the done ones)."""
    import gc
    import math
    import time

    import tf_keras
    done = set()
    if os.path.exists(jsonl):
        for line in open(jsonl):
            if line.strip():
                r = json.loads(line)
                done.add((r["case"], r["setting"], r["seed"]))
    commit = bc.run_info()["git_commit"]
    for case in cases:
        for setting in settings:
            for seed in seeds:
                if (case, setting, seed) in done:
                    continue
                start = time.time()
                r = criterion_run(case, setting, seed, early, data_dir,
                                  train_batch=train_batch)
                if train_batch:
                    r["train_batch"] = train_batch
                row = {"criterion": what, "case": case, "setting": setting,
                       "seed": seed, **r, "finite": math.isfinite(r["auc"]),
                       "seconds": round(time.time() - start, 1),
                       "commit": commit,
                       "date": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                             time.gmtime())}
                with open(jsonl, "a") as f:
                    f.write(json.dumps(row) + "\n")
                print(json.dumps(row), flush=True)
                tf_keras.backend.clear_session()
                gc.collect()


def _paired_difference(a: dict, b: dict) -> float | None:
    """Mean of a's AUC - b's over the seeds both ran (None: no shared
    seed): settings run at different seed counts are compared on the
    same seeds."""
    theirs = dict(zip(b["seeds"], b["aucs"]))
    diffs = [x - theirs[k] for k, x in zip(a["seeds"], a["aucs"])
             if k in theirs]
    return statistics.fmean(diffs) if diffs else None


def sweep_table(jsonl: str) -> tuple[str, list]:
    """Markdown table of a sweep: per case and setting the mean hold-out
    AUC, the spread (max - min over seeds), the per-seed values and the
    difference to stock and to the best setting of the case (the best
    mean; each difference over the seeds both settings ran)."""
    rows = [json.loads(line) for line in open(jsonl) if line.strip()]
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["case"], r["setting"]), []).append(r)
    summary = []
    for (case, setting), runs in sorted(groups.items()):
        runs.sort(key=lambda r: r["seed"])
        if "metric" in runs[0]:  # a score other than AUC names it
            case = f"{case} ({runs[0]['metric']})"
        aucs = [r["auc"] for r in runs]
        summary.append({"case": case, "setting": setting,
                        "seeds": [r["seed"] for r in runs], "aucs": aucs,
                        "mean": statistics.fmean(aucs),
                        "spread": max(aucs) - min(aucs),
                        "epochs": [r["epochs"] for r in runs],
                        "best_epoch": [r.get("best_epoch") for r in runs]})
    lines = ["| case | setting | seeds | mean AUC | spread | - stock | "
             "- best | per seed | epochs run |",
             "|---|---|---:|---:|---:|---:|---:|---|---|"]
    for s in summary:
        same = [t for t in summary if t["case"] == s["case"]]
        stock = next((t for t in same if t["setting"] == "stock"), None)
        best = max((t for t in same if t["setting"] != "stock"),
                   key=lambda t: t["mean"])
        vs = [None if t is None else _paired_difference(s, t)
              for t in (stock, best)]
        vs_stock, vs_best = ("" if d is None else f"{d:+.4f}" for d in vs)
        lines.append(
            f"| {s['case']} | {s['setting']} | {len(s['aucs'])} | "
            f"{s['mean']:.4f} | {s['spread']:.4f} | "
            f"{vs_stock} | "
            f"{vs_best} | "
            f"{' '.join(f'{a:.4f}' for a in s['aucs'])} | "
            f"{' '.join(str(e) for e in s['epochs'])} |")
    return "\n".join(lines), summary


def write_sweep(crit: str, what: str, jsonl: str, out: str,
                command: str) -> None:
    info = bc.run_info()
    table, summary = sweep_table(jsonl)
    crit = ("criterion 1, one pass: every training example seen once, "
            "hold-out AUC" if crit == "one_pass" else
            f"criterion 2, early-stopped: up to {MAX_EPOCHS} epochs, "
            "EarlyStopping(monitor='val_auc', patience=1, "
            "restore_best_weights=True) on a validation split of the "
            "training rows, hold-out AUC")
    markdown = "\n".join([
        bc.header_markdown(info, f"measure_defaults: {what}"), "",
        f"- {crit}",
        "- settings: `stock` = tf_keras with Keras' defaults; `default` = "
        "tnet's defaults at this commit (see README's defaults table); `A` = tnet with the Adagrad rows "
        "(and WideDeep's wide FTRL rows) starting at A; `A/F` = Adagrad "
        "rows from A, wide FTRL rows from F (the default wide lr); "
        "`A/RULE:LR:START` = "
        "the wide rows under RULE (ftrl or adagrad) at LR from START "
        "(`adagrad:LR:START:EPS`: Adagrad's epsilon; `-`: the default)",
        "", table])
    bc.write_results(out, info, [], markdown,
                     {"command": command, "criterion": crit,
                      "summary": summary,
                      "runs": [json.loads(line) for line in open(jsonl)
                               if line.strip()]})
    print(markdown)


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
    p.add_argument("--one_pass", action="store_true",
                   help="criterion 1: one pass over the training rows")
    p.add_argument("--early_stopping", action="store_true",
                   help="criterion 2: up to 10 epochs, EarlyStopping on "
                   "val_auc (patience 1, best weights restored)")
    p.add_argument("--settings", default="stock,default,0.1,0.03,0.01,1e-3,"
                   "1e-6", help="with --one_pass/--early_stopping: "
                   "stock | default | A | A/F (see parse_setting) | adam | "
                   "stock-adam | init:KEY (a CANDIDATES initializer; see "
                   "criterion_run)")
    p.add_argument("--batch", type=int, default=None,
                   help="with --one_pass/--early_stopping on criteo, avazu, "
                   "multi_valued: train in batches of this many examples "
                   "(default: the cases' 256)")
    p.add_argument("--what", default=None,
                   help="results name: bench/results/measure_defaults-"
                   "<what>-<date>.{json,md} (default: the criterion)")
    p.add_argument("--report", action="store_true",
                   help="with --one_pass/--early_stopping: only write the "
                   "results from the run log (bench/results/*.jsonl)")
    args = p.parse_args()
    if args.one_pass or args.early_stopping:
        if args.one_pass == args.early_stopping:
            raise SystemExit("pass one of --one_pass, --early_stopping")
        crit = "one_pass" if args.one_pass else "early_stopping"
        what = args.what or crit
        day = __import__("datetime").date.today().isoformat()
        out = os.path.join(bc.RESULTS_DIR,
                           f"measure_defaults-{what}-{day}.json")
        jsonl = args.jsonl or out[:-len(".json")] + ".jsonl"
        if not args.report:
            sweep(crit, args.early_stopping,
                  [c for c in args.cases.split(",")],
                  args.settings.split(","), list(range(args.seeds)), jsonl,
                  args.data_dir, args.batch)
        write_sweep(crit, what, jsonl, out, "python tools/measure_defaults.py "
                    + " ".join(sys.argv[1:]))
        return
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
