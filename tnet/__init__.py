"""tnet: sparse embedding tables for Keras recommendation models.

Importing tnet selects Keras 2 (`tf_keras`) for TensorFlow by setting
TF_USE_LEGACY_KERAS=1 before TensorFlow is imported: Keras 3 has no
ParameterServerStrategy support in `fit`. If TensorFlow was already imported
and bound to Keras 3, tnet refuses to load and says what to do.
"""
from __future__ import annotations

import os as _os
import sys as _sys


def _select_legacy_keras() -> None:
    value = _os.environ.get("TF_USE_LEGACY_KERAS")
    if value is not None and value.lower() not in ("1", "true"):
        raise ImportError(
            f"tnet needs Keras 2 (tf_keras) but TF_USE_LEGACY_KERAS={value!r}. "
            "Unset it or set TF_USE_LEGACY_KERAS=1 before starting Python.")
    _os.environ["TF_USE_LEGACY_KERAS"] = "1"
    tf = _sys.modules.get("tensorflow")
    if tf is None:
        return
    # tf.keras is resolved lazily; once resolved to Keras 3 it cannot change.
    keras_mod = getattr(getattr(tf, "keras", None), "__name__", "")
    if keras_mod and not keras_mod.startswith("tf_keras"):
        raise ImportError(
            "TensorFlow was imported with Keras 3 before tnet. Import tnet "
            "first (`import tnet as tn` before `import tensorflow`), or set "
            "TF_USE_LEGACY_KERAS=1 in the environment.")


_select_legacy_keras()

# Before TensorFlow is imported: the "tnet" logger's console handler, and
# for `python -m tnet.<cli>` no TensorFlow start-up chatter (tnet/log.py).
from tnet import log  # noqa: E402
log.install()


def _tensorflow_importable() -> bool:
    """Whether this Python can import TensorFlow. Without it tnet loads
    only what needs none (tnet.log, tnet.files and tnet.serving.deltas,
    the delta files a follower reads); its other names say so."""
    import importlib.util  # noqa: PLC0415
    try:
        return importlib.util.find_spec("tensorflow") is not None
    except (ImportError, ValueError):
        return False


_WITH_TENSORFLOW = _tensorflow_importable()


def _runs_as_task_server() -> bool:
    """Whether this Python was started as `python -m tnet.server` (a ps or
    worker task: it runs the graphs the chief sends, never Keras or a tnet
    layer). Any other command line, or one it cannot read, is not."""
    argv = list(getattr(_sys, "orig_argv", ()))[1:]
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "-m":
            return argv[i + 1:i + 2] == ["tnet.server"]
        if arg.startswith("-m"):
            return arg[2:] == "tnet.server"
        if arg == "-c" or not arg.startswith("-"):
            return False
        i += 2 if arg in ("-X", "-W") else 1   # options with a value
    return False


if _WITH_TENSORFLOW and _runs_as_task_server():
    # A ps or worker task loads TensorFlow, the op library and
    # tnet.distribute only. TensorFlow imports Keras' optimizers while it
    # loads unless that import fails; a task never builds, saves or loads
    # a Keras model, so they are skipped during TensorFlow's import (and
    # importable again after it): each task starts with ~1 s less CPU.
    _blocked = "tf_keras.src.optimizers" not in _sys.modules
    if _blocked:
        _sys.modules["tf_keras.src.optimizers"] = None
    try:
        with log.hold_startup_chatter(log.quiet_tensorflow()):
            from tnet import bind  # noqa: E402
            from tnet import distribute  # noqa: E402
    finally:
        if _blocked and _sys.modules.get("tf_keras.src.optimizers", 0) is None:
            del _sys.modules["tf_keras.src.optimizers"]
    __all__ = ["bind", "distribute", "log"]
elif _WITH_TENSORFLOW:
    with log.hold_startup_chatter(log.quiet_tensorflow()):
        from tnet import bind  # noqa: E402
        from tnet import callbacks  # noqa: E402
        from tnet import data  # noqa: E402
        from tnet import distribute  # noqa: E402
        from tnet import feature_column  # noqa: E402
        from tnet import layers  # noqa: E402
        from tnet import model  # noqa: E402
        from tnet import models  # noqa: E402
        from tnet import monitoring  # noqa: E402
        from tnet import optimizer  # noqa: E402
        from tnet import saving  # noqa: E402
        from tnet import serving  # noqa: E402
        from tnet.model import Model  # noqa: E402
        from tnet.table import SparseTable  # noqa: E402

    # The serving names that lived in tn.saving before tn.serving existed
    # keep working there (set here: tnet.saving never imports tnet.serving).
    for _name in ("export_for_serving", "ExportWriteError", "publish_delta",
                  "DeltaError"):
        setattr(saving, _name, getattr(serving, _name))
    del _name

    def _autograph_leaves_tnet_alone() -> None:
        """tnet's graph code is written for graphs (tf.cond, tf.while_loop,
        no Python branches on tensors), so AutoGraph has nothing to convert
        in it; converting it anyway cost each process ~6 s of CPU the first
        time a model was traced (the embedding helpers alone ~3 s). tnet is
        added to AutoGraph's do-not-convert modules, as tf_keras is: a
        user's own layers and steps, called through Keras, are converted
        as before."""
        from tensorflow.python.autograph.core import config  # noqa: PLC0415
        rule = config.DoNotConvert("tnet")
        if not any(isinstance(r, config.DoNotConvert) and r.matches("tnet")
                   for r in config.CONVERSION_RULES):
            config.CONVERSION_RULES = (rule, *config.CONVERSION_RULES)

    _autograph_leaves_tnet_alone()

    __all__ = ["SparseTable", "Model", "bind", "callbacks", "data",
               "distribute", "feature_column", "layers", "log", "model",
               "models", "monitoring", "optimizer", "saving", "serving"]
else:
    def __getattr__(name: str):
        raise AttributeError(
            f"tnet.{name} needs TensorFlow, which this Python cannot import "
            "(pip install -r requirements.txt, or the wheel's TensorFlow); "
            "without it only tnet.serving.deltas, the delta files, loads")

# The package version (setup.py reads it from here; a wheel adds
# "+tf<X.Y.Z>", the TensorFlow its op library was built for).
__version__ = "0.2.0"
