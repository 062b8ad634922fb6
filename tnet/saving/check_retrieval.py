"""Checks a tnet retrieval SavedModel in a process that never imports tnet.

    python <tnet package>/saving/check_retrieval.py --export_dir DIR --sample S.npz \
        [--tolerance 1e-5] [--out result.json]

S.npz holds the raw query features (one array per feature) and
`__ids__` / `__scores__`, the top-K the training process computed for them.
The script loads the SavedModel with stock TensorFlow only, calls
`serving_default`, and exits 1 if any returned id list differs, a score is
off by more than the tolerance, or tnet got imported. `--out` writes the
returned ids and scores as JSON (tests compare them themselves).
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import tensorflow as tf


PATH = __file__


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--export_dir", required=True)
    parser.add_argument("--sample", required=True)
    parser.add_argument("--tolerance", type=float, default=1e-5)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    sample = dict(np.load(args.sample, allow_pickle=False))
    want_ids, want_scores = sample.pop("__ids__"), sample.pop("__scores__")
    loaded = tf.saved_model.load(args.export_dir)
    serve = loaded.signatures["serving_default"]
    got = serve(**{k: tf.constant(v) for k, v in sample.items()})
    ids, scores = got["ids"].numpy(), got["scores"].numpy()
    tnet_loaded = any(m == "tnet" or m.startswith("tnet.") for m in sys.modules)
    same_ids = ids.shape == want_ids.shape and bool((ids == want_ids).all())
    diff = (float(np.max(np.abs(scores - want_scores)))
            if scores.shape == want_scores.shape else float("inf"))
    rows_equal = int((ids == want_ids).all(axis=1).sum()) if same_ids or \
        ids.shape == want_ids.shape else 0
    print(f"retrieval export check: {ids.shape[0]} queries x top-{ids.shape[1]} "
          f"from {args.export_dir} in a process without tnet (tnet imported: "
          f"{tnet_loaded}); id lists equal: {rows_equal}/{ids.shape[0]}; max "
          f"|score diff| = {diff:.2e} (tolerance {args.tolerance:g})", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"ids": ids.tolist(), "scores": scores.tolist(),
                       "tnet_imported": tnet_loaded}, f)
    return 0 if same_ids and diff <= args.tolerance and not tnet_loaded else 1


if __name__ == "__main__":
    sys.exit(main())
