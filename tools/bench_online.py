"""Freshness end to end: from a click to a served prediction, measured.

    python tools/bench_online.py [--rate 10000] [--interval 2] [--probes 60]
                                 [--cluster [2x2]]
                                 [--out bench/results/bench_online-DATE.json]

Processes (all on 127.0.0.1, started by this script):

* a writer (a thread here) lands a CSV file every `--interval` seconds
  holding `--rate` x interval timestamped click events (user_id, item_id,
  click), written under a hidden name and renamed into place; from the
  `--warmup` files on, each file also holds `--new_clicks` clicks on one
  never-seen item id, the first at a known time inside the file's
  interval (one probe per file);
* the trainer, `python -m tnet.train --stream=DIR --export_dir=...
  --publish_every_seconds=P --publish_compact_at=0` (it exports the base
  once the first file has landed and publishes a delta as soon as it has
  caught up with the landed files, at least every P s);
* a PredictionService (tests/programs/predict_server.py) serving that
  base, in a process that never imports tnet;
* the follower, `python -m tnet.serving.follow --interval F` applying the
  deltas to that server over gRPC;
* a prober (a thread here) asking the server every `--probe_every`
  seconds for the prediction of every new id landed so far beside a
  never-seen control id (same user): a new id's prediction equals the
  control's until its row is served, so the first answer where they
  differ is the moment it is served.

Per probe: file-ready-to-served (the file's rename until that answer) and
click-to-served (the new id's first click event time until that answer;
it also holds the writer's partition interval). p50 and p99 of each.
The trainer's input lag (its `tnet_stream_lag_seconds`: now minus the
newest click time trained, from the files' `event_time` column through
`--event_time_feature`), sampled every `--lag_every` s once a click of
the timed run is trained.
Then training throughput on a backlog of `--backlog_files` landed files,
with publishing every P s and without, in `--repeats` pairs (which case
runs first alternates; events/s between the end of the first and of the
last file, from the ledger's times; the ratio of the medians and the
median of the paired ratios); and rows and bytes per delta of the live
run. `--throughput_pair` runs only the throughput pairs.

`--cluster` (2x2, or PSxWORKERS) runs every trainer as the chief of a
local cluster on 127.0.0.1 (`python -m tnet.launch --ps 2 --workers 2 --
python -m tnet.train --stream=...`: the chief reads the files and hands
each batch to a worker); results go to bench_online_cluster-DATE.

Targets (issue 55, 2-core machine, >= 10k events/s): file-ready-to-served
p50 <= 5 s, p99 <= 15 s (one process), p99 <= 30 s (2 ps x 2 workers);
throughput while publishing every 5 s >= 0.9x without. Writes JSON (+ .md)
to bench/results/.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))

import numpy as np  # noqa: E402

from tools import _bench_common as common  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERVER = os.path.join(ROOT, "tests", "programs", "predict_server.py")
SPEC = {"defaults": {"dim": 8, "table": "embedding"},
        "features": [{"name": "click", "kind": "label", "dtype": "int64"},
                     {"name": "user_id", "kind": "id", "dtype": "int64"},
                     {"name": "item_id", "kind": "id", "dtype": "int64"},
                     # Unix seconds of each click: the trainer's input lag
                     # (--event_time_feature; the model does not get it).
                     {"name": "event_time", "kind": "dense",
                      "dtype": "float32"}]}
USERS, ITEMS = 100_000, 10_000
NEW_BASE = 5_000_000  # new item ids: NEW_BASE + file number
CONTROL = 4_999_999  # never in any file
PROBE_USER = 7


class Clicks:
    """Events with a known logistic click model of the ids."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        truth = np.random.default_rng(1)
        self.user_bias = truth.normal(0, 1, USERS)
        self.item_bias = truth.normal(-1, 1, ITEMS)

    def events(self, n: int, t0: float, t1: float):
        """(times, users, items, clicks) of n events in [t0, t1)."""
        times = np.sort(self.rng.uniform(t0, t1, n))
        users = self.rng.integers(0, USERS, n)
        items = np.minimum(self.rng.zipf(1.3, n) - 1, ITEMS - 1)
        logit = self.user_bias[users] + self.item_bias[items]
        clicks = (self.rng.random(n) < 1 / (1 + np.exp(-logit))).astype(int)
        return times, users, items, clicks


