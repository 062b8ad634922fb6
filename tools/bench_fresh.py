"""Fresh models in serving: a delta against a full export + load.

    python tools/bench_fresh.py --rows 10000000 --changed 0.01 [--out FILE]

One table of `--rows` rows (dim 16, filled with import_rows: no training),
one tiny model over it. Measures, side by side in one run:

* full: export_for_serving(updatable=True) seconds + tf.saved_model.load
  seconds, and the export's bytes;
* delta: `--changed` of the rows rewritten (last_step above the base),
  publish_delta seconds, follower apply seconds (in-process target), and
  the delta's bytes; ratio (publish + apply) / (export + load);
* serving p50/p99 of serving_default at batch 1/64/512 on the plain export
  and on the updatable one with the overlay at 0%, 1% and 10% of the base
  (10% = ten 1% deltas of distinct rows), the two called in turn call by
  call, and the p99 ratios;
* per delta (ten 1% deltas): publish and apply seconds and their sum;
  `delta_summary` gives the first delta (it includes the first call of
  `apply_delta`), the median delta (median of the per-delta sums) and the
  slowest delta (largest sum, with its own publish and apply), each with
  its ratio to export + load;
* freshness, MODELLED, not measured end to end: --fresh_samples times,
  one row changed on the trainer, then publish_delta, the follower's step
  and serving_default polled until the prediction changes (the pipeline,
  measured); to each sample are added two waits drawn uniformly, not
  slept: the publish period's phase (0..P, P = 60 s and 30 s) and the
  follower's poll phase (0..I, I = --follow_interval, the follower's
  default); p50/p99 over --model_draws draws, and the worst case P + I +
  the slowest pipeline;
* served memory: RSS of a fresh process that loads the export and
  applies every delta (before / after, per overlay row).

Writes JSON to bench/results/bench_fresh-<date>.json (or --out) with the
command, machine and versions. Targets (issue 27): publish + apply of a
1% delta <= 0.05x a full export + load; p99 with a 10% overlay <= 1.3x the
plain export's; freshness <= 60 s.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))

import numpy as np  # noqa: E402

import tnet as tn  # noqa: E402
import tensorflow as tf  # noqa: E402

from tnet import feature_column as fc  # noqa: E402
from tnet.serving import deltas as delta_files  # noqa: E402
from tnet.serving import follow  # noqa: E402
from tools import _bench_common as common  # noqa: E402

DIM = 16


class One(tn.Model):
    def __init__(self):
        super().__init__()
        self.embed = tn.layers.EmbeddingFeatures(
            [fc.embedding_column(fc.category_column("id"), DIM)])
        self.out = tf.keras.layers.Dense(1)

    def call(self, features, training=False):
        return self.out(self.embed(features, training=training))


def _dir_bytes(path):
    return sum(os.path.getsize(os.path.join(d, f))
               for d, _, fs in os.walk(path) for f in fs)


def _fill(table, keys, step, rng):
    n = len(keys)
    meta = np.zeros((n, 3), np.float64)
    meta[:, 2] = step
    for s in range(0, n, 1 << 20):
        e = min(n, s + (1 << 20))
        table.import_rows(keys[s:e], rng.normal(size=(e - s, DIM)).astype(
            np.float32), np.zeros((e - s, table.num_slots), np.float32),
            meta[s:e])


def _latency(models, rows, rng, calls):
    """serving_default p50/p99 (ms) of each of `models` ({name: loaded}) at
    batch 1/64/512, the models called in turn on the same ids, call by
    call, so drift of the machine hits all of them alike."""
    fns = {n: m.signatures["serving_default"] for n, m in models.items()}
    out = {n: {} for n in models}
    for batch in (1, 64, 512):
        ids = tf.constant(rng.integers(0, rows, (calls, batch)), tf.int64)
        times = {n: [] for n in fns}
        for fn in fns.values():
            fn(id=ids[0])
        for i in range(calls):
            for n, fn in fns.items():
                t = time.perf_counter()
                fn(id=ids[i])
                times[n].append(time.perf_counter() - t)
        for n in fns:
            out[n][str(batch)] = {
                "p50_ms": 1e3 * float(np.percentile(times[n], 50)),
                "p99_ms": 1e3 * float(np.percentile(times[n], 99))}
    return out


def _served_rss(export, cwd):
    """RSS of a fresh process that loads `export` and applies its deltas
    (the follower's in-process target): before and after the deltas."""
    code = (
        "import json, sys, tensorflow as tf\n"
        "sys.path.insert(0, %r)\n"
        "from tools import _bench_common as bc\n"
        "from tnet.serving import follow\n"
        "loaded = tf.saved_model.load(%r)\n"
        "bc.release_free_memory(); before = bc.rss_bytes()\n"
        "follow.Follower(%r, [follow.InProcessTarget(loaded)],"
        " say=lambda m: None).step()\n"
        "bc.release_free_memory(); after = bc.rss_bytes()\n"
        "print(json.dumps({'before': before, 'after': after}))\n"
        % (os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
           export, export))
    import subprocess  # noqa: PLC0415
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, env=env, cwd=cwd, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _delta_summary(deltas, full_s):
    """First, median and slowest delta: the median is of the per-delta
    sums publish + apply, the slowest is the delta with the largest sum
    (its own publish and apply, never maxima of different deltas)."""
    totals = [d["publish_s"] + d["apply_s"] for d in deltas]
    slowest = int(np.argmax(totals))
    out = {
        "first": {"delta": 1, "publish_s": deltas[0]["publish_s"],
                  "apply_s": deltas[0]["apply_s"], "total_s": totals[0]},
        "median": {"total_s": float(np.median(totals)),
                   "publish_s_median": float(np.median(
                       [d["publish_s"] for d in deltas])),
                   "apply_s_median": float(np.median(
                       [d["apply_s"] for d in deltas]))},
        "slowest": {"delta": slowest + 1,
                    "publish_s": deltas[slowest]["publish_s"],
                    "apply_s": deltas[slowest]["apply_s"],
                    "total_s": totals[slowest]},
    }
    for v in out.values():
        v["ratio_vs_export_load"] = v["total_s"] / full_s
    return out


def _freshness_model(pipeline, interval, draws, periods=(60.0, 30.0)):
    """Seconds from a push to a changed prediction, modelled: a measured
    pipeline sample plus the publish period's phase U(0, P) plus the
    follower's poll phase U(0, interval), neither slept."""
    rng = np.random.default_rng(1)
    out = {"modelled": True, "follow_interval_s": interval,
           "pipeline_s": {"p50": float(np.percentile(pipeline, 50)),
                          "p99": float(np.percentile(pipeline, 99)),
                          "max": float(np.max(pipeline)),
                          "samples": len(pipeline)}}
    for period in periods:
        total = (rng.choice(np.asarray(pipeline), draws)
                 + rng.uniform(0, period, draws)
                 + rng.uniform(0, interval, draws))
        out[f"period_{period:g}s"] = {
            "p50_s": float(np.percentile(total, 50)),
            "p99_s": float(np.percentile(total, 99)),
            "worst_s": period + interval + float(np.max(pipeline))}
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--changed", type=float, default=0.01)
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--fresh_samples", type=int, default=20)
    p.add_argument("--follow_interval", type=float,
                   default=follow.DEFAULT_INTERVAL,
                   help="the follower's poll interval in the freshness "
                        "model (seconds)")
    p.add_argument("--model_draws", type=int, default=100_000)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    model = One()
    model.compile(tn.optimizer.Adagrad(0.1))
    model({"id": tf.constant([0], tf.int64)})
    table = model.tables()["id"]
    _fill(table, np.arange(args.rows, dtype=np.int64), 0, rng)
    model.optimizer.iterations.assign(1)
    work = tempfile.mkdtemp(prefix="bench_fresh-", dir=os.environ.get(
        "BENCH_TMP", tempfile.gettempdir()))
    res = {"rows": args.rows, "dim": DIM, "changed": args.changed}
    plain = os.path.join(work, "plain", "1")
    tn.serving.export_for_serving(model, plain)
    t = time.perf_counter()
    export = os.path.join(work, "fresh", "1")
    tn.serving.export_for_serving(model, export, updatable=True)
    res["export_s"] = time.perf_counter() - t
    res["export_bytes"] = _dir_bytes(export)
    t = time.perf_counter()
    loaded = tf.saved_model.load(export)
    res["load_s"] = time.perf_counter() - t
    target = follow.InProcessTarget(loaded)
    follower = follow.Follower(export, [target], say=lambda m: None)
    plain_loaded = tf.saved_model.load(plain)
    lat = _latency({"plain": plain_loaded, "overlay_0": loaded}, args.rows,
                   rng, args.calls)
    per = int(args.rows * args.changed)
    order = rng.permutation(args.rows)
    deltas = []
    for i in range(10):
        step = int(model.optimizer.iterations.numpy())
        _fill(table, order[i * per:(i + 1) * per].astype(np.int64), step, rng)
        model.optimizer.iterations.assign(step + 1)
        t = time.perf_counter()
        path = tn.serving.publish_delta(model, export, compact_at=None)
        publish = time.perf_counter() - t
        t = time.perf_counter()
        follower.step()
        apply = time.perf_counter() - t
        deltas.append({"publish_s": publish, "apply_s": apply,
                       "bytes": _dir_bytes(path)})
        if i == 0:
            lat["overlay_1pct"] = _latency(
                {"plain": plain_loaded, "overlay": loaded}, args.rows, rng,
                args.calls)
    lat["overlay_10pct"] = _latency(
        {"plain": plain_loaded, "overlay": loaded}, args.rows, rng,
        args.calls)
    res["latency"] = lat
    res["p99_ratio_overlay_vs_plain"] = {
        key: {b: lat[key]["overlay"][b]["p99_ms"]
              / lat[key]["plain"][b]["p99_ms"] for b in ("1", "64", "512")}
        for key in ("overlay_1pct", "overlay_10pct")}
    res["deltas"] = deltas
    # Freshness: a row changed on the trainer until the target serves it.
    # The publish period is not slept: a periodic publisher's wait for the
    # next publish is uniform over the period, drawn here and added to the
    # measured publish + apply + first changed prediction.
    pipeline = []
    probe = np.array([int(order[-1])], np.int64)  # never in a delta yet
    fn = loaded.signatures["serving_default"]
    for k in range(args.fresh_samples):
        before = fn(id=tf.constant(probe))["prediction"].numpy()
        step = int(model.optimizer.iterations.numpy())
        t = time.perf_counter()
        _fill(table, probe, step, rng)
        model.optimizer.iterations.assign(step + 1)
        tn.serving.publish_delta(model, export, compact_at=None)
        follower.step()
        while np.array_equal(fn(id=tf.constant(probe))["prediction"].numpy(),
                             before):
            time.sleep(0.001)
        pipeline.append(time.perf_counter() - t)
    res["freshness"] = _freshness_model(pipeline, args.follow_interval,
                                        args.model_draws)
    # Rows the overlay holds: the rows of the deltas (distinct but for the
    # freshness probe's one key, published each sample).
    overlay_rows = sum(
        c["rows"] + c["deleted"] for v in delta_files.list_deltas(export)
        for c in delta_files.read_manifest(export, v)["tables"].values())
    overlay_rows -= max(0, args.fresh_samples - 1)
    mem = _served_rss(export, work)
    res["served_memory"] = dict(mem, overlay_rows=overlay_rows,
                                bytes_per_overlay_row=(
                                    (mem["after"] - mem["before"])
                                    / max(1, overlay_rows)))
    res["delta_summary"] = _delta_summary(deltas,
                                          res["export_s"] + res["load_s"])
    res["run"] = common.run_info()
    res["command"] = " ".join(sys.argv)
    out = args.out or common.default_out_path("bench_fresh")
    with open(out, "w") as f:
        json.dump(res, f, indent=2)
    print(json.dumps({k: v for k, v in res.items() if k != "run"}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
