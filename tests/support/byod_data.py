"""Generated "bring your own data" files for the spec readers' tests and the
daily loop: one table of rows (numpy) written as tf.Example TFRecord, CSV /
TSV with a header, or Parquet, with the spec that describes them.

The label follows a known logistic model of the ids, so a trained model
beats chance. `rows(...)` is also the Python model the readers are checked
against: what each reader must yield for each row.
"""
from __future__ import annotations

import json
import pathlib

import numpy as np

SPEC = {
    "defaults": {"dim": 4, "table": "embedding"},
    "features": [
        {"name": "click", "kind": "label", "dtype": "int64"},
        {"name": "user_id", "kind": "id", "dtype": "int64"},
        {"name": "city", "kind": "id", "dtype": "string", "default": "none"},
        {"name": "tags", "kind": "ids", "dtype": "string", "combiner": "sum"},
        {"name": "history", "kind": "sequence", "dtype": "int64", "max_length": 3},
        {"name": "price", "kind": "dense", "dtype": "float32"},
        {"name": "user", "kind": "group", "column": "user_id"},
    ],
}


def write_spec(path: pathlib.Path, spec: dict = SPEC) -> pathlib.Path:
    path.write_text(json.dumps(spec, indent=1))
    return path


def rows(n: int, seed: int, users: int = 50) -> list[dict]:
    """n rows: python values per file column (None: missing)."""
    rng = np.random.default_rng(seed)
    truth = np.random.default_rng(7).normal(0, 1.0, 1000)
    out = []
    for _ in range(n):
        user = int(rng.integers(0, users))
        city = f"c{int(rng.integers(0, 20))}" if rng.random() > 0.1 else None
        tags = [f"t{int(t)}" for t in rng.integers(0, 30, int(rng.integers(0, 4)))]
        history = [int(h) for h in rng.integers(100, 200, int(rng.integers(0, 6)))]
        price = float(np.round(rng.normal(), 3))
        logit = truth[user % 500] + (truth[500 + int(city[1:])] if city else 0.0) \
            + 0.5 * price
        click = int(rng.random() < 1 / (1 + np.exp(-logit)))
        out.append({"click": click, "user_id": user, "city": city,
                    "tags": tags, "history": history, "price": price})
    return out


def expected(rs: list[dict]) -> dict:
    """What a reader must yield for rows `rs` with SPEC (one batch)."""
    return {
        "user_id": [r["user_id"] for r in rs],
        "city": [(r["city"] or "none").encode() for r in rs],
        "tags": [[t.encode() for t in r["tags"]] for r in rs],
        "history": [r["history"][-3:] for r in rs],
        "price": [r["price"] for r in rs],
        "user": [r["user_id"] for r in rs],
        "label": [float(r["click"]) for r in rs],
    }


def example(r: dict) -> bytes:
    import tensorflow as tf  # noqa: PLC0415
    f = tf.train.Feature
    feats = {"click": f(int64_list=tf.train.Int64List(value=[r["click"]])),
             "user_id": f(int64_list=tf.train.Int64List(value=[r["user_id"]])),
             "tags": f(bytes_list=tf.train.BytesList(value=[t.encode() for t in r["tags"]])),
             "history": f(int64_list=tf.train.Int64List(value=r["history"])),
             "price": f(float_list=tf.train.FloatList(value=[r["price"]]))}
    if r["city"] is not None:
        feats["city"] = f(bytes_list=tf.train.BytesList(value=[r["city"].encode()]))
    return tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString()


def write_tfrecord(path: pathlib.Path, rs: list[dict], gzip_it: bool = False,
                   damaged: dict | None = None) -> pathlib.Path:
    """damaged: {row index: raw bytes written instead of that row}."""
    import tensorflow as tf  # noqa: PLC0415
    damaged = damaged or {}
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path), "GZIP" if gzip_it else "") as w:
        for i, r in enumerate(rs):
            w.write(damaged.get(i, example(r) if i not in damaged else b""))
    return path


def csv_line(r: dict, delim: str) -> str:
    return delim.join([str(r["click"]), str(r["user_id"]), r["city"] or "",
                       "|".join(r["tags"]), "|".join(map(str, r["history"])),
                       repr(r["price"]), "x"])


def write_csv(path: pathlib.Path, rs: list[dict], delim: str = ",",
              damaged: dict | None = None) -> pathlib.Path:
    damaged = damaged or {}
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [delim.join(["click", "user_id", "city", "tags", "history", "price",
                         "unused"])]
    lines += [damaged.get(i, csv_line(r, delim)) for i, r in enumerate(rs)]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_parquet(path: pathlib.Path, rs: list[dict], row_group_size: int = 64,
                  null_label_rows=()) -> pathlib.Path:
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({
        "click": pa.array([None if i in null_label_rows else r["click"]
                           for i, r in enumerate(rs)], pa.int64()),
        "user_id": pa.array([r["user_id"] for r in rs], pa.int64()),
        "city": pa.array([r["city"] for r in rs], pa.string()),
        "tags": pa.array([r["tags"] for r in rs], pa.list_(pa.string())),
        "history": pa.array([r["history"] for r in rs], pa.list_(pa.int64())),
        "price": pa.array([r["price"] for r in rs], pa.float64()),
    })
    pq.write_table(table, str(path), row_group_size=row_group_size)
    return path


__all__ = ["SPEC", "write_spec", "rows", "expected", "write_tfrecord",
           "write_csv", "write_parquet"]
