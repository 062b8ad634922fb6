"""The one-pass training job of `python -m tnet.train` (no --days, no
--stream): fit over the training data, the exact evaluation on the
hold-out, summary.json and TensorBoard logs, and with --export_dir the
serving export, checked without tnet."""
from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

import tensorflow as tf
import tf_keras

import tnet as tn
from tnet.cli import model as cli_model
from tnet.cli.config import JobConfig
from tnet.cli.data import CtrJobData, RetrievalJobData, SpecJobData
from tnet.cli.export import export_and_check, updatable_export_of
from tnet.log import get as _get_logger

_log = _get_logger("train")


@dataclasses.dataclass
class Running:
    """What the entry point needs to name a lost task and the steps it
    cost: the running job's model and checkpoint callback, once made."""
    model: Any = None
    checkpoints: Any = None
    distributed: bool = False


class _Throughput(tf_keras.callbacks.Callback):
    """Wall time and steps of fit. Epoch hooks only: ParameterServerStrategy
    refuses batch-level callbacks (steps per epoch are fixed there)."""

    def __init__(self, steps_per_epoch=None):
        super().__init__()
        self.steps_per_epoch = steps_per_epoch

    def on_train_begin(self, logs=None):
        self.start = time.perf_counter()
        self.steps = 0

    def on_epoch_end(self, epoch, logs=None):
        if self.steps_per_epoch:
            self.steps += self.steps_per_epoch
        else:  # one process: Keras' own count of this fit's steps
            self.steps = int(self.model._train_counter.numpy())

    def on_train_end(self, logs=None):
        self.seconds = time.perf_counter() - self.start


def job_data(cfg: JobConfig, distributed: bool):
    """What the job reads: a feature spec's files, MovieLens or CTR data."""
    if cfg.feature_spec:
        return SpecJobData(cfg, distributed)
    if cfg.model == "two_tower":
        return RetrievalJobData(cfg, distributed)
    return CtrJobData(cfg, distributed)


def train(cfg: JobConfig, strategy, distributed: bool,
          running: Running) -> dict:
    retrieval = cfg.model == "two_tower"
    spec = job_data(cfg, distributed)
    model = (cli_model.compiled_model(cfg, strategy, None, None, None)
             if retrieval else cli_model.compiled_model(
                 cfg, strategy, spec.categorical, spec.dense,
                 spec.string_ids))
    running.model, running.distributed = model, distributed
    steps = -(-spec.train_rows // cfg.batch_size) if distributed else None
    meter = _Throughput(steps)
    checkpoints, callbacks = cli_model.checkpoint_callbacks(cfg)
    running.checkpoints = checkpoints
    publisher = cli_model.publisher_callback(cfg)
    if publisher is not None:
        # After the Checkpoint callback: it publishes from the restored
        # model. The base it publishes to must exist before fit.
        base = updatable_export_of(cfg.export_dir)
        if base is None:
            if checkpoints is not None and tn.saving.latest_checkpoint(
                    cfg.checkpoint_dir):
                tn.saving.restore(model, cfg.checkpoint_dir)
            base = export_and_check(cfg, model, spec)["path"]
        _log.info(f"tnet.train: publishing deltas to {base}")
        callbacks.append(publisher)
    callbacks.append(meter)
    if not distributed:
        callbacks.append(tf_keras.callbacks.TensorBoard(
            os.path.join(cfg.model_dir, "logs"), update_freq=100))
    verbose = 2 if (os.environ.get("CI") or distributed) else 1
    # A read failure (bad record, damaged file) propagates to main(), which
    # names the first bad record in file order (data.explain_bad_input).
    if distributed:
        data = tf_keras.utils.experimental.DatasetCreator(
            lambda ctx: spec.train(ctx, repeat=True))
        model.fit(data, epochs=cfg.epochs, steps_per_epoch=steps,
                  callbacks=callbacks, verbose=verbose)
    else:
        model.fit(spec.train(), epochs=cfg.epochs, callbacks=callbacks,
                  verbose=verbose)
    # The chief's own reads of the ps after fit wait out a ps cut as the
    # steps do (each is read-only, or publishes whole: safe to run again).
    evaluation = tn.distribute.through_ps_cut(
        lambda: (model.evaluate_exact(spec.eval(), spec.candidates)
                 if retrieval else model.evaluate_exact(
                     spec.eval(), group_key=getattr(spec, "group_key", None))),
        "the exact evaluation after training")
    examples = meter.steps * cfg.batch_size
    tables, lifecycle = tn.distribute.through_ps_cut(
        lambda: _table_summary(model), "reading the tables' sizes")
    summary = {
        "model": cfg.model,
        "data": "feature_spec" if cfg.feature_spec else cfg.data,
        "cluster": ({"ps": tn.distribute.num_ps(strategy),
                     "workers": strategy.extended._num_workers}
                    if distributed else None),
        "flags": cfg.as_dict(),
        "eval": evaluation,
        "train": {"steps": meter.steps, "seconds": round(meter.seconds, 3),
                  "examples_per_sec": round(examples / max(meter.seconds, 1e-9), 1)},
        "tables": tables,
        **spec.info,
    }
    summary["lifecycle"] = lifecycle
    if checkpoints is not None:
        summary["checkpoint"] = {
            "restored_step": checkpoints.restored_step,
            "last_saved_step": checkpoints.last_saved_step,
            "last_saved_path": checkpoints.last_saved_path}
    if publisher is not None:
        summary["published"] = publisher.published
    if cfg.export_dir:
        summary["export"] = tn.distribute.through_ps_cut(
            lambda: export_and_check(cfg, model, spec), "the serving export")
    _write_summary(cfg.model_dir, summary)
    _log.debug("eval: %s", evaluation)
    # The CLI's documented output: the summary as one JSON document.
    print(json.dumps({"eval": summary["eval"], "train": summary["train"],
                      **spec.info}, indent=2))
    return summary


def _table_summary(model):
    """Per table: rows, bytes and rows per shard; and the lifecycle stats."""
    tables = {name: {"rows": int(t.size()),
                     "bytes": int(t.memory_bytes()),
                     "rows_per_shard": [int(x) for x in t.shard_sizes()]}
              for name, t in model.tables().items()}
    return tables, {n: t.stats() for n, t in model.tables().items()}


def _write_summary(model_dir: str, summary: dict) -> None:
    path = os.path.join(model_dir, "summary.json")
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(summary, f, indent=2)
    os.replace(tmp, path)
    # TensorBoard: the final evaluation as scalars.
    writer = tf.summary.create_file_writer(os.path.join(model_dir,
                                                        "logs", "eval"))
    with writer.as_default():
        for key, value in summary["eval"].items():
            tf.summary.scalar(key, value, step=summary["train"]["steps"])
    writer.flush()
