"""The flags of `python -m tnet.train`: defined here, read here only.

Each flag is a field of `JobConfig` (tnet/cli/config.py), its default the
field's default. `parse_flags` is absl's parser with tnet's exit status for
bad flags; `job_config()` turns the parsed flags into the JobConfig that
every job receives. No other module of tnet reads FLAGS (a test checks).
"""
from __future__ import annotations

import sys

from absl import flags

from tnet.cli.config import OPTIMIZERS, JobConfig, names
from tnet.log import get as _get_logger
from tnet.log import set_verbosity

FLAGS = flags.FLAGS
_log = _get_logger("train")
_D = JobConfig()

flags.DEFINE_enum("model", _D.model, ["wide_deep", "deepfm", "dcn",
                                        "two_tower"],
                  "Model architecture (two_tower: retrieval, with "
                  "--data=movielens).")
flags.DEFINE_enum("data", _D.data, ["synthetic", "criteo", "avazu",
                                        "movielens"],
                  "Dataset kind.")
flags.DEFINE_string("movielens_dir", _D.movielens_dir,
                    "MovieLens 100k directory (ua.base/ua.test, RecBole "
                    ".user/.item files).")
flags.DEFINE_integer("history_max_length", _D.history_max_length, "two_tower: history ids "
                     "kept (the most recent).")
flags.DEFINE_enum("pooling", _D.pooling, ["mean", "attention"],
                  "two_tower: how the history sequence is pooled.")
flags.DEFINE_bool("sampling_bias_correction", _D.sampling_bias_correction, "two_tower: correct "
                  "in-batch softmax logits by item frequency.")
flags.DEFINE_float("temperature", _D.temperature, "two_tower: softmax temperature.")
flags.DEFINE_integer("top_k", _D.top_k, "two_tower: ids returned by the "
                     "exported retriever.")
flags.DEFINE_string("feature_spec", _D.feature_spec, "A feature spec (JSON, or YAML "
                    "with PyYAML) describing your own data; overrides --data "
                    "(see docs/guides/data-and-cli.md).")
flags.DEFINE_enum("format", _D.format, ["tfrecord", "csv", "tsv", "parquet"],
                  "With --feature_spec: the files' format.")
flags.DEFINE_string("days", _D.days, "With --feature_spec: the daily loop over "
                    "these days, FIRST..LAST (dates YYYY-MM-DD) or a comma "
                    "list; needs --day_pattern and --checkpoint_dir.")
flags.DEFINE_string("day_pattern", _D.day_pattern, "With --days: the files of one day, "
                    "'{day}' replaced by the day, e.g. 'data/{day}/*'.")
flags.DEFINE_string("stream", _D.stream, "With --feature_spec: train "
                    "continuously on the files of this directory or glob as "
                    "they land, in name order, each exactly once across "
                    "restarts (with --checkpoint_dir); see "
                    "docs/guides/online-training.md.")
flags.DEFINE_enum("stream_landed", _D.stream_landed, ["rename", "done", "success"],
                  "With --stream: when a file counts as landed: rename (its "
                  "final name is listed; write under a '.'/'_' name or a "
                  ".tmp suffix, then rename), done (<file>.done exists), "
                  "success (_SUCCESS exists in its directory).")
flags.DEFINE_float("stream_poll_secs", _D.stream_poll_secs, "With --stream: seconds between "
                   "listings when there is nothing to read.")
flags.DEFINE_float("stream_idle_secs", _D.stream_idle_secs, "With --stream: stop (after a "
                   "checkpoint) when no new file landed for this long; 0: "
                   "run until SIGTERM.")
flags.DEFINE_float("stream_max_file_age_secs", _D.stream_max_file_age_secs, "With --stream: "
                   "the ledger of trained files keeps files modified within "
                   "this age; older files are taken as trained (named in the "
                   "log, not read).")
flags.DEFINE_enum("bad_files", _D.bad_files, ["skip", "fail"], "With --stream: a "
                  "damaged file (named file:record) is recorded as bad and "
                  "skipped, or stops the run after a checkpoint with exit "
                  "status 4.")
