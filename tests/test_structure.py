"""The code's structure, checked so that it cannot drift: who reads the
CLI's flags, how long a file may grow, and that docs/DESIGN.md's layout is
the tree. Source reading only (no TensorFlow), so it takes a second."""
from __future__ import annotations

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
TNET = ROOT / "tnet"

# The one module that defines and reads the flags of `python -m tnet.train`,
# and the entry module that hands them to absl's app.run.
FLAG_READERS = {"tnet/cli/flags.py", "tnet/train.py"}


def _absl_flag_uses(path: pathlib.Path) -> list:
    """Lines of `path` that import absl's flags or name FLAGS."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("absl.flags") or (
                    node.module == "absl"
                    and any(a.name == "flags" for a in node.names)):
                found.append(node.lineno)
        elif isinstance(node, ast.Import):
            if any(a.name.startswith("absl.flags") for a in node.names):
                found.append(node.lineno)
        elif isinstance(node, ast.Name) and node.id == "FLAGS":
            found.append(node.lineno)
        elif isinstance(node, ast.Attribute) and node.attr == "FLAGS":
            found.append(node.lineno)
    return found


def test_only_the_cli_flags_module_reads_flags():
    """Everything below the entry point gets a JobConfig: no other module
    of tnet imports absl's flags or names FLAGS."""
    uses = {}
    for path in sorted(TNET.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        lines = _absl_flag_uses(path)
        if lines:
            uses[rel] = lines
    # The scan sees what it is meant to see (it is not blind) ...
    assert "tnet/cli/flags.py" in uses, uses
    # ... and nothing else reads the flags.
    assert set(uses) <= FLAG_READERS, {
        k: v for k, v in uses.items() if k not in FLAG_READERS}


def test_only_the_entry_imports_the_cli_wing():
    """tnet/cli/ sits above the library: no module of tnet outside it but
    the entry imports it (so `import tnet` defines and reads no flags)."""
    importers = set()
    for path in sorted(TNET.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names]
                     if isinstance(node, ast.Import) else [])
            if isinstance(node, ast.ImportFrom) and node.module == "tnet":
                names += [f"tnet.{a.name}" for a in node.names]
            if any(n == "tnet.cli" or n.startswith("tnet.cli.")
                   for n in names):
                importers.add(rel)
    assert "tnet/train.py" in importers
    assert {p for p in importers if not p.startswith("tnet/cli/")} == {
        "tnet/train.py"}

def test_flags_and_job_config_agree():
    """One flag per JobConfig field, its default the field's default."""
    import dataclasses  # noqa: PLC0415
    from absl import flags  # noqa: PLC0415
    from tnet.cli import config, flags as cli_flags  # noqa: PLC0415
    defined = {f.name: f for f in flags.FLAGS.get_key_flags_for_module(
        cli_flags)}
    assert sorted(defined) == sorted(config.names())
    for field in dataclasses.fields(config.JobConfig):
        default = defined[field.name].default
        want = field.default
        assert (list(want) if isinstance(want, tuple) else want) == default, \
            field.name


# --------------------------------------------------------------- file size
MAX_LINES = 800
SIZED = ("tnet", "tnet_ops", "tools")


def test_no_source_file_over_800_lines():
    """Every .py/.cc/.h file of tnet/, tnet_ops/ and tools/ has at most 800
    lines: past that a file holds more than one concept; split it along
    them (see docs/DESIGN.md "Layout")."""
    seen, over = 0, {}
    for top in SIZED:
        for path in sorted((ROOT / top).rglob("*")):
            if path.suffix not in (".py", ".cc", ".h") or not path.is_file():
                continue
            seen += 1
            with open(path, "rb") as f:
                n = sum(1 for _ in f)
            if n > MAX_LINES:
                over[path.relative_to(ROOT).as_posix()] = n
    assert seen > 100  # the walk found the sources
    assert not over, f"files over {MAX_LINES} lines: {over}"


# ------------------------------------------------------------------ layout
DESCRIPTION_COLUMN = 20  # a line indented this far continues a description


def _expand(name: str) -> list:
    """'table_shard.{h,cc}' -> ['table_shard.h', 'table_shard.cc']."""
    m = re.fullmatch(r"(.*)\{([^}]*)\}(.*)", name)
    if not m:
        return [name]
    return [m.group(1) + part + m.group(3) for part in m.group(2).split(",")]


def layout_paths(text: str) -> list:
    """The paths the "## Layout" block of DESIGN.md names, relative to the
    repository root. An entry line is indented two spaces a level (less
    than DESCRIPTION_COLUMN); its names come first (comma-separated, a
    folder ends in "/"), then two spaces and what it holds."""
    section = text.split("\n## Layout\n", 1)[1]
    block = section.split("```\n", 2)[1]
    paths, parents = [], []
    for line in block.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        if indent >= DESCRIPTION_COLUMN:
            continue  # a description's next line
        assert indent % 2 == 0, f"layout: odd indent: {line!r}"
        depth = indent // 2
        assert depth <= len(parents), f"layout: indented too far: {line!r}"
        del parents[depth:]
        assert None not in parents, f"layout: nested under a file: {line!r}"
        names = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        folder = None
        for name in names.split(", "):
            assert re.fullmatch(r"[\w.{},/-]+", name), (
                f"layout: {name!r} is not a name (two spaces before the "
                "description)")
            for one in _expand(name):
                path = "/".join([*parents, one.rstrip("/")])
                paths.append(path)
                if one.endswith("/"):
                    folder = one.rstrip("/")
        parents.append(folder)  # None after a file: nothing nests under it
    return paths


def _tree() -> set:
    """What the layout must name: every package and module of tnet/ (an
    __init__.py is its package) and every file of tnet_ops/."""
    want = set()
    for path in (TNET).rglob("*"):
        rel = path.relative_to(ROOT).as_posix()
        if "__pycache__" in rel:
            continue
        if path.is_dir() and (path / "__init__.py").exists():
            want.add(rel)
        elif path.suffix == ".py" and path.name != "__init__.py":
            want.add(rel)
    for path in (ROOT / "tnet_ops").rglob("*"):
        rel = path.relative_to(ROOT).as_posix()
        if path.is_file() and "__pycache__" not in rel \
                and not path.name.startswith("."):
            want.add(rel)
    return want


def test_design_layout_is_the_tree():
    """docs/DESIGN.md's layout lists every package and module of tnet/ and
    every file of tnet_ops/, and everything it lists exists."""
    listed = layout_paths((ROOT / "docs" / "DESIGN.md").read_text())
    assert len(listed) == len(set(listed)), "layout: a path listed twice"
    missing = sorted(_tree() - set(listed))
    assert not missing, ("add these to docs/DESIGN.md's layout: "
                         f"{missing}")
    gone = sorted(p for p in listed if not (ROOT / p).exists())
    assert not gone, f"docs/DESIGN.md's layout lists what is not there: {gone}"


def test_layout_parser():
    """The parser reads nesting, lists, braces and descriptions' lines."""
    text = ("x\n## Layout\n\n```\n"
            "a/                  top\n"
            "  b.py, c.py        two files\n"
            "  d/                a folder\n"
            "    e.{h,cc}          braces\n"
            "                      more about e\n"
            "  f.py\n"
            "                      about f\n"
            "g.txt               last\n```\n")
    assert layout_paths(text) == ["a", "a/b.py", "a/c.py", "a/d", "a/d/e.h",
                                  "a/d/e.cc", "a/f.py", "g.txt"]
