"""The overlay of an updatable export and its signatures.

`export_for_serving(model, dir, updatable=True)` writes the base (as any
export) plus, per table, an overlay (`ServingTable.with_overlay`): a stock
`tf.lookup.experimental.MutableHashTable` from the table's int64 key to
`[state, row...]` (state 1: a row published since the base, 2: a key freed
since, which reads the zero row), a `serving_version` variable, and three
more signatures, all callable through TF Serving's Predict:

* `apply_delta(version, update_key, <table>_keys, <table>_rows,
  <table>_deleted, ..., dense_0, dense_1, ...) -> {"applied"}`: refuses
  (InvalidArgument, nothing changed) unless `update_key` is the export's
  (tnet.serving.update_key: the export holds only its salted SHA-256) and
  version == serving_version + 1; inserts each table's freed keys and rows
  into its overlay, assigns every dense variable, then sets
  serving_version.
* `apply_rows(version, update_key, <table>_keys/_rows/_deleted ...)`: the
  rows of a delta too big for one request (same key and version checks;
  the version is set by the final `apply_delta`).
* `serving_version() -> {"version", "base_id"}`.

`serving_default` reads the overlay first, then the base. The deltas these
signatures apply are files (tnet.serving.deltas), written by the publisher
(tnet.serving.publish) and sent by the follower (tnet.serving.follow).

What a request sees while a delta is applied: each table's rows arrive in
one `LookupTableInsertV2` (the hash table takes its lock for the whole
insert and a lookup takes it for the whole find), so a request sees all of
a table's rows of that request or none of them, never half a row; a dense
variable is assigned whole (`AssignVariableOp`). Between tables and
variables there is no common lock: a request that runs during
`apply_delta` may see table A's new rows with table B's old ones, or new
embeddings with the previous dense weights, for the microseconds the apply
takes. A delta sent in several `apply_rows` chunks is visible chunk by
chunk; `serving_version` moves only once all of it is in.
"""
from __future__ import annotations

import uuid
from typing import Any, Dict, List

import tensorflow as tf

from tnet.serving import update_key
from tnet.serving.deltas import APPLY_DELTA, APPLY_ROWS, SERVING_VERSION


