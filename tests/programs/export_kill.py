"""For tests/test_faults.py: an export killed while it is being written.

    python export_kill.py DIR

Trains the tiny model of tests/support/ckpt.py, exports version DIR/1,
writes DIR/sample.npz (serving inputs and the model's predictions), then
starts exporting DIR/2 and, once the SavedModel files are written into the
export's temporary directory (before it is renamed into place), prints
EXPORT_WRITING and sleeps, so the test can SIGKILL it mid-export.
"""
import os
import sys
import time

import numpy as np

import tnet as tn
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
from tests.support.ckpt import dataset, fit, tiny  # noqa: E402


def main(directory: str) -> None:
    model = tiny(2)
    fit(model)
    tn.serving.export_for_serving(model, os.path.join(directory, "1"))
    feats, _ = next(iter(dataset(64, seed=5)))
    pred = model.predict(feats, verbose=0)
    np.savez(os.path.join(directory, "sample.npz"),
             __expected__=pred, **{k: v.numpy() for k, v in feats.items()})
    print("EXPORTED 1", flush=True)
    real_save = tf.saved_model.save

    def save_then_stall(*args, **kwargs):
        real_save(*args, **kwargs)
        print("EXPORT_WRITING", flush=True)
        time.sleep(120)

    tf.saved_model.save = save_then_stall
    fit(model, seed=1)
    tn.serving.export_for_serving(model, os.path.join(directory, "2"))
    print("EXPORT_FINISHED", flush=True)  # never reached: killed before


if __name__ == "__main__":
    main(sys.argv[1])
