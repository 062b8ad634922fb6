"""The daily loop of `python -m tnet.train --feature_spec=... --days=A..B`.

For each day of `--days` not trained yet, in order:

1. evaluate the current model on the day's files before training on them
   (progressive validation: yesterday's model scored on today's data; AUC,
   log loss, calibration, group AUC when the spec names a group key);
2. train one pass over the day (`--day_pattern` with `{day}` replaced);
3. optionally decay shows / evict rows once (`--show_decay_rate`,
   `--show_threshold`, `--ttl_steps`: tn.callbacks.TableMaintenance.run);
4. checkpoint to `--checkpoint_dir/ckpt-<YYYYMMDD>` (incremental between
   full ones with `--checkpoint_incremental`, `--checkpoint_full_every`);
5. with `--export_dir`, export `export_dir/<YYYYMMDD>` for serving (the
   version number grows with the day) and check it without tnet.

With `--publish_every_n_steps` / `--publish_every_seconds`, day N's
training publishes deltas into the newest updatable export, day N-1's, so
the served model follows the training within the day; day N's export is
the next base (no compaction inside the loop). Before the first day, when
the export dir holds no updatable export, the model as it stands is
exported as the version of the day before, so the first day publishes too.

Why the day is the checkpoint's step: the newest complete checkpoint then
says which day was finished last, and it is written atomically (temp dir,
manifest last, rename), so a run killed at any point restarts from the end
of the last finished day: the interrupted day is trained again from that
checkpoint (its partial training is discarded), no finished day is trained
twice and none is lost. `days.json` beside the checkpoints (written
atomically after each checkpoint and export) keeps each day's metrics and
export; the checkpoints stay the truth (a day whose checkpoint exists but
is missing from days.json, after a kill between the two writes, is marked
done on the next run, and a missing export of the newest day is redone).
"""
from __future__ import annotations

import datetime
import json
import os
import re
import time

from absl import app

import tnet as tn
import tensorflow as tf
from tnet.cli import model as cli_model
from tnet.cli.config import JobConfig
from tnet.cli.data import SpecJobData
from tnet.cli.export import export_and_check, updatable_export_of
from tnet.log import get as _get_logger
from tnet.files import write_json_atomic
import tf_keras

_log = _get_logger("train")
STATE = "days.json"


def parse_days(text: str) -> list[str]:
    """'2026-11-01..2026-11-07' or '2026-11-01,2026-11-03' -> ISO dates."""
    def date(s: str) -> datetime.date:
        s = s.strip()
        try:
            if re.fullmatch(r"\d{8}", s):
                return datetime.date(int(s[:4]), int(s[4:6]), int(s[6:]))
            return datetime.date.fromisoformat(s)
        except ValueError:
            raise app.UsageError(f"--days: {s!r} is not a date (YYYY-MM-DD "
                                 "or YYYYMMDD)") from None

    if ".." in text:
        first, last = (date(p) for p in text.split("..", 1))
        if last < first:
            raise app.UsageError(f"--days={text}: the last day is before the first")
        days = [first + datetime.timedelta(d) for d in range((last - first).days + 1)]
    else:
        days = sorted({date(p) for p in text.split(",") if p.strip()})
    if not days:
        raise app.UsageError("--days is empty")
    return [d.isoformat() for d in days]


def day_step(day: str) -> int:
    """The checkpoint step / export version of a day: YYYYMMDD."""
    return int(day.replace("-", ""))


def load_state(directory: str) -> dict:
    path = os.path.join(directory, STATE)
    if not os.path.exists(path):
        return {"days": {}}
    with open(path) as f:
        return json.load(f)


def write_state(directory: str, state: dict) -> None:
    write_json_atomic(os.path.join(directory, STATE), state, indent=2,
                      sort_keys=True)


def _day_files(cfg: JobConfig, day: str) -> list[str]:
    pattern = cfg.day_pattern.replace("{day}", day)
    if "{day}" not in cfg.day_pattern:
        raise app.UsageError("--day_pattern must contain '{day}'")
    files = sorted(tf.io.gfile.glob(pattern))
    if not files:
        raise FileNotFoundError(f"day {day}: no file matches {pattern!r} "
                                "(--day_pattern); is the day's data there yet?")
    return files


