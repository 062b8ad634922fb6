"""Fuzzes every registered tnet op in this process (run by
tests/test_fuzz_ops.py, one process per batch, so a crash or hang is caught).

    fuzz_ops.py --cases 500 --seed 3 --log cases.jsonl --summary out.json
    fuzz_ops.py --replay '<one line of the log>'

Each case is written to --log (flushed) before it runs. An op may succeed or
reject its input; the accepted rejections are ALLOWED below. Anything else
(another TF error class, a message that says nothing, wrong output shapes,
a rejected op that changed its table) fails the run; a crash or hang kills
it, and the log's last line reproduces it.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from tensorflow.python.framework import op_def_registry  # noqa: E402

import fuzz_cases as fc  # noqa: E402
import tnet  # noqa: E402, F401
from tnet import _ops  # noqa: E402

# What a rejection may be. tnet's kernels reject bad input with
# InvalidArgument and out-of-memory with ResourceExhausted; TF itself rejects
# a wrong dtype with InvalidArgument (eager) or TypeError/ValueError while
# converting arguments (Python side, before any kernel runs). Internal,
# Unknown, Aborted... or a crash mean a bug.
ALLOWED = {
    tf.errors.InvalidArgumentError: "invalid_argument",
    tf.errors.ResourceExhaustedError: "resource_exhausted",
    TypeError: "python_rejected",
    ValueError: "python_rejected",
}
MIN_MESSAGE = 20  # characters: enough to name the input and the problem


class BadOutcome(AssertionError):
    """An op did something the fuzzer does not accept."""


def tnet_ops() -> list[str]:
    """Every op the library registers (from its Python wrappers)."""
    names = [n for n in dir(_ops.ops)
             if n[:1].isupper() and hasattr(_ops.ops, snake(n) + "_eager_fallback")]
    return sorted(n for n in names if op_def_registry.get(n) is not None)


def snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class Pool:
    """The handles cases refer to by name, and export cursors seen so far."""

    def __init__(self):
        self.handles, self.dims = {}, {}
        for name, (dim, opt, stripes) in fc.POOL.items():
            self.handles[name] = _ops.sparse_table_handle(
                shared_name=f"fuzz_{name}", dim=dim, optimizer=opt,
                num_stripes=stripes)
            self.dims[name] = dim
        dead = _ops.sparse_table_handle(shared_name="fuzz_dead", dim=4,
                                        optimizer="sgd")
        tf.raw_ops.DestroyResourceOp(resource=dead)
        self.handles["destroyed"] = dead
        self._var = tf.Variable(1.0)
        self.handles["variable"] = self._var.handle
        self._ht = tf.lookup.experimental.MutableHashTable(tf.int64, tf.float32,
                                                           0.0)
        self.handles["hashtable"] = self._ht.resource_handle
        self.cursors = collections.defaultdict(int)

    def size(self, name: str | None) -> int | None:
        if name not in self.dims:
            return None
        return int(_ops.sparse_table_size(self.handles[name]))

    def clear(self) -> None:
        """Frees every pool row (bounds memory over a long run)."""
        for name in self.dims:
            _ops.sparse_table_evict(self.handles[name], 0.0, 1.0, 0, 0)


EXPORT_OPS = ("SparseTableExport", "SparseTableExportSince")


def _tensor(spec: dict, case: dict, pool: Pool, arg: str) -> tf.Tensor:
    if (case["op"] in EXPORT_OPS and arg == "cursor"
            and spec["value"] == "last"):
        spec = dict(spec, value=pool.cursors[case["handle"]])
    value = fc.materialize(spec)
    if spec["dtype"] == "string":
        # Flat, then reshaped: `tolist()` of a zero-element array such as
        # [100000, 4096, 0] builds 409M empty Python lists (24 GB).
        flat = tf.constant(value.reshape(-1).tolist(), tf.string,
                           shape=[value.size])
        return tf.reshape(flat, value.shape)
    return tf.constant(value)


def run_case(case: dict, pool: Pool) -> str:
    """Runs one case; returns its outcome or raises BadOutcome."""
    op = case["op"]
    fn = getattr(_ops.ops, snake(op))
    h = case.get("handle")
    before = pool.size(h)
    try:
        kwargs = {k: ([_tensor(x, case, pool, k) for x in v]
                      if isinstance(v, list) else _tensor(v, case, pool, k))
                  for k, v in case["args"].items()}
        if h is not None:
            kwargs["table"] = pool.handles[h]
        attrs = case["attrs"]
        if case.get("graph"):
            out = _run_in_graph(fn, kwargs, attrs, case["graph"])
        else:
            out = fn(**kwargs, **attrs)
    except tuple(ALLOWED) as e:
        kind = ALLOWED[type(e)] if type(e) in ALLOWED else next(
            v for k, v in ALLOWED.items() if isinstance(e, k))
        msg = getattr(e, "message", None) or str(e)
        if len(msg.strip()) < MIN_MESSAGE:
            raise BadOutcome(f"{op}: {type(e).__name__} with a useless "
                             f"message {msg!r}") from e
        if kind == "resource_exhausted" and not re.search(
                r"memory|OOM", msg, re.I):
            raise BadOutcome(f"{op}: ResourceExhausted not about memory: "
                             f"{msg}") from e
        after = pool.size(h)
        if kind == "invalid_argument" and before != after:
            raise BadOutcome(f"{op} was rejected but changed the table's size "
                             f"{before} -> {after}: {msg}") from e
        return kind
    except tf.errors.OpError as e:
        raise BadOutcome(f"{op}: disallowed {type(e).__name__}: "
                         f"{e.message}") from e
    _check_success(case, out, pool)
    return "ok"


GRAPH_MODES = (True, "unknown_dims", "unknown_rank")


def _run_in_graph(fn, kwargs: dict, attrs: dict, mode):
    """Runs the op inside a tf.function, so its shape function runs first.

    mode True traces with the arguments' own shapes; "unknown_dims" with
    every dimension unknown (rank kept) and "unknown_rank" with no shape at
    all, so the shape function sees what a graph built from placeholders or
    a Keras symbolic input gives it. The table handle is captured.
    """
    table = kwargs.pop("table", None)
    extra = {} if table is None else {"table": table}
    names = list(kwargs)
    values = list(kwargs.values())  # a list input is a list of tensors
    flat = tf.nest.flatten(values)
    if mode is True:
        signature = None
    elif mode == "unknown_dims":
        signature = [tf.TensorSpec([None] * t.shape.rank, t.dtype)
                     for t in flat]
    elif mode == "unknown_rank":
        signature = [tf.TensorSpec(None, t.dtype) for t in flat]
    else:
        raise ValueError(f"unknown graph mode {mode!r}")

    @tf.function(autograph=False, input_signature=signature)
    def graph_fn(*ts):
        packed = tf.nest.pack_sequence_as(values, list(ts))
        return fn(**dict(zip(names, packed)), **extra, **attrs)
    return graph_fn(*flat)


def _check_success(case: dict, out, pool: Pool) -> None:
    """Outputs of a successful call have the shapes the op promises."""
    op, h, args = case["op"], case.get("handle"), case["args"]
    if op == "SparseTableHandle":
        if case.get("then_pull") and case["attrs"]["dim"] <= 64:
            rows = _ops.sparse_table_pull(out, tf.constant([1, -7, 2**62]),
                                          True, dim=case["attrs"]["dim"])
            if rows.shape != (3, case["attrs"]["dim"]):
                raise BadOutcome(f"pull from a new table: shape {rows.shape}")
        tf.raw_ops.DestroyResourceOp(resource=out, ignore_lookup_error=True)
    elif op in ("SparseTablePull", "SparseTablePullV2"):
        n = int(np.prod(args["keys"]["shape"]))
        if tuple(out.shape) != (n, pool.dims[h]):
            raise BadOutcome(f"pull output {out.shape}, want {(n, pool.dims[h])}")
    elif op in EXPORT_OPS:
        keys, w, s, meta, nxt = (x.numpy() for x in out)
        n = len(keys)
        only = bool(case["attrs"].get("weights_only"))
        if (w.shape != (n, pool.dims[h]) or len(s) != n
                or meta.shape != (n, 0 if only else 3)
                or (only and s.shape != (n, 0))):
            raise BadOutcome(f"export shapes {w.shape} {s.shape} {meta.shape}")
        if len(set(keys.tolist())) != n:
            raise BadOutcome("export returned a key twice")
        if not (nxt == -1 or nxt >= 0):
            raise BadOutcome(f"export next_cursor {nxt}")
        if op == "SparseTableExportSince" and not only:
            since = int(fc.materialize(args["since_step"]))
            if n and not (meta[:, 2] > since).all():
                raise BadOutcome(f"export since {since} returned a row with "
                                 f"last_step {meta[:, 2].min()}")
        pool.cursors[h] = int(nxt)
    elif op == "SparseTableMarkChanges":
        v = out.numpy()
        enable = bool(fc.materialize(args["enable"]))
        if v.shape != (2,) or v[0] < 0 or v[1] < -1 or (v[1] == -1) == enable:
            raise BadOutcome(f"mark_changes(enable={enable}) returned {v}")
    elif op == "SparseTableChanges":
        info, deleted = (x.numpy() for x in out)
        if info.shape != (4,) or deleted.ndim != 1 or info[0] < 0 or (
                info[1] < -1) or info[2] < 0 or info[3] < 0:
            raise BadOutcome(f"changes returned info {info}, deleted "
                             f"{deleted.shape}")
    elif op == "TnetSumRows" and not case.get("generic"):
        v = fc.materialize(args["values"]).astype(np.float32)
        idx = fc.materialize(args["indices"])
        rows = int(fc.materialize(args["num_rows"]))
        if tuple(out.shape) != (rows, v.shape[1]):
            raise BadOutcome(f"sum_rows output {out.shape}, want "
                             f"{(rows, v.shape[1])}")
        if rows > 10**6:  # e.g. [2^62, 0]: the shape check only
            return
        want = np.zeros((rows, v.shape[1]), np.float32)
        np.add.at(want, idx, v)
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-5)
    elif op == "TnetFlattenKeys":
        _check_flatten_keys(case, [x.numpy() for x in out])
    elif op in ("SparseTableSize", "SparseTableMemoryBytes"):
        if int(out) < 0:
            raise BadOutcome(f"{op} returned {int(out)}")


def _check_flatten_keys(case: dict, out: list) -> None:
    """The op's keys, mask and segments against numpy on the same ids."""
    args, attrs = case["args"], case["attrs"]
    cols = ([fc.materialize(s).reshape(-1) for s in args["block"]],
            [fc.materialize(s) for s in args["values"]],
            [fc.materialize(s) for s in args["splits"]])
    salts = attrs["salts"] or [0] * len(attrs["slots"])
    width = attrs["num_slots"]
    ids, rows, col = [], [], []
    if cols[0]:
        block = np.stack(cols[0], 1)
        ids.append(block.reshape(-1))
        rows.append(np.repeat(np.arange(len(block)), block.shape[1]))
        col.append(np.tile(np.arange(block.shape[1]), len(block)))
    for j, (v, s) in enumerate(zip(cols[1], cols[2])):
        ids.append(v)
        rows.append(np.repeat(np.arange(len(s) - 1), np.diff(s)))
        col.append(np.full(len(v), len(cols[0]) + j))
    ids, rows, col = (np.concatenate(x).astype(np.int64) if x
                      else np.zeros(0, np.int64) for x in (ids, rows, col))
    keys = ids ^ np.array(salts, np.int64)[col]
    segments = rows * width + np.array(attrs["slots"], np.int64)[col]
    keep = ids != -1
    if attrs["compact"]:
        want = (keys[keep], np.zeros(0, bool), segments[keep])
    else:
        want = (keys, keep, np.zeros(0, np.int64))
    for name, got, w in zip(("keys", "valid", "segments"), out, want):
        if got.shape != w.shape or not np.array_equal(got, w):
            raise BadOutcome(f"TnetFlattenKeys {name}: {got[:8]} (shape "
                             f"{got.shape}), want {w[:8]} (shape {w.shape})")


