"""The CLI's serving export: `export_and_check` exports the trained model
to <--export_dir>/<version> and checks it in a fresh Python process that
never imports tnet (the export's predictions against this process's)."""
from __future__ import annotations

import os
import sys
import time

import tensorflow as tf

import tnet as tn
from tnet.cli.config import JobConfig
from tnet.cli.data import RetrievalJobData
from tnet.log import get as _get_logger

_log = _get_logger("train")


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


def export_and_check(cfg: JobConfig, model, spec, version: int | None = None,
                     sample_data=None) -> dict:
    """Exports for serving, then reloads the SavedModel in a fresh Python
    process that never imports tnet and compares its predictions with this
    process's on a hold-out batch. `version` (default: unix time) numbers
    the export directory; `sample_data` (default spec.eval()) gives it."""
    if isinstance(spec, RetrievalJobData):
        return export_and_check_retrieval(cfg, model, spec)
    # A numbered version directory, as TF Serving expects (newest wins).
    version = os.path.join(cfg.export_dir, str(
        int(time.time()) if version is None else version))
    element = next(iter(spec.eval() if sample_data is None else sample_data))
    features = dict(element[0])
    features.pop(getattr(spec, "group_key", None) or "", None)
    # Called before the export: fit never calls the model itself (it calls
    # logits), and the export infers its signature from the model's first
    # call, as Keras' model.save does (ragged ids -> padded [None, None]).
    if not model.built:
        # The base a publisher needs, exported before fit: the model is
        # built here, in the strategy's scope so that under a cluster its
        # variables go to the ps (outside it, fit's optimizer refuses them).
        with model.distribute_strategy.scope():
            model(features, training=False)
    expected = model(features, training=False).numpy()[:256].reshape(-1)
    updatable = cfg.updatable_export or cfg.publishing
    path = tn.saving.export_for_serving(
        model, version, quantize=cfg.quantize, updatable=updatable,
        **({} if not updatable else dict(
            update_key_file=cfg.update_key_file or None,
            rotate_update_key=cfg.rotate_update_key)))
    sample = {k: _serving_array(v)[:256] for k, v in features.items()}
    sample_path = _save_sample(cfg.model_dir, __expected__=expected, **sample)
    tolerance = {None: 1e-5, "float16": 1e-3, "int8": 1e-2}[cfg.quantize]
    result = {"path": path, "quantize": cfg.quantize,
              "updatable": cfg.updatable_export or cfg.publishing}
    result["checked_without_tnet"] = _run_checker(
        "checks.py", path, sample_path, tolerance)
    return result


def export_and_check_retrieval(cfg: JobConfig, model, spec) -> dict:
    """The two-tower export (query features -> top-K ids and scores),
    reloaded in a fresh process without tnet and compared with this
    process's BruteForce top-K on hold-out queries."""
    version = os.path.join(cfg.export_dir, str(int(time.time())))
    path = tn.saving.export_for_serving(model, version,
                                        quantize=cfg.quantize,
                                        candidates=spec.candidates,
                                        k=cfg.top_k)
    result = {"path": path, "quantize": cfg.quantize, "k": cfg.top_k}
    if cfg.quantize is not None:
        # quantized tables move scores, so near-ties may swap: not checked
        return result
    sample = {n: spec.data.test[n][:256] for n in model.query_feature_names()}
    scores, ids = model.candidate_index(spec.candidates)(
        model.query_embedding(sample), k=cfg.top_k)
    sample_path = _save_sample(cfg.model_dir, __ids__=ids.numpy(),
                               __scores__=scores.numpy(), **sample)
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


def _save_sample(model_dir: str, **arrays) -> str:
    """Writes the export check's inputs and expected outputs to an .npz.

    String features arrive as object arrays of bytes, which np.load refuses
    without pickle (the checker loads with allow_pickle=False): they are
    stored as fixed-width bytes, which tf.constant reads back as tf.string.
    """
    import numpy as np  # noqa: PLC0415
    path = os.path.abspath(os.path.join(model_dir, "export_sample.npz"))
    np.savez(path, **{k: (v.astype("S") if v.dtype == object else v)
                      for k, v in arrays.items()})
    return path


def _run_checker(script: str, path: str, sample_path: str,
                 tolerance: float) -> bool:
    """Runs tnet/serving/<script> on an export in a fresh process that never
    imports tnet (by file path: no package import, no PYTHONPATH, no
    cluster, no preload); raises if it fails."""
    import subprocess  # noqa: PLC0415
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    checker = os.path.join(package, "serving", script)
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
