"""CPU seconds per test file from tests/support/cpu_time.py's logs, as a
Markdown table (largest first by the first run).

    python tools/cpu_by_file.py BEFORE_DIR [AFTER_DIR] [--tests N]

Each DIR holds the <worker>.jsonl files of one run (TNET_CPU_LOG). The
columns: CPU seconds (pytest's own + its subprocesses') and tests per
file in each run; the last row the sums. --tests N also lists the N
costliest tests of the last run.
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os


def load(folder: str) -> list[dict]:
    records = []
    for path in sorted(glob.glob(os.path.join(folder, "*.jsonl"))):
        with open(path) as f:
            records += [json.loads(line) for line in f if line.strip()]
    return records


def by_file(records: list[dict]) -> dict:
    files = collections.defaultdict(lambda: [0.0, 0])
    for r in records:
        row = files[r["id"].split("::")[0]]
        row[0] += r["self"] + r["children"]
        row[1] += 1
    return files


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", help="TNET_CPU_LOG directories")
    p.add_argument("--tests", type=int, default=0)
    args = p.parse_args()
    runs = [load(d) for d in args.runs]
    tables = [by_file(r) for r in runs]
    names = sorted(set().union(*tables), key=lambda n: -tables[0][n][0])
    head = " | ".join(f"run {i + 1}: CPU s / tests" for i in range(len(runs)))
    print(f"| file | {head} |")
    print("|---|" + "---:|" * len(runs))
    for name in names:
        cells = " | ".join(f"{t[name][0]:.0f} / {t[name][1]}" if name in t
                           else "-" for t in tables)
        print(f"| {name} | {cells} |")
    sums = " | ".join(f"{sum(v[0] for v in t.values()):.0f} / "
                      f"{sum(v[1] for v in t.values())}" for t in tables)
    print(f"| all | {sums} |")
    if args.tests:
        print()
        for r in sorted(runs[-1], key=lambda r: -(r["self"] + r["children"]))[
                :args.tests]:
            print(f"{r['self'] + r['children']:7.1f} s  {r['id']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
