"""Which room may import which: tnet's module import graph, read from the
sources (top-level and function-local imports alike; imports under
`if TYPE_CHECKING:` are annotations, not edges), has no cycle anywhere and
no import of tnet.serving from tnet.saving;
and tnet.serving.deltas, the delta files a follower reads, loads in a
process that refuses TensorFlow."""
from __future__ import annotations

import ast
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import ROOT

PACKAGE = ROOT / "tnet"


def _modules() -> dict:
    """{dotted name: path} of every module of the tnet package."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: pathlib.Path, modules: dict) -> set:
    """The tnet modules `name` imports anywhere in its file: `import a.b`
    is a.b; `from a import b` is a.b when that is a module, else a."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules else base)
    return {m for m in found if m in modules and m != name}


def _type_checking(node) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _runtime_nodes(tree):
    """ast.walk without the bodies of `if TYPE_CHECKING:` (never run)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if _type_checking(child):
                todo.extend(child.orelse)
            else:
                todo.append(child)


def _graph() -> dict:
    modules = _modules()
    # The package root only gathers the public names (and sets the
    # moved serving names on tn.saving); every import of a submodule runs
    # it first anyway, so it is no edge of the graph.
    return {name: _imports(name, path, modules) - {"tnet"}
            for name, path in modules.items() if name != "tnet"}


def _cycles(graph: dict) -> list:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _in_wings(name: str) -> bool:
    return name.startswith(("tnet.saving", "tnet.serving"))


def test_saving_and_serving_import_no_circle():
    graph = _graph()
    assert "tnet.serving.publish" in graph and "tnet.saving.checkpoint" in \
        graph, sorted(graph)
    # The graph sees function-local imports: the publisher's compaction
    # and export's updatable signatures are edges.
    assert "tnet.serving.export" in graph["tnet.serving.publish"]
    assert "tnet.serving.updatable" in graph["tnet.serving.export"]
    reach_in = sorted((a, b) for a in graph for b in graph[a]
                      if a.startswith("tnet.saving")
                      and b.startswith("tnet.serving"))
    assert not reach_in, f"tnet.saving imports tnet.serving: {reach_in}"
    circles = [c for c in _cycles(graph) if any(map(_in_wings, c))]
    assert not circles, f"import circles through saving/serving: {circles}"


def test_no_import_circle_anywhere_in_tnet():
    circles = _cycles(_graph())
    assert not circles, f"import circles: {circles}"


def test_type_checking_imports_are_no_edge(tmp_path):
    """An annotation-only import does not count; the same import at run
    time does."""
    a = tmp_path / "a.py"
    a.write_text("from typing import TYPE_CHECKING\n"
                 "if TYPE_CHECKING:\n    from tnet.data import b\n"
                 "else:\n    import tnet.data.c\n")
    modules = {"tnet.data.a": a, "tnet.data.b": a, "tnet.data.c": a}
    assert _imports("tnet.data.a", a, modules) == {"tnet.data.c"}


def test_cycle_finder_finds_a_function_local_circle(tmp_path):
    """The check above can fail: a circle hidden behind a function-local
    import is found."""
    a = tmp_path / "a.py"
    a.write_text("def f():\n    from tnet.serving import b\n")
    b = tmp_path / "b.py"
    b.write_text("from tnet.serving import a\n")
    modules = {"tnet.serving.a": a, "tnet.serving.b": b}
    graph = {n: _imports(n, p, modules) for n, p in modules.items()}
    assert _cycles(graph) == [["tnet.serving.a", "tnet.serving.b"]]


# A finder that refuses TensorFlow (and Keras) in the child process.
_NO_TENSORFLOW = """
import json, sys

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("tensorflow", "tf_keras", "keras"):
            raise ImportError(f"{name} is refused in this test")
        return None

sys.meta_path.insert(0, Refuse())
from tnet.serving import deltas

export = sys.argv[1]
info = deltas.read_info(export)
versions = deltas.list_deltas(export)
payload = deltas.load_delta(export, versions[-1], info["base_id"])
try:
    deltas.load_delta(export, versions[-1], "another base")
    refused = None
