"""The model a JobConfig describes, and the callbacks its checkpoint,
lifecycle and publishing flags ask for: plain functions, each returning
what it makes."""
from __future__ import annotations

import os

import tnet as tn
from tnet import models as tn_models
from tnet.cli.config import JobConfig

_MODELS = {"wide_deep": tn_models.WideDeep, "deepfm": tn_models.DeepFM,
           "dcn": tn_models.DCN}


def table_options(cfg: JobConfig) -> dict:
    """The table options of the lifecycle flags (admission, row cap, disk
    tier), as `set_table_options` takes them."""
    return dict(min_count=cfg.min_count, max_rows=cfg.max_rows or None,
                admission_capacity=cfg.admission_capacity,
                memory_budget_bytes=cfg.memory_budget_bytes or None,
                storage_dir=cfg.storage_dir or None)


def build_model(cfg: JobConfig, categorical, dense, string_ids):
    """The --model of `cfg` (two_tower ignores the three columns), its tnet
    layers given `table_options(cfg)` before their tables exist."""
    if cfg.model == "two_tower":
        from tnet.data.movielens import USER_FEATURES  # noqa: PLC0415
        model = tn_models.TwoTower(
            user_features=USER_FEATURES,
            history_max_length=cfg.history_max_length,
            pooling=cfg.pooling, embedding_dim=cfg.embedding_dim,
            hidden_units=[int(u) for u in cfg.hidden_units],
            output_dim=cfg.embedding_dim, temperature=cfg.temperature,
            sampling_probability_key=("item_prob"
                                      if cfg.sampling_bias_correction
                                      else None))
    else:
        model = _MODELS[cfg.model](
            categorical, dense, embedding_dim=cfg.embedding_dim,
            string_ids=string_ids,
            hidden_units=[int(u) for u in cfg.hidden_units])
    options = table_options(cfg)
    for layer in model.tnet_layers():
        layer.set_table_options(**options)
    return model


def compiled_model(cfg: JobConfig, strategy, categorical, dense, string_ids):
    """build_model, compiled with --optimizer at --learning_rate, under
    `strategy`'s scope."""
    with strategy.scope():
        model = build_model(cfg, categorical, dense, string_ids)
        model.compile(tn.optimizer.by_name(cfg.optimizer)(cfg.learning_rate))
    return model


def checkpoint_callbacks(cfg: JobConfig, stream=None):
    """(the checkpoint callback or None, the callbacks a training job's fit
    starts with). Without --checkpoint_dir only the maintenance callback of
    `maintenance_callback`, if any. Else first the checkpoint callback, so
    its restore happens before the other callbacks start: a `Checkpoint`
    every --checkpoint_every_n_steps / _epochs, or for a `stream` (a
    tn.data.FileStream) a `StreamCheckpoint` at file boundaries every
    --checkpoint_every_n_files / _seconds; both keep --checkpoint_keep,
    write deltas by --checkpoint_incremental and --checkpoint_full_every,
    and run the maintenance (which follows) right before each save."""
    maintenance = maintenance_callback(cfg)
    checkpoints = None
    if cfg.checkpoint_dir:
        common = dict(keep=cfg.checkpoint_keep,
                      incremental=cfg.checkpoint_incremental,
                      full_every=cfg.checkpoint_full_every,
                      maintenance=maintenance)
        if stream is not None:
            checkpoints = tn.callbacks.StreamCheckpoint(
                cfg.checkpoint_dir, stream,
                every_n_files=cfg.checkpoint_every_n_files or None,
                every_seconds=cfg.checkpoint_every_seconds or None, **common)
        else:
            checkpoints = tn.callbacks.Checkpoint(
                cfg.checkpoint_dir,
                every_n_steps=cfg.checkpoint_every_n_steps or None,
                every_n_epochs=cfg.checkpoint_every_n_epochs or None, **common)
    return checkpoints, [c for c in (checkpoints, maintenance) if c is not None]


def maintenance_callback(cfg: JobConfig):
    """The TableMaintenance callback of --maintenance_every_n_steps (decay,
    threshold and ttl of their flags), or None when that is 0."""
    if not cfg.maintenance_every_n_steps:
        return None
    return _maintenance(cfg, cfg.maintenance_every_n_steps)


def daily_maintenance(cfg: JobConfig):
    """The TableMaintenance the daily loop runs once after each day, or
    None when --show_decay_rate, --show_threshold and --ttl_steps would
    change nothing."""
    if (cfg.show_decay_rate == 1.0 and cfg.show_threshold == 0.0
            and not cfg.ttl_steps):
        return None
    return _maintenance(cfg, None)


def _maintenance(cfg: JobConfig, every_n_steps):
    return tn.callbacks.TableMaintenance(
        every_n_steps=every_n_steps, show_decay_rate=cfg.show_decay_rate,
        show_threshold=cfg.show_threshold, ttl_steps=cfg.ttl_steps,
        log_dir=os.path.join(cfg.model_dir, "logs", "tables"))


def publisher_callback(cfg: JobConfig):
    """The PublishDeltas callback of --publish_every_*, or None."""
    if not cfg.publishing:
        return None
    return tn.callbacks.PublishDeltas(
        cfg.export_dir, every_n_steps=cfg.publish_every_n_steps or None,
        every_seconds=cfg.publish_every_seconds or None,
        compact_at=cfg.publish_compact_at or None,
        rotate_update_key=cfg.rotate_update_key)