def run_days(cfg: JobConfig, strategy, distributed: bool) -> dict:
    from tnet.data import spec as spec_lib  # noqa: PLC0415
    days = parse_days(cfg.days)
    spec = spec_lib.load(cfg.feature_spec)
    ckpt_dir = cfg.checkpoint_dir
    os.makedirs(ckpt_dir, exist_ok=True)
    model = cli_model.compiled_model(
        cfg, strategy, spec.embedding_columns(cfg.embedding_dim), spec.dense,
        spec.string_ids)
    maintenance = cli_model.daily_maintenance(cfg)  # once after each day
    state = load_state(ckpt_dir)
    latest = tn.saving.latest_checkpoint(ckpt_dir)
    done_step = 0
    if latest is not None:
        done_step = tn.saving.restore(model, latest,
                                      track_changes=cfg.checkpoint_incremental)
        _log.info(f"tnet.train: restored {latest} (days through {done_step} done)")
    for day in days:  # checkpoints are the truth: a finished day stays done
        if day_step(day) <= done_step and day not in state["days"]:
            state["days"][day] = {"checkpoint": f"ckpt-{done_step}"
                                  if day_step(day) == done_step else None,
                                  "recovered": True}
    writer = tf.summary.create_file_writer(os.path.join(cfg.model_dir, "logs", "days"))
    trained_any = latest is not None
    last_done = max((d for d in state["days"] if day_step(d) <= done_step),
                    default=None)
    if last_done is not None and cfg.export_dir:
        _ensure_export(cfg, model, spec, last_done, state, ckpt_dir)
    if cfg.publishing:
        _ensure_publish_base(cfg, model, spec, days, done_step, state,
                             ckpt_dir)
    for day in days:
        if day_step(day) <= done_step:
            _log.info(f"tnet.train: day {day} already trained, skipped")
            continue
        files = _day_files(cfg, day)
        data = SpecJobData(cfg, distributed, spec, files, files)
        # examples: the good ones (with --bad_rows=skip, bad_rows counts
        # the skipped ones per file).
        record = {"files": len(files), "examples": data.train_rows}
        if data.bad_rows is not None:
            record["bad_rows"] = {"skipped": data.bad_rows["train"]["skipped"],
                                  "files": data.bad_rows["train"]["files"]}
        if trained_any:  # progressive validation: before training on the day
            record["eval_before_training"] = model.evaluate_exact(
                data.eval(), group_key=spec.group_key)
            _log.info(f"tnet.train: day {day} before training: "
                  f"{json.dumps(record['eval_before_training'])}")
        _log.info(f"tnet.train: training day {day} ({data.train_rows} examples)")
        start = time.perf_counter()
        publisher = None
        if cfg.publishing:
            base = updatable_export_of(cfg.export_dir)
            if base is not None:  # the day before's export, kept fresh
                publisher = cli_model.publisher_callback(cfg)
                # The day's own export is the next base: a compaction
                # (version N-1 + 1) would take day N's version number.
                publisher.compact_at = None
                _log.info(f"tnet.train: day {day}: publishing deltas to {base}")
        _fit_day(cfg, model, data, distributed,
                 [] if publisher is None else [publisher])
        if publisher is not None:
            record["published"] = publisher.published
        record["train_seconds"] = round(time.perf_counter() - start, 3)
        if maintenance is not None:
            record["evicted"] = maintenance.run(model, day_step(day))
        path = _save_day(cfg, model, ckpt_dir, day_step(day),
                         f"day {day}'s checkpoint")
        record["checkpoint"] = os.path.basename(path)
        record["train_step"] = int(model.optimizer.iterations.numpy())
        trained_any = True
        done_step = day_step(day)
        state["days"][day] = record
        write_state(ckpt_dir, state)
        _log.info(f"tnet.train: day {day} trained, checkpoint {path}")
        with writer.as_default():
            for key, value in (record.get("eval_before_training") or {}).items():
                tf.summary.scalar(f"before_training/{key}", value, step=day_step(day))
        writer.flush()
        if cfg.export_dir:
            _ensure_export(cfg, model, spec, day, state, ckpt_dir)
    summary = {"model": cfg.model, "data": "feature_spec",
               "feature_spec": spec.source, "days": state["days"],
               "flags": cfg.as_dict(),
               "eval": (state["days"].get(days[-1], {}).get("eval_before_training")
                        or {}),
               "train": {"steps": int(model.optimizer.iterations.numpy())},
               "tables": {n: {"rows": int(t.size())}
                          for n, t in model.tables().items()}}
    path = os.path.join(cfg.model_dir, "summary.json")
    with open(f"{path}.tmp", "w") as f:
        json.dump(summary, f, indent=2)
    os.replace(f"{path}.tmp", path)
    # The CLI's documented output: the days' summary as one JSON document.
    print(json.dumps({"days": {d: {k: v for k, v in r.items()
                                   if k in ("checkpoint", "export", "eval_before_training")}
                               for d, r in state["days"].items()}}, indent=2), flush=True)
    return summary