except deltas.DeltaError as e:
    refused = str(e)
import tnet
try:
    tnet.SparseTable
    needs = None
except AttributeError as e:
    needs = str(e)
print(json.dumps({
    "versions": versions, "base_id": info["base_id"],
    "payload": {k: v.tolist() for k, v in payload.items()},
    "refused": refused, "needs": needs,
    "loaded": sorted(m for m in sys.modules
                     if m.split(".")[0] in ("tensorflow", "tf_keras",
                                            "keras"))}))
"""


def test_deltas_load_without_tensorflow(tmp_path):
    from tnet.serving import deltas  # noqa: PLC0415
    export = tmp_path / "1"
    export.mkdir()
    (export / deltas.INFO_FILE).write_text(json.dumps(
        {"updatable": {"base_id": "b0", "through_step": 3,
                       "tables": {"user": {"prefix": "user", "dim": 2}},
                       "dense": []}}))
    rng = np.random.default_rng(7)
    arrays = {"user_keys": np.array([5, -3, 1 << 40], np.int64),
              "user_rows": rng.normal(size=(3, 2)).astype(np.float32),
              "user_deleted": np.array([9], np.int64),
              "dense_0": rng.normal(size=(4,)).astype(np.float32)}
    for version in (1, 2):
        deltas.write_delta(str(export), version, arrays, {
            "format": 1, "version": version, "base_id": "b0",
            "through_step": 3 + version})
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, "-c", _NO_TENSORFLOW, str(export)],
                         env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["loaded"] == []
    assert got["versions"] == [1, 2] and got["base_id"] == "b0"
    assert sorted(got["payload"]) == sorted(arrays)
    for k, v in arrays.items():
        np.testing.assert_array_equal(np.asarray(got["payload"][k], v.dtype),
                                      v)
    assert "belongs to base b0, not another base" in got["refused"]
    assert "tnet.SparseTable needs TensorFlow" in got["needs"]


@pytest.mark.parametrize("argv,module", [
    (["python", "-m", "tnet.server"], "tnet.server"),
    (["python", "-u", "-m", "tnet.server", "--verbosity=1"], "tnet.server"),
    (["python", "-X", "importtime", "-W", "ignore", "-m", "tnet.server"],
     "tnet.server"),
    (["python", "-mtnet.server"], "tnet.server"),
    (["python", "-m", "tnet.train", "--model=dcn"], "tnet.train"),
    (["python", "-m", "tnet.server_check"], "tnet.server_check"),
    (["python", "job.py", "-m", "tnet.server"], ""),
    (["python", "-c", "import tnet", "-m", "tnet.server"], ""),
    (["python", "-m"], ""),
    (["python"], ""),
])
def test_the_module_python_was_started_to_run(monkeypatch, argv, module):
    import tnet  # noqa: PLC0415
    monkeypatch.setattr(sys, "orig_argv", argv)
    assert tnet._main_module() == module
    assert tnet._runs_as_task_server() is (module == "tnet.server")


def _imported(args):
    """(exit status, output, the modules `python -X importtime ARGS`
    imported)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    res = subprocess.run([sys.executable, "-X", "importtime", *args],
                         capture_output=True, text=True, timeout=120, env=env)
    lines = res.stderr.splitlines()
    imported = {line.rsplit("|", 1)[1].strip() for line in lines
                if line.startswith("import time:")}
    said = "\n".join(line for line in lines
                     if not line.startswith("import time:"))
    return res.returncode, res.stdout + said, imported


