"""Hypothesis strategies for fuzzing tnet's ops, and how to run one case.

A case is plain JSON (op name, argument specs, attrs, eager or graph), so
the runner can log it before running it: when the op kills the process the
log's last line is the case that did it, and `fuzz_ops.py --replay` reruns
it. Tensors are specs (dtype, shape, fill, seed), not values, which keeps
the log small even for huge inputs and lets hypothesis shrink shapes.

Two kinds of case cover each op:
- targeted: arguments of the right dtypes and mostly the right ranks, with
  hostile values (NaN/inf, extreme ints, wrong lengths, other tables'
  handles, destroyed handles), so inputs get past the first check;
- generic: built from the op's registered OpDef only (any dtype, any rank,
  random attrs), so an op added later is fuzzed without new code.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

I64_MIN, I64_MAX = -(2**63), 2**63 - 1
I32_MIN, I32_MAX = -(2**31), 2**31 - 1

# Pool tables: name -> (dim, optimizer, num_stripes). The runner creates them
# once per process; "destroyed" is a table handle whose resource is gone,
# "variable" a handle to a tf.Variable (another resource type).
POOL = {
    "sgd4": (4, "sgd", 64),
    "adam1": (1, "adam", 1),
    "ftrl8": (8, "ftrl", 8),
    "adagrad3": (3, "adagrad", 2),
    "rowwise16": (16, "rowwise_adagrad", 64),
}
BAD_HANDLES = ["destroyed", "variable", "hashtable"]
HANDLES = list(POOL) + BAD_HANDLES

DTYPES = ["int64", "int32", "float32", "float64", "bool", "string"]
FLOAT_VALUES = [0.0, 1.0, -1.0, 0.5, 1e-45, -1e-38, 3.4e38, -3.4e38,
                float("nan"), float("inf"), float("-inf"), 2.0, 1e6]
INT_VALUES = [0, 1, -1, 2, 5, 64, 1000, 2**31, 2**40, 2**62, I64_MAX,
              I64_MIN, -(2**40), I32_MAX, I32_MIN]
FILLS = ["rand", "range", "value", "with_nan", "with_inf", "dups"]
# Dimension sizes: mostly small, sometimes 0, rarely large.
SIZES = [0, 1, 1, 2, 3, 4, 5, 8, 16, 17, 64, 300, 4096, 100_000]
MAX_ELEMENTS = 2_000_000

sizes = st.sampled_from(SIZES)


def mostly(good: st.SearchStrategy, bad: st.SearchStrategy,
           p_good: float = 0.8) -> st.SearchStrategy:
    """`good` with probability ~p_good, else `bad`: most cases must get past
    the first check to reach the code behind it."""
    cut = round(p_good * 10)
    return st.integers(0, 9).flatmap(lambda i: good if i < cut else bad)


def tensor(dtype: str | st.SearchStrategy = "float32",
           shape: list | st.SearchStrategy | None = None) -> st.SearchStrategy:
    """A tensor spec: {dtype, shape, fill, value, seed}."""
    dt = dtype if isinstance(dtype, st.SearchStrategy) else st.just(dtype)
    if shape is None:
        shape = st.lists(sizes, min_size=0, max_size=3)
    elif not isinstance(shape, st.SearchStrategy):
        shape = st.just(shape)
    return st.fixed_dictionaries({
        "dtype": dt, "shape": shape, "fill": st.sampled_from(FILLS),
        "value": st.one_of(st.sampled_from(FLOAT_VALUES),
                           st.sampled_from(INT_VALUES)),
        "seed": st.integers(0, 2**16)})


def scalar(dtype: str, good: list, bad: list = ()) -> st.SearchStrategy:
    """Mostly a proper scalar of a `good` value; else a `bad` value or a
    vector or matrix."""
    shape = mostly(st.just([]), st.sampled_from([[1], [2, 1], [0]]), 0.9)
    values = st.sampled_from(good)
    if bad:
        values = mostly(values, st.sampled_from(bad))
    return st.fixed_dictionaries({
        "dtype": st.just(dtype), "shape": shape, "fill": st.just("value"),
        "value": values, "seed": st.just(0)})


def materialize(spec: dict) -> np.ndarray:
    """The numpy array a spec describes (deterministic)."""
    dtype, fill, value = spec["dtype"], spec["fill"], spec["value"]
    shape = list(spec["shape"])
    while int(np.prod(shape, dtype=np.float64)) > MAX_ELEMENTS:
        shape[int(np.argmax(shape))] //= 16
    n = int(np.prod(shape, dtype=np.int64))
    rng = np.random.default_rng(spec["seed"])
    if dtype == "string":
        if fill == "list":  # the strings themselves
            return np.asarray(value, dtype=object).reshape(shape)
        return np.array([f"s{i}" for i in range(n)], dtype=object).reshape(shape)
    npt = np.dtype("bool" if dtype == "bool" else dtype)
    if fill == "value" or fill == "dups":
        if npt.kind == "f":
            v = float(value)
        elif npt.kind == "b":
            v = bool(value)
        else:
            info = np.iinfo(npt)
            v = int(value) if not isinstance(value, float) or np.isfinite(value) else 0
            v = min(max(v, info.min), info.max)
        return np.full(shape, v, npt)
    if fill == "list":  # the values themselves
        return np.asarray(value, npt).reshape(shape)
    if fill == "mod":  # ints in [0, value): valid indices
        return rng.integers(0, max(int(value), 1), n).astype(npt).reshape(shape)
    if fill == "sorted_mod":  # the same, sorted (segments in runs)
        return np.sort(rng.integers(0, max(int(value), 1), n)).astype(
            npt).reshape(shape)
    if fill == "range":
        return (np.arange(n) % 2 if npt.kind == "b" else np.arange(n)).astype(
            npt).reshape(shape)
    if npt.kind == "f":
        out = rng.normal(0, 1, n).astype(npt)
        if n and fill == "with_nan":
            out[rng.integers(n)] = np.nan
        if n and fill == "with_inf":
            out[rng.integers(n)] = -np.inf if rng.integers(2) else np.inf
    elif npt.kind == "b":
        out = rng.integers(0, 2, n).astype(bool)
    else:
        info = np.iinfo(npt)
        if rng.integers(2):
            out = rng.integers(info.min, info.max, n, dtype=npt, endpoint=True)
        else:
            out = rng.integers(-1000, 1000, n).astype(npt)
    return out.reshape(shape)


# ---------------------------------------------------------------- targeted
handle = mostly(st.sampled_from(list(POOL)), st.sampled_from(BAD_HANDLES))
dim_attr = st.sampled_from([1, 3, 4, 8, 16, 0, -1, -4, 2, 65536, I32_MAX,
                            I64_MAX, I64_MIN])
KEY_FILLS = ["rand", "range", "value", "dups"]


def tensor_of(dtype: Any, shape: st.SearchStrategy,
              fills: list) -> st.SearchStrategy:
    """tensor() restricted to some fills (e.g. finite floats)."""
    return tensor(dtype, shape).flatmap(
        lambda t: st.sampled_from(fills).map(lambda f: dict(t, fill=f)))


keys = mostly(
    tensor_of("int64", st.lists(sizes, min_size=1, max_size=1), KEY_FILLS),
    tensor(st.sampled_from(["int64", "int32"]),
           st.lists(sizes, min_size=0, max_size=2)))


def _rows(n: Any, cols: Any) -> st.SearchStrategy:
    return mostly(
        tensor_of("float32", st.just([n, cols]), ["rand", "range", "value"]),
        tensor("float32", st.lists(sizes, min_size=0, max_size=3)))


def _dim(h: str) -> st.SearchStrategy:
    return mostly(st.just(_pool_dim(h)), dim_attr, 0.9)


@st.composite
def pull_case(draw) -> dict:
    h = draw(handle)
    k = draw(keys)
    return {"op": "SparseTablePull", "handle": h,
            "args": {"keys": k, "training": draw(scalar("bool", [True, False]))},
            "attrs": {"dim": draw(_dim(h))}}


def _pool_dim(h: str) -> int:
    return POOL.get(h, (4,))[0]


def _pool_slots(h: str) -> int:
    dim, opt, _ = POOL.get(h, (4, "sgd", 1))
    return {"sgd": 0, "adagrad": dim, "rowwise_adagrad": 1, "adam": 2 * dim,
            "ftrl": 2 * dim}[opt]


@st.composite
def push_case(draw) -> dict:
    h = draw(handle)
    k = draw(keys)
    n = k["shape"][0] if k["shape"] else 1
    n = draw(mostly(st.just(n), sizes))
    counts = mostly(
        tensor_of("float32", st.sampled_from([[0], [n]]), ["rand", "value"]),
        tensor("float32", st.sampled_from([[n + 1], [], [1], [n, 1]])))
    return {"op": "SparseTablePush", "handle": h, "args": {
        "keys": k, "grads": draw(_rows(n, _pool_dim(h))),
        "learning_rate": draw(scalar("float32", [0.0, 0.1, 1.0, 1e-45, 2.0,
                                                 1e6, 3.4e38],
                                     [float("nan"), float("inf"), -1.0])),
        "step": draw(scalar("int64", [0, 1, 5, 2**40, I64_MAX], [-1, I64_MIN])),
        "shows": draw(counts), "clicks": draw(counts),
    }, "attrs": {"dim": draw(_dim(h))}}


# The V2 pull and push: the same inputs plus the batch's example count
# (0: unknown), which scales the accumulator start of the rows they insert.
BATCH_SIZES, BAD_BATCH_SIZES = [0, 1, 64, 4096, I64_MAX], [-1, I64_MIN]


def _v2_case(v1_case, op: str) -> st.SearchStrategy:
    """`v1_case`'s cases as `op`'s: the same inputs plus batch_size."""
    @st.composite
    def case(draw) -> dict:
        out = draw(v1_case)
        out["op"] = op
        out["args"]["batch_size"] = draw(scalar("int64", BATCH_SIZES,
                                                BAD_BATCH_SIZES))
        return out
    return case()


CURSORS = [0, -1, "last", "last", 1, 2**40, (63 << 40) | 5, 2**40 - 1]
BAD_CURSORS = [(64 << 40), I64_MAX, I64_MIN, -2]
MAX_ROWS = [0, 1, 7, 1000, I64_MAX, 2**40]
BAD_MAX_ROWS = [-1, I64_MIN]


@st.composite
def export_case(draw) -> dict:
    h = draw(handle)
    return {"op": "SparseTableExport", "handle": h, "args": {
        "cursor": draw(scalar("int64", CURSORS, BAD_CURSORS)),
        "max_rows": draw(scalar("int64", MAX_ROWS, BAD_MAX_ROWS)),
    }, "attrs": {"dim": draw(_dim(h)), "weights_only": draw(st.booleans())}}


@st.composite
def export_since_case(draw) -> dict:
    """SparseTableExportSince: export's cursor and max_rows plus since_step
    (-1: every row; below -1 is invalid)."""
    h = draw(handle)
    return {"op": "SparseTableExportSince", "handle": h, "args": {
        "cursor": draw(scalar("int64", CURSORS, BAD_CURSORS)),
        "max_rows": draw(scalar("int64", MAX_ROWS, BAD_MAX_ROWS)),
        "since_step": draw(scalar("int64", [-1, -1, 0, 1, 5, 2**40, I64_MAX],
                                  [-2, -(2**40), I64_MIN])),
    }, "attrs": {"dim": draw(_dim(h)), "weights_only": draw(st.booleans())}}


@st.composite
def mark_changes_case(draw) -> dict:
    return {"op": "SparseTableMarkChanges", "handle": draw(handle),
            "args": {"enable": draw(scalar("bool", [True, True, False]))},
            "attrs": {}}


@st.composite
def changes_case(draw) -> dict:
    return {"op": "SparseTableChanges", "handle": draw(handle), "args": {},
            "attrs": {}}


@st.composite
def export_pending_case(draw) -> dict:
    return {"op": "SparseTableExportPending", "handle": draw(handle),
            "args": {}, "attrs": {}}


@st.composite
def import_pending_case(draw) -> dict:
    """SparseTableImportPending: mostly equal lengths, finite non-negative
    counts and ages in [0, 2^32); counters empty or [5]."""
    n = draw(sizes)
    length = mostly(st.just([n]), st.lists(sizes, min_size=0, max_size=2))
    keys = draw(tensor_of("int64", length, KEY_FILLS))
    # Counts are non-negative: whole numbers below 1000 when valid; normal
    # draws (mostly negative), single values and any tensor when not.
    counts = draw(mostly(_ints_strategy("float32", length, 1000),
                         st.one_of(tensor_of("float32", length,
                                             ["rand", "value"]),
                                   tensor("float32", length))))
    ages = draw(mostly(_ints_strategy("int64", length, 2**32),
                       tensor("int64", length)))
    counters = draw(mostly(
        st.sampled_from([[0], [5]]).flatmap(
            lambda shape: _ints_strategy("int64", st.just(shape), 1000)),
        tensor("int64", st.lists(sizes, min_size=0, max_size=2))))
    return {"op": "SparseTableImportPending", "handle": draw(handle),
            "args": {"keys": keys, "counts": counts, "ages": ages,
                     "counters": counters},
            "attrs": {"replace": draw(st.booleans())}}


def _ints_strategy(dtype: str, shape: st.SearchStrategy, below: int):
    """Tensors of valid non-negative ints below `below` (fill "mod")."""
    return shape.flatmap(lambda sh: st.integers(0, 2**16).map(
        lambda seed: {"dtype": dtype, "shape": sh, "fill": "mod",
                      "value": below, "seed": seed}))


@st.composite
def import_case(draw) -> dict:
    h = draw(handle)
    dim = _pool_dim(h)
    k = draw(keys)
    n = k["shape"][0] if k["shape"] else 1
    n = draw(mostly(st.just(n), sizes))
    slots = draw(mostly(st.just(_pool_slots(h)),
                        st.sampled_from([0, dim, 2 * dim, 1, 3])))
    meta = mostly(st.fixed_dictionaries({
        "dtype": st.just("float64"), "shape": st.just([n, 3]),
        "fill": st.sampled_from(["value", "value", "range"]),
        "value": mostly(st.sampled_from([0.0, 1.0, 2.0**52]),
                        st.sampled_from([2.0**53, -1.0, 0.5, float("nan"),
                                         float("inf")])),
        "seed": st.just(0)}),
        tensor("float64", st.lists(sizes, min_size=0, max_size=3)))
    return {"op": "SparseTableImport", "handle": h, "args": {
        "keys": k, "weights": draw(_rows(n, dim)),
        "slots": draw(_rows(n, slots)), "meta": draw(meta),
    }, "attrs": {"dim": draw(_dim(h))}}


@st.composite
def evict_case(draw) -> dict:
    return {"op": "SparseTableEvict", "handle": draw(handle), "args": {
        "show_decay_rate": draw(scalar("float32", [1.0, 0.99, 0.5, 0.0, 1e-45],
                                       FLOAT_VALUES)),
        "show_threshold": draw(scalar("float32", [0.0, 0.5, 1.0, -1.0, 3.4e38,
                                                  -3.4e38], FLOAT_VALUES)),
        "ttl_steps": draw(scalar("int64", [0, 1, 100, I64_MAX], INT_VALUES)),
        "current_step": draw(scalar("int64", [0, 5, 2**40, I64_MAX],
                                    INT_VALUES)),
    }, "attrs": {"compact": draw(st.booleans())}}


@st.composite
def info_case(draw) -> dict:
    """The ops whose only input is the handle: half the cases a bad one, so
    every such op is rejected in some case of a 2,000-case run."""
    op = draw(st.sampled_from(["SparseTableSize", "SparseTableMemoryBytes",
                               "SparseTableStats"]))
    h = draw(mostly(st.sampled_from(list(POOL)), st.sampled_from(BAD_HANDLES),
                    0.5))
    return {"op": op, "handle": h, "args": {}, "attrs": {}}


@st.composite
def rule_slots_case(draw) -> dict:
    """TnetSparseRuleSlots: mostly a rule name and a valid dim (the generic
    case got one right in ~1 of 8 draws, so with ~7 draws per run it
    sometimes never passed the checks)."""
    name = draw(mostly(st.sampled_from(["sgd", "adagrad", "rowwise_adagrad",
                                        "adam", "ftrl"]),
                       st.sampled_from(["", "zeros", "x" * 100, "Adagrad"])))
    return {"op": "TnetSparseRuleSlots", "handle": None, "args": {},
            "attrs": {"optimizer": name,
                      "dim": draw(mostly(st.sampled_from([1, 3, 4, 8, 16]),
                                         dim_attr))}}


@st.composite
def sum_rows_case(draw) -> dict:
    k = draw(sizes)
    d = draw(st.sampled_from([0, 1, 4, 16]))
    values = draw(mostly(
        tensor_of("float32", st.just([k, d]), ["rand", "range", "value"]),
        tensor(st.sampled_from(["float32", "float64"]),
               st.lists(sizes, min_size=0, max_size=3))))
    nr = draw(mostly(st.sampled_from([1, 5, 1000, 4096]),
                     st.sampled_from([0, -1, 2**45, 2**62, I64_MAX, I64_MIN])))
    idx = draw(mostly(
        st.fixed_dictionaries({
            "dtype": st.just("int32"), "shape": st.just([k]),
            "fill": st.just("rand"), "value": st.just(0),
            "seed": st.integers(0, 2**16)}).map(
                lambda t: dict(t, fill="mod", value=nr)),
        tensor(st.sampled_from(["int32", "int64"]),
               st.lists(sizes, min_size=0, max_size=2))))
    # num_rows avoids 1e8..2^44: a real (if silly) allocation the size of
    # this machine's memory; beyond it the allocator refuses.
    num_rows = draw(mostly(scalar("int64", [nr]),
                           scalar("int64", [0, 1, 5, -1, 2**45, I64_MIN])))
    return {"op": "TnetSumRows", "handle": None,
            "args": {"values": values, "indices": idx, "num_rows": num_rows},
            "attrs": {}}


def _ints(dtype: str, shape: list, below: int, seed) -> dict:
    """Valid indices in [0, below) (fill "mod")."""
    return {"dtype": dtype, "shape": shape, "fill": "mod", "value": below,
            "seed": seed}


@st.composite
def unique_case(draw) -> dict:
    n = draw(sizes)
    keys_spec = draw(mostly(
        tensor_of("int64", st.just([n]), KEY_FILLS),
        tensor(st.sampled_from(["int64", "int32"]),
               st.lists(sizes, min_size=0, max_size=2))))
    valid = draw(mostly(
        st.sampled_from([[0], [n]]).flatmap(
            lambda shape: tensor_of("bool", st.just(shape), ["rand", "range",
                                                             "value"])),
        tensor("bool", st.lists(sizes, min_size=0, max_size=2))))
    return {"op": "TnetUnique", "handle": None,
            "args": {"keys": keys_spec, "valid": valid}, "attrs": {}}


# Multi-valued CSV/TSV cells: ids, separators, blanks, signs, overflow, junk.
CELL_TEXT = st.text(alphabet="0123456789|,- +\t\nx", max_size=40) | \
    st.sampled_from(["9223372036854775807", "9223372036854775808",
                     "-9223372036854775808|1", "-9223372036854775809", "",
                     "|||", " 5 | 6", "1e3", "0x10", "--5", "-"])


@st.composite
def decode_id_lists_case(draw) -> dict:
    """TnetDecodeIdLists: cells as a vector (mostly), separators."""
    cells = draw(st.lists(CELL_TEXT, min_size=0, max_size=20))
    shape = draw(mostly(st.just([len(cells)]),
                        st.sampled_from([[], [1, len(cells)]]), 0.85))
    if shape == []:
        cells = cells[:1] or [""]
    text = {"dtype": "string", "shape": shape, "fill": "list",
            "value": cells, "seed": 0}
    sep = draw(mostly(st.sampled_from(["|", ","]),
                      st.sampled_from(["", "ab", "\n", "|"])))
    return {"op": "TnetDecodeIdLists", "handle": None,
            "args": {"text": text}, "attrs": {"separator": sep}}


LINE_TEXT = st.text(alphabet="0123456789|,-.eE+ \t\r\nx\u00e9", max_size=60) | \
    st.sampled_from(["1\t2.5\t7\t1|2", "0\t\t\t", "\t\t\t", "", "\xff\t1\t2\t3",
                     "1\t1e999\t9223372036854775807\t1||2", "1\t.\t-\t|"])


@st.composite
def decode_rows_case(draw) -> dict:
    """TnetDecodeRows: mostly a consistent column layout over random lines."""
    lines = draw(st.lists(LINE_TEXT, min_size=0, max_size=20))
    shape = draw(mostly(st.just([len(lines)]),
                        st.sampled_from([[], [1, len(lines)]]), 0.85))
    if shape == []:
        lines = lines[:1] or [""]
    kinds = draw(mostly(st.lists(st.integers(0, 9), min_size=1, max_size=6),
                        st.lists(st.sampled_from([-1, 10, 2**40]), max_size=3)))
    seps = draw(mostly(st.just(["|"] * len(kinds)),
                       st.lists(st.sampled_from(["", "|", "\t", "ab", "\n"]),
                                max_size=6)))
    pads = draw(mostly(st.just([0] * len(kinds)),
                       st.lists(st.sampled_from(INT_VALUES), max_size=6)))
    counts = [sum(k in (1, 2, 3, 4, 5, 6) for k in kinds), kinds.count(7),
              kinds.count(8), kinds.count(9)]
    counts = draw(mostly(st.just(counts), st.lists(st.integers(0, 3), min_size=4,
                                                   max_size=4)))
    delim = draw(mostly(st.just("\t"), st.sampled_from([",", "", "\n", "ab", "|"])))
    text = {"dtype": "string", "shape": shape, "fill": "list", "value": lines,
            "seed": 0}
    return {"op": "TnetDecodeRows", "handle": None, "args": {"lines": text},
            "attrs": {"delimiter": delim, "kinds": kinds, "separators": seps,
                      "pads": pads, "num_floats": counts[0], "num_ints": counts[1],
                      "num_strings": counts[2], "num_lists": counts[3]}}


@st.composite
def split_lines_case(draw) -> dict:
    """TnetSplitLines: scalar carry and block (mostly), any text."""
    def scalar(draw_text):
        shape = draw(mostly(st.just([]), st.sampled_from([[1], [2], [0]]), 0.9))
        n = int(np.prod(shape)) if shape else 1
        return {"dtype": "string", "shape": shape, "fill": "list",
                "value": [draw_text] * n, "seed": 0}
    carry = scalar(draw(LINE_TEXT))
    block = scalar(draw(LINE_TEXT))
    last = {"dtype": "bool", "shape": draw(mostly(st.just([]), st.just([2]))),
            "fill": "rand", "value": 0, "seed": draw(st.integers(0, 9))}
    return {"op": "TnetSplitLines", "handle": None,
            "args": {"carry": carry, "block": block, "last": last}, "attrs": {}}


@st.composite
def embed_combine_case(draw) -> dict:
    """TnetEmbedCombine(Grad): mostly a consistent layout."""
    grad = draw(st.booleans())
    u = draw(st.sampled_from([1, 5, 300]))
    d = draw(st.sampled_from([0, 1, 4, 16]))
    widths = draw(st.lists(st.sampled_from([0, 1, 2, 50]), min_size=1,
                           max_size=4))
    b = draw(sizes)
    w, c = sum(widths), len(widths)
    seed = draw(st.integers(0, 2**16))
    idx = draw(mostly(st.just(_ints("int32", [b, w], u, seed)),
                      tensor(st.sampled_from(["int32", "int64"]),
                             st.lists(sizes, min_size=0, max_size=3))))
    widths_spec = draw(mostly(
        st.just({"dtype": "int32", "shape": [c], "fill": "value",
                 "value": widths[0], "seed": 0} if len(set(widths)) == 1
                else None),
        tensor("int32", st.lists(sizes, min_size=0, max_size=2))))
    if widths_spec is None:  # unequal widths: spelled out as a "list" fill
        widths_spec = {"dtype": "int32", "shape": [c], "fill": "list",
                       "value": widths, "seed": 0}
    combiners = draw(mostly(st.just(_ints("int32", [c], 3, seed)),
                            tensor("int32", st.lists(sizes, max_size=2))))
    if grad:
        values = draw(mostly(
            tensor_of("float32", st.just([b, c * d]), ["rand", "value"]),
            tensor("float32", st.lists(sizes, min_size=0, max_size=3))))
        num_rows = draw(mostly(scalar("int64", [u]),
                               scalar("int64", [0, -1, 2**40, I64_MAX])))
        return {"op": "TnetEmbedCombineGrad", "handle": None, "attrs": {},
                "args": {"grad": values, "idx": idx, "widths": widths_spec,
                         "combiners": combiners, "num_rows": num_rows}}
    rows = draw(_rows(u, d))
    return {"op": "TnetEmbedCombine", "handle": None, "attrs": {},
            "args": {"rows": rows, "idx": idx, "widths": widths_spec,
                     "combiners": combiners}}


@st.composite
def segment_combine_case(draw) -> dict:
    grad = draw(st.booleans())
    u = draw(st.sampled_from([1, 5, 300]))
    d = draw(st.sampled_from([0, 1, 4, 16]))
    c = draw(st.sampled_from([1, 2, 3]))
    segs = c * draw(st.sampled_from([0, 1, 7, 4096]))
    k = draw(sizes)
    seed = draw(st.integers(0, 2**16))
    idx = draw(mostly(st.just(_ints("int32", [k], u, seed)),
                      tensor(st.sampled_from(["int32", "int64"]),
                             st.lists(sizes, min_size=0, max_size=2))))
    valid_segments = _ints("int64", [k], max(segs, 1), seed)
    segments = draw(mostly(  # random order, or in runs (the layer's order)
        st.sampled_from([valid_segments,
                         {**valid_segments, "fill": "sorted_mod"}]),
        tensor("int64", st.lists(sizes, max_size=2))))
    num_segments = draw(mostly(scalar("int64", [segs]),
                               scalar("int64", [-1, c + 1, 2**40, I64_MIN])))
    combiners = draw(mostly(st.just(_ints("int32", [c], 3, seed)),
                            tensor("int32", st.lists(sizes, max_size=2))))
    args = {"idx": idx, "segments": segments, "num_segments": num_segments,
            "combiners": combiners}
    if grad:
        args = {"grad": draw(mostly(
            tensor_of("float32", st.just([segs, d]), ["rand", "value"]),
            tensor("float32", st.lists(sizes, min_size=0, max_size=3)))),
            **args, "num_rows": draw(mostly(scalar("int64", [u]),
                                            scalar("int64", [-1, 2**40])))}
        return {"op": "TnetSegmentCombineGrad", "handle": None, "attrs": {},
                "args": args}
    return {"op": "TnetSegmentCombine", "handle": None, "attrs": {},
            "args": {"rows": draw(_rows(u, d)), **args}}


@st.composite
def row_ids_case(draw) -> dict:
    """TnetRowIds: mostly proper row_splits (0, then non-decreasing), else
    decreasing, not starting at 0, huge totals, any rank or dtype."""
    dtype = draw(st.sampled_from(["int64", "int32"]))
    lengths = draw(st.lists(st.sampled_from([0, 0, 1, 2, 50, 4096]),
                            max_size=300))
    good = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).tolist()
    bad_lists = st.sampled_from([[], [5], [0, 3, 2], [0, 2**40], [0, -1],
                                 [-4, 0], [0, I32_MAX, I32_MAX + 1],
                                 [0, I64_MAX]])
    splits = draw(mostly(
        st.just({"dtype": dtype, "shape": [len(good)], "fill": "list",
                 "value": good, "seed": 0}),
        st.one_of(
            bad_lists.map(lambda v: {"dtype": "int64", "shape": [len(v)],
                                     "fill": "list", "value": v, "seed": 0}),
            tensor(st.sampled_from(["int64", "int32", "float32"]),
                   st.lists(sizes, min_size=0, max_size=2)))))
    return {"op": "TnetRowIds", "handle": None, "attrs": {},
            "args": {"row_splits": splits}}


@st.composite
def compact_ids_case(draw) -> dict:
    """TnetCompactIds: mostly a [B, L] id block (int or string) with some
    padding (-1 / ""); else any rank or dtype."""
    rows, width = draw(st.integers(0, 40)), draw(st.integers(0, 60))
    n = rows * width
    ints = st.lists(st.sampled_from([-1, -1, 0, 7, -5, I32_MAX]),
                    min_size=n, max_size=n)
    strings = st.lists(st.sampled_from(["", "", "a", "bb", "x" * 70]),
                       min_size=n, max_size=n)
    block = st.one_of(
        st.tuples(st.sampled_from(["int64", "int32"]), ints),
        st.tuples(st.just("string"), strings)).map(
            lambda dv: {"dtype": dv[0], "shape": [rows, width],
                        "fill": "list", "value": dv[1], "seed": 0})
    ids = draw(mostly(block, tensor(
        st.sampled_from(["int64", "int32", "string", "float32"]),
        st.lists(sizes, min_size=0, max_size=3))))
    return {"op": "TnetCompactIds", "handle": None, "attrs": {},
            "args": {"ids": ids}}


def _list_spec(dtype: str, values: list) -> dict:
    return {"dtype": dtype, "shape": [len(values)], "fill": "list",
            "value": values, "seed": 0}


@st.composite
def flatten_keys_case(draw) -> dict:
    """TnetFlattenKeys: mostly N [B] / [B, 1] int64 columns and M ragged
    ones (values with -1 padding, proper row_splits) with matching attrs;
    else (one at a time) a column of another batch size, shape or dtype,
    broken row_splits, or attrs of the wrong length or range. Lists of
    tensors are lists of specs."""
    n, m = draw(st.integers(0, 4)), draw(st.integers(0, 3))
    batch = draw(st.sampled_from([0, 1, 3, 17, 300]))
    ids = st.sampled_from([-1, -1, 0, 7, -5, I32_MAX, I64_MAX, I64_MIN])
    block = []
    for _ in range(n):
        values = draw(st.lists(ids, min_size=batch, max_size=batch))
        shape = draw(st.sampled_from([[batch], [batch, 1]]))
        block.append({"dtype": "int64", "shape": shape, "fill": "list",
                      "value": values, "seed": 0})
    values, splits = [], []
    for _ in range(m):
        lengths = draw(st.lists(st.sampled_from([0, 0, 1, 2, 9]),
                                min_size=batch, max_size=batch))
        total = int(sum(lengths))
        values.append(_list_spec("int64", draw(st.lists(
            ids, min_size=total, max_size=total))))
        splits.append(_list_spec("int64", np.concatenate(
            [[0], np.cumsum(lengths, dtype=np.int64)]).tolist()))
    cols = n + m
    attrs = {"slots": list(range(cols)), "num_slots": max(cols, 1),
             "compact": draw(st.booleans()),
             "salts": draw(st.sampled_from([[], [3 - 2**62] * cols])),
             "names": draw(st.sampled_from([[], [f"c{j}" for j in range(cols)]]))}
    if draw(st.integers(0, 9)) < 3:  # one thing wrong
        what = draw(st.sampled_from(["block", "splits", "values", "attr"]))
        bad_splits = st.sampled_from([[], [5], [0, 3, 2], [0, 2**40], [0, -1],
                                      [-4, 0], [0] * (batch + 2)])
        if what == "block" and block:
            block[draw(st.integers(0, n - 1))] = draw(tensor(
                st.sampled_from(["int64", "int32", "float32"]),
                st.lists(sizes, min_size=0, max_size=3)))
        elif what == "splits" and splits:
            splits[draw(st.integers(0, m - 1))] = draw(
                bad_splits.map(lambda v: _list_spec("int64", v)))
        elif what == "values" and values:
            values[draw(st.integers(0, m - 1))] = draw(tensor(
                "int64", st.lists(sizes, min_size=0, max_size=2)))
        else:
            name = draw(st.sampled_from(["slots", "num_slots", "salts",
                                         "names"]))
            attrs[name] = draw({
                "slots": st.lists(st.sampled_from([0, 1, -1, 2**20, I64_MAX]),
                                  max_size=5),
                "num_slots": st.sampled_from([0, -1, 2**20 + 1, I64_MAX]),
                "salts": st.lists(st.sampled_from(INT_VALUES), max_size=5),
                "names": st.lists(st.sampled_from(["", "x" * 300]),
                                  max_size=5)}[name])
    return {"op": "TnetFlattenKeys", "handle": None, "attrs": attrs,
            "args": {"block": block, "values": values, "splits": splits}}


@st.composite
def shard_order_case(draw) -> dict:
    """TnetShardOrder: mostly a consistent dedup result (idx in [-1, U),
    counts [U]); else out-of-range idx, mismatched counts, any rank."""
    u = draw(sizes)
    keys_spec = draw(mostly(tensor_of("int64", st.just([u]), KEY_FILLS),
                            tensor("int64", st.lists(sizes, max_size=2))))
    n = draw(sizes)
    idx = draw(mostly(
        st.just({"dtype": "int32", "shape": [n], "fill": "mod",
                 "value": max(u, 1), "seed": draw(st.integers(0, 99))}),
        tensor("int32", st.lists(sizes, max_size=2))))
    counts = draw(mostly(tensor_of("float32", st.just([u]), ["rand", "value"]),
                         tensor("float32", st.lists(sizes, max_size=2))))
    shards = draw(mostly(st.sampled_from([1, 2, 3, 16]),
                         st.sampled_from([0, -1, 2**20])))
    return {"op": "TnetShardOrder", "handle": None,
            "attrs": {"num_shards": shards},
            "args": {"keys": keys_spec, "idx": idx, "counts": counts}}


NAMES = ["", "t", "x" * 300, "a/b", "bad name!", "\u00e9", "clash"]


INIT_PARAMS = {"zeros": [], "constant": [0.5], "uniform": [-0.1, 0.1],
               "normal": [0.0, 0.1], "truncated_normal": [0.0, 0.05]}


def sparse_rules() -> tuple[list[str], list[str]]:
    """(the rules, every hyperparameter of any rule), as the op library's
    registration table (tnet_ops/optimizers/rules.h) has them: a new rule
    or hyperparameter is fuzzed without an edit here."""
    from tnet.optimizer.sparse import registered  # noqa: PLC0415
    rules = registered()
    return sorted(rules), sorted({h for names in rules.values()
                                  for h in names})


@st.composite
def handle_case(draw) -> dict:
    """SparseTableHandle: a valid configuration with (mostly) one hostile
    attr. The runner pulls from the new table when asked, then destroys it."""
    rules, hparams = sparse_rules()
    init = draw(st.sampled_from(sorted(INIT_PARAMS)))
    attrs = {
        "dim": draw(st.sampled_from([1, 2, 4, 7, 64])),
        "optimizer": draw(st.sampled_from(rules)),
        "initializer": init, "initializer_params": INIT_PARAMS[init],
        "seed": draw(st.sampled_from(INT_VALUES)),
        "num_stripes": draw(st.sampled_from([1, 2, 64, 4096])),
        "container": draw(st.sampled_from(["", "c1"])),
        "shared_name": draw(st.sampled_from(NAMES)),
    }
    budget = draw(st.sampled_from([0, 0, 1, 4096, 1 << 20]))
    if budget:  # a disk tier: rows beyond the budget go to a file in /tmp
        attrs["memory_budget_bytes"] = budget
        attrs["storage_dir"] = "/tmp"
    hostile = {
        "dim": dim_attr,
        "optimizer": st.sampled_from(["", "SGD", "rmsprop", "adam\0x"]),
        "initializer": st.sampled_from(["", "glorot"] + sorted(INIT_PARAMS)),
        "initializer_params": st.lists(st.sampled_from(FLOAT_VALUES),
                                       max_size=3),
        "num_stripes": st.sampled_from([65536, 0, 3, -4, 131072, I64_MAX]),
        "container": st.sampled_from(["x" * 300, "bad name!", "\u00e9"]),
        "memory_budget_bytes": st.sampled_from([-1, -(1 << 62), I64_MAX]),
        "storage_dir": st.sampled_from(["/nonexistent/tnet", "/proc",
                                        "\u00e9/x", "/dev/null"]),
        **{name: st.sampled_from(FLOAT_VALUES + [0.9, 0.999, -0.5, 1e-7])
           for name in hparams},
    }
    for _ in range(draw(st.sampled_from([0, 1, 1, 1, 2]))):
        name = draw(st.sampled_from(sorted(hostile)))
        attrs[name] = draw(hostile[name])
    return {"op": "SparseTableHandle", "handle": None, "args": {},
            "attrs": attrs, "then_pull": draw(st.booleans())}


TARGETED = {
    "SparseTableHandle": handle_case(),
    "SparseTablePull": pull_case(),
    "SparseTablePush": push_case(),
    "SparseTablePullV2": _v2_case(pull_case(), "SparseTablePullV2"),
    "SparseTablePushV2": _v2_case(push_case(), "SparseTablePushV2"),
    "SparseTableExport": export_case(),
    "SparseTableExportSince": export_since_case(),
    "SparseTableMarkChanges": mark_changes_case(),
    "SparseTableChanges": changes_case(),
    "SparseTableImport": import_case(),
    "SparseTableExportPending": export_pending_case(),
    "SparseTableImportPending": import_pending_case(),
    "SparseTableEvict": evict_case(),
    "SparseTableSize": info_case(),
    "SparseTableMemoryBytes": info_case(),
    "SparseTableStats": info_case(),
    "TnetSumRows": sum_rows_case(),
    "TnetSparseRuleSlots": rule_slots_case(),
    "TnetUnique": unique_case(),
    "TnetDecodeIdLists": decode_id_lists_case(),
    "TnetDecodeRows": decode_rows_case(),
    "TnetSplitLines": split_lines_case(),
    "TnetEmbedCombine": embed_combine_case(),
    "TnetEmbedCombineGrad": embed_combine_case(),
    "TnetSegmentCombine": segment_combine_case(),
    "TnetSegmentCombineGrad": segment_combine_case(),
    "TnetRowIds": row_ids_case(),
    "TnetCompactIds": compact_ids_case(),
    "TnetFlattenKeys": flatten_keys_case(),
    "TnetShardOrder": shard_order_case(),
}


# ----------------------------------------------------------------- generic
_ATTR_VALUES = {
    "int": st.sampled_from([0, 1, 4, -1, 8, 65536, I64_MAX, I64_MIN]),
    "float": st.sampled_from(FLOAT_VALUES),
    "bool": st.booleans(),
    "string": st.sampled_from(["", "sgd", "zeros", "x" * 100]),
    "list(float)": st.lists(st.sampled_from(FLOAT_VALUES), max_size=4),
    "list(int)": st.lists(st.sampled_from(INT_VALUES), max_size=4),
    "type": st.sampled_from(["int64", "int32", "float32"]),
}


@st.composite
def generic_case(draw, op_def) -> dict:
    """Arguments from the OpDef alone: each input any dtype (biased to the
    declared one), any rank; each attr a random value of its type."""
    from tensorflow.python.framework import dtypes  # noqa: PLC0415
    args, h = {}, None
    for arg in op_def.input_arg:
        if arg.type == dtypes.resource.as_datatype_enum:
            h = draw(handle)
            continue
        declared = (dtypes.as_dtype(arg.type).name if arg.type
                    else draw(st.sampled_from(DTYPES)))
        dt = draw(st.one_of(st.just(declared), st.just(declared),
                            st.sampled_from(DTYPES)))
        args[arg.name] = draw(tensor(dt))
    attrs = {}
    for a in op_def.attr:
        if a.type in _ATTR_VALUES and (not a.HasField("default_value")
                                       or draw(st.booleans())):
            attrs[a.name] = draw(_ATTR_VALUES[a.type])
    return {"op": op_def.name, "handle": h, "args": args, "attrs": attrs,
            "generic": True}
