"""Checks a tnet SavedModel in a process that never imports tnet.

    python <tnet package>/saving/check.py --export_dir DIR --sample SAMPLE.npz [--tolerance 1e-5]

Run it by path (`tnet.saving.check.PATH`), never as `python -m`: importing
the tnet package would defeat the check. `python -m tnet.train` runs it
after every export.

SAMPLE.npz holds the serving inputs (one array per feature) and
`__expected__`, the predictions the training process computed for them. The
script loads the SavedModel with stock TensorFlow only, calls its
`serving_default` signature, compares, and exits 1 on any mismatch (or if
tnet got imported).
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
import tensorflow as tf


PATH = __file__


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--export_dir", required=True)
    parser.add_argument("--sample", required=True)
    parser.add_argument("--tolerance", type=float, default=1e-5)
    args = parser.parse_args()
    sample = dict(np.load(args.sample, allow_pickle=False))
    expected = sample.pop("__expected__")
    loaded = tf.saved_model.load(args.export_dir)
    serve = loaded.signatures["serving_default"]
    inputs = {k: tf.constant(v) for k, v in sample.items()}
    got = serve(**inputs)["prediction"].numpy().reshape(-1)
    diff = float(np.max(np.abs(got - expected.reshape(-1))))
    tnet_loaded = any(m == "tnet" or m.startswith("tnet.") for m in sys.modules)
    print(f"export check: {got.size} predictions from {args.export_dir} in a "
          f"process without tnet (tnet imported: {tnet_loaded}); max |diff| "
          f"vs training process = {diff:.2e} (tolerance {args.tolerance:g})",
          flush=True)
    return 0 if diff <= args.tolerance and not tnet_loaded else 1


if __name__ == "__main__":
    sys.exit(main())
