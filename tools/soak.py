"""Soak test: a long local-cluster run with RSS and table size sampled.

    python tools/soak.py                 # 10 minutes, 2 ps x 2 workers
    python tools/soak.py --minutes 2     # quick look (the verdict needs >= 5)

Starts a local cluster (tnet.launch.LocalCluster) with `tools/_soak_chief.py` as the chief (a
Wide&Deep on generated data whose ids come from a bounded key space, with a
checkpoint every few epochs), samples the resident memory (VmRSS) of every
process of the cluster every few seconds, and reads the tables' live rows
and bytes from the chief's per-epoch lines.

Why a bounded key space: the tables fill up early and then stop growing, so
after a warm-up any further memory growth is not explained by table rows,
i.e. a leak (in the ops, the gRPC path, tf.data or the checkpoint writer).
The check: for every process, RSS growth from the end of the warm-up to the
end of the run must stay below the table bytes added meanwhile (counted for
ps tasks only, which hold the rows) plus a slack (`--slack_mb` + 5%).

Writes bench/results/soak-<date>.json (every sample) and .md (a per-minute
table and the verdict). Exit status 1 if the check fails or the cluster
fails.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import threading
import time
from typing import Any, Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tools import procfs  # noqa: E402
from tools._bench_common import (RESULTS_DIR, REPO_ROOT, local_cluster,  # noqa: E402
                                 run_info)

MB = 1 << 20


def rss_bytes(pid: int) -> Optional[int]:
    """VmRSS of a process, or None if it is gone."""
    return procfs.status_bytes("VmRSS", pid)


class ClusterRun:
    """The launcher in the background; collects pids, SOAK lines, a tail of output."""

    def __init__(self, args: argparse.Namespace):
        chief = [sys.executable, os.path.join(REPO_ROOT, "tools", "_soak_chief.py"),
                 "--minutes", str(args.minutes), "--keys", str(args.keys),
                 "--batch", str(args.batch), "--steps_per_epoch", str(args.steps_per_epoch),
                 "--checkpoint_every", str(args.checkpoint_every),
                 "--model", args.model,
                 "--train_metrics", str(args.train_metrics),
                 "--report_tables", str(args.report_tables)]
        self.tables: List[Dict[str, Any]] = []
        self.tail: List[str] = []
        self.start = time.monotonic()
        self.lock = threading.Lock()
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
        self.cluster = local_cluster(args.ps, args.workers, chief,
                                     timeout=args.minutes * 60 + 600, env=env,
                                     on_line=self._line)
        self.command = self.cluster.command
        self.proc = self.cluster.proc

    @property
    def pids(self) -> Dict[str, int]:
        return dict(self.cluster.pids, launcher=self.proc.pid)

    def _line(self, line: str) -> None:
        with self.lock:
            if "SOAK {" in line:
                record = json.loads(line.split("SOAK ", 1)[1])
                record["wall"] = round(time.monotonic() - self.start, 2)
                self.tables.append(record)
            self.tail = (self.tail + [line])[-200:]


def _median_in(samples: List[Dict[str, Any]], name: str, lo: float, hi: float) -> Optional[float]:
    values = [s["rss"][name] for s in samples
              if lo <= s["t"] <= hi and s["rss"].get(name) is not None]
    return statistics.median(values) if values else None


def _fit(samples, name, after: float) -> Optional[Dict[str, float]]:
    """Least-squares line through RSS after `after` seconds: slope (MB/min),
    the rise it predicts over those samples (MB) and the residual SD (MB)."""
    pts = [(s["t"], s["rss"][name]) for s in samples
           if s["t"] >= after and s["rss"].get(name) is not None]
    if len(pts) < 3:
        return None
    mt = statistics.fmean(t for t, _ in pts)
    mv = statistics.fmean(v for _, v in pts)
    den = sum((t - mt) ** 2 for t, _ in pts)
    if not den:
        return None
    slope = sum((t - mt) * (v - mv) for t, v in pts) / den
    resid = [v - (mv + slope * (t - mt)) for t, v in pts]
    sd = (sum(r * r for r in resid) / (len(pts) - 2)) ** 0.5 if len(pts) > 2 else 0.0
    return {"slope_mb_per_min": slope * 60 / MB,
            "rise_mb": slope * (pts[-1][0] - pts[0][0]) / MB,
            "residual_sd_mb": sd / MB}


def _slope_mb_per_min(samples, name, after: float) -> Optional[float]:
    fit = _fit(samples, name, after)
    return fit["slope_mb_per_min"] if fit else None


def _table_bytes_at(tables: List[Dict[str, Any]], t: float) -> int:
    """Total table bytes of the last SOAK line at or before wall time t."""
    best = 0
    for rec in tables:
        if rec["wall"] <= t:
            best = sum(v["bytes"] for v in rec["tables"].values())
    return best


def analyse(samples, tables, warmup_s: float, end_s: float, slack_mb: float,
            window_s: float, fit_s: float = 20 * 60) -> Dict[str, Any]:
    """RSS growth per process after the warm-up versus table growth, and
    the strict check: a line fitted to the last `fit_s` seconds (never
    before the warm-up) rises by no more than 2 residual SDs ("flat")."""
    table_growth = max(0, _table_bytes_at(tables, end_s) - _table_bytes_at(tables, warmup_s))
    names = sorted({n for s in samples for n in s["rss"]})
    out: Dict[str, Any] = {"table_bytes_growth": table_growth, "processes": {}}
    ok = True
    for name in names:
        if name == "launcher":
            continue
        at_warm = _median_in(samples, name, warmup_s - window_s, warmup_s + window_s)
        at_end = _median_in(samples, name, end_s - 2 * window_s, end_s)
        if at_warm is None or at_end is None:
            continue
        explained = table_growth if name.startswith("ps:") else 0
        allowed = explained + slack_mb * MB + 0.05 * at_warm
        growth = at_end - at_warm
        passed = growth <= allowed
        ok &= passed
        out["processes"][name] = {
            "rss_after_warmup_mb": round(at_warm / MB, 1), "rss_end_mb": round(at_end / MB, 1),
            "growth_mb": round(growth / MB, 1), "allowed_mb": round(allowed / MB, 1),
            "slope_mb_per_min": _round(_slope_mb_per_min(samples, name, warmup_s)),
            "peak_mb": round(max(s["rss"].get(name) or 0 for s in samples) / MB, 1),
            "ok": passed}
        fit = _fit(samples, name, max(warmup_s, end_s - fit_s))
        if fit is not None:
            out["processes"][name].update(
                fit_slope_mb_per_min=round(fit["slope_mb_per_min"], 4),
                fit_rise_mb=round(fit["rise_mb"], 2),
                fit_residual_sd_mb=round(fit["residual_sd_mb"], 2),
                flat=fit["rise_mb"] <= 2 * fit["residual_sd_mb"])
    out["fit_window_s"] = round(min(fit_s, end_s - warmup_s), 1)
    out["ok"] = ok and bool(out["processes"])
    return out


def _round(x: Optional[float]) -> Optional[float]:
    return None if x is None else round(x, 2)


def markdown(result: Dict[str, Any]) -> str:
    a = result["analysis"]
    lines = [f"# Soak run {result['date']}", "",
             f"`{result['command']}`", "",
             f"Cluster: {result['config']['ps']} ps x {result['config']['workers']} workers, "
             f"{result['duration_s'] / 60:.1f} min, {result['steps']} steps, "
             f"key space {result['config']['keys']} ids x 4 columns, warm-up "
             f"{result['warmup_s']:.0f} s. Machine: {result['machine'].get('cpu_model')}, "
             f"{result['machine'].get('nproc')} cores.", "",
             f"**Verdict: {'PASS' if a['ok'] else 'FAIL'}** (RSS growth after warm-up <= "
             f"table bytes added ({a['table_bytes_growth'] / MB:.1f} MB, ps only) + "
             f"{result['config']['slack_mb']} MB + 5%)", "",
             "| process | RSS after warm-up MB | RSS end MB | growth MB | allowed MB "
             "| slope MB/min | peak MB | ok |", "|---|---|---|---|---|---|---|---|"]
    for name, p in a["processes"].items():
        lines.append(f"| {name} | {p['rss_after_warmup_mb']} | {p['rss_end_mb']} | "
                     f"{p['growth_mb']} | {p['allowed_mb']} | {p['slope_mb_per_min']} | "
                     f"{p['peak_mb']} | {'yes' if p['ok'] else 'NO'} |")
    if a.get("fit_window_s"):
        lines += ["", f"Strict check: least-squares line over the last "
                  f"{a['fit_window_s'] / 60:.1f} min; flat = its rise <= 2 residual SDs.", "",
                  "| process | slope MB/min | rise MB | residual SD MB | flat |",
                  "|---|---|---|---|---|"]
        for name, p in a["processes"].items():
            if "flat" in p:
                lines.append(f"| {name} | {p['fit_slope_mb_per_min']} | {p['fit_rise_mb']} | "
                             f"{p['fit_residual_sd_mb']} | {'yes' if p['flat'] else 'no'} |")
    names = sorted(a["processes"])
    lines += ["", "Per minute (RSS MB; table rows and MB from the chief):", "",
              "| min | step | table rows | table MB | " + " | ".join(names) + " |",
              "|---" * (4 + len(names)) + "|"]
    minute = -1
    for s in result["samples"]:
        if not s["rss"].get("chief") or int(s["t"] // 60) == minute:
            continue
        minute = int(s["t"] // 60)
        rec = next((r for r in reversed(result["tables"]) if r["wall"] <= s["t"]), None)
        rows = sum(v["rows"] for v in rec["tables"].values()) if rec else 0
        tbytes = sum(v["bytes"] for v in rec["tables"].values()) if rec else 0
        step = rec["step"] if rec else 0
        rss = " | ".join(f"{(s['rss'].get(n) or 0) / MB:.0f}" for n in names)
        lines.append(f"| {s['t'] / 60:.1f} | {step} | {rows} | {tbytes / MB:.1f} | {rss} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--ps", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--keys", type=int, default=20_000)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--steps_per_epoch", type=int, default=50)
    p.add_argument("--checkpoint_every", type=int, default=10)
    p.add_argument("--model", choices=("tnet", "stock"), default="tnet",
                   help="stock: the same Wide&Deep in plain tf_keras (no tnet "
                        "op; needs --checkpoint_every 0), a control for how "
                        "much TensorFlow's own PS runtime grows")
    p.add_argument("--train_metrics", type=int, default=-1,
                   help="training-step AUC / log-loss metrics: -1 the model's "
                        "default (tnet on, stock off), 0 off, 1 on (a probe of "
                        "where memory per step goes)")
    p.add_argument("--report_tables", type=int, default=1,
                   help="0: the chief reads no table sizes each epoch (a probe)")
    p.add_argument("--sample_seconds", type=float, default=5.0)
    p.add_argument("--warmup_fraction", type=float, default=0.3)
    p.add_argument("--slack_mb", type=float, default=48.0)
    p.add_argument("--out", default=RESULTS_DIR)
    p.add_argument("--name", default="soak", help="results file prefix")
    args = p.parse_args(argv)
    if args.model == "stock" and args.checkpoint_every:
        p.error("--model stock runs without checkpoints: add --checkpoint_every 0")

    run = ClusterRun(args)
    samples: List[Dict[str, Any]] = []
    while run.proc.poll() is None:
        t = time.monotonic() - run.start
        with run.lock:
            pids = dict(run.pids)
        samples.append({"t": round(t, 2), "rss": {n: rss_bytes(pid) for n, pid in pids.items()}})
        time.sleep(args.sample_seconds)
    run.cluster.wait()
    code = run.proc.returncode
    if not run.tables:
        print("".join(run.tail[-60:]))
        print(f"soak: the cluster produced no SOAK lines (exit {code})", file=sys.stderr)
        return 1
    end_s = run.tables[-1]["wall"]
    # Process start-up (imports, first traces, table fill) takes about a
    # minute here: never judge growth from earlier than that.
    warmup_s = max(args.warmup_fraction * end_s, min(60.0, 0.5 * end_s))
    window = max(2 * args.sample_seconds, 0.02 * end_s)
    analysis = analyse(samples, run.tables, warmup_s, end_s, args.slack_mb, window)
    date = datetime.date.today().isoformat()
    result = {
        **run_info(), "date": date, "command": " ".join([os.path.relpath(sys.argv[0], REPO_ROOT)]
                                          + sys.argv[1:]),
        "cluster_command": run.command, "exit_code": code,
        "config": vars(args), "duration_s": end_s, "warmup_s": warmup_s,
        "steps": run.tables[-1]["step"], "analysis": analysis,
        "samples": samples, "tables": run.tables,
    }
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, f"{args.name}-{date}")
    with open(base + ".json", "w") as f:
        json.dump(result, f, indent=1)
    with open(base + ".md", "w") as f:
        f.write(markdown(result))
    print(markdown(result))
    print(f"wrote {base}.json and {base}.md")
    if code != 0:
        print("".join(run.tail[-40:]))
        print(f"soak: the cluster exited with {code}", file=sys.stderr)
        return 1
    return 0 if analysis["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