def case_strategy(ops: list[str]) -> st.SearchStrategy:
    """Targeted cases for the ops fuzz_cases knows, generic ones for all."""
    choices = []
    for name in ops:
        if name in fc.TARGETED:
            choices += [fc.TARGETED[name]] * 3
        choices.append(fc.generic_case(op_registry_def(name)))
    # One case in four builds a graph (shape inference runs), half of those
    # with unknown dimensions or an unknown rank.
    graph = st.sampled_from([False] * 6 + [True, True, "unknown_dims",
                                            "unknown_rank"])
    return st.tuples(st.one_of(choices), graph).map(
        lambda cg: dict(cg[0], graph=cg[1]))


def _spec(dtype: str, shape: list, fill: str = "range", value=0) -> dict:
    return {"dtype": dtype, "shape": shape, "fill": fill, "value": value,
            "seed": 0}


def shape_sweep_cases() -> list[dict]:
    """Every op with a `dim` attr, every extreme `dim`, in every graph mode:
    each must be rejected (a Python error from shape inference or an
    InvalidArgument), never abort. Valid arguments, so the attr is what is
    wrong."""
    h, d = "sgd4", 4
    ops = {
        "SparseTableHandle": (None, {}, {"optimizer": "sgd"}),
        "SparseTablePull": (h, {"keys": _spec("int64", [3]),
                                "training": _spec("bool", [], "value", 1)}, {}),
        "SparseTablePush": (h, {
            "keys": _spec("int64", [2]), "grads": _spec("float32", [2, d]),
            "learning_rate": _spec("float32", [], "value", 0.1),
            "step": _spec("int64", [], "value", 1),
            "shows": _spec("float32", [0]), "clicks": _spec("float32", [0])},
            {}),
        "SparseTableExport": (h, {"cursor": _spec("int64", [], "value", 0),
                                  "max_rows": _spec("int64", [], "value", 8)},
                              {}),
        "SparseTableExportSince": (h, {
            "cursor": _spec("int64", [], "value", 0),
            "max_rows": _spec("int64", [], "value", 8),
            "since_step": _spec("int64", [], "value", -1)}, {}),
        "SparseTableImport": (h, {
            "keys": _spec("int64", [2]), "weights": _spec("float32", [2, d]),
            "slots": _spec("float32", [2, 0]), "meta": _spec("float64", [2, 3])},
            {}),
    }
    cases = []
    for op, (handle, args, attrs) in ops.items():
        for dim in (0, -1, -4, 65537, fc.I32_MAX, fc.I64_MAX, fc.I64_MIN):
            for mode in GRAPH_MODES:
                cases.append({"op": op, "handle": handle, "args": args,
                              "attrs": dict(attrs, dim=dim), "graph": mode})
    return cases


