"""The serving signature of an export: given, or inferred the way Keras'
model.save infers it, and how its plain tensors become the model's inputs
(sparse / ragged ids are served padded; see tnet.serving.export)."""
from __future__ import annotations

from typing import Mapping

import tensorflow as tf


def input_signature(model, signature) -> "Signature":
    """The serving inputs: the caller's, else what Keras' `model.save` would
    infer (the inputs of the model's first call or fit), else, for a
    `tn.models.CTRModel`, one `[None]` tensor per feature it names."""
    if signature is None:
        return _inferred_signature(model)
    if not isinstance(signature, Mapping) or not signature:
        raise TypeError("input_signature must be a non-empty dict of feature "
                        f"name -> tf.TensorSpec, got {signature!r}")
    specs = {}
    for name, spec in signature.items():
        if not isinstance(spec, tf.TensorSpec):
            raise TypeError(
                f"input_signature[{name!r}] must be a tf.TensorSpec, got "
                f"{spec!r}; sparse and ragged ids are served as a dense "
                "[None, None] tensor padded with the column's padding (-1, "
                "or \"\" for strings, unless category_column(padding=) "
                "says otherwise)")
        specs[name] = spec
    return Signature(specs, {}, None)


class Signature:
    """What serving_default takes and how it becomes the model's input.

    specs: {name: TensorSpec} of the signature. A feature the model read
    as a `tf.SparseTensor` or `tf.RaggedTensor` is served as a dense
    `[None, None]` tensor padded with the column's padding (default -1 /
    ""; what a TF Serving client can send: a signature input is a plain
    tensor) and rebuilt in the graph with stock ops (`converters`). structure: None (the model takes the
    dict) or the list of names a functional model takes positionally.
    """

    def __init__(self, specs, converters, structure):
        # The spec's name becomes the signature's input name.
        self.specs = {n: tf.TensorSpec(s.shape, s.dtype, name=n)
                      for n, s in specs.items()}
        self.converters = converters
        self.structure = structure

    def model_inputs(self, features):
        features = {n: self.converters.get(n, _identity)(t)
                    for n, t in features.items()}
        if self.structure is None:
            return features
        inputs = [features[n] for n in self.structure]
        return inputs[0] if len(inputs) == 1 else inputs


def _identity(t):
    return t


def _inferred_signature(model) -> Signature:
    spec = None
    get_spec = getattr(model, "_get_save_spec", None)
    if get_spec is not None:
        spec = get_spec(dynamic_batch=True, inputs_only=True)
    if spec is None:
        return _ctr_model_signature(model)
    structure = None
    if not isinstance(spec, Mapping):
        names = list(getattr(model, "input_names", None) or [])
        flat = tf.nest.flatten(spec, expand_composites=False)
        if len(names) != len(flat):
            raise ValueError(
                f"export_for_serving cannot name the inputs of "
                f"{type(model).__name__} (it takes {len(flat)} unnamed "
                "tensors); pass input_signature={name: tf.TensorSpec(...)} "
                "or give the model a dict of named inputs")
        structure, spec = names, dict(zip(names, flat))
    specs, converters = {}, {}
    for name, s in spec.items():
        if isinstance(s, (tf.SparseTensorSpec, tf.RaggedTensorSpec)):
            if s.shape.rank != 2:
                raise ValueError(
                    f"export_for_serving: feature {name!r} is a {s}; only "
                    "[batch, ids] sparse / ragged features can be served. "
                    "Pass input_signature to choose the serving input.")
            specs[name] = tf.TensorSpec([None, None], s.dtype)
            converters[name] = _PaddedTo(
                "sparse" if isinstance(s, tf.SparseTensorSpec) else "ragged",
                _paddings(model).get(name))
        elif isinstance(s, tf.TensorSpec):
            specs[name] = s
        else:
            raise ValueError(
                f"export_for_serving: cannot serve feature {name!r} of type "
                f"{type(s).__name__}; pass input_signature")
    return Signature(specs, converters, structure)


def _paddings(model) -> dict:
    """{feature: padding value} of the id columns of the model's tnet
    layers."""
    layers = getattr(model, "tnet_layers", None)
    return {c.categorical_column.key: c.categorical_column.padding
            for layer in (layers() if layers else [])
            for c in layer.columns}


class _PaddedTo:
    """Padded dense ids [B, L] -> the SparseTensor or RaggedTensor the model
    was trained on, with stock ops only. The padding is the column's
    (`category_column(padding=)`, default -1 / "")."""

    def __init__(self, kind: str, padding=None):
        self.kind = kind
        self.padding = padding

    def __call__(self, ids):
        pad = self.padding
        if pad is None:
            pad = "" if ids.dtype == tf.string else -1
        pad = tf.constant(pad, ids.dtype)
        ragged = tf.ragged.boolean_mask(ids, tf.not_equal(ids, pad))
        # Sparse: values left-aligned per row, as tf.Example VarLen parsing
        # gives them.
        return ragged if self.kind == "ragged" else ragged.to_sparse()


def _ctr_model_signature(model) -> Signature:
    categorical = getattr(model, "categorical", None)
    columns = getattr(model, "category_columns", None)
    dense = getattr(model, "dense_names", None)
    if categorical is None or columns is None or dense is None:
        raise ValueError(
            f"export_for_serving cannot infer the input features of "
            f"{type(model).__name__}: it has not been called or fit yet. Fit "
            "or call it once on a batch (as Keras' model.save needs), or "
            "pass input_signature={name: tf.TensorSpec([None], dtype), ...} "
            "with one entry per feature the model reads")
    specs = {c.key: tf.TensorSpec([None], c.dtype) for c in columns}
    specs.update({n: tf.TensorSpec([None], tf.float32) for n in dense})
    return Signature(specs, {}, None)
