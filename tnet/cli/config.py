"""JobConfig: the parsed flags of `python -m tnet.train`, as one frozen
dataclass. `tnet/cli/flags.py` defines a flag per field (its default is the
field's default) and builds the JobConfig once; the jobs read only it, so a
test or a program builds one with `JobConfig(batch_size=64, ...)`.
`check_config` refuses a flag combination that cannot work. Nothing here
imports TensorFlow: `python -m tnet.train` runs both before it loads.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

from absl import app

# --optimizer's choices: the rules with a tnet Keras optimizer
# (tn.optimizer.names(); a test checks they agree), listed here so the
# flags parse before TensorFlow loads.
OPTIMIZERS = ("sgd", "adagrad", "rowwise_adagrad", "adam", "ftrl")


@dataclasses.dataclass(frozen=True)
class JobConfig:
    # The model and its data.
    model: str = "wide_deep"
    data: str = "synthetic"
    movielens_dir: str = "../shared/data/movielens"
    history_max_length: int = 20
    pooling: str = "attention"
    sampling_bias_correction: bool = True
    temperature: float = 0.1
    top_k: int = 100
    feature_spec: str = ""
    format: str = "tfrecord"
    # The daily loop and the stream.
    days: str = ""
    day_pattern: str = ""
    stream: str = ""
    stream_landed: str = "rename"
    stream_poll_secs: float = 1.0
    stream_idle_secs: float = 0.0
    stream_max_file_age_secs: float = 7 * 86400.0
    bad_files: str = "skip"
    event_time_feature: str = ""
    metrics_port: int = -1
    checkpoint_every_n_files: int = 0
    checkpoint_every_seconds: float = 0.0
    # Files and rows.
    train_files: Tuple[str, ...] = ()
    eval_files: Tuple[str, ...] = ()
    train_rows: int = -1
    eval_rows: int = -1
    synthetic_train_examples: int = 200_000
    synthetic_eval_examples: int = 50_000
    synthetic_scale: float = 0.05
    bad_rows: str = "fail"
    verbose: bool = False
    # Training.
    batch_size: int = 1024
    epochs: int = 1
    optimizer: str = "adagrad"
    learning_rate: float = 0.05
    embedding_dim: int = 8
    hidden_units: Tuple[str, ...] = ("400", "400", "400")
    model_dir: str = "/tmp/tnet_run"
    seed: int = 0
    shuffle_buffer: int = 10_000
    # Export and publishing.
    export_dir: str = ""
    quantize: Optional[str] = None
    updatable_export: bool = False
    update_key_file: str = ""
    rotate_update_key: bool = False
    publish_every_n_steps: int = 0
    publish_every_seconds: float = 0.0
    publish_compact_at: float = 0.1
    # Checkpoints.
    checkpoint_dir: str = ""
    checkpoint_every_n_steps: int = 0
    checkpoint_every_n_epochs: int = 1
    checkpoint_keep: int = 3
    checkpoint_incremental: bool = False
    checkpoint_full_every: int = 8
    data_cache_dir: str = "/tmp/tnet_data"
    # Feature lifecycle (admission, row cap, disk tier, eviction).
    min_count: float = 1.0
    admission_capacity: int = 1 << 20
    max_rows: int = 0
    memory_budget_bytes: int = 0
    storage_dir: str = ""
    show_decay_rate: float = 1.0
    show_threshold: float = 0.0
    ttl_steps: int = 0
    maintenance_every_n_steps: int = 0

    @property
    def publishing(self) -> bool:
        """--publish_every_n_steps or --publish_every_seconds is set."""
        return bool(self.publish_every_n_steps or self.publish_every_seconds)

    def as_dict(self) -> dict:
        """The values by flag name (summary.json's "flags"; lists as lists)."""
        return {k: (list(v) if isinstance(v, tuple) else v)
                for k, v in dataclasses.asdict(self).items()}


def names() -> list:
    """The field names: one flag each."""
    return [f.name for f in dataclasses.fields(JobConfig)]


def check_config(cfg: JobConfig) -> None:
    """Raises app.UsageError for a flag combination that cannot work."""
    if cfg.memory_budget_bytes < 0:
        raise app.UsageError("--memory_budget_bytes must be >= 0 (0: every "
                             "row in memory)")
    if bool(cfg.memory_budget_bytes) != bool(cfg.storage_dir):
        raise app.UsageError("--memory_budget_bytes and --storage_dir go "
                             "together: the disk tier needs a budget and a "
                             "writable local directory")
    if cfg.event_time_feature and not cfg.stream:
        raise app.UsageError("--event_time_feature measures a stream's input "
                             "lag: it goes with --stream")
    if cfg.publishing:
        if not cfg.export_dir:
            raise app.UsageError("--publish_every_n_steps/_seconds publish "
                                 "to an export: set --export_dir")
        if cfg.model == "two_tower":
            raise app.UsageError("--publish_every_* keeps a ranking model's "
                                 "export fresh, not two_tower's")
        if min(cfg.publish_every_n_steps, cfg.publish_every_seconds,
               cfg.publish_compact_at) < 0:
            raise app.UsageError("--publish_every_n_steps, "
                                 "--publish_every_seconds and "
                                 "--publish_compact_at must be >= 0")
    if cfg.stream:
        _check_stream(cfg)
    if cfg.feature_spec:
        if cfg.model == "two_tower":
            raise app.UsageError("--feature_spec trains the ranking models "
                                 "(wide_deep, deepfm, dcn), not two_tower")
        if cfg.days and not (cfg.day_pattern and cfg.checkpoint_dir):
            raise app.UsageError("--days needs --day_pattern (e.g. "
                                 "'data/{day}/*') and --checkpoint_dir")
        return
    if cfg.days:
        raise app.UsageError("--days needs --feature_spec")
    retrieval = cfg.model == "two_tower"
    if retrieval != (cfg.data == "movielens"):
        raise app.UsageError("--model=two_tower goes with --data=movielens "
                             "(and the ranking models with the CTR data)")


def _check_stream(cfg: JobConfig) -> None:
    """The --stream flags (check_config calls it when --stream is set)."""
    if not cfg.feature_spec:
        raise app.UsageError("--stream needs --feature_spec (and --format)")
    if cfg.days:
        raise app.UsageError("--stream and --days are two ways to read: "
                             "pick one")
    if cfg.stream_poll_secs <= 0:
        raise app.UsageError("--stream_poll_secs must be > 0")
    if min(cfg.stream_idle_secs, cfg.checkpoint_every_n_files,
           cfg.checkpoint_every_seconds) < 0:
        raise app.UsageError("--stream_idle_secs, --checkpoint_every_n_files "
                             "and --checkpoint_every_seconds must be >= 0")
    if cfg.stream_max_file_age_secs <= 0:
        raise app.UsageError("--stream_max_file_age_secs must be > 0")