def write_csv(path: str, times, users, items, clicks) -> None:
    lines = ["click,user_id,item_id,event_time"]
    lines += [f"{c},{u},{i},{t:.3f}" for c, u, i, t in zip(
        clicks.tolist(), users.tolist(), items.tolist(), times.tolist())]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def land(directory: str, name: str, times, users, items, clicks) -> float:
    """Writes under a hidden name, renames into place; the rename time."""
    tmp = os.path.join(directory, f".{name}.tmp")
    write_csv(tmp, times, users, items, clicks)
    os.rename(tmp, os.path.join(directory, name))
    return time.time()


def _env(with_tnet: bool = True) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    if with_tnet:
        env["PYTHONPATH"] = ROOT
    return env


def trainer_cmd(work: str, data: str, name: str, args, publish: bool,
                idle: float = 0.0) -> list:
    """The trainer's command: tnet.train in one process, or with
    --cluster as the chief of a local cluster (tnet.launch)."""
    launch = []
    if args.cluster:
        ps, workers = (int(x) for x in args.cluster.split("x"))
        launch = [sys.executable, "-m", "tnet.launch", "--ps", str(ps),
                  "--workers", str(workers), "--"]
    cmd = launch + [sys.executable, "-m", "tnet.train",
           f"--feature_spec={os.path.join(work, 'spec.json')}",
           "--format=csv", f"--stream={data}",
           f"--checkpoint_dir={os.path.join(work, name + '-ckpt')}",
           f"--model_dir={os.path.join(work, name + '-run')}",
           f"--batch_size={args.batch_size}", "--shuffle_buffer=0",
           f"--hidden_units={args.hidden_units}",
           f"--stream_poll_secs={args.poll}",
           f"--checkpoint_every_seconds={args.checkpoint_every}",
           "--event_time_feature=event_time"]
    if idle:
        cmd.append(f"--stream_idle_secs={idle}")
    if publish:
        cmd += [f"--export_dir={os.path.join(work, name + '-export')}",
                f"--publish_every_seconds={args.publish_every}",
                "--publish_compact_at=0"]
    return cmd


def _wait(predicate, timeout: float, what: str, procs=()):
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"{what}: {p.args[:3]} exited "
                                   f"{p.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: timed out after {timeout:.0f} s")
        time.sleep(0.05)


