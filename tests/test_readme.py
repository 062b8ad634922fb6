"""Every code block of README.md and of the pages under docs/ runs as written.

A page's blocks form programs (docs/development.md says how to steer them
with `<!-- test: ... -->` comments): the Python blocks of a program run in
order in one fresh process, its shell blocks (`sh`, `bash`) run with bash
at their place in that order, in a temporary directory which `/tmp/` paths
are moved into. `json` blocks must parse (a feature spec must load).
`text` blocks and blocks without a language are output or listings.

Blocks marked `long` run in `make test-long` only (the program without
them runs in `make test`); a program whose first block is marked `long` is
long as a whole. A block marked `skip` must say why.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

import numpy as np
import pytest

from tests.conftest import ROOT
from tests.support import forkrun

BLOCK = re.compile(
    r"(?:<!--\s*test:\s*(?P<directive>[^>]*?)\s*-->\s*\n)?"
    r"^```(?P<lang>[\w-]*)[^\n]*\n(?P<code>.*?)^```\s*$", re.S | re.M)
RUNNABLE = ("python", "sh", "bash")


def pages() -> List[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@dataclasses.dataclass
class Block:
    lang: str
    code: str
    long: bool = False


@dataclasses.dataclass
class Program:
    page: str
    index: int
    prelude: Optional[str] = None
    long: bool = False
    blocks: List[Block] = dataclasses.field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{self.page}#{self.index}"


def parse(path: Path):
    """(programs, skips, json blocks) of one page."""
    text = path.read_text()
    page = str(path.relative_to(ROOT))
    programs: List[Program] = []
    skips, jsons = [], []
    current: Optional[Program] = None
    for m in BLOCK.finditer(text):
        directive = (m["directive"] or "").strip()
        lang, code = m["lang"], m["code"]
        if directive.startswith("skip"):
            skips.append((page, directive, code))
            continue
        if lang == "json":
            jsons.append((page, code))
            continue
        if lang not in RUNNABLE:
            assert not directive, f"{page}: `{directive}` on a {lang!r} block"
            continue
        words = [w.strip() for w in directive.split(",") if w.strip()]
        for w in words:
            assert w in ("new", "continue", "long") or w.startswith(
                "prelude="), f"{page}: unknown <!-- test: {directive} -->"
        prelude = next((w[8:] for w in words if w.startswith("prelude=")),
                       None)
        if prelude or "new" in words or current is None:
            current = Program(page, len(programs), prelude=prelude)
            programs.append(current)
            # A program that starts long is long as a whole.
            current.long = "long" in words
        current.blocks.append(Block(lang, code,
                                    long=current.long or "long" in words))
    return programs, skips, jsons


def quickstart() -> str:
    """The README's quick start: the prelude pages name when they go on
    from its `model` and `data`."""
    text = (ROOT / "README.md").read_text()
    start = text.index("## Quick start")
    return re.search(r"```python\n(.*?)```", text[start:], re.S)[1]


PRELUDES = {"quickstart": quickstart}


def script(program: Program, tmp: Path, long: bool) -> str:
    """The program as one Python file: shell blocks become bash calls."""
    parts = ["import subprocess as _subprocess\n"]
    if program.prelude:
        parts.append(PRELUDES[program.prelude]())
    for block in program.blocks:
        if block.long and not long:
            continue
        if block.lang == "python":
            parts.append(block.code)
        else:
            shell = re.sub(r"(^|[\s;&|(])python(?=\s)",
                           lambda m: m[1] + sys.executable, block.code)
            parts.append(f"_subprocess.run(['bash', '-ec', {shell!r}], "
                         "check=True)\n")
    return "\n".join(parts).replace("/tmp/", f"{tmp}/")


def run(program: Program, tmp: Path, long: bool) -> str:
    code = script(program, tmp, long)
    for name in ("configs", "tests", "examples", "tools"):
        link = tmp / name
        if not link.exists():
            link.symlink_to(ROOT / name)
    (tmp / "program.py").write_text(code)
    # A program whose first import of the TensorFlow family is tnet's runs
    # forked from a process that imported tnet (the same start, ~3 s of
    # CPU less); one that loads an export with TensorFlow alone starts
    # afresh.
    first = re.search(r"^(?:import|from)\s+(tnet|tensorflow|tf_keras|keras)\b",
                      code, re.M)
    res = forkrun.run([sys.executable, "program.py"], cwd=tmp,
                      capture_output=True, text=True, timeout=900,
                      env=dict(os.environ, PYTHONPATH=str(ROOT),
                               TF_CPP_MIN_LOG_LEVEL="2"),
                      script_imports_tnet=bool(first) and first[1] == "tnet")
    assert res.returncode == 0, (
        f"{program.id} failed:\n{res.stdout[-3000:]}\n{res.stderr[-5000:]}")
    return res.stdout


# The README's quick start and "Serve it" are checked for what they print
# by their own test below.
README_PROGRAMS = {"README.md#0", "README.md#1"}


def collect():
    """One pytest case per distinct program (the getting-started page
    repeats the README's quick start: it runs once), short and long."""
    short, long_, seen = [], [], set()
    for path in pages():
        for program in parse(path)[0]:
            key = hashlib.sha1(repr([(b.lang, b.code, b.long)
                                     for b in program.blocks]).encode()
                               + str(program.prelude).encode()).hexdigest()
            if key in seen:
                continue
            seen.add(key)
            if (any(not b.long for b in program.blocks)
                    and program.id not in README_PROGRAMS):
                short.append(pytest.param(program, False, id=program.id))
            if any(b.long for b in program.blocks):
                long_.append(pytest.param(program, True,
                                          id=program.id + "-long",
                                          marks=pytest.mark.long))
    return short + long_


@pytest.mark.parametrize("program,long", collect())
def test_doc_program_runs(program, long, tmp_path):
    run(program, tmp_path, long=long)


def test_readme_quickstart_and_serve_it(tmp_path):
    """The quick start trains (the AUC it prints climbs above 0.9), has a
    row per user, exports; "Serve it" loads the export without tnet and
    scores a clicking user above a non-clicking one."""
    programs, _, _ = parse(ROOT / "README.md")
    out = run(programs[0], tmp_path, long=False)
    out += run(programs[1], tmp_path, long=False)
    assert "rows in the user table: 1000" in out, out
    aucs = [float(a) for a in re.findall(r"auc: (\d\.\d+)", out)]
    assert len(aucs) == 3 and aucs[-1] > 0.9, out
    assert (tmp_path / "tnet_quickstart" / "1" / "saved_model.pb").exists()
    scores = re.findall(r"^\[([^\]]*)\]\s*$", out, re.M)[-1].split()
    clicker, other, unseen = map(float, scores)
    assert clicker > 0.5 > other, out          # user 3 clicks, user 4 does not
    # The printed signature names both inputs.
    assert "'city'" in out and "'user_id'" in out, out


def test_readme_shows_what_the_quickstart_prints():
    text = (ROOT / "README.md").read_text()
    start = text.index("It prints")
    shown = re.search(r"```text\n(.*?)```", text[start:], re.S)[1]
    assert "Epoch 3/3" in shown and "rows in the user table: 1000" in shown


def test_every_skip_says_why():
    for path in pages():
        for page, directive, code in parse(path)[1]:
            reason = directive[len("skip"):].lstrip(":").strip()
            assert len(reason) >= 10, f"{page}: a skipped block needs a " \
                f"reason: <!-- test: skip: why -->\n{code}"


def test_json_blocks_parse():
    import tnet as tn  # noqa: PLC0415
    for path in pages():
        for page, code in parse(path)[2]:
            data = json.loads(code)
            if isinstance(data, dict) and "features" in data:
                spec = tn.data.spec.from_dict(data, source=page)
                assert spec.label is not None


def test_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200
