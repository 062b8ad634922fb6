"""The training CLI on your own CSV files, described by a feature spec.

    python examples/cli_csv.py                       # 6 days x 2,000 rows
    python examples/cli_csv.py --days 30 --rows_per_day 200000

It writes a week of CSV files (one directory per day: click, user id,
city, a set of tags, a price) and `spec.json`, then runs, as you would
from a shell:

    python -m tnet.train --feature_spec=spec.json --format=csv \\
        --train_files='data/day-01/*,...,data/day-05/*' \\
        --eval_files='data/day-06/*' \\
        --model=wide_deep --model_dir=run --export_dir=export

The CLI trains, evaluates the last day exactly, writes `run/summary.json`
and exports a SavedModel (checked in a fresh process without tnet).

It ends by serving that export with stock TensorFlow on the evaluation
day and checking that the AUC of the served predictions equals the AUC
the CLI reported, and that it learned (AUC above 0.6). Exit status 1 if
a check fails.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

SPEC = {"defaults": {"dim": 8},
        "features": [{"name": "click", "kind": "label"},
                     {"name": "user_id", "kind": "id"},
                     {"name": "city", "kind": "id", "dtype": "string"},
                     {"name": "tags", "kind": "ids", "dtype": "string"},
                     {"name": "price", "kind": "dense"}]}


def write_data(work: str, days: int, rows: int) -> None:
    """data/day-NN/part-0.csv: users divisible by 3 click, and so do
    buyers of a "sale" tag; the rest is noise."""
    rng = np.random.default_rng(0)
    for day in range(1, days + 1):
        path = os.path.join(work, "data", f"day-{day:02d}", "part-0.csv")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        users = rng.integers(0, 500, rows)
        with open(path, "w") as f:
            f.write("click,user_id,city,tags,price\n")
            for u in users:
                tags = rng.choice(["new", "sale", "eco", "kids"], rng.integers(1, 4))
                click = int(u % 3 == 0 or ("sale" in tags and rng.random() < 0.5))
                f.write(f"{click},{u},{rng.choice(['paris', 'lima'])},"
                        f"{'|'.join(tags)},{rng.random():.3f}\n")
    with open(os.path.join(work, "spec.json"), "w") as f:
        json.dump(SPEC, f, indent=1)


def serving_form(features, wanted):
    """What a serving client sends: sets of ids as [B, L] padded."""
    import tensorflow as tf
    out = {}
    for name in wanted:
        v = features[name]
        if isinstance(v, tf.SparseTensor):
            v = tf.sparse.to_dense(v, default_value="" if v.dtype == tf.string else -1)
        elif isinstance(v, tf.RaggedTensor):
            v = v.to_tensor(default_value="" if v.dtype == tf.string else -1)
        out[name] = v
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--days", type=int, default=6, help="the last one is held out")
    p.add_argument("--rows_per_day", type=int, default=2000)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--workdir", default=None,
                   help="where data, run and export go (default: a temporary dir)")
    a = p.parse_args(argv)
    work = os.path.abspath(a.workdir or tempfile.mkdtemp(prefix="tnet_cli_"))
    write_data(work, a.days, a.rows_per_day)
    last = f"day-{a.days:02d}"

    cmd = [sys.executable, "-m", "tnet.train",
           "--feature_spec=spec.json", "--format=csv",
           "--train_files=" + ",".join(f"data/day-{d:02d}/*"
                                       for d in range(1, a.days)),
           f"--eval_files=data/{last}/*",
           "--model=wide_deep", "--hidden_units=32,16", "--batch_size=256",
           f"--epochs={a.epochs}", "--model_dir=run", "--export_dir=export"]
    print("$", " ".join(cmd[1:]), flush=True)
    if subprocess.run(cmd, cwd=work).returncode != 0:
        print("FAILED: python -m tnet.train did not finish")
        return 1

    import tnet as tn                 # before tensorflow: it selects Keras 2
    import tensorflow as tf

    summary = json.load(open(os.path.join(work, "run", "summary.json")))
    reported = summary["eval"]["auc"]
    export = max(glob.glob(os.path.join(work, "export", "*", "saved_model.pb")))
    export = os.path.dirname(export)
    serve = tf.saved_model.load(export).signatures["serving_default"]
    wanted = list(serve.structured_input_signature[1])
    spec = tn.data.spec.load(os.path.join(work, "spec.json"))
    labels, scores = [], []
    for features, label in spec.dataset(os.path.join(work, "data", last, "*"),
                                        "csv", 512):
        out = serve(**serving_form(features, wanted))["prediction"]
        scores.append(out.numpy().ravel())
        labels.append(label.numpy().ravel())
    served = tn.data.auc(np.concatenate(labels), np.concatenate(scores))
    print(f"eval AUC: reported by the CLI {reported:.5f}, "
          f"of the served export {served:.5f}")

    failed = []
    if abs(served - reported) > 1e-4:
        failed.append("the export does not score the held-out day as the "
                      "trained model did")
    if not reported > 0.6:
        failed.append(f"eval AUC {reported:.4f} is not above 0.6")
    for f in failed:
        print("FAILED:", f)
    if not failed:
        print(f"OK: {export} serves the model the CLI trained")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
