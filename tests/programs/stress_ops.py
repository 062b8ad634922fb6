"""Concurrency stress of one table's ops (run by tests/test_stress.py).

    stress_ops.py --seconds 20 --threads 8 --num-stripes 4

Python threads call the ops eagerly (TF releases the GIL while a kernel
runs, and the kernels fan out on TF's thread pool), all on the same SGD
table, for a bounded time:
- pushers apply gradients c * [1, 2, .., dim] (c a small integer) to "hot"
  keys, with duplicates inside a batch, and record sum(c) per key;
- trainers pull hot and fresh "cold" keys with training=True (cold rows get
  show 0), readers pull with training=False;
- exporters walk the table in small random chunks (cursor loops);
- evictors free every row with show < 0.5 and compact=False (every pushed
  row has show >= 1, so only cold rows go); one thread reads size/memory.

Checked while running: every pulled or exported hot row is a consistent
snapshot (w[j] = -lr * S * (j + 1) for one integer S: no torn row); every
export walk returns every hot key exactly once (a cold key evicted and
re-created during a walk may come twice: it is a new row); size never drops
below the hot key count. Checked after: each hot key's weights equal
-lr * (sum of all its pushed c) * (j + 1) exactly (integers and lr = 0.5
keep float32 sums exact: no lost or doubled update), the final export holds
each live key once and size equals their count, and one more eviction leaves
exactly the hot keys. Prints one JSON line STRESS {...}; exits 1 on failure.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tnet  # noqa: E402, F401
from tnet import _ops  # noqa: E402

DIM = 4
LR = 0.5
HOT = 2000
COLD_BASE = 1 << 40
COLD_KEYS = 1 << 16  # few enough that evicted cold keys come back often
RAMP = np.arange(1, DIM + 1, dtype=np.float32)


class Stress:
    def __init__(self, num_stripes: int, seconds: float, seed: int):
        self.h = _ops.sparse_table_handle(
            shared_name="stress", dim=DIM, optimizer="sgd",
            initializer="zeros", initializer_params=[],
            num_stripes=num_stripes)
        self.deadline = time.monotonic() + seconds
        self.seed = seed
        self.forget_one_push = False
        self.sums: list[np.ndarray] = []
        self.errors: list[str] = []
        self.counts = collections.Counter()
        self.lock = threading.Lock()
        # Every hot key exists (show 1, weights 0) before the threads start.
        hot = np.arange(HOT, dtype=np.int64)
        self.push(hot, np.zeros((HOT, DIM), np.float32))

    def push(self, keys: np.ndarray, grads: np.ndarray) -> None:
        _ops.sparse_table_push(self.h, keys, grads, LR, 1, np.zeros(0, np.float32),
                               np.zeros(0, np.float32), dim=DIM)

    def check_rows(self, keys: np.ndarray, w: np.ndarray, where: str) -> None:
        """Hot rows must be w = -LR * S * RAMP for an integer S."""
        hot = keys < HOT
        s = -w[hot] / (LR * RAMP)
        bad = (s != s[:, :1]).any(axis=1) | (s[:, 0] != np.round(s[:, 0]))
        if bad.any():
            i = int(np.argmax(bad))
            self.fail(f"{where}: torn or wrong row for key {keys[hot][i]}: "
                      f"{w[hot][i]}")

    def fail(self, msg: str) -> None:
        with self.lock:
            self.errors.append(msg)

    def running(self) -> bool:
        return time.monotonic() < self.deadline and not self.errors

    # ---------------------------------------------------------------- roles
    def pusher(self, rng: np.random.Generator) -> None:
        sums = np.zeros(HOT, np.int64)
        forget = self.forget_one_push  # self-test: the checks must notice
        while self.running():
            n = int(rng.integers(1, 512))
            keys = rng.integers(0, HOT, n)
            c = rng.integers(-3, 4, n)
            c[0] = 1  # so that the self-test's forgotten push is never a no-op
            self.push(keys, c[:, None].astype(np.float32) * RAMP)
            if forget:
                forget = False
            else:
                np.add.at(sums, keys, c)
            self.counts["push"] += 1
            self.counts["pushed_keys"] += n
        with self.lock:
            self.sums.append(sums)

    def trainer(self, rng: np.random.Generator) -> None:
        while self.running():
            keys = np.concatenate([rng.integers(0, HOT, 64),
                                   COLD_BASE + rng.integers(0, COLD_KEYS, 256)])
            w = _ops.sparse_table_pull(self.h, keys, True, dim=DIM).numpy()
            self.check_rows(keys, w, "training pull")
            self.counts["pull_train"] += 1

    def reader(self, rng: np.random.Generator) -> None:
        while self.running():
            keys = np.concatenate([rng.integers(0, HOT, 256),
                                   COLD_BASE + rng.integers(0, COLD_KEYS, 64)])
            w = _ops.sparse_table_pull(self.h, keys, False, dim=DIM).numpy()
            self.check_rows(keys, w, "inference pull")
            self.counts["pull_infer"] += 1

    def exporter(self, rng: np.random.Generator) -> None:
        while self.running():
            keys, cursor = [], 0
            while cursor != -1:
                k, w, _, _, cursor = _ops.sparse_table_export(
                    self.h, cursor, int(rng.integers(1, 2000)), dim=DIM)
                k = k.numpy()
                self.check_rows(k, w.numpy(), "export")
                keys.append(k)
                self.counts["export_call"] += 1
            keys = np.concatenate(keys)
            hot = np.bincount(keys[keys < HOT], minlength=HOT)
            if (hot != 1).any():
                k = int(np.flatnonzero(hot != 1)[0])
                self.fail(f"an export walk returned live hot key {k} "
                          f"{hot[k]} times")
            # A cold key evicted and pulled again during the walk is a new
            # row, possibly at a row id the cursor has not passed yet: the
            # contract (rows live for the whole walk come exactly once) lets
            # it appear twice. Counted, not failed.
            cold = keys[keys >= HOT]
            self.counts["cold_key_recreated_in_walk"] += len(cold) - len(
                np.unique(cold))
            self.counts["export_walk"] += 1

    def evictor(self, rng: np.random.Generator) -> None:
        while self.running():
            n = int(_ops.sparse_table_evict(self.h, 1.0, 0.5, 0, 0,
                                            compact=False))
            self.counts["evict"] += 1
            self.counts["evicted_rows"] += n
            time.sleep(float(rng.uniform(0, 0.02)))

    def watcher(self, rng: np.random.Generator) -> None:
        while self.running():
            if int(_ops.sparse_table_size(self.h)) < HOT:
                self.fail("size dropped below the number of hot keys")
            if int(_ops.sparse_table_memory_bytes(self.h)) <= 0:
                self.fail("memory_bytes not positive")
            self.counts["size"] += 1
            time.sleep(0.001)

    # --------------------------------------------------------------- checks
    def final_checks(self) -> dict:
        keys, w, _, meta, nxt = (x.numpy() for x in _ops.sparse_table_export(
            self.h, 0, 2**62, dim=DIM))
        size = int(_ops.sparse_table_size(self.h))
        if int(nxt) != -1 or len(np.unique(keys)) != len(keys):
            self.fail("final export repeated a key or did not finish")
        if size != len(keys):
            self.fail(f"size {size} != {len(keys)} live keys exported")
        order = np.argsort(keys)
        keys, w, meta = keys[order], w[order], meta[order]
        hot = keys < HOT
        if not np.array_equal(keys[hot], np.arange(HOT)):
            self.fail("final export lacks hot keys")
        total = np.sum(self.sums, axis=0)
        want = (-LR * total)[:, None].astype(np.float32) * RAMP
        wrong = np.flatnonzero((w[hot] != want).any(axis=1))
        if len(wrong):
            k = int(wrong[0])
            self.fail(f"{len(wrong)} hot keys lost or doubled updates; key {k}: "
                      f"{w[hot][k]} != {want[k]}")
        live_before = size
        _ops.sparse_table_evict(self.h, 1.0, 0.5, 0, 0, compact=True)
        after = int(_ops.sparse_table_size(self.h))
        if after != HOT:
            self.fail(f"after evicting cold rows size is {after}, not {HOT}")
        return {"live_rows_at_end": live_before, "hot_keys": HOT}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--threads", type=int, default=8,
                   help="pushers; plus 2 trainers, 1 reader, 2 exporters, "
                        "1 evictor, 1 watcher")
    p.add_argument("--num-stripes", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--self-test-forget-push", action="store_true",
                   help="one pusher does not record its first push: the "
                        "final check must report lost updates")
    a = p.parse_args()
    s = Stress(a.num_stripes, a.seconds, a.seed)
    s.forget_one_push = a.self_test_forget_push
    roles = ([s.pusher] * a.threads + [s.trainer] * 2 + [s.reader]
             + [s.exporter] * 2 + [s.evictor, s.watcher])

    def guarded(fn, i):
        try:
            fn(np.random.default_rng([a.seed, i]))
        except Exception as e:  # noqa: BLE001 - any op error is a failure
            s.fail(f"{fn.__name__}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=guarded, args=(fn, i))
               for i, fn in enumerate(roles)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.monotonic() - start
    result = s.final_checks() if not s.errors else {}
    s.counts["per_second_push_keys"] = int(s.counts["pushed_keys"] / seconds)
    report = {"ok": not s.errors, "seconds": round(seconds, 1),
              "threads": len(threads), "num_stripes": a.num_stripes,
              "ops": dict(s.counts), **result, "errors": s.errors[:5]}
    print("STRESS " + json.dumps(report), flush=True)
    return 0 if not s.errors else 1


if __name__ == "__main__":
    sys.exit(main())
