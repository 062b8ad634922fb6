"""tn.saving: table checkpoints.

- `save(model, dir)` / `restore(model, dir)`: checkpoints that lose nothing
  (HDF5 table parts streamed through the export cursor, dense state, a
  manifest with checksums; incremental deltas; resharding on restore). See
  `tnet.saving.checkpoint`; `tn.callbacks.Checkpoint` drives them from fit.

The serving export and its deltas moved to `tn.serving`
(`tn.serving.export_for_serving`, `tn.serving.publish_delta`); the names
`tn.saving.export_for_serving`, `tn.saving.ExportWriteError`,
`tn.saving.publish_delta` and `tn.saving.DeltaError` still work (tnet's
package init sets them: this package never imports `tnet.serving`).
"""
from tnet.saving.checkpoint import (CheckpointError, latest_checkpoint,
                                    list_checkpoints, read_manifest,
                                    read_state, restore, save)

__all__ = ["save", "restore", "latest_checkpoint", "list_checkpoints",
           "read_manifest", "read_state", "CheckpointError"]
