"""The model's state other than table rows: the dense view (the model's
trackables with tnet tables left out), its write and restore, and the
helpers that find a model's tables, train step and strategy.
"""
from __future__ import annotations

import os
import weakref
from typing import Any, Dict, Optional, Tuple

import tensorflow as tf
from tensorflow.python.trackable import base as trackable_base

from tnet.saving.manifest import CheckpointError, DENSE_PREFIX
from tnet.table import _TableShard, SparseTable, model_tables


# ------------------------------------------------------- dense state
class _WithoutTables(trackable_base.Trackable):
    """A view of a trackable whose children omit tnet tables (recursively).

    Children that hold no table are the real objects, so the saved object
    graph has the model's own paths; only objects that (transitively) hold
    a SparseTable are replaced by such a view.
    """

    def __init__(self, obj, memo: Dict[int, Any], holds: Dict[int, bool]):
        self._obj = obj
        self._memo = memo
        self._holds = holds

    def _trackable_children(self, save_type=trackable_base.SaveType.CHECKPOINT,
                            **kwargs):
        out = {}
        for name, child in self._obj._trackable_children(save_type,
                                                         **kwargs).items():
            if isinstance(child, (SparseTable, _TableShard)):
                continue
            if _holds_table(child, self._holds):
                view = self._memo.get(id(child))
                if view is None:
                    view = self._memo[id(child)] = _WithoutTables(
                        child, self._memo, self._holds)
                child = view
            out[name] = child
        return out


def _holds_table(obj, cache: Dict[int, bool], _stack=None) -> bool:
    if isinstance(obj, (SparseTable, _TableShard)):
        return True
    key = id(obj)
    if key in cache:
        return cache[key]
    cache[key] = False  # cycles
    try:
        children = obj._trackable_children(trackable_base.SaveType.CHECKPOINT)
    except Exception:  # noqa: BLE001  (objects that cannot list children)
        children = {}
    result = any(_holds_table(c, cache) for c in children.values())
    cache[key] = result
    return result


def _dense_view(model):
    return _WithoutTables(model, {}, {})


def _dense_variable_count(model) -> int:
    seen = set()
    view = _dense_view(model)  # TrackableView holds its root weakly
    for obj in tf.train.TrackableView(view).descendants():
        if isinstance(obj, tf.Variable):
            seen.add(id(obj))
    return len(seen)


def _strategy_scope(model):
    strategy = getattr(model, "distribute_strategy", None)
    if strategy is None:
        return tf.distribute.get_strategy().scope()
    return strategy.scope()


def _model_tables(model) -> Dict[str, SparseTable]:
    return model_tables(model, "tn.saving checkpoints")


def _train_step(model) -> Optional[int]:
    opt = getattr(model, "optimizer", None)
    if opt is None or not hasattr(opt, "iterations"):
        return None
    return int(opt.iterations.numpy())


class _DenseWriter:
    """Writes the dense state through one traced `Checkpoint.write`.

    An eager `tf.train.Checkpoint.write` of variables placed on ps tasks
    grows every ps process by ~0.3 MB per save, without bound (measured
    here: +96 MB per 300 writes of 20 ps variables, each ps); the same
    write traced once in a tf.function and called again rises once (~30 MB)
    and then stays flat over 1,200 writes. The function is retraced only
    when the model's set of dense variables changes (e.g. optimizer slots
    created by the first step): the object graph is fixed at trace time.
    """

    def __init__(self, model):
        self._view = _dense_view(model)   # TrackableView holds it weakly
        self.key = _dense_variable_ids(self._view)
        checkpoint = tf.train.Checkpoint(model=self._view)
        self._write = tf.function(checkpoint.write, autograph=False)

    def __call__(self, prefix: str) -> None:
        self._write(tf.constant(prefix))


_DENSE_WRITERS: "weakref.WeakKeyDictionary[Any, _DenseWriter]" = (
    weakref.WeakKeyDictionary())


def _on_ps_tasks(model) -> bool:
    strategy = getattr(model, "distribute_strategy", None)
    return isinstance(strategy,
                      tf.distribute.experimental.ParameterServerStrategy)


def _dense_variable_ids(view) -> Tuple[int, ...]:
    return tuple(sorted({id(obj) for obj in
                         tf.train.TrackableView(view).descendants()
                         if isinstance(obj, tf.Variable)}))


def _write_dense(model, tmp: str) -> Dict[str, Any]:
    prefix = os.path.join(tmp, DENSE_PREFIX)
    os.makedirs(os.path.dirname(prefix), exist_ok=True)
    if not _on_ps_tasks(model):   # one process: the plain eager write
        tf.train.Checkpoint(model=_dense_view(model)).write(prefix)
    else:
        writer = _DENSE_WRITERS.get(model)
        if writer is None or writer.key != _dense_variable_ids(
                _dense_view(model)):
            writer = _DENSE_WRITERS[model] = _DenseWriter(model)
        writer(prefix)
    entries = [n for n, _ in tf.train.list_variables(prefix)
               if n != "_CHECKPOINTABLE_OBJECT_GRAPH"]
    return {"prefix": DENSE_PREFIX, "entries": len(entries)}


def _restore_dense(model, ckpt: str, manifest: Dict[str, Any],
                   built: int) -> None:
    prefix = os.path.join(ckpt, manifest["dense"]["prefix"])
    entries = manifest["dense"]["entries"]
    if built > entries:
        raise CheckpointError(
            f"{prefix}: the model has {built} dense variables, the checkpoint "
            f"{entries}; it was written by a different architecture", prefix)
    try:
        tf.train.Checkpoint(model=model).read(prefix).expect_partial()
    except (tf.errors.OpError, ValueError, AssertionError) as e:
        raise CheckpointError(f"{prefix}: dense state does not restore into "
                              f"this model: {e}", prefix) from None
    train_step = manifest.get("train_step")
    got = _train_step(model)
    if got is not None and train_step is not None and got != train_step:
        raise CheckpointError(
            f"{prefix}: restored optimizer.iterations is {got}, the manifest "
            f"says {train_step} (was the model compiled with an optimizer?)",
            prefix)
