"""The code's structure, checked so that it cannot drift: who reads the
CLI's flags, how long a file may grow, and that docs/DESIGN.md's layout is
the tree. Source reading only (no TensorFlow), so it takes a second."""
from __future__ import annotations

import ast
import pathlib

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