flags.DEFINE_string("event_time_feature", _D.event_time_feature, "With --stream: "
                    "a dense feature of the spec holding each example's event "
                    "time in unix seconds; the input lag (metric and log) is "
                    "then now minus the newest event time trained, not the "
                    "newest trained file's modification time. The model does "
                    "not get this feature.")
flags.DEFINE_integer("metrics_port", _D.metrics_port, "With --stream: serve Prometheus "
                     "metrics (files trained and pending, lag, freshness, "
                     "step, checkpoint time, table rows, memory) on this "
                     "port at /metrics (0: any free port, printed; -1: off).")
flags.DEFINE_integer("checkpoint_every_n_files", _D.checkpoint_every_n_files, "With --stream: "
                     "checkpoint after every N files (0: off).")
flags.DEFINE_float("checkpoint_every_seconds", _D.checkpoint_every_seconds, "With --stream: "
                   "checkpoint at the first file boundary S seconds after "
                   "the previous checkpoint (0: off). Either way a stream "
                   "checkpoints when it stops.")
flags.DEFINE_list("train_files", list(_D.train_files), "Training files (criteo / avazu / "
                  "--feature_spec); globs allowed.")
flags.DEFINE_list("eval_files", list(_D.eval_files), "Evaluation files; default: the rows of "
                  "--train_files after --train_rows.")
flags.DEFINE_integer("train_rows", _D.train_rows, "Use the first N rows of "
                     "--train_files for training (-1: all).")
flags.DEFINE_integer("eval_rows", _D.eval_rows, "Evaluate on at most N rows (-1: all).")
flags.DEFINE_integer("synthetic_train_examples", _D.synthetic_train_examples,
                     "Synthetic training examples per epoch.")
flags.DEFINE_integer("synthetic_eval_examples", _D.synthetic_eval_examples,
                     "Synthetic hold-out examples.")
flags.DEFINE_float("synthetic_scale", _D.synthetic_scale, "Synthetic cardinality scale "
                   "(1.0 = about 5M distinct ids).")
flags.DEFINE_enum("bad_rows", _D.bad_rows, ["fail", "skip"],
                  "Malformed input rows: fail (exit status 4 naming the first "
                  "bad file:record in file order) or skip (log the first 5, "
                  "count all per file in the log and summary.json).")
flags.DEFINE_bool("verbose", _D.verbose, "On bad input (exit status 4), print "
                  "the traceback after the one-line message.")
flags.DEFINE_integer("batch_size", _D.batch_size, "Examples per step.")
flags.DEFINE_integer("epochs", _D.epochs, "Passes over the training data.")
flags.DEFINE_enum("optimizer", _D.optimizer, list(OPTIMIZERS),
                  "Optimizer for dense variables and tables.")
flags.DEFINE_float("learning_rate", _D.learning_rate, "Learning rate.")
flags.DEFINE_integer("embedding_dim", _D.embedding_dim, "Embedding width per id column.")
flags.DEFINE_list("hidden_units", list(_D.hidden_units), "MLP widths.")
flags.DEFINE_string("model_dir", _D.model_dir, "Where TensorBoard logs "
                    "and summary.json go.")
flags.DEFINE_integer("seed", _D.seed, "Random seed (initializers, shuffling, "
                     "synthetic data).")
flags.DEFINE_integer("shuffle_buffer", _D.shuffle_buffer, "Shuffle buffer for real "
                     "data (0: no shuffling).")
flags.DEFINE_string("export_dir", _D.export_dir, "If set, export a SavedModel for "
                    "serving to <export_dir>/<unix time> after training (no tnet op inside) and "
                    "check it in a fresh process without tnet.")
flags.DEFINE_enum("quantize", _D.quantize, ["float16", "int8"], "Embedding storage "
                  "of the export (default float32).")
flags.DEFINE_bool("updatable_export", _D.updatable_export, "Write the export with "
                  "updatable=True (an overlay and the apply_delta "
                  "signatures): tn.saving.publish_delta and python -m "
                  "tnet.serving.follow can then keep it fresh.")
flags.DEFINE_string("update_key_file", _D.update_key_file, "Updatable exports: the file "
                    "that keeps the update key apply_delta / apply_rows "
                    "require (owner-only; generated when missing). Default: "
                    "<export_dir>.update_key. Keep it off the volume the "
                    "model server mounts; give it to the follower only.")