@pytest.mark.parametrize("args,status,says", [
    (["-m", "tnet.train", "--helpfull"], 1, "--feature_spec"),  # absl's 1
    (["-m", "tnet.train", "--batch_sise=8"], 2,
     "tnet.train: Unknown command line flag 'batch_sise'"),
    (["-m", "tnet.train", "epochs=2"], 2, "unexpected arguments"),
    (["-m", "tnet.train", "--days=1..2"], 2,
     "tnet.train: --days needs --feature_spec"),
    (["-m", "tnet.train", "--stream=in", "--feature_spec=s.json",
      "--stream_poll_secs=0"], 2, "--stream_poll_secs must be > 0"),
    (["-m", "tnet.launch", "--psx", "1", "--", "true"], 2,
     "unrecognized arguments"),
])
def test_a_cli_answers_its_flags_before_tensorflow_loads(args, status, says):
    """`python -m tnet.train` and `tnet.launch`: --help, a bad flag and a
    flag combination that cannot work answer without loading TensorFlow
    (a TensorFlow start is ~2.5 s of CPU; a typo should not cost it)."""
    code, out, imported = _imported(args)
    assert code == status, out[-3000:]
    assert says in out
    assert not {m for m in imported
                if m.split(".")[0] in ("tensorflow", "tf_keras", "keras")}


_FLAGS_FIRST_THEN_LOAD = r"""
import json, sys
sys.orig_argv = [sys.executable, "-m", "tnet.train"]
import tnet as tn
light = sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow",
                                                             "tf_keras"))
tn._load()
from tensorflow.python.autograph.core import config
print(json.dumps({
    "light": light, "missing": [n for n in tn.__all__ if not hasattr(tn, n)],
    "saving": hasattr(tn.saving, "export_for_serving"),
    "autograph": any(isinstance(r, config.DoNotConvert) and r.matches("tnet")
                     for r in config.CONVERSION_RULES)}))
"""


def test_a_flags_first_cli_loads_what_import_tnet_loads():
    """Run as `python -m tnet.train`, `import tnet` loads no TensorFlow;
    once the flags are good, `tn._load()` gives every name `import tnet`
    gives, the serving names under tn.saving, and AutoGraph leaves tnet
    alone (each fails if `_load` misses one)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    res = subprocess.run([sys.executable, "-c", _FLAGS_FIRST_THEN_LOAD],
                         capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got == {"light": [], "missing": [], "saving": True,
                   "autograph": True}


def test_the_cli_optimizer_choices_are_tnets_optimizers():
    from tnet.cli.config import OPTIMIZERS  # noqa: PLC0415
    import tnet as tn  # noqa: PLC0415
    assert list(OPTIMIZERS) == tn.optimizer.names()


def test_a_task_server_loads_neither_keras_nor_tnets_layers():
    """`python -m tnet.server` (a ps or worker task) loads TensorFlow, the
    op library and tnet.distribute: no tf_keras, no tnet layer or callback
    (each task starts with ~1 s less CPU and ~85 MB less memory)."""
    code, out, imported = _imported(["-m", "tnet.server", "--help"])
    assert code == 0, out[-3000:]
    assert "usage: python -m tnet.server" in out
    assert {"tensorflow", "tnet._ops", "tnet.distribute"} <= imported
    assert not {m for m in imported if m.split(".")[0] in ("tf_keras", "keras")}
    assert not {"tnet.layers", "tnet.callbacks", "tnet.model"} & imported


@pytest.mark.parametrize("level", [None, "2"])
def test_a_cli_task_prints_no_tensorflow_start_up_chatter(level):
    """`python -m tnet.server` with TF_CPP_MIN_LOG_LEVEL unset, or set to 2
    as tnet.launch sets it for its tasks: none of the lines TensorFlow
    writes while it loads and lists its devices (oneDNN, CUDA probing and
    its "failed call to cuInit" on a machine without a GPU, absl's
    InitializeLog notice) reaches stderr (tnet/log.py)."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["PYTHONPATH"] = str(ROOT)
    if level is not None:
        env["TF_CPP_MIN_LOG_LEVEL"] = level
    res = subprocess.run([sys.executable, "-m", "tnet.server", "--help"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    chatter = [line for line in res.stderr.splitlines()
               if "oneDNN" in line or "cuda" in line.lower()
               or "InitializeLog" in line]
    assert chatter == []
