"""What a ranking export's `serving_default` returns, named by what it holds.

Every ranking export (tnet's models and users' alike) returns:

* `prediction`: the model's output exactly as `call` returns it (the name
  every export has always had);
* the same tensor under the name of what it holds, `logits` or
  `probabilities`, when that is known;
* `probabilities` too when the output is the logit of a binary loss
  (`sigmoid(logits)`), so a client reads probabilities from every binary
  ranking export by one name.

What the output holds is, in order: `export_for_serving(prediction=...)`;
the model's own `prediction_kind` attribute (tnet's CTR models:
"probabilities"); the model's loss (the compiled loss, or the loss of a
`tfrs.tasks.Ranking` inside it): a cross-entropy with `from_logits=True`
means logits, without it probabilities, a regression loss plain values.
Otherwise "unknown": only `prediction` is returned, and the export logs
how to say. `export_info.json` records it (`prediction_holds`).
"""
from __future__ import annotations

import logging
from typing import Any, Dict, Optional, Tuple

import tensorflow as tf

KINDS = ("logits", "probabilities", "values")
UNKNOWN = "unknown"

_BINARY = ("binary_crossentropy", "bce", "binary_focal_crossentropy")
_CATEGORICAL = ("categorical_crossentropy", "sparse_categorical_crossentropy",
                "cce", "scce", "categorical_focal_crossentropy")
_REGRESSION = ("mean_squared_error", "mse", "mean_absolute_error", "mae",
               "huber", "huber_loss", "log_cosh", "logcosh",
               "mean_absolute_percentage_error", "mape",
               "mean_squared_logarithmic_error", "msle")


def prediction_kind(model, given: Optional[str] = None) -> Tuple[str, bool]:
    """(what the model's output holds: one of KINDS or "unknown", whether it
    is the output of a binary loss)."""
    if given is not None:
        if given not in KINDS:
            raise ValueError(f"export_for_serving(prediction=...) must be one "
                             f"of {KINDS}, got {given!r}")
        return given, _binary(model)
    own = getattr(model, "prediction_kind", None)
    if own in KINDS:
        return own, _binary(model)
    kinds = {k for k, _ in (_loss_kind(l) for l in _losses(model))} - {None}
    if len(kinds) == 1:
        return kinds.pop(), _binary(model)
    return UNKNOWN, False


def serving_outputs(prediction, kind: str, binary: bool) -> Dict[str, Any]:
    """The serving_default outputs for a model output `prediction`."""
    out = {"prediction": tf.identity(prediction, name="prediction")}
    if kind in ("logits", "probabilities"):
        out[kind] = tf.identity(prediction, name=kind)
    if kind == "logits" and binary:
        out["probabilities"] = tf.sigmoid(prediction, name="probabilities")
    return out


def log_unknown(model) -> None:
    logging.getLogger("tnet.saving").warning(
        "export_for_serving: cannot tell whether %s's output holds logits "
        "or probabilities (no cross-entropy or regression loss found); the "
        "export returns only 'prediction'. Pass prediction='logits', "
        "'probabilities' or 'values' to name it.", type(model).__name__)


def _losses(model):
    compiled = getattr(model, "compiled_loss", None)
    losses = list(tf.nest.flatten(getattr(compiled, "_user_losses", None)))
    try:
        import tensorflow_recommenders as tfrs  # noqa: PLC0415
        modules = model._flatten_modules(include_self=False)
        losses += [m._loss for m in modules
                   if isinstance(m, tfrs.tasks.Ranking)]
    except (ImportError, AttributeError):
        pass
    return [l for l in losses if l is not None]


def _binary(model) -> bool:
    return any(_loss_kind(l)[1] for l in _losses(model))


def _loss_kind(loss) -> Tuple[Optional[str], bool]:
    """(kind of the predictions this loss takes, binary?)."""
    if isinstance(loss, str):
        name, from_logits = loss.lower(), False
    else:
        name = getattr(loss, "name", None) or getattr(loss, "__name__", "")
        fn = getattr(loss, "fn", None)  # a LossFunctionWrapper's function
        if fn is not None and name not in _BINARY + _CATEGORICAL:
            name = getattr(fn, "__name__", name)
        name = _snake(str(name))
        from_logits = bool(getattr(loss, "from_logits", None) or getattr(
            loss, "_fn_kwargs", {}).get("from_logits", False))
    if name in _BINARY or name in _CATEGORICAL:
        return ("logits" if from_logits else "probabilities",
                name in _BINARY)
    if name in _REGRESSION:
        return "values", False
    return None, False


def _snake(name: str) -> str:
    out = []
    for i, ch in enumerate(name):
        if ch.isupper() and i and not name[i - 1].isupper():
            out.append("_")
        out.append(ch.lower())
    return "".join(out)
