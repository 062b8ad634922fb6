"""tn.serving: the serving wing.

- `export_for_serving(model, export_dir, quantize=None)`: a SavedModel that
  stock TensorFlow and TF Serving load without tnet (`tnet.serving.export`;
  its tables `serving_table`, its inputs `signature`, its outputs
  `outputs`, the op check `op_check`, the two-tower top-K `retrieval`).
- With `updatable=True`, `publish_delta(model, export_dir)` (or the
  `tn.callbacks.PublishDeltas` callback) streams changed rows to it as
  numbered deltas (`tnet.serving.publish`; the files:
  `tnet.serving.deltas`; the signatures that apply them:
  `tnet.serving.updatable`), guarded by an update key
  (`update_key`), and `python -m tnet.serving.follow` applies them to
  serving replicas.
- `tnet/serving/checks.py`, run by path in a process without tnet, checks
  an export's predictions.

Without TensorFlow (a follower host reading delta files) only
`tnet.serving.deltas` loads.
"""
import tnet as _tnet
from tnet.serving.deltas import DeltaError

if _tnet._WITH_TENSORFLOW:  # noqa: SLF001  (else: deltas alone, see tnet)
    from tnet.serving.export import ExportWriteError, export_for_serving
    from tnet.serving.publish import publish_delta

__all__ = ["export_for_serving", "ExportWriteError", "publish_delta",
           "DeltaError"]
