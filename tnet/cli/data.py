"""What `python -m tnet.train` reads: the CTR job's files or synthetic data
(CtrJobData), MovieLens for the two-tower job (RetrievalJobData) and a
user's own data described by a feature spec (SpecJobData).

Each is built from the JobConfig and gives `train(input_context, repeat)`
and `eval()` datasets, the train row count and `info` for summary.json;
`explain_bad_input` is the CLI's one bad-input path (exit status 4).
"""
from __future__ import annotations

import os

import tensorflow as tf

from absl import app

from tnet.cli.config import JobConfig
from tnet.log import get as _get_logger

_log = _get_logger("train")

LOG_LIMIT = 5  # bad rows logged one by one per job (the rest: counted)


class BadInputError(Exception):
    """A data file or the feature spec is wrong: one line naming the file
    and record (or line) and the feature, and what to do (exit status 4)."""


# The job data of this run, newest last: where a read failure is looked for.
_JOBS: list = []


def explain_bad_input(error: BaseException):
    """A BadInputError for `error` if it is bad input (a damaged or bad
    record in the files being read, a spec error, a missing file), else
    None. A read failure of a tf.data pipeline (TensorFlow's message may
    name no file, or the shuffled pipeline's first bad row, or carry a
    binary record's bytes that Python cannot even decode) makes the job
    reread its files in file order, so the message names the first bad
    record in file order (train files before eval files)."""
    from tnet.data import readers, spec as spec_lib  # noqa: PLC0415
    if isinstance(error, BadInputError):
        return error
    if isinstance(error, (spec_lib.SpecError, readers.BadDataError)):
        prefix = "" if isinstance(error, spec_lib.SpecError) else "bad input: "
        return BadInputError(prefix + str(error))
    if isinstance(error, FileNotFoundError):
        return BadInputError(f"{error.args[0] if error.args else error}")
    if not _is_read_error(error):
        return None
    seen = set()
    # The newest jobs only: the day (or run) being read, and its export's.
    for job in reversed(_JOBS[-2:]):
        for files in job.files_read():
            key = tuple(files)
            if not files or key in seen:
                continue
            seen.add(key)
            found = job.first_bad(files)
            if found:
                return BadInputError(found)
    return None


def _is_read_error(error: BaseException) -> bool:
    if isinstance(error, (UnicodeDecodeError, tf.errors.DataLossError)):
        return True  # the former: TF's message held a binary record's bytes
    if not isinstance(error, (tf.errors.InvalidArgumentError,
                              tf.errors.UnknownError)):
        return False
    text = str(error)
    return any(k in text for k in (
        "IteratorGetNext", "Iterator::", "ParseExample", "parse example",
        "bad_rows", "tf.Example", "TFRecord"))


def _fix_record(where: str) -> str:
    return (f"bad input: {where}. Fix or remove the record, or pass "
            "--bad_rows=skip to drop and count bad records")


def report_skips(scans, what: str) -> dict:
    """Logs the bad rows `scan_files` found (the first LOG_LIMIT one by one,
    a count per file, and a notice for the rest) and returns them for
    summary.json / days.json. A damaged file is not skippable: raises."""
    for found in scans:
        if found.damaged:
            raise BadInputError(f"bad input: {found.damaged}")
    logged = 0
    for found in scans:
        for where in found.first:
            if logged < LOG_LIMIT:
                _log.warning(f"W tnet.train: skipping bad {what} row {where}")
                logged += 1
    total = sum(f.skipped for f in scans)
    for found in scans:
        if found.skipped:
            _log.warning(f"W tnet.train: {found.path}: {found.skipped:,} of "
                         f"{found.records:,} rows skipped as bad")
    if total > logged:
        _log.warning(f"W tnet.train: {total - logged:,} more bad {what} rows "
                     "skipped without logging them one by one (counts per "
                     "file above and in summary.json)")
    return {"skipped": total, "rows": sum(f.rows for f in scans),
            "files": {f.path: f.skipped for f in scans if f.skipped},
            "first": [w for f in scans for w in f.first][:LOG_LIMIT]}


def count_rows(paths) -> int:
    total = 0
    for path in paths:
        with open(path, "rb") as f:
            total += sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    return total


