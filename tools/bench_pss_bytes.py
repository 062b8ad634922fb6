"""What one SPARSE-HEAVY step moves through each ps, against the minimum.

    python tools/bench_pss_bytes.py            # batch 4096, 1 worker, 2 ps
    python tools/bench_pss_bytes.py --quick    # batch 512: checks the script

Issue 29 asks that under ParameterServerStrategy "each step sends one
request per ps for the pull and one for the push, carrying only the batch's
unique keys and rows", bytes <= 1.1x the minimum U x (8 + 4 x dim) each way.
This script measures how far a step is from that, on a local cluster
(tnet.launch.LocalCluster: chief + 1 worker + --ps ps tasks on 127.0.0.1)
running tools/_pss_bytes_chief.py: the SPARSE-HEAVY model
(tools/_sparse_heavy.py: tn.models.WideDeep, deep table "embedding" dim 16,
wide table "wide" dim 1 with in-table FTRL, DNN 128-64 on the ps tasks)
trained with `fit` on --batches batches cycled (a warm-up pass, then
--epochs measured passes between two marks the chief prints).

Per ps and per step it reports:

(a) minimum: for every table whose shard lives on the ps, U_ps x (8 + 4 x
    dim), U_ps the unique keys of the batch that the table routes to that
    ps, computed on the chief with numpy from the same batches and the
    table's own `_route` (see tools/_pss_bytes_chief.py), summed over the
    tables: the issue's figure, the same each way. Beside it the strict
    floor: into the ps the keys once (both tables read the same keys:
    the wide and deep layers share one dedup) plus 4 x dim x U_ps of
    gradients per table; out of it 4 x dim x U_ps of rows per table.
    Sparse payload measured: the bytes of the tensor transfers
    (RecvTensor responses) into / out of the ps whose size is that of a
    per-key tensor of the batch: 8 x U_ps (keys), 4 x dim x U_ps (rows,
    gradients), 4 x U_ps (dim-1 rows and gradients, and the show counts)
    plus at most 64 bytes of message header, for one of the batches.
(b) every byte into / out of the ps: gRPC message bytes of every call the
    ps served or made (by kind: sparse as above, dense = a transfer the size
    of a trainable variable, the rest), and the kernel's TCP counters of
    every socket of the ps process (`ss -tinp` at both marks: gRPC and
    HTTP/2 framing, pings and TCP/IP headers not included, acks included).
(c) the calls: every gRPC call by method, by who made it and who served it
    (RunComponentFunction: the worker runs the ps's part of the step
    function; RecvTensor: one tensor transfer, always made by the side
    that receives the tensor; Enqueue: eager ops).

How calls and their bytes are counted: every task runs with gRPC's own
tracer on (GRPC_TRACE=http, GRPC_VERBOSITY=debug, TF_CPP_MIN_LOG_LEVEL=0),
which logs each call a process makes with its method and request length
(`perform_stream_op[s=...]: SEND_INITIAL_METADATA{... :path: /M ...}
SEND_MESSAGE:...:len=N`), the transport it goes on (`Transport T allocating
new grpc_chttp2_stream S`, and T's peer address), and every HTTP/2 DATA
frame fragment the process receives on it (`INCOMING[T;S]: Parse Nb ...
with data`; the response, with gRPC's 5-byte message prefix, which is
subtracted). Calls are counted on the side that made them (every process
of the cluster is traced, so every call is seen once); the peer's port names
the task that served it. A call belongs to the measured span if it started
between the chief's two marks. TensorFlow's own count of the RecvTensor
calls each task served (TF_CPP_VMODULE=grpc_worker_service=3: one
`GrpcRecvTensorAsync req` line per call) is reported beside it as a check.
The tracing slows the run, not what it sends: no timings are reported.

The span also holds what fit does at each epoch boundary (the chief reads
the loss, starts the next epoch's closures): the chief's own calls are
reported apart, per epoch, and are not in the per-step figures, which are
the calls between the worker and the ps tasks (and between ps tasks).

Results: bench/results/bench_pss_bytes[-quick]-<date>.json and .md; the
cluster's log in --data_dir/logs (large: the traces; deleted unless
--keep_log).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import signal
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from tools import _bench_common as bc  # noqa: E402
from tools import _sparse_heavy as sparse_heavy  # noqa: E402

TARGET = 1.1  # issue 29: bytes <= 1.1x the minimum each way
HEADER_SLACK = 64  # bytes of RecvTensorResponse / TensorProto around a tensor
ENV = {"GRPC_TRACE": "http", "GRPC_VERBOSITY": "debug",
       "TF_CPP_MIN_LOG_LEVEL": "0",
       "TF_CPP_VMODULE": "grpc_worker_service=3"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="batch 512, 2 batches, 1 measured epoch")
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--batches", type=int, default=4,
                   help="distinct batches cycled (steps per epoch)")
    p.add_argument("--epochs", type=int, default=2, help="measured epochs")
    p.add_argument("--ps", type=int, default=2)
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--data_dir", default="/tmp/tnet_bench_data")
    p.add_argument("--keep_log", action="store_true")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.quick:
        args.batch, args.batches, args.epochs = 512, 2, 1
    return args


# ------------------------------------------------------------ the trace
_LINE = re.compile(r"^\[(?P<task>[^\]]+)\] [IWEF]\d{4} \d\d:\d\d:(?P<t>\d+\.\d+)"
                   r" +\d+ (?P<src>[\w.]+:\d+)\] (?P<msg>.*)$")
_TRANSPORT = re.compile(r"W:(0x[0-9a-f]+) (CLIENT|SERVER) \[ipv4:[\d.]+:(\d+)\]")
_CALL = re.compile(r"^perform_stream_op\[s=(0x[0-9a-f]+); op=0x[0-9a-f]+\]:  "
                   r"SEND_INITIAL_METADATA\{(.*?)\}(.*)$")
_MORE = re.compile(r"^perform_stream_op\[s=(0x[0-9a-f]+); op=0x[0-9a-f]+\]:  "
                   r"SEND_MESSAGE")
_LEN = re.compile(r"SEND_MESSAGE:flags=0x[0-9a-f]+:len=(\d+)")
_PATH = re.compile(r":path: ([^,}]+)")
_ALLOC = re.compile(r"Transport (0x[0-9a-f]+) allocating new grpc_chttp2_stream "
                    r"(0x[0-9a-f]+)")
_DATA = re.compile(r"^INCOMING\[(0x[0-9a-f]+);(0x[0-9a-f]+)\]: Parse (\d+)b "
                   r".*with data$")
_CLOSED = re.compile(r"^MARK_STREAM_CLOSED: t=(0x[0-9a-f]+) s=(0x[0-9a-f]+)"
                     r"\(id=\d+\) (read\+write|read|write)")
_SERVED = re.compile(r"GrpcRecvTensorAsync req")
_GRPC_PREFIX = 5  # compressed flag + length in front of every gRPC message


def parse_calls(lines):
    """gRPC calls made by the traced processes of a cluster log.

    Returns (calls, served): calls are dicts {task, time, method, request
    (message bytes sent), requests (messages), response (message bytes
    received), transport, peer_port (the port of the peer: the serving
    task's for a call)}; served is [(task, time)] of TensorFlow's
    RecvTensor-served log lines. `lines`: the launcher's output
    (`[task] <log line>`), any iterable of str.
    """
    transports, open_calls, calls, served = {}, {}, [], []
    for line in lines:
        m = _LINE.match(line)
        if not m:
            continue
        task, msg, t = m.group("task"), m.group("msg"), float(m.group("t"))
        if _SERVED.search(msg):
            served.append((task, t))
            continue
        tm = _TRANSPORT.search(msg)
        if tm:
            transports[(task, tm.group(1))] = int(tm.group(3))
        cm = _CALL.match(msg)
        if cm:
            path = _PATH.search(cm.group(2))
            if path:  # a call starts (a server's reply has no :path)
                lens = [int(x) for x in _LEN.findall(cm.group(3))]
                open_calls[(task, cm.group(1))] = {
                    "task": task, "time": t, "method": path.group(1).strip(),
                    "request": sum(lens), "requests": len(lens),
                    "response_data": 0, "responses": 0, "transport": None}
            continue
        mm = _MORE.match(msg)
        if mm:
            call = open_calls.get((task, mm.group(1)))
            if call is not None:
                lens = [int(x) for x in _LEN.findall(msg)]
                call["request"] += sum(lens)
                call["requests"] += len(lens)
            continue
        am = _ALLOC.search(msg)
        if am:
            call = open_calls.get((task, am.group(2)))
            if call is not None:
                call["transport"] = am.group(1)
            continue
        dm = _DATA.match(msg)
        if dm:
            call = open_calls.get((task, dm.group(2)))
            if call is not None:
                call["response_data"] += int(dm.group(3))
                call["transport"] = dm.group(1)
            continue
        xm = _CLOSED.match(msg)
        if xm and xm.group(3) != "write":  # a call's stream closes for reading
            call = open_calls.pop((task, xm.group(2)), None)
            if call is not None:
                call["transport"] = xm.group(1)
                calls.append(call)
    for call in calls:
        call["peer_port"] = transports.get((call["task"], call["transport"]))
        # One response message per unary call (gRPC prefix taken off).
        call["response"] = max(0, call.pop("response_data") - _GRPC_PREFIX)
    return calls, served


SMALL = "small (<= 64 B: scalars, flags, empty)"


def classify(size, sizes):
    """The kind of a transferred tensor message of `size` bytes: SMALL up
    to HEADER_SLACK bytes, else the kind of the first (kind, reference) in
    `sizes` with reference <= size <= reference + HEADER_SLACK, else
    "other"."""
    if size <= HEADER_SLACK:
        return SMALL
    for kind, ref in sizes:
        if ref <= size <= ref + HEADER_SLACK:
            return kind
    return "other"


def sparse_sizes(minimum, shard, batch):
    """[(kind, bytes)] of the per-key tensors a step of batch `batch` moves
    to or from `shard`: keys (8U), each table's rows / gradients (4 x dim x
    U; tables of one width share a kind) and the show counts (4U, the same
    size as dim-1 rows). Largest first."""
    by_size = collections.defaultdict(list)
    for name, m in minimum.items():
        u = m["unique_per_batch_per_shard"][batch][shard]
        by_size[8 * u].append("keys")
        by_size[4 * m["dim"] * u].append(f"{name} rows/grads (dim {m['dim']})")
        by_size[4 * u].append("show counts")
    return sorted(((" or ".join(sorted(set(k))), size)
                   for size, k in by_size.items()), key=lambda kv: -kv[1])


# ------------------------------------------------------------ the run
def prepare_data(args) -> str:
    from tnet.data.synthetic import SyntheticCriteo  # noqa: PLC0415
    os.makedirs(args.data_dir, exist_ok=True)
    rows = args.batch * args.batches
    path = os.path.join(args.data_dir, f"synthetic-seed0-scale{args.scale:g}"
                        f"-mv{sparse_heavy.MULTI_VALUED}-train-{rows}.tsv")
    if not os.path.exists(path):
        tmp = f"{path}.tmp{os.getpid()}"
        try:
            SyntheticCriteo(seed=0, scale=args.scale,
                            multi_valued=sparse_heavy.MULTI_VALUED).write_tsv(
                tmp, rows, stream="train")
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
    return path


def run_cluster(args, data_path, log_path):
    chief = [sys.executable, os.path.join(REPO, "tools", "_pss_bytes_chief.py"),
             "--data", data_path, "--batch", str(args.batch),
             "--batches", str(args.batches), "--epochs", str(args.epochs)]
    env = dict(os.environ)
    env.update(ENV)
    result, cluster_line = None, None

    def on_line(line):
        nonlocal result, cluster_line
        if line.startswith("[chief] PSS_BYTES_RESULT "):
            result = json.loads(line[len("[chief] PSS_BYTES_RESULT "):])
        elif line.startswith("[launch] cluster "):
            cluster_line = json.loads(line[len("[launch] cluster "):])

    with open(log_path, "w") as log:
        cluster = bc.local_cluster(args.ps, 1, chief, timeout=args.timeout,
                                   log=log, on_line=on_line, env=env)
        try:
            status = cluster.wait()
        except BaseException:
            cluster.stop()
            raise
    if status != 0 or result is None:
        raise RuntimeError(f"cluster run failed (exit {status}); log {log_path}")
    return result, cluster_line


# -------------------------------------------------------------- report
def analyse(result, cluster, calls, served):
    """Per-ps figures per step (see the module docstring)."""
    ports = {}
    for job, addrs in cluster.items():
        for i, addr in enumerate(addrs):
            ports[int(addr.rpartition(":")[2])] = f"{job}:{i}"
    t0, t1 = result["mark_times"]
    steps, epochs = result["steps"], result["epochs"]
    span = [c for c in calls if t0 < c["time"] < t1]
    for c in span:
        c["server"] = ports.get(c["peer_port"], f"port {c['peer_port']}")
    mins = result["minimum"]
    num_ps = len(cluster["ps"])
    dense_sizes = sorted({v["bytes"] for v in result["variables"]}, reverse=True)
    per_ps = {}
    for i in range(num_ps):
        ps = f"ps:{i}"
        # Per-key tensor sizes of this shard, for every batch; then the
        # variables' sizes (largest first within each group).
        sizes = [kv for b in range(result["batches"])
                 for kv in sparse_sizes(mins, i, b)]
        sparse_kinds = {k for k, _ in sizes}
        sizes.sort(key=lambda kv: -kv[1])
        kinds = collections.defaultdict(set)
        for v in result["variables"]:
            kinds[v["bytes"]].add(v["kind"])
        dense = sorted(((" or ".join(sorted(k)) + " variables", size)
                        for size, k in kinds.items()), key=lambda kv: -kv[1])
        in_kind, out_kind = collections.Counter(), collections.Counter()
        in_count, out_count = collections.Counter(), collections.Counter()
        rpc = collections.Counter()
        rpc_bytes = collections.Counter()
        chief = collections.Counter()
        others = collections.Counter()
        for c in span:
            method = c["method"].rsplit("/", 1)[-1]
            if ps not in (c["task"], c["server"]):
                continue
            if "chief" in (c["task"], c["server"]):
                chief[f"{c['task']} -> {c['server']} {method}"] += 1
                chief["bytes_in"] += (c["request"] if c["server"] == ps
                                      else c["response"])
                chief["bytes_out"] += (c["response"] if c["server"] == ps
                                       else c["request"])
                continue
            key = f"{c['task']} -> {c['server']} {method}"
            rpc[key] += 1
            # Into the ps: what it was sent (requests it served) and what
            # it fetched (responses to its calls); out: the reverse.
            if c["server"] == ps:
                got, gave = c["request"], c["response"]
            else:
                got, gave = c["response"], c["request"]
            rpc_bytes[key + " in"] += got
            rpc_bytes[key + " out"] += gave
            tensor = c["response"] if method == "RecvTensor" else None
            kind = (classify(tensor, sizes + dense)
                    if tensor is not None else "control")
            if tensor is not None and kind == "other":
                others[tensor] += 1
            # A RecvTensor response is a tensor: into the ps when the ps
            # made the call, out of it when it served it.
            if c["server"] == ps:
                out_kind[kind] += gave
                out_count[kind] += 1
                in_kind["control"] += got
            else:
                in_kind[kind] += got
                in_count[kind] += 1
                out_kind["control"] += gave
        u_steps = [[mins[n]["unique_per_batch_per_shard"][b][i] for n in mins]
                   for b in range(result["batches"])]
        # The minimum per step, averaged over the batches (each batch is
        # stepped on equally often in the span).
        issue_min = sum(sum(mins[n]["unique_per_batch_per_shard"][b][i]
                            * (8 + 4 * mins[n]["dim"]) for n in mins)
                        for b in range(result["batches"])) / result["batches"]
        floor_in = sum(8 * max(u) + sum(4 * mins[n]["dim"]
                                        * mins[n]["unique_per_batch_per_shard"][b][i]
                                        for n in mins)
                       for b, u in enumerate(u_steps)) / result["batches"]
        floor_out = sum(sum(4 * mins[n]["dim"]
                            * mins[n]["unique_per_batch_per_shard"][b][i]
                            for n in mins)
                        for b in range(result["batches"])) / result["batches"]
        sparse_in = sum(v for k, v in in_kind.items() if k in sparse_kinds) / steps
        sparse_out = sum(v for k, v in out_kind.items() if k in sparse_kinds) / steps
        pid = result["pids"].get(ps)
        tcp_in = sum(s["bytes_received"] for s in result["sockets"]
                     if s["task"] == ps) / steps
        tcp_out = sum(s["bytes_acked"] for s in result["sockets"]
                      if s["task"] == ps) / steps
        tcp_chief_in = sum(s["bytes_received"] for s in result["sockets"]
                           if s["task"] == ps and s["peer"] == "chief") / steps
        tcp_chief_out = sum(s["bytes_acked"] for s in result["sockets"]
                            if s["task"] == ps and s["peer"] == "chief") / steps
        served_span = sum(1 for task, t in served if task == ps and t0 < t < t1)
        per_ps[ps] = {
            "pid": pid,
            "unique_keys_per_step": sum(max(u) for u in u_steps) / len(u_steps),
            "minimum_issue_bytes_per_step": issue_min,
            "floor_in_bytes_per_step": floor_in,
            "floor_out_bytes_per_step": floor_out,
            "sparse_in_bytes_per_step": sparse_in,
            "sparse_out_bytes_per_step": sparse_out,
            "grpc_in_bytes_per_step": sum(in_kind.values()) / steps,
            "grpc_out_bytes_per_step": sum(out_kind.values()) / steps,
            "grpc_in_by_kind_per_step": {k: v / steps for k, v in in_kind.items()},
            "grpc_out_by_kind_per_step": {k: v / steps for k, v in out_kind.items()},
            "transfers_in_by_kind_per_step": {k: v / steps for k, v in in_count.items()},
            "transfers_out_by_kind_per_step": {k: v / steps for k, v in out_count.items()},
            "tcp_in_bytes_per_step": tcp_in,
            "tcp_out_bytes_per_step": tcp_out,
            "tcp_in_bytes_per_step_without_chief": tcp_in - tcp_chief_in,
            "tcp_out_bytes_per_step_without_chief": tcp_out - tcp_chief_out,
            "calls_per_step": {k: v / steps for k, v in sorted(rpc.items())},
            "call_bytes_per_step": {k: v / steps for k, v in sorted(rpc_bytes.items())},
            "other_transfer_sizes": {str(k): v / steps for k, v in others.items()},
            "chief_calls_per_epoch": {k: v / epochs for k, v in sorted(chief.items())},
            "recvtensor_served_tf_log_per_step": served_span / steps,
            "ratios": {
                "sparse_in_vs_issue_minimum": sparse_in / issue_min,
                "sparse_out_vs_issue_minimum": sparse_out / issue_min,
                "sparse_in_vs_floor": sparse_in / floor_in,
                "sparse_out_vs_floor": sparse_out / floor_out,
                "grpc_in_vs_issue_minimum": sum(in_kind.values()) / steps / issue_min,
                "grpc_out_vs_issue_minimum": sum(out_kind.values()) / steps / issue_min,
                "tcp_in_vs_issue_minimum": tcp_in / issue_min,
                "tcp_out_vs_issue_minimum": tcp_out / issue_min,
                "tcp_in_without_chief_vs_issue_minimum":
                    (tcp_in - tcp_chief_in) / issue_min,
                "tcp_out_without_chief_vs_issue_minimum":
                    (tcp_out - tcp_chief_out) / issue_min,
            },
        }
    return per_ps


def _fmt_bytes(x):
    return f"{x / 1e3:,.1f} kB" if x < 1e6 else f"{x / 1e6:,.2f} MB"


def build_report(args, info, result, per_ps):
    measurements = []
    for ps, r in per_ps.items():
        section = f"SPARSE-HEAVY PSS 1w/{len(per_ps)}ps {ps}"
        ratios = r["ratios"]
        mn = r["minimum_issue_bytes_per_step"]
        measurements += [
            bc.Measurement(section, "minimum U x (8 + 4 x dim), summed over tables",
                           "bytes/step", [mn]),
            bc.Measurement(section, "sparse payload into the ps", "bytes/step",
                           [r["sparse_in_bytes_per_step"]], "minimum",
                           [ratios["sparse_in_vs_issue_minimum"]], target=TARGET,
                           higher_is_better=False),
            bc.Measurement(section, "sparse payload out of the ps", "bytes/step",
                           [r["sparse_out_bytes_per_step"]], "minimum",
                           [ratios["sparse_out_vs_issue_minimum"]], target=TARGET,
                           higher_is_better=False),
            bc.Measurement(section, "all gRPC messages into the ps", "bytes/step",
                           [r["grpc_in_bytes_per_step"]], "minimum",
                           [ratios["grpc_in_vs_issue_minimum"]], target=TARGET,
                           higher_is_better=False),
            bc.Measurement(section, "all gRPC messages out of the ps", "bytes/step",
                           [r["grpc_out_bytes_per_step"]], "minimum",
                           [ratios["grpc_out_vs_issue_minimum"]], target=TARGET,
                           higher_is_better=False),
            bc.Measurement(section, "TCP bytes into the ps (all sockets)", "bytes/step",
                           [r["tcp_in_bytes_per_step"]], "minimum",
                           [ratios["tcp_in_vs_issue_minimum"]], target=TARGET,
                           higher_is_better=False),
            bc.Measurement(section, "TCP bytes out of the ps (all sockets)", "bytes/step",
                           [r["tcp_out_bytes_per_step"]], "minimum",
                           [ratios["tcp_out_vs_issue_minimum"]], target=TARGET,
                           higher_is_better=False),
        ]
    title = "bench_pss_bytes: SPARSE-HEAVY step traffic per ps" + (
        " (quick)" if args.quick else "")
    md = bc.header_markdown(info, title)
    md += "\n\n" + bc.markdown_table(measurements)
    mins = result["minimum"]
    md += (f"\n\nSetup: 1 worker, {len(per_ps)} ps, batch {args.batch}, "
           f"{args.batches} distinct batches cycled (a warm-up pass, then "
           f"{args.epochs} measured passes: {result['steps']} steps); "
           "tables: " + ", ".join(
               f"{n} dim {m['dim']} ({m['optimizer']})" for n, m in mins.items())
           + "; U per ps per step (mean over the batches): "
           + ", ".join(f"{ps} {r['unique_keys_per_step']:,.0f}"
                       for ps, r in per_ps.items())
           + ". Minimum: U x (8 + 4 x dim) summed over the tables (the same "
           "keys count once per table). Sparse payload: RecvTensor messages "
           "the size of a per-key tensor of the batch (keys 8U, rows or "
           "gradients 4 x dim x U, show counts 4U). gRPC: message bytes "
           "(no framing) of every call the ps made or served between the "
           "worker and the ps tasks, the chief's per-epoch calls left out; "
           "TCP: every socket of the ps process, the chief's included. "
           "Calls and bytes from gRPC's own trace (GRPC_TRACE=http), see "
           "tools/bench_pss_bytes.py.")
    check = {name: (result["rows_per_shard"][name], m["distinct_per_shard"])
             for name, m in mins.items()}
    md += ("\n\nCheck of U: rows each shard holds after the run (training "
           "inserts every key it pulls) vs the distinct keys the chief routed "
           "to it over the batches: " + "; ".join(
               f"{n} {rows} vs {want}" for n, (rows, want) in check.items())
           + (" (equal)" if all(a == b for a, b in check.values())
              else " (DIFFERENT: the minimum is wrong)") + ".")
    for ps, r in per_ps.items():
        md += f"\n\n{ps} per step:\n"
        for way in ("in", "out"):
            by_bytes = r[f"grpc_{way}_by_kind_per_step"]
            counts = r[f"transfers_{way}_by_kind_per_step"]
            md += (f"\n- bytes {way} by kind (transfers per step): " + ", ".join(
                f"{k} {_fmt_bytes(v)}"
                + (f" ({counts[k]:g})" if k in counts else "")
                for k, v in sorted(by_bytes.items(), key=lambda kv: -kv[1])))
        md += (f"\n- strict floor: in {_fmt_bytes(r['floor_in_bytes_per_step'])} "
               f"(keys once + gradients), out "
               f"{_fmt_bytes(r['floor_out_bytes_per_step'])} (rows); sparse "
               f"payload / floor: in {r['ratios']['sparse_in_vs_floor']:.3f}x, "
               f"out {r['ratios']['sparse_out_vs_floor']:.3f}x")
        md += "\n- calls (caller -> server method: calls per step): " + "; ".join(
            f"{k}: {v:g}" for k, v in r["calls_per_step"].items())
        md += (f"\n- RecvTensor calls this ps served per step by TensorFlow's "
               f"log: {r['recvtensor_served_tf_log_per_step']:g}")
        chief = {k: v for k, v in r["chief_calls_per_epoch"].items()
                 if not k.startswith("bytes")}
        md += ("\n- the chief's calls per epoch (not in the per-step figures): "
               + "; ".join(f"{k}: {v:g}" for k, v in chief.items())
               + f"; {_fmt_bytes(r['chief_calls_per_epoch'].get('bytes_in', 0))} in, "
               f"{_fmt_bytes(r['chief_calls_per_epoch'].get('bytes_out', 0))} out")
    return measurements, md


class Interrupted(Exception):
    pass


def _raise_interrupted(signum, frame):
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)
    raise Interrupted(f"signal {signum}")


def main(argv=None) -> int:
    args = parse_args(argv)
    old = {s: signal.signal(s, _raise_interrupted)
           for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        import tnet  # noqa: F401,PLC0415  (first: selects tf_keras)
        info = bc.run_info()
        data_path = prepare_data(args)
        log_dir = os.path.join(args.data_dir, "logs")
        os.makedirs(log_dir, exist_ok=True)
        log_path = os.path.join(log_dir, f"bench_pss_bytes-{os.getpid()}.log")
        t = time.perf_counter()
        result, cluster = run_cluster(args, data_path, log_path)
        print(f"cluster run {time.perf_counter() - t:.0f}s; parsing "
              f"{os.path.getsize(log_path) / 1e6:.0f} MB of log", flush=True)
        with open(log_path, errors="replace") as f:
            calls, served = parse_calls(f)
        per_ps = analyse(result, cluster, calls, served)
        measurements, md = build_report(args, info, result, per_ps)
        out = args.out or bc.default_out_path(
            "bench_pss_bytes" + ("-quick" if args.quick else ""))
        result.pop("sockets_raw", None)
        md_path = bc.write_results(out, info, measurements, md, extra={
            "config": vars(args), "env": ENV, "per_ps": per_ps,
            "chief_result": result,
            "log": log_path if args.keep_log else None})
        if not args.keep_log:
            os.remove(log_path)
        print(md)
        print(f"\nwrote {out} and {md_path}", flush=True)
        return 0
    except Interrupted as e:
        print(f"bench_pss_bytes: interrupted ({e}); cluster stopped", flush=True)
        return 130
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


if __name__ == "__main__":
    sys.exit(main())
