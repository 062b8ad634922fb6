"""Which op types a serving graph may hold: exactly those a Python process
that never imports tnet registers (`stock_op_types`); and the device
clean-up that lets an export trained under ParameterServerStrategy load
anywhere."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Dict, Optional

import tensorflow as tf


def _nodes_of(graph_def):
    """(where, NodeDef) for a GraphDef's nodes and its function bodies."""
    nodes = [("graph", n) for n in graph_def.node]
    for fn in graph_def.library.function:
        nodes += [(fn.signature.name, n) for n in fn.node_def]
    return nodes


def _saved_graph_nodes(path: str):
    """The SavedModel proto of `path` and (where, NodeDef) for all its nodes."""
    from tensorflow.core.protobuf import saved_model_pb2
    proto = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        proto.ParseFromString(f.read())
    nodes = []
    for meta in proto.meta_graphs:
        nodes += _nodes_of(meta.graph_def)
    return proto, nodes


def ops_of(graph_def) -> Dict[str, list]:
    functions = {f.signature.name for f in graph_def.library.function}
    return _foreign_ops(_nodes_of(graph_def), functions)


_STOCK_OPS_SCRIPT = r"""
import json
from tensorflow.core.framework import op_def_pb2
from tensorflow.python.client import pywrap_tf_session as c_api
ops = op_def_pb2.OpList()
ops.ParseFromString(c_api.TF_GetBuffer(c_api.TF_GetAllOpList()))
print(json.dumps(sorted(o.name for o in ops.op)))
"""
_STOCK_OPS: Optional[frozenset] = None


def stock_op_types() -> frozenset:
    """Op types registered in a Python process that imports TensorFlow and
    never imports tnet (computed once per process, in a subprocess).

    This, not a name pattern, decides what a serving graph may hold: a
    SavedModel op outside this set would not load in TF Serving or in a
    plain `tf.saved_model.load` (a name-prefix check once let `TnetSumRows`
    through).
    """
    global _STOCK_OPS
    if _STOCK_OPS is None:
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        env["TF_CPP_MIN_LOG_LEVEL"] = "3"
        done = subprocess.run([sys.executable, "-c", _STOCK_OPS_SCRIPT],
                              capture_output=True, text=True, env=env,
                              cwd=tempfile.gettempdir(), timeout=600)
        if done.returncode != 0:
            raise RuntimeError(
                "export_for_serving: could not list TensorFlow's stock ops "
                f"in a fresh process (exit {done.returncode}): "
                f"{done.stderr[-2000:]}")
        _STOCK_OPS = frozenset(json.loads(done.stdout.strip().splitlines()[-1]))
    return _STOCK_OPS


def _foreign_ops(nodes, functions) -> Dict[str, list]:
    """{op type: [where]} of ops that are neither stock nor functions."""
    stock = stock_op_types()
    found: Dict[str, list] = {}
    for where, node in nodes:
        if node.op not in stock and node.op not in functions:
            found.setdefault(node.op, []).append(where)
    return found


def tnet_ops_in(path: str) -> Dict[str, list]:
    """{op type: [graph or function names]} of the ops in a SavedModel that
    a process without tnet has not registered (tnet's custom ops or any
    other); every function body of saved_model.pb is scanned."""
    proto, nodes = _saved_graph_nodes(path)
    functions = {f.signature.name for m in proto.meta_graphs
                 for f in m.graph_def.library.function}
    return _foreign_ops(nodes, functions)


def raise_if_tnet_ops(found: Dict[str, list], what: str) -> None:
    if found:
        raise RuntimeError(
            f"export_for_serving: the {what} serving graph contains ops "
            f"{sorted(found)} that stock TensorFlow (a process without tnet) "
            "does not register, so it could not load in TF Serving. A lookup "
            "bypassed tnet.layers.lookup.fused_lookup (which honours the "
            "serving override), one of its tables is not in model.tables(), "
            "or the model calls a custom op of its own. Nothing was written "
            "to the export directory.")


def strip_cluster_devices(path: str) -> None:
    """Drops job/replica/task from every device string in saved_model.pb.

    A device such as "/job:ps/task:0/device:CPU:0" (an op traced next to a
    variable on a ps task) names a cluster that a serving process does not
    have; "/device:CPU:0" is valid anywhere.
    """
    proto, nodes = _saved_graph_nodes(path)
    changed = False
    for _, node in nodes:
        if node.device:
            local = _local_device(node.device)
            if local != node.device:
                node.device = local
                changed = True
    for obj in (o for m in proto.meta_graphs
                for o in m.object_graph_def.nodes):
        if obj.HasField("variable") and obj.variable.device:
            obj.variable.device = _local_device(obj.variable.device)
            changed = True
    if changed:
        with open(os.path.join(path, "saved_model.pb"), "wb") as f:
            f.write(proto.SerializeToString())


def _local_device(device: str) -> str:
    spec = tf.DeviceSpec.from_string(device)
    return spec.replace(job=None, replica=None, task=None).to_string()