def _save_day(cfg: JobConfig, model, ckpt_dir: str, step: int,
              what: str) -> str:
    """The day's checkpoint, a ps cut waited out (through_ps_cut). Run
    again after a failure, a checkpoint the failed attempt published
    already (a ps cut off between its rename and its change marks) is taken
    as it is; a first attempt refuses an existing one, as save does."""
    final = os.path.join(os.path.abspath(ckpt_dir), f"ckpt-{step}")
    tried = []

    def write():
        if tried and os.path.isdir(final):
            return final
        tried.append(step)
        return tn.saving.save(model, ckpt_dir, step=step,
                              incremental=cfg.checkpoint_incremental,
                              keep=cfg.checkpoint_keep,
                              full_every=cfg.checkpoint_full_every)
    return tn.distribute.through_ps_cut(write, what)


def _fit_day(cfg: JobConfig, model, data, distributed: bool,
             callbacks=()) -> None:
    """One pass over the day. Under a cluster the day is `steps` steps;
    afterwards `optimizer.iterations` (days.json's `train_step`) is set
    back to the steps that ran, as retried steps can count twice
    (tn.callbacks.recount_steps). In one process every step runs once."""
    verbose = 2 if (os.environ.get("CI") or distributed) else 1
    if distributed:
        steps = max(1, -(-data.train_rows // cfg.batch_size))
        start = int(model.optimizer.iterations.numpy())
        model.fit(tf_keras.utils.experimental.DatasetCreator(
            lambda ctx: data.train(ctx, repeat=True)), epochs=1,
            steps_per_epoch=steps, verbose=verbose, callbacks=list(callbacks))
        tn.distribute.through_ps_cut(
            lambda: tn.callbacks.recount_steps(model, start + steps),
            "the day's end, recounting steps")
    else:
        model.fit(data.train(), epochs=1, verbose=verbose,
                  callbacks=list(callbacks))


def _ensure_publish_base(cfg: JobConfig, model, spec, days, done_step: int,
                         state: dict, ckpt_dir: str) -> None:
    """With --publish_every_*: the updatable export the first day to train
    publishes into, when the export dir has none (a first run): the model
    as it stands (restored, or not trained yet) as the version of the day
    before that day, so the first day's rows are served too."""
    if updatable_export_of(cfg.export_dir) is not None:
        return
    todo = [d for d in days if day_step(d) > done_step]
    if not todo:
        return
    before = (datetime.date.fromisoformat(todo[0])
              - datetime.timedelta(days=1)).isoformat()
    version = day_step(before)
    target = os.path.join(cfg.export_dir, str(version))
    if os.path.isdir(target) and os.listdir(target):
        _log.info(f"tnet.train: {target} exists and is not updatable: day "
              f"{todo[0]} publishes nothing (its own export is updatable)")
        return
    files = _day_files(cfg, todo[0])
    job = SpecJobData(cfg, False, spec, files, files, count=False)
    result = export_and_check(cfg, model, job, version=version,
                              sample_data=job.eval())
    state["publish_base"] = {"day": before, "export": result["path"]}
    write_state(ckpt_dir, state)
    _log.info(f"tnet.train: exported {result['path']}, the base day "
          f"{todo[0]} publishes into")


def _ensure_export(cfg: JobConfig, model, spec, day: str, state: dict,
                   ckpt_dir: str) -> None:
    """Exports the model of `day` as export_dir/<YYYYMMDD> unless it exists
    (a rerun after a kill between the checkpoint and the export redoes it)."""
    version = day_step(day)
    target = os.path.join(cfg.export_dir, str(version))
    if os.path.isdir(target) and os.listdir(target):
        return
    files = _day_files(cfg, day)
    job = SpecJobData(cfg, False, spec, files, files, count=False)
    try:
        result = export_and_check(cfg, model, job, version=version,
                                  sample_data=job.eval())
    except BaseException:
        # An export that failed its check (or was interrupted after the
        # rename) must not stand as the day's version: a rerun would skip
        # it. Moved aside (TF Serving loads numeric names only) and redone
        # by the next run.
        if os.path.isdir(target):
            aside = os.path.join(cfg.export_dir,
                                 f".{version}.failed-{int(time.time())}")
            os.rename(target, aside)
            _log.info(f"tnet.train: day {day}: export failed; moved it to "
                  f"{aside}")
        raise
    state["days"].setdefault(day, {})["export"] = result["path"]
    write_state(ckpt_dir, state)
    _log.info(f"tnet.train: day {day} exported {result['path']}")