def _stop_trainer(proc, log_path: str, timeout: float = 300.0) -> None:
    """SIGTERM to the trainer: under --cluster to the chief itself (its
    pid from the launcher's log line), which checkpoints, writes its
    summary and exits; the launcher then stops the ps and workers."""
    if proc is None or proc.poll() is not None:
        return
    chief = None
    for line in open(log_path, errors="replace"):
        if line.startswith("[launch] chief pid="):
            chief = int(line.split("=", 1)[1])
    if chief is None:
        _stop(proc, timeout=timeout)
        return
    try:
        os.kill(chief, signal.SIGTERM)
        proc.wait(timeout)
    except ProcessLookupError:
        _stop(proc, timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(proc, timeout=60)


def _stop(proc, sig=signal.SIGTERM, timeout=60.0):
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def pct(values, q):
    return float(np.percentile(np.asarray(values, float), q)) if values \
        else None


# ------------------------------------------------------------ freshness
def freshness(args, work: str) -> dict:
    import grpc  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415
    from tensorflow_serving.apis import (  # noqa: PLC0415
        predict_pb2, prediction_service_pb2_grpc)
    data = os.path.join(work, "live")
    os.makedirs(data)
    clicks = Clicks(seed=0)
    per_file = int(round(args.rate * args.interval))
    logs = os.path.join(work, "logs")
    os.makedirs(logs, exist_ok=True)
    procs = {}
    landed = {}  # file number -> dict(ready, first_click, new_id)
    served = {}  # file number -> served time
    lags = []  # the trainer's tnet_stream_lag_seconds, sampled
    stop = threading.Event()
    errors = []
    start = time.time()

    def one_file(i: int, t0: float, t1: float):
        times, users, items, y = clicks.events(per_file, t0, t1)
        record = {"events": per_file}
        if i >= args.warmup:
            k = args.new_clicks
            at = np.sort(clicks.rng.uniform(t0, t1, k))
            pos = np.searchsorted(times, at)
            times = np.insert(times, pos, at)
            users = np.insert(users, pos, clicks.rng.integers(0, USERS, k))
            items = np.insert(items, pos, NEW_BASE + i)
            y = np.insert(y, pos, 1)
            record.update(new_id=NEW_BASE + i, first_click=float(at[0]),
                          events=per_file + k)
        record["ready"] = land(data, f"clicks-{i:06d}.csv", times, users,
                               items, y)
        record["newest_event"] = float(times[-1])
        landed[i] = record

    # The first file (seen ids only) lets the trainer export its base.
    one_file(0, start - args.interval, start)
    n_files = args.warmup + args.probes

    def writer():
        try:
            for i in range(1, n_files):
                t0 = start + (i - 1) * args.interval
                t1 = t0 + args.interval
                while not stop.is_set() and time.time() < t1:
                    time.sleep(min(0.05, max(0.0, t1 - time.time())))
                if stop.is_set():
                    return
                one_file(i, t0, t1)
        except Exception as e:  # noqa: BLE001
            errors.append(f"writer: {e!r}")

    def prober(address: str):
        try:
            channel = grpc.insecure_channel(address)
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            while not stop.is_set():
                waiting = sorted(i for i in list(landed)
                                 if "new_id" in landed[i] and i not in served)
                if waiting:
                    ids = [landed[i]["new_id"] for i in waiting] + [CONTROL]
                    req = predict_pb2.PredictRequest()
                    req.model_spec.name = "ranker"
                    req.model_spec.signature_name = "serving_default"
                    req.inputs["user_id"].CopyFrom(tf.make_tensor_proto(
                        np.full(len(ids), PROBE_USER, np.int64)))
                    req.inputs["item_id"].CopyFrom(tf.make_tensor_proto(
                        np.asarray(ids, np.int64)))
                    resp = stub.Predict(req, timeout=30)
                    now = time.time()
                    out = tf.make_ndarray(next(iter(
                        resp.outputs.values()))).reshape(-1)
                    for i, p in zip(waiting, out[:-1]):
                        # Identical rows at two places of a batch may
                        # differ in their last bits (the matmul's blocking):
                        # a served row moves the prediction far more.
                        if abs(float(p) - float(out[-1])) > args.moved:
                            served[i] = now
                stop.wait(args.probe_every)
        except Exception as e:  # noqa: BLE001
            errors.append(f"prober: {e!r}")

    def lag_sampler(url: str):
        import urllib.request  # noqa: PLC0415
        while not stop.is_set():
            try:
                text = urllib.request.urlopen(url, timeout=5).read().decode()
            except OSError:
                text = ""
            for line in text.splitlines():
                if line.startswith("tnet_stream_lag_seconds "):
                    lag = float(line.split()[1])
                    # Counted once a click of the timed run is trained
                    # (the first file's clicks predate the clock: startup).
                    if lag < time.time() - start:
                        lags.append(lag)
            stop.wait(args.lag_every)

    export_root = os.path.join(work, "live-export")
    threads = []
    try:
        with open(os.path.join(logs, "trainer.log"), "w") as log:
            procs["trainer"] = subprocess.Popen(
                trainer_cmd(work, data, "live", args, publish=True)
                + ["--metrics_port=0"],
                cwd=work, env=_env(), stdout=log, stderr=subprocess.STDOUT)
        export = _wait(lambda: sorted(glob.glob(os.path.join(
            export_root, "*", "export_info.json"))), 600,
            "the trainer's base export", [procs["trainer"]])
        export = os.path.dirname(export[-1])
        port_file = os.path.join(work, "server.port")
        with open(os.path.join(logs, "server.log"), "w") as log:
            procs["server"] = subprocess.Popen(
                [sys.executable, SERVER, export, "ranker", port_file],
                cwd=work, env=_env(with_tnet=False), stdout=log,
                stderr=subprocess.STDOUT)
        _wait(lambda: os.path.exists(port_file), 300, "the server",
              [procs["server"]])
        address = f"127.0.0.1:{open(port_file).read().strip()}"
        with open(os.path.join(logs, "follower.log"), "w") as log:
            procs["follower"] = subprocess.Popen(
                [sys.executable, "-m", "tnet.serving.follow",
                 "--export_dir", export, "--target",
                 f"grpc://{address}/ranker",
                 f"--interval={args.follow_interval}"],
                cwd=work, env=_env(), stdout=log, stderr=subprocess.STDOUT)
        # The clock starts once the pipeline is up: the first file trained
        # and its delta applied (startup is not freshness).
        trainer_log = os.path.join(logs, "trainer.log")
        follower_log = os.path.join(logs, "follower.log")
        _wait(lambda: "clicks-000000.csv (" in open(trainer_log).read(),
              600, "the first file trained", list(procs.values()))
        _wait(lambda: "applied delta-" in open(follower_log).read(), 600,
              "the first delta applied", list(procs.values()))
        start = time.time()
        threads = [threading.Thread(target=writer, daemon=True),
                   threading.Thread(target=prober, args=(address,),
                                    daemon=True)]
        url = metrics_url(trainer_log)
        if url:
            threads.append(threading.Thread(target=lag_sampler, args=(url,),
                                            daemon=True))
        for t in threads:
            t.start()
        last_landing = start + n_files * args.interval
        _wait(lambda: (len(served) >= args.probes or errors
                       or time.time() > last_landing + args.timeout),
              n_files * args.interval + args.timeout + 60, "the probes",
              list(procs.values()))
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        _stop(procs.get("follower"))
        _stop_trainer(procs.get("trainer"), os.path.join(logs, "trainer.log"))
        _stop(procs.get("server"), signal.SIGKILL)
    if errors:
        raise RuntimeError("; ".join(errors))
    probes = sorted(i for i in landed if "new_id" in landed[i])
    ready = [served[i] - landed[i]["ready"] for i in probes if i in served]
    click = [served[i] - landed[i]["first_click"] for i in probes
             if i in served]
    deltas = delta_sizes(export)
    summary = json.load(open(os.path.join(work, "live-run", "summary.json")))
    later = [r for i, r in landed.items() if i > 0]
    span = (max(r["ready"] for r in later) - min(r["ready"] for r in later)
            + args.interval) if later else 0.0
    events = sum(r["events"] for r in later)
    return {
        "events_per_file": per_file, "interval_s": args.interval,
        "files": len(landed), "events": events,
        "events_per_s_landed": round(events / span, 1) if span else None,
        "probes": len(probes), "probes_served": len(ready),
        "file_ready_to_served_s": _stats(ready),
        "click_to_served_s": _stats(click),
        # Now minus the newest click time trained (the trainer's
        # --event_time_feature), sampled every lag_every s while files land.
        "input_lag_s": _stats(lags) | {"every_s": args.lag_every},
        "per_probe": [{"file": i, "ready_to_served_s": round(
            served[i] - landed[i]["ready"], 3) if i in served else None}
            for i in probes],
        "deltas": deltas,
        "trainer": {"examples": summary["streamed"]["examples"],
                    "files": summary["streamed"]["files"],
                    "published": len(summary.get("published", []))},
    }


def metrics_url(trainer_log: str):
    """The trainer's /metrics address, from its log line."""
    marker = "metrics on http://0.0.0.0:"
    for line in open(trainer_log):
        if marker in line:
            port = line.split(marker)[1].split("/")[0]
            return f"http://127.0.0.1:{port}/metrics"
    return None


def _stats(values) -> dict:
    return {"n": len(values), "p50": _r(pct(values, 50)),
            "p99": _r(pct(values, 99)), "max": _r(max(values) if values
                                                  else None),
            "min": _r(min(values) if values else None)}


def _r(x):
    return None if x is None else round(x, 3)


def delta_sizes(export: str) -> dict:
    from tnet.serving import deltas as fresh  # noqa: PLC0415
    rows, sizes = [], []
    for v in fresh.list_deltas(export):
        manifest = fresh.read_manifest(export, v)
        sizes.append(manifest["files"][fresh.PAYLOAD]["bytes"])
        payload = fresh.load_delta(export, v)
        rows.append(int(sum(a.shape[0] for k, a in payload.items()
                            if k.endswith("_keys"))))
    return {"count": len(rows),
            "rows_p50": pct(rows, 50), "rows_max": max(rows) if rows else None,
            "bytes_p50": pct(sizes, 50),
            "bytes_max": max(sizes) if sizes else None,
            "bytes_per_row": (round(sum(sizes) / max(1, sum(rows)), 1)
                              if rows else None)}


# ----------------------------------------------------------- throughput
def throughput(args, work: str) -> dict:
    data = os.path.join(work, "backlog")
    os.makedirs(data)
    os.makedirs(os.path.join(work, "logs"), exist_ok=True)
    clicks = Clicks(seed=1)
    per_file = int(round(args.rate * args.interval))
    now = time.time()
    for i in range(args.backlog_files):
        times, users, items, y = clicks.events(per_file, now, now + 1)
        land(data, f"clicks-{i:06d}.csv", times, users, items, y)
    runs = {"publishing": [], "not_publishing": []}
    for r in range(args.repeats):
        # Pairs alternate which case runs first (a drift of the machine's
        # load falls on both).
        order = ("not_publishing", "publishing")
        for case in (order if r % 2 == 0 else order[::-1]):
            name = f"tp-{case}-{r}"
            log_path = os.path.join(work, "logs", name + ".log")
            with open(log_path, "w") as log:
                res = subprocess.run(
                    trainer_cmd(work, data, name, args,
                                publish=case == "publishing", idle=3),
                    cwd=work, env=_env(), stdout=log,
                    stderr=subprocess.STDOUT, timeout=1800)
            if res.returncode != 0:
                raise RuntimeError(f"{name}: exit {res.returncode}; see "
                                   f"{log_path}")
            runs[case].append(_ledger_rate(os.path.join(work, name + "-ckpt"))
                              | {"published": _published(work, name)})
            shutil.rmtree(os.path.join(work, name + "-ckpt"))
    rates = {c: [x["examples_per_s"] for x in v] for c, v in runs.items()}
    ratio = (np.median(rates["publishing"]) / np.median(
        rates["not_publishing"]))
    paired = [a / b for a, b in zip(rates["publishing"],
                                    rates["not_publishing"])]
    return {"files": args.backlog_files, "examples_per_file": per_file,
            "publish_every_s": args.publish_every,
            "runs": runs, "median_examples_per_s": {
                c: round(float(np.median(v)), 1) for c, v in rates.items()},
            "ratio_publishing_over_not": round(float(ratio), 3),
            "paired_ratios": [round(x, 3) for x in paired],
            "median_paired_ratio": round(float(np.median(paired)), 3)}


def _published(work: str, name: str) -> int:
    path = os.path.join(work, name + "-run", "summary.json")
    return len(json.load(open(path)).get("published", []))


def _ledger_rate(ckpt: str) -> dict:
    sys.path.insert(0, ROOT)
    import tnet as tn  # noqa: PLC0415
    ledger = tn.saving.read_state(tn.saving.latest_checkpoint(ckpt), "stream")
    entries = sorted(ledger["files"].values(),
                     key=lambda e: e["consumed_unix"])
    examples = sum(e["examples"] for e in entries[1:])
    seconds = entries[-1]["consumed_unix"] - entries[0]["consumed_unix"]
    return {"examples": examples, "seconds": round(seconds, 3),
            "examples_per_s": round(examples / seconds, 1)}


# ---------------------------------------------------------------- main
def markdown(info: dict, res: dict, args) -> str:
    f, t = res.get("freshness"), res.get("throughput")
    lines = [common.header_markdown(info, "bench_online: click to served"),
             f"- load: `uptime` at start: {res['uptime_start']}; at end: "
             f"{res.get('uptime_end')}"]
    if f:
        lines += _freshness_markdown(f, args)
    if t:
        lines += _throughput_markdown(t, args)
    return "\n".join(lines)


def _trainer_kind(args) -> str:
    if not args.cluster:
        return "one process"
    ps, workers = args.cluster.split("x")
    return f"{ps} ps x {workers} workers on 127.0.0.1 (tnet.launch)"


def _freshness_markdown(f: dict, args) -> list:
    ready, click = f["file_ready_to_served_s"], f["click_to_served_s"]
    lag = f.get("input_lag_s") or _stats([])
    target = "p99 <= 30" if args.cluster else "p50 <= 5, p99 <= 15"
    return ["",
             f"Trainer: {_trainer_kind(args)}. "
             f"Writer: a file every {args.interval:g} s of "
             f"{f['events_per_file']} events ({args.rate:g} events/s; "
             f"{f['events_per_s_landed']} landed/s measured), "
             f"{f['files']} files; trainer --publish_every_seconds="
             f"{args.publish_every:g}, follower --interval="
             f"{args.follow_interval:g}, prober every {args.probe_every:g} s.",
             "", "| measured over probes | n | p50 | p99 | max | target |",
             "|---|---|---|---|---|---|",
             f"| file-ready-to-served (s) | {ready['n']} | {ready['p50']} | "
             f"{ready['p99']} | {ready['max']} | {target} |",
             f"| click-to-served (s) | {click['n']} | {click['p50']} | "
             f"{click['p99']} | {click['max']} | |",
             f"| trainer's input lag (s, sampled) | {lag['n']} | "
             f"{lag['p50']} | {lag['p99']} | {lag['max']} | |", "",
             f"Deltas: {f['deltas']['count']}, rows p50 "
             f"{f['deltas']['rows_p50']} (max {f['deltas']['rows_max']}), "
             f"bytes p50 {f['deltas']['bytes_p50']} (max "
             f"{f['deltas']['bytes_max']}), {f['deltas']['bytes_per_row']} "
             "bytes/row."]


def _throughput_markdown(t: dict, args) -> list:
    m = t["median_examples_per_s"]
    return ["", f"Throughput on a backlog of {t['files']} files x "
                  f"{t['examples_per_file']} events (median of "
                  f"{len(t['runs']['publishing'])} alternated runs): "
                  f"publishing every {args.publish_every:g} s "
                  f"{m['publishing']} examples/s, not publishing "
                  f"{m['not_publishing']} examples/s: "
                  f"ratio of the medians {t['ratio_publishing_over_not']}x, "
                  f"median of the paired ratios "
                  f"**{t.get('median_paired_ratio')}x** (target >= 0.9x; "
                  f"pairs {t['paired_ratios']})."]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=10_000, help="events/s")
    p.add_argument("--interval", type=float, default=2.0,
                   help="seconds between files (the partition interval)")
    p.add_argument("--warmup", type=int, default=5,
                   help="files before the first probe file")
    p.add_argument("--probes", type=int, default=60)
    p.add_argument("--new_clicks", type=int, default=20,
                   help="clicks of each new id in its file")
    p.add_argument("--batch_size", type=int, default=1024)
    p.add_argument("--hidden_units", default="64,32")
    p.add_argument("--poll", type=float, default=0.2,
                   help="the trainer's --stream_poll_secs")
    p.add_argument("--publish_every", type=float, default=5.0)
    p.add_argument("--checkpoint_every", type=float, default=60.0)
    p.add_argument("--follow_interval", type=float, default=0.2)
    p.add_argument("--probe_every", type=float, default=0.05)
    p.add_argument("--lag_every", type=float, default=0.5,
                   help="seconds between samples of the trainer's input "
                        "lag (now minus the newest click time trained)")
    p.add_argument("--moved", type=float, default=1e-4,
                   help="a prediction moved when it differs from the "
                        "control id's by more than this")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds after the last file to wait for probes")
    p.add_argument("--backlog_files", type=int, default=40)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--skip_throughput", action="store_true")
    p.add_argument("--skip_freshness", action="store_true")
    p.add_argument("--throughput_pair", action="store_true",
                   help="only the throughput pairs: the same backlog of "
                        "landed files trained publishing every "
                        "--publish_every s and not, alternated --repeats "
                        "times (events/s of each, their ratio)")
    p.add_argument("--cluster", nargs="?", const="2x2", default=None,
                   metavar="PSxWORKERS",
                   help="train on a local cluster of PS ps and WORKERS "
                        "workers on 127.0.0.1 (tnet.launch; the trainer "
                        "is its chief); --cluster alone: 2x2")
    p.add_argument("--keep", action="store_true", help="keep the work dir")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    if args.cluster is not None:
        parts = args.cluster.split("x")
        if len(parts) != 2 or not all(x.isdigit() and int(x) > 0
                                      for x in parts):
            p.error(f"--cluster takes PSxWORKERS (e.g. 2x2), got "
                    f"{args.cluster!r}")
    if args.throughput_pair:
        args.skip_freshness, args.skip_throughput = True, False
    info = common.run_info()
    uptime = subprocess.run(["uptime"], capture_output=True,
                            text=True).stdout.strip()
    work = tempfile.mkdtemp(prefix="bench_online-")
    with open(os.path.join(work, "spec.json"), "w") as f:
        json.dump(SPEC, f)
    res = {"uptime_start": uptime, "trainer": _trainer_kind(args)}
    out = args.out or common.default_out_path(
        "bench_online_cluster" if args.cluster else "bench_online")
    try:
        if not args.skip_freshness:
            res["freshness"] = freshness(args, work)
            print(json.dumps(res["freshness"]["file_ready_to_served_s"]),
                  flush=True)
            # Kept now: the throughput runs that follow are long.
            res["uptime_end"] = subprocess.run(
                ["uptime"], capture_output=True, text=True).stdout.strip()
            common.write_results(out, info, [], markdown(info, res, args),
                                 extra=res)
        if not args.skip_throughput:
            res["throughput"] = throughput(args, work)
    finally:
        res["uptime_end"] = subprocess.run(["uptime"], capture_output=True,
                                           text=True).stdout.strip()
        if args.keep:
            print(f"work dir: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    md = markdown(info, res, args)
    common.write_results(out, info, [], md, extra=res)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
