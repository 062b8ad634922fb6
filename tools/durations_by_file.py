"""Groups pytest's `--durations=0` lines by test file, as a Markdown table.

    python tools/durations_by_file.py BEFORE.txt [AFTER.txt]

Each file is the output of a pytest run with `--durations=0` (`make test
PYTEST_ARGS=--durations=0` prints them; setup, call and teardown all count
to the file of the test). Rows are test files, largest first (by the first
run); the columns are seconds and tests run per file in each run, and the
last row the sums. Under pytest-xdist the seconds are per worker, so they
add to more than the wall time; the wall time is the run's last line.

    python tools/durations_by_file.py --write-order tests/file_seconds.json LOG

writes the seconds per file of one run as JSON instead: tests/conftest.py
orders the files by it, largest first, for make test's workers.
"""
from __future__ import annotations

import collections
import json
import re
import sys

LINE = re.compile(r"\s*([\d.]+)s (call|setup|teardown)\s+(tests/[^:\s]+)")
WALL = re.compile(r"(?:passed|failed).* in ([\d.]+)s")


def parse(path: str):
    seconds = collections.defaultdict(float)
    tests = collections.Counter()
    wall = None
    with open(path, errors="replace") as f:
        for line in f:
            m = LINE.match(line)
            if m:
                seconds[m.group(3)] += float(m.group(1))
                if m.group(2) == "call":
                    tests[m.group(3)] += 1
            m = WALL.search(line)
            if m:
                wall = float(m.group(1)) if wall is None else wall + float(m.group(1))
    return seconds, tests, wall


def main(paths: list[str]) -> None:
    if paths and paths[0] == "--write-order":
        out, log = paths[1], paths[2]
        seconds = parse(log)[0]
        ordered = {k: round(v, 1) for k, v in
                   sorted(seconds.items(), key=lambda kv: -kv[1])}
        with open(out, "w") as f:
            f.write(json.dumps(ordered, indent=1) + "\n")
        return
    runs = [parse(p) for p in paths]
    files = sorted(set().union(*(r[0] for r in runs)),
                   key=lambda k: -runs[0][0].get(k, 0.0))
    head = " | ".join(f"s (run {i + 1}) | tests" for i in range(len(runs)))
    print(f"| file | {head} |")
    print("|---|" + "---:|---:|" * len(runs))
    for name in files:
        cells = " | ".join(f"{r[0].get(name, 0.0):.0f} | {r[1].get(name, 0)}"
                           for r in runs)
        print(f"| {name} | {cells} |")
    cells = " | ".join(f"**{sum(r[0].values()):.0f}** | **{sum(r[1].values())}**"
                       for r in runs)
    print(f"| all (per-test seconds added up) | {cells} |")
    walls = ", ".join(f"run {i + 1}: {r[2]:.0f} s" if r[2] else f"run {i + 1}: ?"
                      for i, r in enumerate(runs))
    print(f"\npytest wall time: {walls}")


if __name__ == "__main__":
    main(sys.argv[1:])
