"""The training CLI: python -m tnet.train --flagfile=configs/<model>_<data>.cfg

Trains a ranking model (Wide&Deep, DeepFM, DCN) on Criteo, Avazu or the
synthetic Criteo-like generator, with the Keras progress bar; evaluates AUC
and log loss on the hold-out; writes TensorBoard logs and `summary.json`
(config, metrics, throughput, table sizes) to --model_dir.
`--model=two_tower --data=movielens` trains the retrieval model instead and
evaluates recall@10/50/100 over all items (with a popularity baseline).

`--feature_spec=spec.json --format=tfrecord|csv|tsv|parquet` trains on a
user's own data (tnet.data.spec); with `--days=A..B --day_pattern=...` it
runs the daily loop of tnet/train_daily.py (resume, evaluate the day before
training on it, train, checkpoint, export a new version).

With no flags it runs the embedded default: Wide&Deep on synthetic data.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback

from absl import app, flags

import tnet as tn  # noqa: F401  (first: selects tf_keras)
import tensorflow as tf
import tf_keras

from tnet import bind
from tnet.log import get as _get_logger
from tnet.log import set_verbosity
from tnet.train_data import (BadInputError, CtrJobData, RetrievalJobData,  # noqa: F401
                             SpecJobData, explain_bad_input)
from tnet import models as tn_models

FLAGS = flags.FLAGS
_log = _get_logger("train")
flags.DEFINE_enum("model", "wide_deep", ["wide_deep", "deepfm", "dcn",
                                        "two_tower"],
                  "Model architecture (two_tower: retrieval, with "
                  "--data=movielens).")
flags.DEFINE_enum("data", "synthetic", ["synthetic", "criteo", "avazu",
                                        "movielens"],
                  "Dataset kind.")
flags.DEFINE_string("movielens_dir", "../shared/data/movielens",
                    "MovieLens 100k directory (ua.base/ua.test, RecBole "
                    ".user/.item files).")
flags.DEFINE_integer("history_max_length", 20, "two_tower: history ids "
                     "kept (the most recent).")
flags.DEFINE_enum("pooling", "attention", ["mean", "attention"],
                  "two_tower: how the history sequence is pooled.")
flags.DEFINE_bool("sampling_bias_correction", True, "two_tower: correct "
                  "in-batch softmax logits by item frequency.")
flags.DEFINE_float("temperature", 0.1, "two_tower: softmax temperature.")
flags.DEFINE_integer("top_k", 100, "two_tower: ids returned by the "
                     "exported retriever.")
flags.DEFINE_string("feature_spec", "", "A feature spec (JSON, or YAML "
                    "with PyYAML) describing your own data; overrides --data "
                    "(see docs/guides/data-and-cli.md).")
flags.DEFINE_enum("format", "tfrecord", ["tfrecord", "csv", "tsv", "parquet"],
                  "With --feature_spec: the files' format.")
flags.DEFINE_string("days", "", "With --feature_spec: the daily loop over "
                    "these days, FIRST..LAST (dates YYYY-MM-DD) or a comma "
                    "list; needs --day_pattern and --checkpoint_dir.")
flags.DEFINE_string("day_pattern", "", "With --days: the files of one day, "
                    "'{day}' replaced by the day, e.g. 'data/{day}/*'.")
flags.DEFINE_string("stream", "", "With --feature_spec: train "
                    "continuously on the files of this directory or glob as "
                    "they land, in name order, each exactly once across "
                    "restarts (with --checkpoint_dir); see "
                    "docs/guides/online-training.md.")
flags.DEFINE_enum("stream_landed", "rename", ["rename", "done", "success"],
                  "With --stream: when a file counts as landed: rename (its "
                  "final name is listed; write under a '.'/'_' name or a "
                  ".tmp suffix, then rename), done (<file>.done exists), "
                  "success (_SUCCESS exists in its directory).")
flags.DEFINE_float("stream_poll_secs", 1.0, "With --stream: seconds between "
                   "listings when there is nothing to read.")
flags.DEFINE_float("stream_idle_secs", 0, "With --stream: stop (after a "
                   "checkpoint) when no new file landed for this long; 0: "
                   "run until SIGTERM.")
flags.DEFINE_float("stream_max_file_age_secs", 7 * 86400, "With --stream: "
                   "the ledger of trained files keeps files modified within "
                   "this age; older files are taken as trained (named in the "
                   "log, not read).")
flags.DEFINE_enum("bad_files", "skip", ["skip", "fail"], "With --stream: a "
                  "damaged file (named file:record) is recorded as bad and "
                  "skipped, or stops the run after a checkpoint with exit "
                  "status 4.")
flags.DEFINE_integer("metrics_port", -1, "With --stream: serve Prometheus "
                     "metrics (files trained and pending, lag, freshness, "
                     "step, checkpoint time, table rows, memory) on this "
                     "port at /metrics (0: any free port, printed; -1: off).")
flags.DEFINE_integer("checkpoint_every_n_files", 0, "With --stream: "
                     "checkpoint after every N files (0: off).")
flags.DEFINE_float("checkpoint_every_seconds", 0, "With --stream: "
                   "checkpoint at the first file boundary S seconds after "
                   "the previous checkpoint (0: off). Either way a stream "
                   "checkpoints when it stops.")
flags.DEFINE_list("train_files", [], "Training files (criteo / avazu / "
                  "--feature_spec); globs allowed.")
flags.DEFINE_list("eval_files", [], "Evaluation files; default: the rows of "
                  "--train_files after --train_rows.")
flags.DEFINE_integer("train_rows", -1, "Use the first N rows of "
                     "--train_files for training (-1: all).")
flags.DEFINE_integer("eval_rows", -1, "Evaluate on at most N rows (-1: all).")
flags.DEFINE_integer("synthetic_train_examples", 200_000,
                     "Synthetic training examples per epoch.")
flags.DEFINE_integer("synthetic_eval_examples", 50_000,
                     "Synthetic hold-out examples.")
flags.DEFINE_float("synthetic_scale", 0.05, "Synthetic cardinality scale "
                   "(1.0 = about 5M distinct ids).")
flags.DEFINE_enum("bad_rows", "fail", ["fail", "skip"],
                  "Malformed input rows: fail (exit status 4 naming the first "
                  "bad file:record in file order) or skip (log the first 5, "
                  "count all per file in the log and summary.json).")
flags.DEFINE_bool("verbose", False, "On bad input (exit status 4), print "
                  "the traceback after the one-line message.")
flags.DEFINE_integer("batch_size", 1024, "Examples per step.")
flags.DEFINE_integer("epochs", 1, "Passes over the training data.")
flags.DEFINE_enum("optimizer", "adagrad", tn.optimizer.names(),
                  "Optimizer for dense variables and tables.")
flags.DEFINE_float("learning_rate", 0.05, "Learning rate.")
flags.DEFINE_integer("embedding_dim", 8, "Embedding width per id column.")
flags.DEFINE_list("hidden_units", ["400", "400", "400"], "MLP widths.")
flags.DEFINE_string("model_dir", "/tmp/tnet_run", "Where TensorBoard logs "
                    "and summary.json go.")
flags.DEFINE_integer("seed", 0, "Random seed (initializers, shuffling, "
                     "synthetic data).")
flags.DEFINE_integer("shuffle_buffer", 10_000, "Shuffle buffer for real "
                     "data (0: no shuffling).")
flags.DEFINE_string("export_dir", "", "If set, export a SavedModel for "
                    "serving to <export_dir>/<unix time> after training (no tnet op inside) and "
                    "check it in a fresh process without tnet.")
flags.DEFINE_enum("quantize", None, ["float16", "int8"], "Embedding storage "
                  "of the export (default float32).")
flags.DEFINE_bool("updatable_export", False, "Write the export with "
                  "updatable=True (an overlay and the apply_delta "
                  "signatures): tn.saving.publish_delta and python -m "
                  "tnet.serving.follow can then keep it fresh.")
flags.DEFINE_string("update_key_file", "", "Updatable exports: the file "
                    "that keeps the update key apply_delta / apply_rows "
                    "require (owner-only; generated when missing). Default: "
                    "<export_dir>.update_key. Keep it off the volume the "
                    "model server mounts; give it to the follower only.")
flags.DEFINE_bool("rotate_update_key", False, "Updatable exports: every new "
                  "base this run writes (compaction, the final export, each "
                  "day's export) gets a new update key; the key file keeps "
                  "the previous one second.")
flags.DEFINE_integer("publish_every_n_steps", 0, "With --export_dir: keep "
                     "the served model fresh while training: every N steps "
                     "(under a cluster: at the epoch end that crosses it), "
                     "publish the rows changed since the last publish as a "
                     "delta of the newest updatable export (one is written "
                     "first if there is none); python -m tnet.serving.follow "
                     "applies them. Implies --updatable_export. 0: off.")
flags.DEFINE_float("publish_every_seconds", 0, "As --publish_every_n_steps, "
                   "every S seconds. 0: off.")
flags.DEFINE_float("publish_compact_at", 0.1, "With --publish_every_*: "
                   "when the rows published since the export's base reach "
                   "this fraction of its rows, publish a new base version "
                   "instead of a delta (TF Serving loads it; the follower "
                   "moves to it). 0: never.")
flags.DEFINE_string("checkpoint_dir", "", "Checkpoints (tables + dense "
                    "state) go here; training resumes from the newest one. "
                    "Empty: no checkpoints.")
flags.DEFINE_integer("checkpoint_every_n_steps", 0, "Save every N steps (one "
                     "process only; 0: off).")
flags.DEFINE_integer("checkpoint_every_n_epochs", 1, "Save every N epochs "
                     "(under ParameterServerStrategy the only option).")
flags.DEFINE_integer("checkpoint_keep", 3, "Checkpoints to keep.")
flags.DEFINE_bool("checkpoint_incremental", False, "Write deltas (changed "
                  "rows + deleted keys) between full checkpoints.")
flags.DEFINE_integer("checkpoint_full_every", 8, "With incremental: a full "
                     "checkpoint at least every N saves.")
flags.DEFINE_string("data_cache_dir", "/tmp/tnet_data", "Where synthetic "
                    "data is written as TSV for cluster runs.")

# Feature lifecycle (admission, row cap, eviction): see tnet/table.py.
flags.DEFINE_float("min_count", 1, "Shows an id needs before it gets a "
                   "table row (1: every id at once); earlier it reads zeros "
                   "and gets no update.")
flags.DEFINE_integer("admission_capacity", 1 << 20, "Ids per table shard "
                     "counted while waiting for admission (exact, bounded).")
flags.DEFINE_integer("max_rows", 0, "Most rows per table, split over its "
                     "shards; the lowest-show rows go first (0: unbounded).")
flags.DEFINE_integer("memory_budget_bytes", 0, "Disk tier: bytes of rows "
                     "each table keeps in memory (split over its shards); "
                     "the rest live in --storage_dir (0: all in memory).")
flags.DEFINE_string("storage_dir", "", "Disk tier: a writable local "
                    "directory (on every ps host) for the rows beyond "
                    "--memory_budget_bytes.")
flags.DEFINE_float("show_decay_rate", 1.0, "Maintenance: show *= rate.")
flags.DEFINE_float("show_threshold", 0.0, "Maintenance: evict rows whose "
                   "(decayed) show is below this.")
flags.DEFINE_integer("ttl_steps", 0, "Maintenance: evict rows not updated "
                     "for more than N steps (0: off).")
flags.DEFINE_integer("maintenance_every_n_steps", 0, "Run table maintenance "
                     "every N steps (under ParameterServerStrategy: at the "
                     "epoch ends that cross a multiple of N); 0: never.")


def _lifecycle(model, checkpoints):
    """Applies the lifecycle flags to the model's tnet layers (before their
    tables exist) and returns the TableMaintenance callback, or None."""
    for layer in model.tnet_layers():
        layer.set_table_options(
            min_count=FLAGS.min_count,
            max_rows=FLAGS.max_rows or None,
            admission_capacity=FLAGS.admission_capacity,
            memory_budget_bytes=FLAGS.memory_budget_bytes or None,
            storage_dir=FLAGS.storage_dir or None)
    if not FLAGS.maintenance_every_n_steps:
        return None
    maintenance = tn.callbacks.TableMaintenance(
        every_n_steps=FLAGS.maintenance_every_n_steps,
        show_decay_rate=FLAGS.show_decay_rate,
        show_threshold=FLAGS.show_threshold, ttl_steps=FLAGS.ttl_steps,
        log_dir=os.path.join(FLAGS.model_dir, "logs", "tables"))
    if checkpoints is not None:
        checkpoints.maintenance = maintenance  # evict before each save
    return maintenance


_MODELS = {"wide_deep": tn_models.WideDeep, "deepfm": tn_models.DeepFM,
           "dcn": tn_models.DCN}


def _publishing() -> bool:
    return bool(FLAGS.publish_every_n_steps or FLAGS.publish_every_seconds)


def _publisher():
    """The PublishDeltas callback of --publish_every_*, or None."""
    if not _publishing():
        return None
    return tn.callbacks.PublishDeltas(
        FLAGS.export_dir, every_n_steps=FLAGS.publish_every_n_steps or None,
        every_seconds=FLAGS.publish_every_seconds or None,
        compact_at=FLAGS.publish_compact_at or None,
        rotate_update_key=FLAGS.rotate_update_key)


def updatable_export_of(export_dir: str):
    """The newest updatable version under `export_dir`, or None."""
    from tnet.serving import deltas as fresh  # noqa: PLC0415
    if not os.path.isdir(export_dir):
        return None
    try:
        newest = fresh.newest_export(export_dir)
        fresh.read_info(newest)
    except (fresh.DeltaError, OSError):
        return None
    return newest


def _check_model_data() -> None:
    if FLAGS.memory_budget_bytes < 0:
        raise app.UsageError("--memory_budget_bytes must be >= 0 (0: every "
                             "row in memory)")
    if bool(FLAGS.memory_budget_bytes) != bool(FLAGS.storage_dir):
        raise app.UsageError("--memory_budget_bytes and --storage_dir go "
                             "together: the disk tier needs a budget and a "
                             "writable local directory")
    if _publishing():
        if not FLAGS.export_dir:
            raise app.UsageError("--publish_every_n_steps/_seconds publish "
                                 "to an export: set --export_dir")
        if FLAGS.model == "two_tower":
            raise app.UsageError("--publish_every_* keeps a ranking model's "
                                 "export fresh, not two_tower's")
        if min(FLAGS.publish_every_n_steps, FLAGS.publish_every_seconds,
               FLAGS.publish_compact_at) < 0:
            raise app.UsageError("--publish_every_n_steps, "
                                 "--publish_every_seconds and "
                                 "--publish_compact_at must be >= 0")
    if FLAGS.feature_spec:
        if FLAGS.model == "two_tower":
            raise app.UsageError("--feature_spec trains the ranking models "
                                 "(wide_deep, deepfm, dcn), not two_tower")
        if FLAGS.days and not (FLAGS.day_pattern and FLAGS.checkpoint_dir):
            raise app.UsageError("--days needs --day_pattern (e.g. "
                                 "'data/{day}/*') and --checkpoint_dir")
        return
    if FLAGS.days:
        raise app.UsageError("--days needs --feature_spec")
    retrieval = FLAGS.model == "two_tower"
    if retrieval != (FLAGS.data == "movielens"):
        raise app.UsageError("--model=two_tower goes with --data=movielens "
                             "(and the ranking models with the CTR data)")


def build_model(categorical, dense, string_ids):
    if FLAGS.model == "two_tower":
        from tnet.data.movielens import USER_FEATURES  # noqa: PLC0415
        return tn_models.TwoTower(
            user_features=USER_FEATURES,
            history_max_length=FLAGS.history_max_length,
            pooling=FLAGS.pooling, embedding_dim=FLAGS.embedding_dim,
            hidden_units=[int(u) for u in FLAGS.hidden_units],
            output_dim=FLAGS.embedding_dim, temperature=FLAGS.temperature,
            sampling_probability_key=("item_prob"
                                      if FLAGS.sampling_bias_correction
                                      else None))
    kwargs = dict(embedding_dim=FLAGS.embedding_dim, string_ids=string_ids,
                  hidden_units=[int(u) for u in FLAGS.hidden_units])
    return _MODELS[FLAGS.model](categorical, dense, **kwargs)


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


# The running job's model and Checkpoint callback, for the lost-task line.
_RUN: dict = {}


def run() -> dict:
    tf_keras.utils.set_random_seed(FLAGS.seed)
    os.makedirs(FLAGS.model_dir, exist_ok=True)
    strategy = tn.distribute.ParameterServerStrategy()
    distributed = tn.distribute.is_parameter_server_strategy(strategy)
    _check_model_data()
    if FLAGS.stream:
        from tnet import train_stream  # noqa: PLC0415
        train_stream.check_flags(distributed)
        return train_stream.run_stream(strategy, sys.modules[__name__])
    if FLAGS.feature_spec and FLAGS.days:
        from tnet import train_daily  # noqa: PLC0415
        return train_daily.run_days(strategy, distributed,
                                    sys.modules[__name__])
    retrieval = FLAGS.model == "two_tower"
    if FLAGS.feature_spec:
        spec = SpecJobData(distributed)
    else:
        spec = (RetrievalJobData(distributed) if retrieval
                else CtrJobData(distributed))
    with strategy.scope():
        model = (build_model(None, None, None) if retrieval else
                 build_model(spec.categorical, spec.dense, spec.string_ids))
        model.compile(tn.optimizer.by_name(FLAGS.optimizer)(FLAGS.learning_rate))
    _RUN["model"], _RUN["distributed"] = model, distributed
    steps = -(-spec.train_rows // FLAGS.batch_size) if distributed else None
    meter = _Throughput(steps)
    callbacks = []
    checkpoints = None
    if FLAGS.checkpoint_dir:
        # First, so the restore happens before the other callbacks start.
        checkpoints = tn.callbacks.Checkpoint(
            FLAGS.checkpoint_dir,
            every_n_steps=FLAGS.checkpoint_every_n_steps or None,
            every_n_epochs=FLAGS.checkpoint_every_n_epochs or None,
            keep=FLAGS.checkpoint_keep,
            incremental=FLAGS.checkpoint_incremental,
            full_every=FLAGS.checkpoint_full_every)
        callbacks.append(checkpoints)
        _RUN["checkpoints"] = checkpoints
    maintenance = _lifecycle(model, checkpoints)
    if maintenance is not None:
        callbacks.append(maintenance)
    publisher = _publisher()
    if publisher is not None:
        # After the Checkpoint callback: it publishes from the restored
        # model. The base it publishes to must exist before fit.
        base = updatable_export_of(FLAGS.export_dir)
        if base is None:
            if checkpoints is not None and tn.saving.latest_checkpoint(
                    FLAGS.checkpoint_dir):
                tn.saving.restore(model, FLAGS.checkpoint_dir)
            base = export_and_check(model, spec)["path"]
        _log.info(f"tnet.train: publishing deltas to {base}")
        callbacks.append(publisher)
    callbacks.append(meter)
    if not distributed:
        callbacks.append(tf_keras.callbacks.TensorBoard(
            os.path.join(FLAGS.model_dir, "logs"), update_freq=100))
    verbose = 2 if (os.environ.get("CI") or distributed) else 1
    # A read failure (bad record, damaged file) propagates to main(), which
    # names the first bad record in file order (train_data.explain_bad_input).
    if distributed:
        data = tf_keras.utils.experimental.DatasetCreator(
            lambda ctx: spec.train(ctx, repeat=True))
        model.fit(data, epochs=FLAGS.epochs, steps_per_epoch=steps,
                  callbacks=callbacks, verbose=verbose)
    else:
        model.fit(spec.train(), epochs=FLAGS.epochs, callbacks=callbacks,
                  verbose=verbose)
    # The chief's own reads of the ps after fit wait out a ps cut as the
    # steps do (each is read-only, or publishes whole: safe to run again).
    evaluation = tn.distribute.through_ps_cut(
        lambda: (model.evaluate_exact(spec.eval(), spec.candidates)
                 if retrieval else model.evaluate_exact(
                     spec.eval(), group_key=getattr(spec, "group_key", None))),
        "the exact evaluation after training")
    examples = meter.steps * FLAGS.batch_size
    tables, lifecycle = tn.distribute.through_ps_cut(
        lambda: _table_summary(model), "reading the tables' sizes")
    summary = {
        "model": FLAGS.model,
        "data": "feature_spec" if FLAGS.feature_spec else FLAGS.data,
        "cluster": ({"ps": tn.distribute.num_ps(strategy),
                     "workers": strategy.extended._num_workers}
                    if distributed else None),
        "flags": _flag_values(),
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
    if FLAGS.export_dir:
        summary["export"] = tn.distribute.through_ps_cut(
            lambda: export_and_check(model, spec), "the serving export")
    _write_summary(summary)
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


def export_and_check(model, spec, version: int | None = None,
                     sample_data=None) -> dict:
    """Exports for serving, then reloads the SavedModel in a fresh Python
    process that never imports tnet and compares its predictions with this
    process's on a hold-out batch. `version` (default: unix time) numbers
    the export directory; `sample_data` (default spec.eval()) gives it."""
    if isinstance(spec, RetrievalJobData):
        return export_and_check_retrieval(model, spec)
    # A numbered version directory, as TF Serving expects (newest wins).
    version = os.path.join(FLAGS.export_dir, str(
        int(time.time()) if version is None else version))
    element = next(iter(spec.eval() if sample_data is None else sample_data))
    features = dict(element[0])
    features.pop(getattr(spec, "group_key", None) or "", None)
    # Called before the export: fit never calls the model itself (it calls
    # logits), and the export infers its signature from the model's first
    # call, as Keras' model.save does (ragged ids -> padded [None, None]).
    expected = model(features, training=False).numpy()[:256].reshape(-1)
    updatable = FLAGS.updatable_export or _publishing()
    path = tn.saving.export_for_serving(
        model, version, quantize=FLAGS.quantize, updatable=updatable,
        **({} if not updatable else dict(
            update_key_file=FLAGS.update_key_file or None,
            rotate_update_key=FLAGS.rotate_update_key)))
    sample = {k: _serving_array(v)[:256] for k, v in features.items()}
    sample_path = _save_sample(__expected__=expected, **sample)
    tolerance = {None: 1e-5, "float16": 1e-3, "int8": 1e-2}[FLAGS.quantize]
    result = {"path": path, "quantize": FLAGS.quantize,
              "updatable": FLAGS.updatable_export or _publishing()}
    result["checked_without_tnet"] = _run_checker(
        "checks.py", path, sample_path, tolerance)
    return result


def export_and_check_retrieval(model, spec) -> dict:
    """The two-tower export (query features -> top-K ids and scores),
    reloaded in a fresh process without tnet and compared with this
    process's BruteForce top-K on hold-out queries."""
    version = os.path.join(FLAGS.export_dir, str(int(time.time())))
    path = tn.saving.export_for_serving(model, version,
                                        quantize=FLAGS.quantize,
                                        candidates=spec.candidates,
                                        k=FLAGS.top_k)
    result = {"path": path, "quantize": FLAGS.quantize, "k": FLAGS.top_k}
    if FLAGS.quantize is not None:
        # quantized tables move scores, so near-ties may swap: not checked
        return result
    sample = {n: spec.data.test[n][:256] for n in model.query_feature_names()}
    scores, ids = model.candidate_index(spec.candidates)(
        model.query_embedding(sample), k=FLAGS.top_k)
    sample_path = _save_sample(__ids__=ids.numpy(), __scores__=scores.numpy(),
                               **sample)
    result["checked_without_tnet"] = _run_checker(
        "checks.py", path, sample_path, 1e-4)
    return result


