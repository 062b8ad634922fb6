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


def _main_module() -> str:
    """The module Python was started to run (`python -m NAME` or `-mNAME`),
    or "" for a script, `-c`, an interactive session or a command line it
    cannot read."""
    argv = list(getattr(_sys, "orig_argv", ()))[1:]
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "-m":
            return argv[i + 1] if i + 1 < len(argv) else ""
        if arg.startswith("-m"):
            return arg[2:]
        if arg == "-c" or not arg.startswith("-"):
            return ""
        i += 2 if arg in ("-X", "-W") else 1   # options with a value
    return ""


def _runs_as_task_server() -> bool:
    """Whether this Python was started as `python -m tnet.server` (a ps or
    worker task: it runs the graphs the chief sends, never Keras or a tnet
    layer)."""
    return _main_module() == "tnet.server"


# Command-line tools that read their flags before they need TensorFlow:
# `--help`, a bad flag or a bad flag combination answers at once, and the
# job loads everything (`_load`) once its flags are good. tnet.launch
# never needs TensorFlow: it only starts processes.
_FLAGS_FIRST = ("tnet.train", "tnet.launch")

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
    def _load() -> None:
        """Loads TensorFlow, Keras and every tnet module, once: at import,
        or for a flags-first tool (`_FLAGS_FIRST`) when its flags are
        good or a name below is first used."""
        global _loaded, Model, SparseTable  # noqa: PLW0603
        if _loaded:
            return
        _loaded = True
        import importlib  # noqa: PLC0415
        with log.hold_startup_chatter(log.quiet_tensorflow()):
            for _name in __all__:
                if _name != "log" and _name[0].islower():
                    importlib.import_module(f"tnet.{_name}")
            from tnet.model import Model  # noqa: PLC0415
            from tnet.table import SparseTable  # noqa: PLC0415
        # The serving names that lived in tn.saving before tn.serving
        # existed keep working there (set here: tnet.saving never imports
        # tnet.serving).
        for _name in ("export_for_serving", "ExportWriteError",
                      "publish_delta", "DeltaError"):
            setattr(saving, _name, getattr(serving, _name))  # noqa: F821
        _autograph_leaves_tnet_alone()

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

    __all__ = ["SparseTable", "Model", "bind", "callbacks", "data",
               "distribute", "feature_column", "layers", "log", "model",
               "models", "monitoring", "optimizer", "saving", "serving"]
    _loaded = False
    if _main_module() in _FLAGS_FIRST:
        def __getattr__(name: str):
            # `from tnet import bind` asks for the name first: a module
            # loads alone (as `import tnet.bind` does); the classes load
            # everything.
            if name in __all__ and name[0].islower():
                import importlib  # noqa: PLC0415
                return importlib.import_module(f"tnet.{name}")
            if name in __all__ and not _loaded:
                _load()
                return globals()[name]
            raise AttributeError(f"module 'tnet' has no attribute {name!r}")
    else:
        _load()
else:
    def __getattr__(name: str):
        raise AttributeError(
            f"tnet.{name} needs TensorFlow, which this Python cannot import "
            "(pip install -r requirements.txt, or the wheel's TensorFlow); "
            "without it only tnet.serving.deltas, the delta files, loads")

# The package version (setup.py reads it from here; a wheel adds
# "+tf<X.Y.Z>", the TensorFlow its op library was built for).
__version__ = "0.2.0"
