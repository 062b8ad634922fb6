"""MkDocs hooks: pages generated from files outside docs/.

- The repository's CHANGELOG.md becomes the site's changelog page (one
  file, two places: the root for GitHub and the wheel's readers, the
  site's nav).
- examples/README.md becomes the Examples page and each examples/*.py a
  page of its own (its source), so the programs stay runnable files
  (tests/test_examples.py runs them) and the site shows them.
"""
from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def _index() -> str:
    """examples/README.md with its links made relative to the site page
    examples/index.md: docs pages lose their docs/ prefix, example
    programs point at their pages."""
    text = (EXAMPLES / "README.md").read_text()
    text = text.replace("](../docs/", "](../")
    return re.sub(r"\]\((\w+)\.py\)", r"](\1.md)", text)


def _example(path: Path) -> str:
    return (f"# {path.name}\n\n"
            f"`python examples/{path.name}` (`--help` for its flags); "
            "`tests/test_examples.py` runs it.\n\n"
            f"```python\n{path.read_text()}```\n")


def on_files(files, config):
    files.append(File.generated(config, "changelog.md",
                                content=(ROOT / "CHANGELOG.md").read_text()))
    files.append(File.generated(config, "examples/index.md", content=_index()))
    for path in sorted(EXAMPLES.glob("*.py")):
        files.append(File.generated(config, f"examples/{path.stem}.md",
                                    content=_example(path)))
    return files