def _serving_array(value):
    """A feature batch as the serving signature takes it: ragged and sparse
    ids padded with -1 (or "") into a dense [B, L] array."""
    if isinstance(value, (tf.RaggedTensor, tf.SparseTensor)):
        pad = "" if value.dtype == tf.string else -1
        value = (value.to_tensor(default_value=pad)
                 if isinstance(value, tf.RaggedTensor)
                 else tf.sparse.to_dense(value, default_value=pad))
    return value.numpy()


def _save_sample(**arrays) -> str:
    """Writes the export check's inputs and expected outputs to an .npz.

    String features arrive as object arrays of bytes, which np.load refuses
    without pickle (the checker loads with allow_pickle=False): they are
    stored as fixed-width bytes, which tf.constant reads back as tf.string.
    """
    import numpy as np  # noqa: PLC0415
    path = os.path.abspath(os.path.join(FLAGS.model_dir, "export_sample.npz"))
    np.savez(path, **{k: (v.astype("S") if v.dtype == object else v)
                      for k, v in arrays.items()})
    return path


def _run_checker(script: str, path: str, sample_path: str,
                 tolerance: float) -> bool:
    """Runs tnet/serving/<script> on an export in a fresh process that never
    imports tnet (by file path: no package import, no PYTHONPATH, no
    cluster, no preload); raises if it fails."""
    import subprocess  # noqa: PLC0415
    checker = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                           "serving", script)
    env = {k: v for k, v in os.environ.items()
           if k not in ("TF_CONFIG", "PYTHONPATH", "LD_PRELOAD")
           and not k.startswith("TNET_BIND")}
    res = subprocess.run([sys.executable, checker, "--export_dir",
                          os.path.abspath(path),
                          "--sample", sample_path, "--tolerance",
                          str(tolerance)], env=env, capture_output=True,
                         text=True, cwd="/")
    _log.info(res.stdout.strip())
    if res.returncode != 0:
        raise RuntimeError(f"the exported SavedModel failed its check:\n"
                           f"{res.stdout}{res.stderr[-3000:]}")
    return True


