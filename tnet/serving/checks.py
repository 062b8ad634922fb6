"""Checks a tnet SavedModel in a process that never imports tnet.

    python <tnet package>/serving/checks.py --export_dir DIR --sample SAMPLE.npz \\
        [--tolerance 1e-5] [--out result.json]

Run it by path (`tnet.serving.checks.PATH`), never as `python -m`: importing
the tnet package would defeat the check. `python -m tnet.train` runs it
after every export.

SAMPLE.npz holds the serving inputs (one array per feature) and what the
training process computed for them:

* a ranking export: `__expected__`, the predictions; the check compares
  `serving_default`'s `prediction` with them (max |diff| <= tolerance);
* a retrieval export: `__ids__` and `__scores__`, the top-K; the check
  wants every returned id list equal and every score within the
  tolerance. `--out` writes the returned ids and scores as JSON (tests
  compare them themselves).

The script loads the SavedModel with stock TensorFlow only, calls its
`serving_default` signature, compares, and exits 1 on any mismatch (or if
tnet got imported).
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

# A serving process has no Keras (TF Serving has no Python at all), and the
# check needs none: TensorFlow imports Keras' optimizers while it loads
# unless that import fails, so it fails here (~1 s of CPU less per check).
for _keras in ("keras.src.optimizers", "tf_keras.src.optimizers"):
    sys.modules.setdefault(_keras, None)
import tensorflow as tf  # noqa: E402


PATH = __file__


def _tnet_loaded() -> bool:
    return any(m == "tnet" or m.startswith("tnet.") for m in sys.modules)


def check_ranking(serve, sample, args) -> bool:
    expected = sample.pop("__expected__")
    inputs = {k: tf.constant(v) for k, v in sample.items()}
    got = serve(**inputs)["prediction"].numpy().reshape(-1)
    diff = float(np.max(np.abs(got - expected.reshape(-1))))
    tnet_loaded = _tnet_loaded()
    print(f"export check: {got.size} predictions from {args.export_dir} in a "
          f"process without tnet (tnet imported: {tnet_loaded}); max |diff| "
          f"vs training process = {diff:.2e} (tolerance {args.tolerance:g})",
          flush=True)
    return diff <= args.tolerance and not tnet_loaded


def check_retrieval(serve, sample, args) -> bool:
    want_ids, want_scores = sample.pop("__ids__"), sample.pop("__scores__")
    got = serve(**{k: tf.constant(v) for k, v in sample.items()})
    ids, scores = got["ids"].numpy(), got["scores"].numpy()
    tnet_loaded = _tnet_loaded()
    same_ids = ids.shape == want_ids.shape and bool((ids == want_ids).all())
    diff = (float(np.max(np.abs(scores - want_scores)))
            if scores.shape == want_scores.shape else float("inf"))
    rows_equal = int((ids == want_ids).all(axis=1).sum()) \
        if ids.shape == want_ids.shape else 0
    print(f"retrieval export check: {ids.shape[0]} queries x top-{ids.shape[1]} "
          f"from {args.export_dir} in a process without tnet (tnet imported: "
          f"{tnet_loaded}); id lists equal: {rows_equal}/{ids.shape[0]}; max "
          f"|score diff| = {diff:.2e} (tolerance {args.tolerance:g})", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"ids": ids.tolist(), "scores": scores.tolist(),
                       "tnet_imported": tnet_loaded}, f)
    return same_ids and diff <= args.tolerance and not tnet_loaded


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--export_dir", required=True)
    parser.add_argument("--sample", required=True)
    parser.add_argument("--tolerance", type=float, default=1e-5)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    sample = dict(np.load(args.sample, allow_pickle=False))
    loaded = tf.saved_model.load(args.export_dir)  # held while serving
    serve = loaded.signatures["serving_default"]
    check = check_retrieval if "__ids__" in sample else check_ranking
    return 0 if check(serve, sample, args) else 1


if __name__ == "__main__":
    sys.exit(main())