def synthetic_files(cfg: JobConfig, gen, cats_scale_seed: str):
    """Writes (once) the synthetic train / hold-out sets as Criteo TSV so
    that ParameterServerStrategy workers can read them with pure tf.data."""
    os.makedirs(cfg.data_cache_dir, exist_ok=True)
    paths = {}
    for stream, n in (("train", cfg.synthetic_train_examples),
                      ("holdout", cfg.synthetic_eval_examples)):
        path = os.path.join(cfg.data_cache_dir,
                            f"synthetic-{cats_scale_seed}-{stream}-{n}.tsv")
        if not os.path.exists(path):
            tmp = f"{path}.tmp{os.getpid()}"
            gen.write_tsv(tmp, n, stream=stream)
            os.replace(tmp, path)
        paths[stream] = path
    return paths


class CtrJobData:
    """What the job reads: features, files (or in-memory synthetic data)."""

    def __init__(self, cfg: JobConfig, distributed: bool):
        self.cfg = cfg
        from tnet import data as tn_data  # noqa: PLC0415
        self.tn_data = tn_data
        self.info = {}
        self.log_limit = LOG_LIMIT
        self.bad_rows = None
        self.kind = self.cfg.data
        if self.cfg.data in ("synthetic", "criteo"):
            self.categorical = list(tn_data.CRITEO_CAT_COLUMNS)
            self.dense = list(tn_data.CRITEO_INT_COLUMNS)
            self.string_ids = False
        else:
            self.categorical = list(tn_data.AVAZU_CAT_COLUMNS)
            self.dense = []
            self.string_ids = True
        self.train_skip, self.train_take = 0, self.cfg.train_rows
        if self.cfg.data == "synthetic":
            self.gen = tn_data.SyntheticCriteo(seed=self.cfg.seed,
                                               scale=self.cfg.synthetic_scale)
            self.info["oracle_auc"] = float(self.gen.oracle_auc(
                "holdout", self.cfg.synthetic_eval_examples))
            self.train_rows = self.cfg.synthetic_train_examples
            self.files = None
            if distributed:
                files = synthetic_files(
                    self.cfg, self.gen, f"{self.cfg.seed}-{self.cfg.synthetic_scale}")
                self.kind = "criteo"
                self.files = [files["train"]]
                self.eval_files = [files["holdout"]]
                self.eval_skip, self.eval_take = 0, -1
            return
        if not self.cfg.train_files:
            raise app.UsageError(f"--data={self.cfg.data} needs --train_files")
        self.files = list(self.cfg.train_files)
        if self.cfg.eval_files:
            self.eval_files, self.eval_skip = list(self.cfg.eval_files), 0
        else:
            if self.cfg.train_rows <= 0:
                raise app.UsageError(
                    "without --eval_files, set --train_rows: the rows after "
                    "them are the hold-out")
            self.eval_files, self.eval_skip = self.files, self.cfg.train_rows
        self.eval_take = self.cfg.eval_rows
        header = 1 if self.cfg.data == "avazu" else 0
        lines = [count_rows([f]) - header for f in self.files]
        total = sum(lines)
        self.train_rows = total if self.cfg.train_rows <= 0 else min(
            self.cfg.train_rows, total)
        _JOBS.append(self)
        if self.cfg.bad_rows == "skip":
            self._count_skips(lines)

    def _count_skips(self, lines):
        """Skip mode: every malformed row of the train (and eval) lines
        counted per file in file order, before training (the CLI's log and
        summary.json); the train count becomes the good rows."""
        train = self._scan(self.files, lines, 0, self.train_take)
        if self.eval_files is self.files:
            evals = self._scan(self.files, lines, self.eval_skip, self.eval_take)
        else:
            evals = self._scan(self.eval_files, None, 0, self.eval_take)
        self.bad_rows = {"train": report_skips(train, "train"),
                         "eval": report_skips(evals, "eval")}
        self.train_rows = self.bad_rows["train"]["rows"]
        self.info["bad_rows_skipped"] = {
            k: {"skipped": v["skipped"], "files": v["files"]}
            for k, v in self.bad_rows.items()}
        self.info["train_examples"] = self.train_rows
        self.log_limit = 0

    def _scan(self, files, lines, skip, take):
        """FileScans of the window [skip, skip + take) of the files' data
        lines (take < 0: to the end), one file at a time."""
        from tnet.data import ReadStats  # noqa: PLC0415
        from tnet.data.readers import FileScan  # noqa: PLC0415
        out = []
        for i, path in enumerate(files):
            n = lines[i] if lines is not None else None
            if n is not None:  # this file's part of the window
                file_skip = min(skip, n)
                skip -= file_skip
                file_take = n - file_skip if take < 0 else min(take, n - file_skip)
                if take >= 0:
                    take -= file_take
                if file_take <= 0:
                    continue
            else:
                file_skip, file_take = 0, take
            stats = ReadStats(max_examples=LOG_LIMIT)
            for _ in self._reader()([path], 4096, bad_rows="skip", stats=stats,
                                    skip=file_skip, take=file_take, log_limit=0):
                pass
            found = FileScan(path)
            found.records, found.skipped = stats.lines_read, stats.skipped
            found.first = stats.examples
            out.append(found)
            if lines is None and take >= 0:
                take = max(take - stats.lines_read, 0)
                if take == 0:
                    break
        return out

    def files_read(self):
        return [self.files or [], getattr(self, "eval_files", None) or []]

    def first_bad(self, files):
        """The first malformed row of `files` in file order, or None."""
        from tnet.data import ReadStats  # noqa: PLC0415
        stats = ReadStats(max_examples=1)
        for _ in self._reader()(files, 4096, bad_rows="skip", stats=stats,
                                log_limit=0):
            if stats.skipped:
                break
        return _fix_record(stats.examples[0]) if stats.examples else None

    def _reader(self):
        if self.kind == "criteo":
            return self.tn_data.criteo_dataset
        return self.tn_data.avazu_dataset

    def train(self, input_context=None, repeat=False):
        if self.files is None:  # in-memory synthetic, one process
            return self.gen.dataset(self.train_rows, self.cfg.batch_size,
                                    stream="train")
        batch = self.cfg.batch_size
        if input_context is not None:
            batch = input_context.get_per_replica_batch_size(batch)
        return self._reader()(
            self.files, batch, bad_rows=self.cfg.bad_rows, take=self.train_take,
            log_limit=self.log_limit,
            shuffle_buffer=self.cfg.shuffle_buffer,
            seed=self.cfg.seed if input_context is None else
            self.cfg.seed + input_context.input_pipeline_id,
            num_epochs=None if repeat else 1, input_context=input_context)

    def eval(self):
        if self.files is None:
            return self.gen.dataset(self.cfg.synthetic_eval_examples,
                                    self.cfg.batch_size, stream="holdout")
        return self._reader()(self.eval_files, self.cfg.batch_size,
                              bad_rows=self.cfg.bad_rows, skip=self.eval_skip,
                              take=self.eval_take, log_limit=self.log_limit)


