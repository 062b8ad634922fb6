"""Every public name has a docstring the API reference can render.

The public API is what the API reference pages (docs/api/*.md) document
(each `::: target` and its `members:`) and the `__all__` of each public
module. A class or function needs a docstring with an `Example:` section,
and an `Args:` section when it takes arguments (a class: its `__init__`'s);
each public method and property of a public class defined in tnet needs
a docstring, with `Args:` when the method takes arguments. Keras' own
methods overridden in tnet classes (`call`, `get_config`, ...) keep
Keras' documentation.
"""
from __future__ import annotations

import importlib
import inspect
import re

import pytest
import tf_keras

import tnet as tn  # noqa: F401  (selects tf_keras before the modules load)
from tests.conftest import ROOT

MODULES = ["tnet.layers", "tnet.feature_column", "tnet.optimizer",
           "tnet.optimizer.sparse", "tnet.optimizer.keras", "tnet.callbacks",
           "tnet.data", "tnet.data.spec", "tnet.models", "tnet.monitoring",
           "tnet.saving", "tnet.serving", "tnet.serving.follow",
           "tnet.distribute"]
EXTRA = {"tnet.Model": "tnet.model.Model", "tnet.SparseTable": "tnet.table.SparseTable"}
EXAMPLE = re.compile(r"^\s*Examples?:\s*$", re.M)
ARGS = re.compile(r"^\s*Args:\s*$", re.M)
KERAS_BASES = (tf_keras.Model, tf_keras.layers.Layer,
               tf_keras.callbacks.Callback, tf_keras.optimizers.Optimizer,
               tf_keras.optimizers.legacy.Optimizer, Exception)


def _resolve(path: str):
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for p in parts[i:]:
            obj = getattr(obj, p)
        return obj
    raise ImportError(path)


def api_pages():
    """{target: members} of every `::: target` in docs/api/*.md."""
    out = {}
    for page in sorted((ROOT / "docs" / "api").glob("*.md")):
        for m in re.finditer(r"^::: ([\w.]+)\n((?:    .*\n)*)",
                             page.read_text(), re.M):
            members = re.search(r"members: \[([^\]]*)\]", m[2])
            out.setdefault(m[1], set()).update(
                [x.strip() for x in members[1].split(",")] if members else [])
    return out


def public_api():
    """{qualified name: object} of every public class and function."""
    names = {}
    for module in MODULES:
        mod = importlib.import_module(module)
        for n in getattr(mod, "__all__", []):
            names[f"{module}.{n}"] = getattr(mod, n)
    for target, members in api_pages().items():
        obj = _resolve(target)
        if inspect.ismodule(obj):
            for n in members or getattr(obj, "__all__", []):
                names[f"{target}.{n}"] = getattr(obj, n)
        else:
            names[target] = obj
    for name, target in EXTRA.items():
        names[name] = _resolve(target)
    out, seen = {}, set()
    for name, obj in sorted(names.items()):
        if inspect.ismodule(obj) or not callable(obj) or id(obj) in seen:
            continue
        seen.add(id(obj))
        out[name] = obj
    return out


def _params(fn):
    if isinstance(fn, type):
        # A class documents the arguments of its own __init__, not those
        # of a Keras or Python base it inherits one from.
        owner = next((c for c in fn.__mro__ if "__init__" in vars(c)), object)
        if not owner.__module__.startswith("tnet"):
            return []
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    return [p for p in sig.parameters.values()
            if p.name not in ("self", "cls")
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def problems(name, obj):
    """What is missing from `obj`'s documentation, one string each."""
    out = []
    doc = inspect.cleandoc(obj.__doc__) if obj.__doc__ else ""
    if not doc:
        out.append(f"{name}: no docstring")
    else:
        if not EXAMPLE.search(doc):
            out.append(f"{name}: no Example: section")
        if _params(obj) and not ARGS.search(doc):
            out.append(f"{name}: takes arguments but has no Args: section")
    if not isinstance(obj, type):
        return out
    for attr, value in vars(obj).items():
        if attr.startswith("_") or any(hasattr(b, attr) for b in KERAS_BASES):
            continue
        if isinstance(value, property):
            if not (value.fget and value.fget.__doc__):
                out.append(f"{name}.{attr}: property without a docstring")
            continue
        fn = getattr(value, "__func__", value)
        if not inspect.isfunction(fn):
            continue
        mdoc = inspect.cleandoc(fn.__doc__) if fn.__doc__ else ""
        if not mdoc:
            out.append(f"{name}.{attr}(): no docstring")
        elif _params(fn) and not ARGS.search(mdoc):
            out.append(f"{name}.{attr}(): takes arguments but has no Args:")
    return out


def test_the_public_api_is_what_the_reference_documents():
    api = public_api()
    # The reference covers the modules the README promises.
    for must in ("tnet.Model", "tnet.SparseTable",
                 "tnet.layers.EmbeddingFeatures",
                 "tnet.feature_column.embedding_column",
                 "tnet.optimizer.Adagrad", "tnet.saving.save",
                 "tnet.serving.export_for_serving", "tnet.callbacks.Checkpoint",
                 "tnet.serving.follow.Follower", "tnet.data.spec.load",
                 "tnet.models.WideDeep", "tnet.monitoring.TrainerMetrics"):
        assert must in api, must
    # Every module listed has an API page.
    documented = set(api_pages())
    for module in MODULES:
        assert any(t == module or t.startswith(module + ".")
                   or module.startswith(t + ".") for t in documented), (
            f"{module} has no page under docs/api/")


@pytest.mark.parametrize("name", sorted(public_api()))
def test_public_name_is_documented(name):
    missing = problems(name, public_api()[name])
    assert not missing, "\n".join(missing)