def op_registry_def(name: str):
    return op_def_registry.get(name)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--cases", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log", default=os.devnull)
    p.add_argument("--summary")
    p.add_argument("--replay", help="run one logged case and exit")
    p.add_argument("--replay-file", help="run every case of this JSON list "
                   "(logged to --log first); print their outcomes")
    p.add_argument("--shape-sweep", action="store_true",
                   help="run shape_sweep_cases(); print their outcomes")
    p.add_argument("--list-ops", action="store_true")
    p.add_argument("--ops", help="comma-separated: fuzz only these ops")
    p.add_argument("--crash-at", type=int, default=-1,
                   help="abort() at this case (tests the harness itself)")
    a = p.parse_args()
    ops = tnet_ops()
    if a.ops:
        unknown = sorted(set(a.ops.split(",")) - set(ops))
        if unknown:
            p.error(f"--ops: not a registered tnet op: {', '.join(unknown)} "
                    f"(known: {', '.join(ops)})")
        ops = a.ops.split(",")
    if a.list_ops:
        print(json.dumps({"ops": ops, "targeted": sorted(fc.TARGETED)}))
        return 0
    pool = Pool()
    if a.replay:
        print(run_case(json.loads(a.replay), pool))
        return 0
    if a.replay_file:
        log = open(a.log, "w", buffering=1)
        outcomes = []
        for case in json.loads(pathlib.Path(a.replay_file).read_text()):
            log.write(json.dumps(case) + "\n")
            outcomes.append(run_case(case, pool))
        print(json.dumps({"outcomes": outcomes}))
        return 0
    if a.shape_sweep:
        log = open(a.log, "w", buffering=1)
        outcomes = []
        for case in shape_sweep_cases():
            log.write(json.dumps(case) + "\n")
            outcomes.append([case["op"], case["attrs"]["dim"], case["graph"],
                             run_case(case, pool)])
        print(json.dumps({"outcomes": outcomes}))
        return 0
    counts = collections.defaultdict(collections.Counter)
    log = open(a.log, "w", buffering=1)

    @seed(a.seed)
    @settings(max_examples=a.cases, database=None, deadline=None,
              derandomize=False, phases=[Phase.generate, Phase.shrink],
              suppress_health_check=list(HealthCheck))
    @given(case_strategy(ops))
    def fuzz(case):
        n = sum(sum(c.values()) for c in counts.values())
        log.write(json.dumps(case) + "\n")
        if n == a.crash_at:
            os.abort()
        if n and n % 250 == 0:
            pool.clear()
        counts[case["op"]][run_case(case, pool)] += 1

    fuzz()
    total = sum(sum(c.values()) for c in counts.values())
    summary = {"cases": total, "seed": a.seed,
               "by_op": {k: dict(v) for k, v in sorted(counts.items())}}
    if a.summary:
        pathlib.Path(a.summary).write_text(json.dumps(summary))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