class RetrievalJobData:
    """MovieLens 100k for the two-tower model: examples in memory in one
    process; under ParameterServerStrategy written once with
    `Dataset.save` under --data_cache_dir so workers read pure tf.data."""

    def __init__(self, cfg: JobConfig, distributed: bool):
        self.cfg = cfg
        from tnet.data import movielens  # noqa: PLC0415
        self.movielens = movielens
        self.data = movielens.load_movielens(self.cfg.movielens_dir,
                                             self.cfg.history_max_length)
        self.candidates = self.data.items
        self.train_rows = self.data.train["item_id"].shape[0]
        self.info = {"popularity_baseline": movielens.popularity_recall(
            self.data.item_counts, self.data.test["item_id"])}
        self.path = None
        if distributed:
            os.makedirs(self.cfg.data_cache_dir, exist_ok=True)
            self.path = movielens.save_examples(
                self.data.train, os.path.join(
                    self.cfg.data_cache_dir,
                    f"movielens-train-h{self.cfg.history_max_length}"))

    def train(self, input_context=None, repeat=False):
        if self.path is None:
            return self.movielens.movielens_dataset(
                self.data.train, self.cfg.batch_size,
                shuffle_buffer=self.cfg.shuffle_buffer, seed=self.cfg.seed,
                repeat=repeat)
        batch = self.cfg.batch_size
        if input_context is not None:
            batch = input_context.get_per_replica_batch_size(batch)
        return self.movielens.load_examples_dataset(
            self.path, batch, shuffle_buffer=self.cfg.shuffle_buffer,
            seed=self.cfg.seed + (input_context.input_pipeline_id
                               if input_context is not None else 0),
            repeat=repeat, input_context=input_context)

    def eval(self):
        return self.movielens.movielens_dataset(self.data.test, 4096)


