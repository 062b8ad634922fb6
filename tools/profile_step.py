"""Per-op breakdown of the tnet SPARSE-HEAVY training step (issue 29).

    python tools/profile_step.py --steps 15 --trace /tmp/trace_a
    python tools/profile_step.py --parse before=/tmp/trace_a after=/tmp/trace_b
    python tools/profile_step.py --timeline /tmp/trace_a --step 7
    PYTHONPATH=CHECKOUT python tools/profile_step.py --no_trace --blocks 3

The first form builds the SPARSE-HEAVY tnet model of tools/_sparse_heavy.py
on synthetic batches (M1..M4 as RaggedTensor, as bench_train; --config
wd400: bench_train's WD-400 model on its in-memory batches), times
--steps untraced steps (wall and process CPU per step), then traces as
many with tf.profiler and prints the breakdown. The second prints the
breakdowns of several traces side by side (e.g. two commits traced in
turn). Per op instance the duration is summed per step; a type's figure
is the sum over its instances of the min (and the median) over the steps:
on a shared machine the min is the op without preemption. Groups: the
sparse kernels (deep table / wide table), the DNN (matmuls and their
gradients) and glue (everything else in the step). The third prints one
traced step op by op in time order (start, duration, thread): the ops the
step waits on one after the other are its critical path. The fourth only
times untraced steps (--blocks timings of --steps steps): run it at two
checkouts in turn for an A/B of the whole step.
"""
import argparse
import collections
import glob
import os
import shutil
import statistics
import sys
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # PYTHONPATH first

WRAP = ("ExecutorState::Process", "KernelAndDeviceFunc::Run", "EagerLocalExecute")
SPARSE = {"TnetUnique", "SparseTablePull", "SparseTablePush",
          "SparseTablePullV2", "SparseTablePushV2", "TnetEmbedCombine",
          "TnetEmbedCombineGrad", "TnetSegmentCombine", "TnetSegmentCombineGrad"}
DNN = {"MatMul", "_FusedMatMul", "BiasAddGrad", "ReluGrad"}