def _write_summary(summary: dict) -> None:
    path = os.path.join(FLAGS.model_dir, "summary.json")
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(summary, f, indent=2)
    os.replace(tmp, path)
    # TensorBoard: the final evaluation as scalars.
    writer = tf.summary.create_file_writer(os.path.join(FLAGS.model_dir,
                                                        "logs", "eval"))
    with writer.as_default():
        for key, value in summary["eval"].items():
            tf.summary.scalar(key, value, step=summary["train"]["steps"])
    writer.flush()


def _flag_values() -> dict:
    """This module's flags and their values (recorded in summary.json)."""
    module = FLAGS.find_module_defining_flag("model")
    return {f.name: f.value for f in FLAGS.get_key_flags_for_module(module)}


def parse_flags(argv, prog: str = "tnet.train"):
    """absl's flag parsing with tnet's exit status for bad flags: one line
    on stderr and exit 2 (absl exits 1 with a FATAL banner), so
    `tnet.launch --restarts` and a TFJob's restartPolicy ExitCode never
    restart a typo."""
    try:
        rest = FLAGS(argv)
    except flags.Error as e:
        _log.error(f"{prog}: {e} (--helpfull lists the flags)")
        sys.exit(2)
    # absl's --verbosity sets tnet's logger too. absl's own default (-1)
    # hides info: tnet's progress lines are info, so unset it means 0.
    set_verbosity(FLAGS.verbosity if FLAGS["verbosity"].present else 0)
    return rest


