"""Shared helpers for tnet's benchmark scripts (tools/bench_*.py).

docs/BENCHMARK_PROTOCOL.md asks every figure to be measured side by side in one
run (A, B, A, B ...), reported as the median of >= 3 repeats with the ratio,
and stored with its command, git commit, machine, date, versions and peak
RSS. This module does exactly that and nothing else:

- `run_info()`: the provenance block (command, commit, machine, versions).
- `rss_bytes()` / `peak_rss_bytes()` / `release_free_memory()`: current
  and peak resident memory, and a clean baseline between measurements.
- `time_calls()` / `alternate()`: the timing loop and the A, B, A, B driver.
- `Measurement`: one figure with all its repeats, baseline ratio and target.
- `markdown_table()` / `write_results()`: the JSON + markdown outputs.

It must not import TensorFlow at module level: benchmark scripts import tnet
first (tnet selects Keras 2 before TensorFlow loads).
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Iterable, Sequence

try:
    from tools import procfs
except ImportError:  # run as tools/<script>.py with only tools/ on sys.path
    import procfs

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_DIR = os.path.join(REPO_ROOT, "bench", "results")


# ------------------------------------------------------------- provenance
def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=REPO_ROOT, check=True,
                              capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine_info() -> dict[str, Any]:
    """nproc, CPU model and total memory (from /proc), kernel."""
    cpu_model = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu_model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_total = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_total = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    try:
        nproc = int(subprocess.run(["nproc"], capture_output=True, text=True,
                                   check=True).stdout)
    except (OSError, ValueError, subprocess.CalledProcessError):
        nproc = os.cpu_count()
    try:
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        uptime = None
    return {"nproc": nproc, "cpu_model": cpu_model,
            "mem_total_bytes": mem_total, "kernel": platform.release(),
            "load_avg_at_start": os.getloadavg(),
            # On a VM, memory not touched since boot can cost several times
            # more to fault in (BENCHMARKS, twentieth session): a table that
            # grows in the timed steps pays it, a dense one built before
            # timing does not.
            "uptime_s_at_start": uptime}


def versions() -> dict[str, str]:
    """python / tensorflow / numpy versions (imports them if needed)."""
    import numpy as np
    import tensorflow as tf
    out = {"python": platform.python_version(), "tensorflow": tf.__version__,
           "numpy": np.__version__}
    try:
        import tf_keras
        out["tf_keras"] = tf_keras.__version__
    except ImportError:
        pass
    return out


def _commit() -> tuple[str, bool]:
    """(commit, dirty). A copy that is not a git checkout (a `git archive`
    of a commit, for A/B runs of two versions side by side) has no commit
    of its own: TNET_BENCH_COMMIT names the one it was made from."""
    commit = _git("rev-parse", "HEAD")
    if commit != "unknown":
        # Uncommitted changes make the commit an approximation: say so.
        return commit, bool(_git("status", "--porcelain",
                                 "--untracked-files=no"))
    given = os.environ.get("TNET_BENCH_COMMIT", "").strip()
    where = f"{REPO_ROOT} is not a git checkout"
    if given:
        return f"{given} (TNET_BENCH_COMMIT; {where})", False
    return f"unknown ({where}; set TNET_BENCH_COMMIT)", False


def run_info() -> dict[str, Any]:
    """Everything the protocol asks to store with a figure, except results."""
    commit, dirty = _commit()
    return {
        "command": " ".join([sys.executable] + sys.argv),
        "git_commit": commit,
        "git_dirty": dirty,
        "date": datetime.datetime.now().astimezone().isoformat(
            timespec="seconds"),
        "machine": machine_info(),
        "versions": versions(),
    }


def default_out_path(bench_name: str) -> str:
    """bench/results/<bench_name>-<YYYY-MM-DD>.json."""
    day = datetime.date.today().isoformat()
    return os.path.join(RESULTS_DIR, f"{bench_name}-{day}.json")


# ----------------------------------------------------------------- memory
def rss_bytes() -> int:
    """Current resident set size of this process (VmRSS)."""
    value = procfs.status_bytes("VmRSS")
    return -1 if value is None else value


def release_free_memory() -> None:
    """gc.collect(), then glibc malloc_trim(0): hands freed heap pages back
    to the OS, so RSS measured next is not hidden by memory an earlier,
    deleted object left in malloc's free lists. No-op without glibc."""
    import ctypes
    import gc
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def peak_rss_bytes() -> int:
    """Peak resident set size of this process (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# ----------------------------------------------------------------- timing
def time_calls(fn: Callable[..., Any], args: Sequence[tuple], calls: int,
               ) -> float:
    """Seconds for `calls` calls of fn, cycling over the argument tuples.

    The caller must make fn synchronous (eager TF and tf.function calls on
    CPU are) and do any warm-up itself; nothing is converted inside the loop.
    """
    n = len(args)
    start = time.perf_counter()
    for i in range(calls):
        fn(*args[i % n])
    return time.perf_counter() - start


def alternate(cases: dict[str, Callable[[], float]], repeats: int,
              log: Callable[[str], None] | None = print,
              ) -> dict[str, list[float]]:
    """Runs every case once per repeat, in order (A, B, A, B ...).

    Each case is a zero-argument callable returning one value (for example
    rows/s over a fixed number of calls). Returns the values per case in
    repeat order, so ratios can be paired within a repeat.
    """
    values: dict[str, list[float]] = {name: [] for name in cases}
    for r in range(repeats):
        for name, case in cases.items():
            values[name].append(case())
        if log:
            log(f"  repeat {r + 1}/{repeats}: " + ", ".join(
                f"{k}={_fmt(v[-1])}" for k, v in values.items()))
    return values


# ------------------------------------------------------------ measurements
@dataclasses.dataclass
class Measurement:
    """One figure: its repeats, and optionally a ratio against a baseline.

    ratio: the median of the per-repeat ratios value/baseline (paired within
    a repeat, which cancels most of the machine's drift), or value/reference
    for a fixed reference such as a payload size.
    target: the ratio the project aims for, with `higher_is_better` telling
    whether the ratio must be >= or <= it.
    """
    section: str
    name: str
    unit: str
    values: list[float]
    baseline: str | None = None
    ratios: list[float] | None = None
    target: float | None = None
    higher_is_better: bool = True
    note: str = ""
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def ratio(self) -> float | None:
        return statistics.median(self.ratios) if self.ratios else None

    @property
    def status(self) -> str | None:
        if self.target is None or self.ratio is None:
            return None
        ok = (self.ratio >= self.target if self.higher_is_better
              else self.ratio <= self.target)
        return "reached" if ok else "missed"

    def target_text(self) -> str:
        if self.target is None:
            return ""
        return f"{'>=' if self.higher_is_better else '<='} {self.target:g}x"

    def to_json(self) -> dict[str, Any]:
        return {"section": self.section, "name": self.name, "unit": self.unit,
                "median": self.median, "values": self.values,
                "baseline": self.baseline, "ratio": self.ratio,
                "ratios": self.ratios, "target": self.target_text() or None,
                "status": self.status, "note": self.note, **self.extra}


def paired_ratios(values: Sequence[float], base: Sequence[float]
                  ) -> list[float]:
    return [v / b for v, b in zip(values, base)]


def _fmt(x: float | None) -> str:
    if x is None:
        return ""
    if abs(x) >= 1e6:
        return f"{x / 1e6:.2f}M"
    if abs(x) >= 1e4:
        return f"{x / 1e3:.0f}k"
    if abs(x) >= 100:
        return f"{x:.0f}"
    return f"{x:.3g}"


def markdown_table(measurements: Iterable[Measurement]) -> str:
    """One row per figure: median (min-max), ratio vs baseline, target."""
    lines = ["| section | figure | median | range | unit | vs | ratio | "
             "target | status |",
             "|---|---|---:|---:|---|---|---:|---|---|"]
    for m in measurements:
        rng = (f"{_fmt(min(m.values))}-{_fmt(max(m.values))}"
               if len(m.values) > 1 else "")
        ratio = f"{m.ratio:.2f}x" if m.ratio is not None else ""
        lines.append(f"| {m.section} | {m.name} | {_fmt(m.median)} | {rng} | "
                     f"{m.unit} | {m.baseline or ''} | {ratio} | "
                     f"{m.target_text()} | {m.status or ''} |")
    return "\n".join(lines)


def write_results(json_path: str, info: dict[str, Any],
                  measurements: Sequence[Measurement], markdown: str,
                  extra: dict[str, Any] | None = None) -> str:
    """Writes <json_path> and the markdown beside it (.md); returns md path."""
    os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
    payload = dict(info)
    payload["peak_rss_bytes"] = peak_rss_bytes()
    payload.update(extra or {})
    payload["measurements"] = [m.to_json() for m in measurements]
    payload["markdown"] = markdown
    with open(json_path, "w") as f:
        json.dump(payload, f, indent=1)
        f.write("\n")
    md_path = os.path.splitext(json_path)[0] + ".md"
    with open(md_path, "w") as f:
        f.write(markdown + "\n")
    return md_path


def header_markdown(info: dict[str, Any], title: str) -> str:
    """The provenance lines printed above a results table."""
    m = info["machine"]
    v = info["versions"]
    dirty = " (with uncommitted changes)" if info.get("git_dirty") else ""
    return "\n".join([
        f"### {title}",
        "",
        f"- command: `{info['command']}`",
        f"- commit: `{info['git_commit']}`{dirty}",
        f"- machine: {m['nproc']} cores, {m['cpu_model']}, "
        f"{(m['mem_total_bytes'] or 0) / 2**30:.0f} GiB; "
        f"load average at start {m['load_avg_at_start'][0]:.2f}"
        + (f", up {m['uptime_s_at_start'] / 60:.0f} min, kernel {m['kernel']}"
           if m.get("uptime_s_at_start") is not None else ""),
        f"- date: {info['date']}",
        f"- python {v['python']}, tensorflow {v['tensorflow']}, "
        f"numpy {v['numpy']}",
    ])


def local_cluster(*args, **kwargs):
    """tnet.launch.LocalCluster(*args, **kwargs), loaded by path so that a
    monitoring script (tools/soak.py) never imports TensorFlow."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "_tnet_launch", os.path.join(REPO_ROOT, "tnet", "launch.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    kwargs.setdefault("cwd", REPO_ROOT)
    kwargs.setdefault("pythonpath", REPO_ROOT)
    return module.LocalCluster(*args, **kwargs)
