"""tn.saving: table checkpoints and the serving export.

- `save(model, dir)` / `restore(model, dir)`: checkpoints that lose nothing
  (HDF5 table parts streamed through the export cursor, dense state, a
  manifest with checksums; incremental deltas; resharding on restore). See
  `tnet.saving.checkpoint`; `tn.callbacks.Checkpoint` drives them from fit.
- `export_for_serving(model, export_dir, quantize=None)`: a SavedModel that
  stock TensorFlow and TF Serving load without tnet (see
  `tnet.saving.export`); with `updatable=True`, `publish_delta(model,
  export_dir)` streams changed rows to it (see `tnet.saving.fresh`).
"""
from tnet.saving.checkpoint import (CheckpointError, latest_checkpoint,
                                    list_checkpoints, read_manifest,
                                    read_state, restore, save)
from tnet.saving.export import ExportWriteError, export_for_serving
from tnet.saving.fresh import DeltaError, publish_delta

__all__ = ["save", "restore", "latest_checkpoint", "list_checkpoints",
           "read_manifest", "read_state", "CheckpointError", "export_for_serving",
           "ExportWriteError", "publish_delta", "DeltaError"]