def events(d):
    """(steps [(start, end) ps], ops [(start ps, name, ms, thread line)])."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2  # noqa: PLC0415
    path = sorted(glob.glob(d + "/**/*.xplane.pb", recursive=True))[-1]
    xs = xplane_pb2.XSpace(); xs.ParseFromString(open(path, "rb").read())
    plane = next(p for p in xs.planes if p.name == "/host:CPU")
    md = {k: v.name for k, v in plane.event_metadata.items()}
    steps, evs = [], []
    for li, line in enumerate(plane.lines):
        for ev in line.events:
            name = md.get(ev.metadata_id, "?")
            t0 = line.timestamp_ns * 1000 + ev.offset_ps
            if "EagerLocalExecute: __inference_train" in name:
                steps.append((t0, t0 + ev.duration_ps))
            elif ":" in name and not name.startswith(WRAP) and not name.startswith("$"):
                evs.append((t0, name, ev.duration_ps / 1e9, li))
    return sorted(set(steps)), evs


def timeline(d, which, floor_ms=0.2):
    """One traced step's ops of at least floor_ms, in start order: where
    the step waits on one op (the critical path) and what runs beside it."""
    steps, evs = events(d)
    if not 0 <= which < len(steps):
        sys.exit(f"--step {which}: {d} holds traced steps 0..{len(steps) - 1}")
    a, b = steps[which]
    print(f"step {which} of {len(steps)}: {(b - a) / 1e9:.1f} ms; "
          "start ms, duration ms, thread, op")
    for t0, name, ms, li in sorted(evs):
        if a <= t0 <= b and ms >= floor_ms and "Iterator" not in name:
            print(f"{(t0 - a) / 1e9:7.2f} {ms:6.2f}  {li:3d}  {name[:100]}")


def load(d):
    steps, evs = events(d)
    per = collections.defaultdict(lambda: [0.0] * len(steps))
    for t0, name, d, _ in evs:
        for i, (a, b) in enumerate(steps):
            if a <= t0 <= b:
                per[name][i] += d; break
    wall = [(b - a) / 1e9 for a, b in steps]
    return per, wall


def group(name):
    # The deep layer is called first, so its push is SparseTablePushV2 and
    # the wide one SparseTablePushV2_1 (other ops carry their layer scope).
    typ = name.rsplit(":", 1)[1]
    if typ in SPARSE:
        if typ.startswith("SparseTablePush"):
            return f"sparse kernels: {typ}" + (" (wide)" if name.startswith(f"{typ}_1") else " (deep)")
        return f"sparse kernels: {typ}" + (" (wide)" if "wide/" in name else " (deep)")
    if typ in DNN:
        return "DNN: " + typ
    return "glue: " + typ


def report(pairs):
    res = {}
    for label, d in pairs:
        per, wall = load(d)
        g = collections.defaultdict(lambda: [0.0, 0.0])
        for name, ds in per.items():
            k = group(name); g[k][0] += min(ds); g[k][1] += statistics.median(ds)
        res[label] = (g, wall)
    labels = list(res)
    keys = sorted({k for g, _ in res.values() for k in g}, key=lambda k: -max(res[l][0].get(k, [0, 0])[0] for l in labels))
    print("| op (type) | " + " | ".join(f"{l} min / median ms" for l in labels) + " |")
    print("|---|" + "---:|" * len(labels))
    tot = {l: collections.defaultdict(lambda: [0.0, 0.0]) for l in labels}
    for k in keys:
        vals = [res[l][0].get(k, [0, 0]) for l in labels]
        if max(v[0] for v in vals) < 0.15 and max(v[1] for v in vals) < 0.3:
            for l, v in zip(labels, vals):
                tot[l]["glue: other"][0] += v[0]; tot[l]["glue: other"][1] += v[1]
            continue
        print(f"| {k} | " + " | ".join(f"{v[0]:.2f} / {v[1]:.2f}" for v in vals) + " |")
    for l in labels:
        for k, v in res[l][0].items():
            grp = k.split(":")[0]
            tot[l]["= " + grp][0] += v[0]; tot[l]["= " + grp][1] += v[1]
            tot[l]["= all ops"][0] += v[0]; tot[l]["= all ops"][1] += v[1]
    print("| glue: other (each < 0.15 ms) | " + " | ".join(f"{tot[l]['glue: other'][0]:.2f} / {tot[l]['glue: other'][1]:.2f}" for l in labels) + " |")
    for k in ("= sparse kernels", "= DNN", "= glue", "= all ops"):
        print(f"| **{k[2:]}** | " + " | ".join(f"**{tot[l][k][0]:.1f} / {tot[l][k][1]:.1f}**" for l in labels) + " |")
    print("| step wall (min / median) | " + " | ".join(f"{min(res[l][1]):.1f} / {statistics.median(res[l][1]):.1f}" for l in labels) + " |")


def trace(steps, examples, trace_dir, blocks=1, form="ragged",
          config="sparse_heavy"):
    import tnet  # noqa: F401,PLC0415  (before TensorFlow)
    import tensorflow as tf  # noqa: PLC0415
    from tnet.data.synthetic import SyntheticCriteo  # noqa: PLC0415
    from tools import _sparse_heavy as sh  # noqa: PLC0415
    from tools import bench_train as bt  # noqa: PLC0415
    if config == "wd400":  # bench_train's WD-400 model and in-memory batches
        f, y, _ = SyntheticCriteo(seed=0, scale=1.0).batch(examples, "train")
        ds = bt.tf_dataset(f, y, 4096, repeat=True)
        fn = bt.build_tnet(0.05).make_train_function()
    else:
        _, multi, _ = sh.columns()
        gen = SyntheticCriteo(seed=0, scale=1.0, multi_valued=sh.MULTI_VALUED)
        f, y, _ = gen.batch(examples, "train")
        ds = bt.sparse_heavy_dataset(f, y, 4096, multi, form).repeat().prefetch(4)
        fn = sh.build_tnet(0.05).make_train_function()
    it = iter(ds)

    def timed(n):
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(n):
            logs = fn(it)
        _ = {k: v.numpy() for k, v in logs.items()}
        return ((time.perf_counter() - t0) / n * 1e3,
                (time.process_time() - c0) / n * 1e3)

    timed(5)  # trace, create the frequent rows
    for _ in range(blocks):
        wall, cpu = timed(steps)
        print(f"untraced: {wall:.1f} ms wall/step, {cpu:.1f} ms CPU/step, "
              f"{4096 / wall * 1e3:.0f} examples/s", flush=True)
    if trace_dir is None:
        return
    shutil.rmtree(trace_dir, ignore_errors=True)
    tf.profiler.experimental.start(trace_dir)
    wall, cpu = timed(steps)
    tf.profiler.experimental.stop()
    print(f"traced: {wall:.1f} ms wall/step, {cpu:.1f} ms CPU/step")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--examples", type=int, default=4096 * 16)
    p.add_argument("--trace", default="/tmp/tnet_profile_step")
    p.add_argument("--parse", nargs="+", metavar="LABEL=DIR")
    p.add_argument("--no_trace", action="store_true",
                   help="only the untraced timing (for alternating A/B runs)")
    p.add_argument("--blocks", type=int, default=1,
                   help="untraced timings of --steps steps each")
    p.add_argument("--timeline", metavar="DIR",
                   help="print one traced step of DIR op by op, in time order")
    p.add_argument("--step", type=int, default=7,
                   help="which traced step --timeline prints")
    p.add_argument("--form", choices=("ragged", "padded"), default="ragged",
                   help="M1..M4 as RaggedTensor or [B, 50] padded with -1")
    p.add_argument("--config", choices=("sparse_heavy", "wd400"),
                   default="sparse_heavy",
                   help="the model: SPARSE-HEAVY, or bench_train's WD-400")
    args = p.parse_args()
    if args.timeline:
        timeline(args.timeline, args.step)
        return 0
    if args.parse:
        report([a.split("=", 1) for a in args.parse])
        return 0
    trace(args.steps, args.examples, None if args.no_trace else args.trace,
          args.blocks, args.form, args.config)
    if args.no_trace:
        return 0
    report([("this commit", args.trace)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
