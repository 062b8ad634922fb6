"""The save-memory measurement of tests/test_checkpoint.py, in a process of
its own: a 2M-row table is saved (plain, then incremental) and the growth
of the peak RSS (VmHWM) over each save is printed as one JSON line.

Its own process because glibc's malloc state is process-wide and carries
the history of everything the process ran before: in the pytest process a
test that built a train function had set M_TOP_PAD (tn.Model), and the
dynamic mmap threshold had been raised by whatever large buffers came
before, so the same save measured 48-87 MB (and over the bound once) by
the order the tests ran in. Here it starts from glibc's defaults every run.

    python save_memory.py DIR  ->  SAVE_MEMORY {"plain": B, "incremental": B, ...}
"""
import json
import sys
import time

import numpy as np

import tnet as tn
from tnet import feature_column as fc
from tools import procfs

ROWS, DIM = 2_000_000, 16


class OneTable(tn.Model):
    def __init__(self, dim):
        super().__init__()
        self.emb = tn.layers.EmbeddingFeatures(
            [fc.embedding_column(fc.category_column("id"), dim, table="big")])

    def call(self, features, training=False):
        return self.emb(features, training=training)


def main(directory: str) -> None:
    if not procfs.reset_peak():
        print("SAVE_MEMORY " + json.dumps({"skip": "cannot reset VmHWM "
                                           "(/proc/self/clear_refs)"}))
        return
    model = OneTable(DIM)
    model.compile(tn.optimizer.Adagrad(0.05))
    model.emb.build(None)
    table = model.tables()["big"]
    rng = np.random.default_rng(0)
    step = 50_000  # small import chunks: little freed heap to hide growth
    for a in range(0, ROWS, step):
        n = min(step, ROWS - a)
        keys = (np.arange(a, a + n, dtype=np.int64) * 2654435761) % (2**62)
        meta = np.stack([rng.integers(1, 50, n), rng.integers(0, 5, n),
                         rng.integers(0, 1000, n)], axis=1).astype(np.float64)
        table.import_rows(keys, rng.standard_normal((n, DIM), np.float32),
                          rng.random((n, DIM), np.float32) + 0.1, meta)
    out = {"rows": int(table.size())}
    rss = procfs.status_bytes("VmRSS")
    procfs.reset_peak()  # VmHWM := VmRSS
    start = time.monotonic()
    path = tn.saving.save(model, directory, step=1, progress=lambda _: None)
    out["seconds"] = time.monotonic() - start
    out["plain"] = procfs.status_bytes("VmHWM") - rss
    manifest = tn.saving.read_manifest(path)
    out["bytes"] = sum(i["bytes"] for i in manifest["files"].values())
    out["manifest_rows"] = manifest["tables"]["big"]["rows"]
    # incremental=True (here a full save, nothing before it) only marks the
    # shards' change state: no per-row index on the chief.
    rss = procfs.status_bytes("VmRSS")
    procfs.reset_peak()
    tn.saving.save(model, directory, step=2, incremental=True,
                   progress=lambda _: None)
    out["incremental"] = procfs.status_bytes("VmHWM") - rss
    print("SAVE_MEMORY " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