def updatable_signatures(module, serving, dense, model, key_record):
    """The extra signatures of an updatable export and its info entry.

    `key_record` ({"salt", "sha256"}, `update_key.entry`): the digest of the
    update key that `apply_delta` and `apply_rows` require; the key itself
    is never in the export."""
    base_id = uuid.uuid4().hex
    module.serving_version = tf.Variable(tf.constant(0, tf.int64),
                                         trainable=False,
                                         name="serving_version")
    names = {n: serving[n].name for n in sorted(serving)}
    table_specs = {}
    for n, p in names.items():
        dim = serving[n].dim
        table_specs[f"{p}_keys"] = tf.TensorSpec([None], tf.int64)
        table_specs[f"{p}_rows"] = tf.TensorSpec([None, dim], tf.float32)
        table_specs[f"{p}_deleted"] = tf.TensorSpec([None], tf.int64)
    dense_specs = {f"dense_{i}": tf.TensorSpec(v.shape, v.dtype)
                   for i, v in enumerate(dense)}
    version_spec = {"version": tf.TensorSpec([], tf.int64),
                    update_key.KEY_INPUT: tf.TensorSpec([], tf.string)}

    def _named(specs):
        return {k: tf.TensorSpec(s.shape, s.dtype, name=k)
                for k, s in specs.items()}

    if key_record is None:
        # The format before update keys (no key input, no check): only
        # reproduced by tests of old exports.
        del version_spec[update_key.KEY_INPUT]

    def checks(inputs, signature):
        """The key check, then the version check: every mutation depends
        on both, so a refused request changes nothing."""
        key = tf.no_op() if key_record is None else update_key.refuse_unless(
            update_key.key_ok(key_record, inputs[update_key.KEY_INPUT]),
            signature)
        with tf.control_dependencies([key]):
            version = tf.debugging.assert_equal(
                inputs["version"], module.serving_version + 1,
                message=f"{signature}: refused, the delta's version is not "
                        "serving_version + 1 (applied twice, out of order, "
                        "or a gap)")
        return [key, version]

    def insert_rows(inputs, signature):
        ops = []
        with tf.control_dependencies(checks(inputs, signature)):
            for n, p in names.items():
                ops.append(serving[n].apply(inputs[f"{p}_keys"],
                                            inputs[f"{p}_rows"],
                                            inputs[f"{p}_deleted"]))
        return ops

    def apply_rows(inputs):
        ops = insert_rows(inputs, APPLY_ROWS)
        with tf.control_dependencies(ops):
            return {"applied": tf.identity(inputs["version"])}

    def apply_delta(inputs):
        ops = insert_rows(inputs, APPLY_DELTA)
        with tf.control_dependencies(ops):
            assigns = [v.assign(inputs[f"dense_{i}"])
                       for i, v in enumerate(dense)]
        with tf.control_dependencies(assigns):
            done = module.serving_version.assign(inputs["version"])
        with tf.control_dependencies([done]):
            return {"applied": tf.identity(inputs["version"])}

    def version():
        return {"version": tf.identity(module.serving_version),
                "base_id": tf.constant(base_id)}

    sigs = {
        APPLY_DELTA: tf.function(apply_delta, input_signature=[_named(
            {**version_spec, **table_specs, **dense_specs})],
            autograph=False).get_concrete_function(),
        APPLY_ROWS: tf.function(apply_rows, input_signature=[_named(
            {**version_spec, **table_specs})],
            autograph=False).get_concrete_function(),
        SERVING_VERSION: tf.function(
            version, input_signature=[],
            autograph=False).get_concrete_function(),
    }
    info = {
        "base_id": base_id,
        "through_step": model_step(model) - 1,
        "tables": {n: {"prefix": p, "dim": serving[n].dim}
                   for n, p in names.items()},
        "dense": dense_entries(model, dense),
        "signatures": [APPLY_DELTA, APPLY_ROWS, SERVING_VERSION],
        # Salt and digest only (update_key): the follower picks its key
        # for this base by it.
        **({} if key_record is None else {"update_key": dict(key_record)}),
    }
    return sigs, info


def model_step(model) -> int:
    opt = getattr(model, "optimizer", None)
    it = getattr(opt, "iterations", None)
    return int(it.numpy()) if it is not None else 0


def dense_entries(model, dense) -> List[Dict[str, Any]]:
    """Per dense variable of the export: its position in model.variables
    (stable for the same model code in another process, where names may
    carry other suffixes), name, shape and dtype."""
    index = {}
    names: Dict[str, list] = {}
    for i, v in enumerate(model.variables):
        # Under ParameterServerStrategy model.variables holds wrappers
        # (AggregatingVariable: `_v`) of what the traced graph captured.
        for inner in (v, getattr(v, "_v", None), getattr(v, "_variable",
                                                         None)):
            if inner is not None:
                index[id(inner)] = i
        names.setdefault(v.name, []).append(i)
    out = []
    for v in dense:
        if id(v) not in index and len(names.get(v.name, [])) == 1:
            index[id(v)] = names[v.name][0]
        if id(v) not in index:
            raise ValueError(
                f"updatable export: the serving graph reads variable "
                f"{v.name!r}, which is not in model.variables; only the "
                "model's own variables can ship with each delta")
        out.append({"index": index[id(v)], "name": v.name,
                    "shape": v.shape.as_list(), "dtype": v.dtype.name})
    return out


def model_dense(model, entries) -> List[tf.Variable]:
    """The model's variables an export's dense list names, in order."""
    variables = model.variables
    out = []
    for e in entries:
        v = variables[e["index"]] if e["index"] < len(variables) else None
        if v is None or v.shape.as_list() != e["shape"] or \
                v.dtype.name != e["dtype"]:
            raise ValueError(
                f"publish_delta: the model's variable #{e['index']} is "
                f"{None if v is None else (v.name, v.shape.as_list())}, but "
                f"the export serves {e['name']} {e['shape']}: this is not "
                "the model the export was written from")
        out.append(v)
    return out
