"""Training program for tests/test_hosts.py (a cluster across network
namespaces): the small Wide&Deep of tests/programs/ckpt_train.py on its
deterministic synthetic rows, with a checkpoint every epoch.

Lines it prints:
  HOSTS_START steps_per_epoch=N attempt=A
  HOSTS_RESTORED step=N          (a checkpoint was restored)
  PROGRESS t=<unix time> it=<optimizer.iterations>   (every --every s, from
                                  a thread that reads the step on the ps)
  HOSTS_SAVED step=N epoch=E     (after each checkpoint)
  HOSTS_PAUSE epoch=E where=W    (--pause_epoch: the program sleeps now)
  HOSTS_DONE iterations=N planned=M
  HOSTS_SHOWS table=T shows=S per_step=P   (per table: S / P = the pushes
                                  that landed, in batches)
  HOSTS_DENSE ps=K landed=N       (per ps: the steps whose dense update
                                  reached that ps, see CountedWideDeep)
  HOSTS_END                       (the counts above are printed; what
                                  follows is the process's exit alone)
  HOSTS_DEVICES iterations=<device of optimizer.iterations>
  HOSTS_LOST <tnet's one-line lost-task message>   (then exit 138)
"""
import argparse
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))

import tnet as tn  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

from tests.programs.ckpt_train import CATS, DENSE, make_data  # noqa: E402
from tnet.models import WideDeep  # noqa: E402


class Report(tf_keras.callbacks.Callback):
    def __init__(self, ckpt):
        super().__init__()
        self.ckpt = ckpt

    def on_train_begin(self, logs=None):
        if self.ckpt.restored_step is not None:
            print(f"HOSTS_RESTORED step={self.ckpt.restored_step}", flush=True)

    def on_epoch_end(self, epoch, logs=None):
        print(f"HOSTS_SAVED step={self.ckpt.last_saved_step} epoch={epoch + 1}",
              flush=True)


class Pause(tf_keras.callbacks.Callback):
    """At the end of epoch `epoch` prints HOSTS_PAUSE and sleeps `seconds`
    (for a test to cut a host then): placed before the Checkpoint callback
    the checkpoint runs into the cut, placed last the next epoch's start
    (Keras' reset of the metrics) does."""

    def __init__(self, epoch, seconds, where):
        super().__init__()
        self.epoch, self.seconds, self.where = epoch, seconds, where

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 == self.epoch:
            print(f"HOSTS_PAUSE epoch={epoch + 1} where={self.where}",
                  flush=True)
            time.sleep(self.seconds)


def monitor(model, every, stop):
    while not stop.wait(every):
        try:
            it = int(model.optimizer.iterations.numpy())
        except Exception:  # noqa: BLE001  (a lost ps: the main thread reports)
            continue
        print(f"PROGRESS t={time.time():.3f} it={it}", flush=True)


class CountedWideDeep(WideDeep):
    """WideDeep with one int64 counter per ps task that every step adds 1
    to once all its dense gradients exist: the condition under which the
    optimizer's update of a dense variable on that ps can run. So a
    counter's total is the steps whose dense update reached its ps,
    however often a step was attempted (unlike optimizer.iterations, whose
    += 1 waits on nothing but its own read: docs/DESIGN.md "Failures across
    hosts")."""

    def __init__(self, *args, num_ps=1, **kwargs):
        super().__init__(*args, **kwargs)
        # Created one after the other: ParameterServerStrategy places them
        # round-robin, one on each ps (their devices are printed).
        self.dense_landed = [
            tf.Variable(0, dtype=tf.int64, trainable=False,
                        name=f"dense_landed_{i}") for i in range(num_ps)]

    def transform_gradients(self, dense, sparse):
        ready = [g.values if isinstance(g, tf.IndexedSlices) else g
                 for g in dense if g is not None]
        with tf.control_dependencies(ready):
            for counter in self.dense_landed:
                counter.assign_add(1)
        return dense, sparse


RUN = {}


