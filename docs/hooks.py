"""MkDocs hook: the repository's CHANGELOG.md becomes the site's
changelog page (one file, two places: the root for GitHub and the wheel's
readers, the site's nav)."""
from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent


def on_files(files, config):
    files.append(File.generated(config, "changelog.md",
                                content=(ROOT / "CHANGELOG.md").read_text()))
    return files
