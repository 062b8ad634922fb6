"""Training program for tests/test_faults.py: ckpt_train plus fault hooks.

The model, data, checkpoint callback and state dumps are those of
tests/programs/ckpt_train.py (dumps `saved-<step>.npz` after each
checkpoint and `restored-<step>.npz` after a restore, with the dense and
optimizer variables). On top:

* `--pause_at_save K --pause_seconds S`: during the K-th checkpoint save of
  this run, after the first table part file is written into the temp
  directory, print `FAULT_IN_SAVE tmp=<dir>` and sleep S seconds, so a test
  can SIGKILL the process in the middle of a save (deterministically).
* A lost ps task makes it exit 138 (tn.distribute.EXIT_RESTART) with
  `tn.distribute.explain_failure`'s message, as `python -m tnet.train` does.

Lines it prints: those of ckpt_train, FAULT_IN_SAVE, FAULT_LOST_PS <msg>.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))

import tnet as tn  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

from tests.programs.ckpt_train import CATS, DENSE, Dumper, make_data  # noqa: E402
from tnet.models import WideDeep  # noqa: E402
from tnet.saving import checkpoint as ckpt_mod  # noqa: E402


def install_pause(at_save: int, seconds: float) -> None:
    saves = {"n": 0, "paused": False}
    real_write, real_part = ckpt_mod._write, ckpt_mod._write_part

    def write(*args, **kwargs):
        saves["n"] += 1
        return real_write(*args, **kwargs)

    def write_part(path, *args, **kwargs):
        out = real_part(path, *args, **kwargs)
        if saves["n"] == at_save and not saves["paused"]:
            saves["paused"] = True
            tmp = path.split(os.sep + "sparse" + os.sep)[0]
            print(f"FAULT_IN_SAVE tmp={tmp}", flush=True)
            time.sleep(seconds)
        return out

    ckpt_mod._write, ckpt_mod._write_part = write, write_part


def train(args) -> None:
    tf_keras.utils.set_random_seed(0)
    strategy = tn.distribute.ParameterServerStrategy()
    pss = tn.distribute.is_parameter_server_strategy(strategy)
    with strategy.scope():
        model = WideDeep(CATS, DENSE, embedding_dim=4, hidden_units=[8])
        model.compile(tn.optimizer.Adagrad(0.05))
    ckpt = tn.callbacks.Checkpoint(args.dir, every_n_epochs=1, keep=3,
                                   incremental=args.incremental, verbose=0)
    dumper = Dumper(ckpt, args.dump_dir, args.sleep, batch_hooks=False, dense=True)
    feats, labels = make_data(args.rows)
    with strategy.scope():
        model({k: v[:8] for k, v in feats.items()}, training=False)
        model.optimizer.build(model.trainable_variables)
    steps = args.rows // args.batch
    print(f"CKPT_START pss={pss} steps_per_epoch={steps}", flush=True)
    if pss:
        def dataset_fn(ctx):
            ds = tf.data.Dataset.from_tensor_slices((feats, labels))
            return ds.repeat().batch(args.batch)
        data = tf_keras.utils.experimental.DatasetCreator(dataset_fn)
        model.fit(data, epochs=args.epochs, steps_per_epoch=steps,
                  callbacks=[ckpt, dumper], verbose=0)
    else:
        ds = tf.data.Dataset.from_tensor_slices((feats, labels)).batch(
            args.batch, drop_remainder=True)
        model.fit(ds, epochs=args.epochs, callbacks=[ckpt, dumper], verbose=0)
    print(f"CKPT_DONE iterations={int(model.optimizer.iterations.numpy())}",
          flush=True)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--dump_dir", required=True)
    p.add_argument("--rows", type=int, default=640)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--incremental", action="store_true")
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--pause_at_save", type=int, default=0)
    p.add_argument("--pause_seconds", type=float, default=600.0)
    args = p.parse_args()
    os.makedirs(args.dump_dir, exist_ok=True)
    if args.pause_at_save:
        install_pause(args.pause_at_save, args.pause_seconds)
    try:
        train(args)
    except Exception as e:  # noqa: BLE001
        lost = tn.distribute.explain_failure(e)
        if lost is None:
            raise
        tn.distribute.exit_now(tn.distribute.EXIT_RESTART,
                               f"FAULT_LOST_PS {lost}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
