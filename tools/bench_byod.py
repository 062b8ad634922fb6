"""Throughput of the feature-spec readers (examples/s), one core.

    taskset -c 0 python tools/bench_byod.py --rows 200000

Writes the generated rows of tests/support/byod_data.py (1 int id, 1
string id, string ids, an int sequence, a float, label, group key) as
TFRecord, gzip TFRecord, CSV and Parquet under a temp dir, then times a
full pass of `spec.dataset(..., batch_size=1024)` per format (second pass
timed, after one warm-up pass), and TFRecord with bad_rows=skip (per-record
validation). Prints a markdown table for BENCHMARKS.md.

    taskset -c 0 python tools/bench_byod.py --sparse_heavy 65536

instead reads SPARSE-HEAVY rows (`SyntheticCriteo(multi_valued=4)`: 13
dense, 26 single ids, 4 id lists of 1-50 ids) as the TSV `write_tsv`
writes and as tf.Example TFRecords (ids VarLen), through the feature
spec's reader in batches of 4096 as training reads them, one core (one
inter- and intra-op thread): examples/s per format and CPU ms per batch
(process CPU time, so the reader's own threads count). Compare with the
training throughput per core of `bench_train.py --config sparse_heavy`
(`--train_examples_per_s`, the figure of 2 cores, gives the ratio).
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
    p.add_argument("--sparse_heavy", type=int, default=0, metavar="ROWS",
                   help="read ROWS SPARSE-HEAVY rows per format instead")
    p.add_argument("--train_examples_per_s", type=float, default=0.0,
                   help="tnet SPARSE-HEAVY training examples/s on 2 cores "
                   "(bench_train), for the reader / per-core ratio")
    a = p.parse_args()
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    if a.sparse_heavy:
        sparse_heavy(a.sparse_heavy, a.train_examples_per_s)
        return
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


def _write_sparse_heavy_tfrecord(gen, path: str, rows: int) -> None:
    """The rows of `gen.write_tsv(path, rows)` as tf.Examples: label and I*
    float, C* one int64, M* the list's ids (VarLen)."""
    from tnet.data.synthetic import CRITEO_CAT_COLUMNS, CRITEO_INT_COLUMNS
    feats, labels, _ = gen.batch(rows, "train")
    with tf.io.TFRecordWriter(path) as w:
        for i in range(rows):
            f = {"label": tf.train.Feature(
                int64_list=tf.train.Int64List(value=[int(labels[i])]))}
            for n in CRITEO_INT_COLUMNS:
                f[n] = tf.train.Feature(
                    float_list=tf.train.FloatList(value=[feats[n][i]]))
            for n in CRITEO_CAT_COLUMNS:
                f[n] = tf.train.Feature(
                    int64_list=tf.train.Int64List(value=[feats[n][i]]))
            for n in gen.multi_valued_columns:
                ids = feats[n][i]
                f[n] = tf.train.Feature(
                    int64_list=tf.train.Int64List(value=ids[ids >= 0]))
            w.write(tf.train.Example(
                features=tf.train.Features(feature=f)).SerializeToString())


def sparse_heavy(rows: int, train_eps: float) -> None:
    from tnet.data import synthetic
    batch = 4096
    gen = synthetic.SyntheticCriteo(seed=0, multi_valued=4)
    spec = synthetic.feature_spec(4)
    with tempfile.TemporaryDirectory() as tmp:
        files = {"tsv": os.path.join(tmp, "a.tsv"),
                 "tfrecord": os.path.join(tmp, "a.tfrecord")}
        gen.write_tsv(files["tsv"], rows)
        _write_sparse_heavy_tfrecord(gen, files["tfrecord"], rows)
        per_core = train_eps / 2 if train_eps else 0.0
        print("| SPARSE-HEAVY rows, one core | examples/s | CPU ms per "
              "batch of 4096 | file MB |"
              + (" reader / training per core |" if per_core else "")
              + "\n|---|---:|---:|---:|" + ("---:|" if per_core else ""))
        for fmt, path in files.items():
            ds = spec.dataset(path, fmt, batch)
            for _ in ds:   # warm-up pass (tracing, page cache)
                pass
            cpu0, start, n = time.process_time(), time.perf_counter(), 0
            for _, label in ds:
                n += int(label.shape[0])
            sec = time.perf_counter() - start
            cpu = time.process_time() - cpu0
            assert n == rows, (fmt, n)
            eps = n / sec
            line = (f"| {fmt} | {eps:,.0f} | {1000 * cpu / (n / batch):.1f} "
                    f"| {os.path.getsize(path) / 1e6:.1f} |")
            if per_core:
                line += f" {eps / per_core:.2f}x |"
            print(line, flush=True)


if __name__ == "__main__":
    main()