flags.DEFINE_bool("rotate_update_key", _D.rotate_update_key, "Updatable exports: every new "
                  "base this run writes (compaction, the final export, each "
                  "day's export) gets a new update key; the key file keeps "
                  "the previous one second.")
flags.DEFINE_integer("publish_every_n_steps", _D.publish_every_n_steps, "With --export_dir: keep "
                     "the served model fresh while training: every N steps "
                     "(under a cluster: at the epoch end that crosses it), "
                     "publish the rows changed since the last publish as a "
                     "delta of the newest updatable export (one is written "
                     "first if there is none); python -m tnet.serving.follow "
                     "applies them. Implies --updatable_export. 0: off.")
flags.DEFINE_float("publish_every_seconds", _D.publish_every_seconds, "As --publish_every_n_steps, "
                   "every S seconds. 0: off.")
flags.DEFINE_float("publish_compact_at", _D.publish_compact_at, "With --publish_every_*: "
                   "when the rows published since the export's base reach "
                   "this fraction of its rows, publish a new base version "
                   "instead of a delta (TF Serving loads it; the follower "
                   "moves to it). 0: never.")
flags.DEFINE_string("checkpoint_dir", _D.checkpoint_dir, "Checkpoints (tables + dense "
                    "state) go here; training resumes from the newest one. "
                    "Empty: no checkpoints.")
flags.DEFINE_integer("checkpoint_every_n_steps", _D.checkpoint_every_n_steps, "Save every N steps (one "
                     "process only; 0: off).")
flags.DEFINE_integer("checkpoint_every_n_epochs", _D.checkpoint_every_n_epochs, "Save every N epochs "
                     "(under ParameterServerStrategy the only option).")
flags.DEFINE_integer("checkpoint_keep", _D.checkpoint_keep, "Checkpoints to keep.")
flags.DEFINE_bool("checkpoint_incremental", _D.checkpoint_incremental, "Write deltas (changed "
                  "rows + deleted keys) between full checkpoints.")
flags.DEFINE_integer("checkpoint_full_every", _D.checkpoint_full_every, "With incremental: a full "
                     "checkpoint at least every N saves.")
flags.DEFINE_string("data_cache_dir", _D.data_cache_dir, "Where synthetic "
                    "data is written as TSV for cluster runs.")

# Feature lifecycle (admission, row cap, disk tier, eviction): tnet/table.py.
flags.DEFINE_float("min_count", _D.min_count, "Shows an id needs before it gets a "
                   "table row (1: every id at once); earlier it reads zeros "
                   "and gets no update.")
flags.DEFINE_integer("admission_capacity", _D.admission_capacity, "Ids per table shard "
                     "counted while waiting for admission (exact, bounded).")
flags.DEFINE_integer("max_rows", _D.max_rows, "Most rows per table, split over its "
                     "shards; the lowest-show rows go first (0: unbounded).")
flags.DEFINE_integer("memory_budget_bytes", _D.memory_budget_bytes, "Disk tier: bytes of rows "
                     "each table keeps in memory (split over its shards); "
                     "the rest live in --storage_dir (0: all in memory).")
flags.DEFINE_string("storage_dir", _D.storage_dir, "Disk tier: a writable local "
                    "directory (on every ps host) for the rows beyond "
                    "--memory_budget_bytes.")
flags.DEFINE_float("show_decay_rate", _D.show_decay_rate, "Maintenance: show *= rate.")
flags.DEFINE_float("show_threshold", _D.show_threshold, "Maintenance: evict rows whose "
                   "(decayed) show is below this.")
flags.DEFINE_integer("ttl_steps", _D.ttl_steps, "Maintenance: evict rows not updated "
                     "for more than N steps (0: off).")
flags.DEFINE_integer("maintenance_every_n_steps", _D.maintenance_every_n_steps, "Run table maintenance "
                     "every N steps (under ParameterServerStrategy: at the "
                     "epoch ends that cross a multiple of N); 0: never.")


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


def job_config() -> JobConfig:
    """The parsed flags as a JobConfig (lists as tuples)."""
    values = {}
    for name in names():
        value = FLAGS[name].value
        values[name] = tuple(value) if isinstance(value, list) else value
    return JobConfig(**values)
