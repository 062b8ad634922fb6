"""Throughput of the feature-spec readers (examples/s), one core.

    taskset -c 0 python tools/bench_byod.py --rows 200000

Writes the generated rows of tests/support/byod_data.py (1 int id, 1
string id, string ids, an int sequence, a float, label, group key) as
TFRecord, gzip TFRecord, CSV and Parquet under a temp dir, then times a
full pass of `spec.dataset(..., batch_size=1024)` per format (second pass
timed, after one warm-up pass), and TFRecord with bad_rows=skip (per-record
validation). Prints a markdown table for BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tnet  # noqa: E402,F401  (before tensorflow)
import tensorflow as tf  # noqa: E402

from support import byod_data as bd  # noqa: E402
from tnet.data import spec as spec_lib  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--batch_size", type=int, default=1024)
    a = p.parse_args()
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        d = pathlib.Path(tmp)
        spec = spec_lib.load(bd.write_spec(d / "spec.json"))
        rows = bd.rows(a.rows, seed=0, users=10_000)
        files = {"tfrecord": bd.write_tfrecord(d / "a.tfrecord", rows),
                 "tfrecord (gzip)": bd.write_tfrecord(d / "a.tfrecord.gz", rows, gzip_it=True),
                 "csv": bd.write_csv(d / "a.csv", rows)}
        try:
            files["parquet"] = bd.write_parquet(d / "a.parquet", rows, row_group_size=65536)
        except ImportError:
            print("pyarrow missing: parquet not measured")
        cases = [(name, str(path), name.split(" ")[0], "fail") for name, path in files.items()]
        cases.append(("tfrecord, bad_rows=skip", str(files["tfrecord"]), "tfrecord", "skip"))
        print(f"| format | examples/s | MB/s | file MB |\n|---|---|---|---|")
        for name, path, fmt, bad in cases:
            ds = spec.dataset(path, fmt, a.batch_size, bad_rows=bad, with_group=True)
            for _ in ds:
                pass
            start = time.perf_counter()
            n = 0
            for _, label in ds:
                n += int(label.shape[0])
            sec = time.perf_counter() - start
            assert n == a.rows, (name, n)
            mb = os.path.getsize(path) / 1e6
            print(f"| {name} | {n / sec:,.0f} | {mb / sec:.1f} | {mb:.1f} |", flush=True)


if __name__ == "__main__":
    main()