def train(args) -> None:
    tf_keras.utils.set_random_seed(0)
    strategy = tn.distribute.ParameterServerStrategy()
    with strategy.scope():
        model = CountedWideDeep(CATS, DENSE, embedding_dim=8,
                                hidden_units=[64, 32],
                                num_ps=max(1, tn.distribute.num_ps(strategy)))
        model.compile(tn.optimizer.Adagrad(0.05),
                      metrics=[tf_keras.metrics.AUC(name="auc")])
    ckpt = tn.callbacks.Checkpoint(args.dir, every_n_epochs=1, keep=3,
                                   verbose=0)
    RUN.update(model=model, checkpoint=ckpt)
    feats, labels = make_data(args.rows)
    with strategy.scope():
        model({k: v[:8] for k, v in feats.items()}, training=False)
        model.optimizer.build(model.trainable_variables)
    steps = args.rows // args.batch
    attempt = os.environ.get("TNET_LAUNCH_ATTEMPT", "0")
    print(f"HOSTS_START steps_per_epoch={steps} attempt={attempt}", flush=True)
    print(f"HOSTS_DEVICES iterations={model.optimizer.iterations.device}",
          flush=True)
    stop = threading.Event()
    if args.every > 0:
        threading.Thread(target=monitor, args=(model, args.every, stop),
                         daemon=True).start()

    def dataset_fn(ctx):
        ds = tf.data.Dataset.from_tensor_slices((feats, labels))
        return ds.repeat().batch(args.batch)

    data = tf_keras.utils.experimental.DatasetCreator(dataset_fn)
    callbacks = [ckpt, Report(ckpt)]
    if args.pause_epoch:
        pause = Pause(args.pause_epoch, args.pause_seconds, args.pause_where)
        callbacks.insert(0 if args.pause_where == "before_checkpoint"
                         else len(callbacks), pause)
    model.fit(data, epochs=args.epochs, steps_per_epoch=steps,
              callbacks=callbacks, verbose=0)
    stop.set()
    print(f"HOSTS_DONE iterations={int(model.optimizer.iterations.numpy())} "
          f"planned={args.epochs * steps}", flush=True)
    # Pushes that landed, counted by the tables themselves: every push adds
    # each id's occurrences in its batch to the row's show, so a table's
    # show total is (pushes landed) x (ids per batch); nothing decays here.
    for name, table in sorted(model.tables().items()):
        total = sum(float(meta.numpy()[:, 0].sum())
                    for _, _, _, meta in table.export_chunks())
        print(f"HOSTS_SHOWS table={name} shows={total:.0f} "
              f"per_step={args.batch * len(CATS)}", flush=True)
    for counter in model.dense_landed:
        task = counter.device.rsplit("task:", 1)[-1].split("/")[0]
        print(f"HOSTS_DENSE ps={task} landed={int(counter.numpy())}",
              flush=True)
    print("HOSTS_END", flush=True)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--rows", type=int, default=25600)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--every", type=float, default=0.5)
    p.add_argument("--pause_epoch", type=int, default=0,
                   help="pause at the end of this epoch (0: never)")
    p.add_argument("--pause_seconds", type=float, default=3.0)
    p.add_argument("--pause_where", default="before_checkpoint",
                   choices=["before_checkpoint", "after_checkpoint"])
    args = p.parse_args()
    try:
        train(args)
    except Exception as e:  # noqa: BLE001
        lost = tn.distribute.explain_failure(e)
        if lost is None:
            raise
        note = tn.distribute.steps_lost_note(RUN.get("model"),
                                             RUN.get("checkpoint"))
        tn.distribute.exit_now(tn.distribute.EXIT_RESTART,
                               f"HOSTS_LOST {lost} ({note})")
    return 0


if __name__ == "__main__":
    from tnet import bind  # noqa: E402
    bind.ensure()  # a chief's port too stays on its TF_CONFIG address
    tn.distribute.exit_now(main())  # no teardown (docs/DESIGN.md "Failures across hosts")