class SpecJobData:
    """A user's data described by --feature_spec (tnet.data.spec), in
    --format, from `train_files` (and `eval_files`, read with the group key
    for group AUC). Parquet under ParameterServerStrategy is converted once
    to gzip TFRecord under --data_cache_dir (workers read pure tf.data)."""

    def __init__(self, cfg: JobConfig, distributed: bool, spec=None,
                 train_files=None, eval_files=None, count: bool = True):
        """count=False: neither count records nor scan for bad rows (a job
        that only takes a sample batch, e.g. the daily loop's export)."""
        from tnet.data import readers, spec as spec_lib  # noqa: PLC0415
        self.cfg = cfg
        self.readers = readers
        self.spec = spec if spec is not None else spec_lib.load(self.cfg.feature_spec)
        self.kind = "spec"
        self.format = self.cfg.format
        self.categorical = self.spec.embedding_columns(self.cfg.embedding_dim)
        self.dense = self.spec.dense
        self.string_ids = self.spec.string_ids
        self.group_key = self.spec.group_key
        self.candidates = None
        files = list(self.cfg.train_files if train_files is None else train_files)
        evals = list(self.cfg.eval_files if eval_files is None else eval_files)
        if not files:
            raise app.UsageError("--feature_spec needs --train_files (or "
                                 "--days with --day_pattern)")
        original, original_evals = files, evals
        if self.format == "parquet" and distributed:
            cache = os.path.join(self.cfg.data_cache_dir, "parquet-tfrecord")
            files = readers.parquet_to_tfrecord(self.spec, files, cache,
                                                self.cfg.bad_rows, log_limit=0)
            evals = (readers.parquet_to_tfrecord(self.spec, evals, cache,
                                                 self.cfg.bad_rows, log_limit=0)
                     if evals else [])
            self.format = "tfrecord"
        self.files, self.eval_files = files, evals
        _JOBS.append(self)
        self.info = {"feature_spec": self.spec.source, "format": self.cfg.format}
        self.log_limit = LOG_LIMIT
        self.bad_rows, self.train_rows = None, None
        if not count:
            self.log_limit = 0 if self.cfg.bad_rows == "skip" else LOG_LIMIT
        elif self.cfg.bad_rows == "skip":
            # One pass in file order before training: every bad row counted
            # per file (the pipelines then skip them silently), and the
            # example counts (steps per epoch too) are the good rows only.
            # The original files: Parquet's bad rows are dropped when it is
            # converted.
            self.bad_rows = {"train": report_skips(readers.scan_files(
                self.spec, original, self.cfg.format), "train")}
            if list(original_evals) != list(original) and original_evals:
                self.bad_rows["eval"] = report_skips(readers.scan_files(
                    self.spec, original_evals, self.cfg.format), "eval")
            else:
                self.bad_rows["eval"] = self.bad_rows["train"]
            self.train_rows = self.bad_rows["train"]["rows"]
            self.log_limit = 0
            self.info["bad_rows_skipped"] = {
                k: {"skipped": v["skipped"], "files": v["files"]}
                for k, v in self.bad_rows.items()}
        else:
            try:
                self.train_rows = readers.count_records(files, self.format)
            except tf.errors.DataLossError as e:
                raise BadInputError(f"bad input: {e.message}") from None
        self.info["train_examples"] = self.train_rows

    def files_read(self):
        return [self.files, self.eval_files]

    def first_bad(self, files):
        """The first bad record of `files` in file order, as the one-line
        message, or None."""
        for found in self.readers.scan_files(self.spec, files, self.format,
                                             max_examples=1,
                                             stop_at_first=True):
            if found.first:
                return _fix_record(found.first[0])
            if found.damaged:
                return f"bad input: {found.damaged}"
        return None

    def train(self, input_context=None, repeat=False):
        batch = self.cfg.batch_size
        if input_context is not None:
            batch = input_context.get_per_replica_batch_size(batch)
        return self.spec.dataset(
            self.files, self.format, batch, bad_rows=self.cfg.bad_rows,
            log_limit=self.log_limit, shuffle_buffer=self.cfg.shuffle_buffer,
            seed=self.cfg.seed if input_context is None else
            self.cfg.seed + input_context.input_pipeline_id,
            num_epochs=None if repeat else 1, input_context=input_context)

    def eval(self, files=None):
        files = self.eval_files if files is None else files
        if not files:
            raise app.UsageError("--feature_spec needs --eval_files to "
                                 "evaluate (or use --days)")
        return self.spec.dataset(files, self.format, self.cfg.batch_size,
                                 bad_rows=self.cfg.bad_rows, log_limit=self.log_limit,
                                 with_group=self.group_key is not None)