def main(argv):
    if len(argv) > 1:
        _log.error(f"tnet.train: unexpected arguments {argv[1:]}: flags are "
                   "--name=value")
        return 2
    try:
        run()
    except app.UsageError as e:  # a flag combination that cannot work
        _log.error(f"tnet.train: {e}")
        return 2
    except tn.distribute.ClusterConfigError as e:
        _log.error(f"tnet.train: bad TF_CONFIG: {e}")
        return 2
    except tn.distribute.MallocSettingError as e:
        _log.error(f"tnet.train: {e}")
        return 2
    except Exception as e:  # noqa: BLE001
        bad = explain_bad_input(e)
        if bad is not None:
            # One line (no traceback unless --verbose): what, where, the fix.
            text = " ".join(str(bad).split())
            _log.error(f"tnet.train: {text}")
            if FLAGS.verbose:
                traceback.print_exception(e)
            return 4
        lost = tn.distribute.explain_failure(e)
        if lost is None:
            raise
        note = tn.distribute.steps_lost_note(_RUN.get("model"),
                                             _RUN.get("checkpoints"))
        # EXIT_RESTART (138): a restart of the cluster resumes from the newest
        # checkpoint; no teardown waiting on the lost task.
        tn.distribute.exit_now(tn.distribute.EXIT_RESTART,
                               f"tnet.train: {lost} ({note})")
    if _RUN.get("distributed"):
        # Everything is written: skip the interpreter's teardown, which
        # removes functions from every remote task and stalled 38 s on a
        # worker that had been cut off (measured, tests/test_hosts.py).
        tn.distribute.exit_now(0)
    return 0


if __name__ == "__main__":
    bind.ensure()  # before any server starts: keep the port on TF_CONFIG's host
    app.run(main, flags_parser=parse_flags)
