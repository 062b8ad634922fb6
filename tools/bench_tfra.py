"""TFRA 0.8.1 beside tnet: WD-400 throughput, quality and PSS, same data.

    python tools/bench_tfra.py            # WD-400, docs/BENCHMARK_PROTOCOL.md
    python tools/bench_tfra.py --config sparse_heavy --no_pss   # SPARSE-HEAVY
    python tools/bench_tfra.py --quick    # small, checks the script works
                                          # (tnet and TFRA only, 1 repeat)

Run with tnet's venv python (make bench-tfra). TensorFlow Recommenders-Addons
0.8.1 is built against TensorFlow 2.16.2 and fails to load on tnet's 2.21,
so it runs in a venv of its own, created once at --tfra_venv (default
.venv-tfra at the repo root; reused while its stamp file says it is
complete): tensorflow==2.16.2, tf-keras==2.16.0 (TF 2.16's Keras 2; TFRA's
layers import tf_keras, and TF_USE_LEGACY_KERAS=1 makes tf.keras the same
package), tensorflow-recommenders-addons==0.8.1. About 2.3 GB.

Data: tnet.data.SyntheticCriteo(seed=0, scale=--scale) (26 id columns,
Zipf 1.1, about 5M distinct ids at scale 1, 13 dense features), generated
once here and handed to every child as an .npz file in a temp dir (the TFRA
venv never imports tnet). Model WD-400: Wide&Deep, deep dim 8, wide dim 1,
DNN 400-400-400, batch 4096, Adagrad lr 0.05; see tools/_tfra_child.py for
each implementation:
- tnet: tn.models.WideDeep + tn.optimizer.Adagrad (as tools/bench_train.py;
  tnet's venv, TF 2.21);
- TFRA: `de.keras.layers.Embedding` over TFRA's CPU cuckoo hash tables, one
  deep and one wide table shared by the 26 columns (column-salted keys: one
  lookup per table and step, TFRA's fastest layout here; `--tfra_tables
  per_column` gives 52 tables), `de.DynamicEmbeddingOptimizer(
  tf_keras.optimizers.Adagrad)` for the dense layers and the rows;
- stock: tf_keras floormod(id, 2**20) + Embedding, tf_keras Adagrad, in the
  TFRA venv (a sanity anchor on TF 2.16; --no_stock skips it);
- DNN-only in each venv: the same DNN fed a constant input of the same
  width, the dense part's limit on TF 2.21 and on TF 2.16.2 (WD-400 is
  dense-bound, so these bound the reachable ratio; --no_dnn skips them).

Throughput: one process per measurement, alternated tnet, TFRA, stock,
DNN-only x2, tnet, ... for --repeats: each builds its model, runs
--warmup_steps steps,
then times --steps steps of the Keras train function over in-memory batches
(examples/s). Reported: median and range, the ratio tnet / TFRA paired within
a repeat (target >= 2x), peak RSS of each child. Quality: one fresh process
per implementation trains --epochs over --train_examples examples in order
and scores the hold-out (exact AUC, numpy rank-sum), beside the oracle AUC
of the true logits (target: tnet >= TFRA).

SPARSE-HEAVY (`--config sparse_heavy`): the same 26 columns plus 4
multi-valued ones M1..M4 (SyntheticCriteo(multi_valued=4): 1-50 ids a
row, int64 [B, 50] padded with -1), dim 16 everywhere, DNN 128-64; tnet is
tools/_sparse_heavy.py's model fed the padded arrays, TFRA looks up the
single ids and the multi-valued columns' real ids in one call per table and
pools them per row (mean deep, sum wide), stock pools floormod rows of the
real ids the same way. Target: tnet >= 3x TFRA (WD-400: 2x). PSS is
WD-400's only.

PSS (--pss_shapes, default 2x2; --no_pss skips it): TFRA on a local
cluster on 127.0.0.1 (chief + W workers + P ps, every task a process of the
TFRA venv, listening only on 127.0.0.1 through tnet's bind preload
library), tables placed on the ps tasks, Keras fit over per-worker datasets.
TFRA has been seen to fail there as soon as two workers train; the script
records what happens (the error, or examples/s), with a timeout, once with
TFRA's default `with_unique=True` and, if that fails, once with
`with_unique=False`. Every process it starts is stopped on exit.

Results: bench/results/bench_tfra[-quick]-<date>.json and .md.
"""
from __future__ import annotations

import argparse
import atexit
import ctypes
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
CHILD = os.path.join(REPO, "tools", "_tfra_child.py")
from tools._tfra_report import (IMPL_NAMES,  # noqa: E402
                                _first_error_line, build_report)

# TFRA 0.8.1 is built against TensorFlow 2.16.2 (its ops fail to load on
# tnet's TF 2.21). TF 2.16 made Keras 3 the default `tf.keras`; TFRA's
# layers import `tf_keras` first, so the Keras 2 of TF 2.16 (tf-keras 2.16)
# with TF_USE_LEGACY_KERAS=1 keeps tf.keras and tf_keras one package.
# TFRA's resource loader imports pkg_resources (setuptools < 81 has it).
TFRA_REQUIREMENTS = ("tensorflow==2.16.2", "tf-keras==2.16.0",
                     "tensorflow-recommenders-addons==0.8.1",
                     "setuptools<81")
TFRA_ENV = {"TF_USE_LEGACY_KERAS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
STAMP_NAME = ".tnet-bench-tfra"
# tnet's settings a run may change (forwarded to tools/_tfra_child.py).
TNET_PROBES = ("tnet_accumulator", "tnet_row_accumulator",
               "tnet_wide_accumulator", "tnet_row_epsilon", "tnet_wide_rule",
               "tnet_wide_lr", "tnet_wide_epsilon", "tnet_init_stddev",
               "tnet_start_reference_batch")
# case -> (tools/_tfra_child.py --impl, which venv runs it)
CASES = {"tnet": ("tnet", "tnet"), "tfra": ("tfra", "tfra"),
         "stock": ("stock", "tfra"), "dnn_tnet_venv": ("dnn", "tnet"),
         "dnn_tfra_venv": ("dnn", "tfra")}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--config", choices=("wd400", "sparse_heavy"),
                   default="wd400")
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--warmup_steps", type=int, default=5)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--train_examples", type=int, default=2**20)
    p.add_argument("--holdout_examples", type=int, default=2**17)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0,
                   help="every child's tf_keras.utils.set_random_seed (the "
                        "initial weights and rows; the data and their order "
                        "stay fixed)")
    p.add_argument("--tnet_accumulator", type=float, default=None,
                   help="initial_accumulator_value of tnet's Adagrad, dense "
                        "variables and rows (default: tnet's defaults, "
                        "Keras' 0.1 dense and 0.01 for rows; TFRA's row "
                        "slots start at 0 whatever it is set to)")
    p.add_argument("--tnet_row_accumulator", type=float, default=None,
                   help="tnet's deep rows' Adagrad start alone "
                        "(row_initial_accumulator_value)")
    p.add_argument("--tnet_wide_accumulator", type=float, default=None,
                   help="tnet's wide part (in-table FTRL, lr 0.1) "
                        "initial_accumulator_value (default 0.1)")
    p.add_argument("--tnet_row_epsilon", type=float, default=None,
                   help="epsilon of tnet's deep rows' Adagrad alone (tnet "
                        "and Keras: 1e-7; tnet's rows add it outside the "
                        "square root, Keras' and TFRA's inside)")
    p.add_argument("--tnet_wide_rule", choices=("ftrl", "adagrad"),
                   default=None,
                   help="tnet's wide part's in-table rule (default: FTRL, "
                        "lr 0.1; TFRA's wide rows: Adagrad, --lr)")
    p.add_argument("--tnet_wide_lr", type=float, default=None,
                   help="its learning rate (default: 0.1 FTRL, --lr Adagrad)")
    p.add_argument("--tnet_wide_epsilon", type=float, default=None,
                   help="its epsilon (Adagrad)")
    p.add_argument("--tnet_start_reference_batch", type=float, default=None,
                   help="start_reference_batch of tnet's deep rows and wide "
                        "part (default 256; 0: off, the starts fixed at "
                        "every batch size)")
    p.add_argument("--tnet_init_stddev", type=float, default=None,
                   help="tnet's deep rows start normal with this stddev "
                        "(tnet's default 0.01; TFRA's side here 0.05)")
    p.add_argument("--tfra_tables", choices=("shared", "per_column"),
                   default="shared")
    p.add_argument("--tfra_optimizer", choices=("keras", "legacy"),
                   default="keras",
                   help="tf_keras.optimizers.Adagrad or .legacy.Adagrad")
    p.add_argument("--no_stock", action="store_true",
                   help="skip the stock floormod rows (TFRA venv)")
    p.add_argument("--no_dnn", action="store_true",
                   help="skip the DNN-only rows (one per venv)")
    p.add_argument("--no_quality", action="store_true")
    p.add_argument("--tnet_only", action="store_true",
                   help="tnet's children only (a probe of tnet's settings)")
    p.add_argument("--tfra_only", action="store_true",
                   help="TFRA's children only (another --seed of TFRA)")
    p.add_argument("--no_throughput", action="store_true")
    p.add_argument("--no_pss", action="store_true")
    p.add_argument("--pss_shapes", default="2x2",
                   help="local cluster shapes WORKERSxPS, comma-separated")
    p.add_argument("--pss_steps", type=int, default=20,
                   help="steps per timed PSS epoch")
    p.add_argument("--pss_epochs", type=int, default=2,
                   help="timed PSS epochs (after an untimed one)")
    p.add_argument("--pss_batches", type=int, default=8,
                   help="distinct in-memory batches each worker cycles over")
    p.add_argument("--pss_timeout", type=float, default=900,
                   help="seconds before a PSS attempt is stopped")
    p.add_argument("--child_timeout", type=float, default=3600,
                   help="seconds before a one-process child is stopped")
    p.add_argument("--tfra_venv", default=os.path.join(REPO, ".venv-tfra"))
    p.add_argument("--tfra_python",
                   default=getattr(sys, "_base_executable", sys.executable),
                   help="interpreter that creates the TFRA venv "
                        "(CPython 3.9-3.11)")
    p.add_argument("--setup_only", action="store_true",
                   help="create the TFRA venv and exit")
    p.add_argument("--data_cache", default=None,
                   help="a directory keeping the generated .npz (and its "
                        "facts) between runs of the same --config, --scale, "
                        "--train_examples, --holdout_examples and --batch "
                        "(the data are seeded: the same bytes every time)")
    p.add_argument("--keep_tmp", action="store_true",
                   help="keep the temp dir (data, every child's log)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.quick:  # each process spends ~30 s importing and tracing
        args.scale, args.warmup_steps, args.steps, args.repeats = 0.05, 2, 8, 1
        args.train_examples, args.holdout_examples, args.epochs = \
            2**16, 2**14, 1
        args.no_stock = args.no_dnn = True
        args.pss_steps, args.pss_epochs, args.pss_timeout = 4, 1, 420
        args.child_timeout = 600
    if args.config != "wd400":
        args.no_pss = True  # the PSS child builds WD-400 only
    args.shape_list = []
    for s in args.pss_shapes.split(","):
        w, _, ps = s.strip().partition("x")
        args.shape_list.append((int(w), int(ps)))
    return args


def _log(message: str) -> None:
    print(message, flush=True)


# ------------------------------------------------------------ TFRA venv
def tfra_python(venv: str) -> str:
    return os.path.join(venv, "bin", "python")


def _read_stamp(stamp: str) -> dict:
    facts = {}
    with open(stamp) as f:
        text = f.read()
    head, _, tail = text.partition("---\n")
    facts["requirements"] = head
    for line in tail.splitlines():
        key, _, value = line.partition(" ")
        facts[key] = value
    return facts


def ensure_tfra_venv(venv: str, base_python: str) -> dict:
    """Creates (once) the TFRA venv; reuses it when its stamp says it is
    complete for TFRA_REQUIREMENTS. Returns facts about it for the report
    (versions, install seconds, size). Exits with a clear message when pip
    cannot install the packages."""
    stamp = os.path.join(venv, STAMP_NAME)
    wanted = "\n".join(TFRA_REQUIREMENTS) + "\n"
    if os.path.exists(stamp) and os.path.exists(tfra_python(venv)):
        facts = _read_stamp(stamp)
        if facts["requirements"] == wanted:
            _log(f"TFRA venv: reusing {venv} ({facts.get('versions', '')})")
            return {"path": venv, "created_now": False, **facts}
    _log(f"TFRA venv: creating {venv} with {base_python}: "
         f"{' '.join(TFRA_REQUIREMENTS)} (a few minutes, ~2.3 GB; pip's "
         "output follows)")
    t0 = time.perf_counter()
    if os.path.exists(stamp):
        os.remove(stamp)
    made = subprocess.run([base_python, "-m", "venv", venv])
    if made.returncode != 0:
        raise SystemExit(f"bench_tfra: `{base_python} -m venv {venv}` "
                         "failed; pass --tfra_python with a CPython 3.9-3.11")
    py = tfra_python(venv)
    cmd = [py, "-m", "pip", "install", "--progress-bar", "off",
           *TFRA_REQUIREMENTS]
    _log("TFRA venv: " + " ".join(cmd))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            errors="replace")
    tail = []
    for line in proc.stdout:
        line = line.rstrip()
        if line.startswith("WARNING: Location"):
            continue  # this machine's pip config names absent local indexes
        tail = (tail + [line])[-30:]
        _log(f"  [pip] {line}")
    if proc.wait() != 0:
        raise SystemExit(
            f"bench_tfra: pip could not install {' '.join(TFRA_REQUIREMENTS)} "
            f"into {venv} (exit {proc.returncode}). Last lines:\n  "
            + "\n  ".join(tail) + "\nTFRA 0.8.1 has wheels for Linux x86_64 "
            "(and macOS arm64), CPython 3.9-3.11 only: pass --tfra_python "
            "with such an interpreter, check that the package index is "
            "reachable, and run again (the venv is then re-used or "
            "completed; delete it to start over).")
    check = subprocess.run(
        [py, "-c", "import tensorflow as tf, tf_keras; "
         "import tensorflow_recommenders_addons as tfra; "
         "from tensorflow_recommenders_addons import dynamic_embedding; "
         "print('tensorflow', tf.__version__, 'tf_keras', tf_keras.__version__,"
         " 'tfra', tfra.__version__)"],
        env=dict(os.environ, **TFRA_ENV), capture_output=True, text=True)
    if check.returncode != 0:
        raise SystemExit(f"bench_tfra: TFRA installed into {venv} but does "
                         f"not import:\n{check.stderr[-3000:]}")
    versions = check.stdout.strip().splitlines()[-1]  # TFRA prints a notice
    seconds = time.perf_counter() - t0
    size = int(subprocess.run(["du", "-sb", venv], capture_output=True,
                              text=True).stdout.split()[0])
    with open(stamp, "w") as f:
        f.write(wanted + "---\n" + f"versions {versions}\n"
                f"install_seconds {seconds:.0f}\nsize_bytes {size}\n")
    _log(f"TFRA venv: ready in {seconds:.0f}s, {size / 2**30:.2f} GiB "
         f"({versions})")
    return {"path": venv, "created_now": True, "versions": versions,
            "install_seconds": f"{seconds:.0f}", "size_bytes": str(size)}


# ------------------------------------------------------------ processes
_PROCS: list = []  # every child started, stopped on exit


try:  # resolved here, not in the forked child (the parent has threads)
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):
    _PRCTL = None


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it if this script dies without
    cleaning up (prctl PR_SET_PDEATHSIG, Linux)."""
    if _PRCTL is not None:
        _PRCTL(1, int(signal.SIGKILL))


def _start(cmd, env, log_path):
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                            cwd=REPO, start_new_session=True,
                            preexec_fn=_die_with_parent)
    log.close()
    _PROCS.append(proc)
    return proc


def _stop(proc, grace: float = 10.0) -> None:
    """SIGTERM to the child's process group, SIGKILL after `grace`."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 30.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _stop_all() -> None:
    for proc in _PROCS:
        _stop(proc, grace=5.0)


def _on_signal(signum, frame):
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)  # once: let the cleanup finish
    raise KeyboardInterrupt(f"signal {signum}")


def _result_line(log_path: str):
    with open(log_path, errors="replace") as f:
        lines = f.read().splitlines()
    for line in reversed(lines):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):]), lines
    return None, lines


def child_env(venv: str) -> dict:
    env = dict(os.environ)
    env.pop("TF_CONFIG", None)
    env["PYTHONUNBUFFERED"] = "1"
    if venv == "tfra":
        # Nothing of tnet's venv may reach the TFRA interpreter.
        env.pop("PYTHONPATH", None)
        env.pop("VIRTUAL_ENV", None)
        env.update(TFRA_ENV)
    else:
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def run_child(args, ctx, case: str, mode: str, tag: str) -> dict:
    impl, venv = CASES[case]
    py = sys.executable if venv == "tnet" else tfra_python(args.tfra_venv)
    cmd = [py, CHILD, "--impl", impl, "--mode", mode, "--data", ctx["data"],
           "--config", args.config,
           "--batch", str(args.batch), "--warmup_steps",
           str(args.warmup_steps), "--steps", str(args.steps),
           "--epochs", str(args.epochs), "--lr", str(args.lr),
           "--seed", str(args.seed), "--tables", args.tfra_tables,
           "--optimizer", args.tfra_optimizer,
           *[x for flag in TNET_PROBES if getattr(args, flag) is not None
             for x in (f"--{flag}", str(getattr(args, flag)))]]
    log_path = os.path.join(ctx["tmp"], f"{tag}.log")
    t0 = time.perf_counter()
    proc = _start(cmd, child_env(venv), log_path)
    try:
        proc.wait(timeout=args.child_timeout)
    except subprocess.TimeoutExpired:
        _stop(proc)
        raise RuntimeError(f"{tag}: no result after {args.child_timeout:.0f}s"
                           f" (stopped); log tail:\n" + "\n".join(
                               _result_line(log_path)[1][-20:]))
    result, lines = _result_line(log_path)
    if proc.returncode != 0 or result is None:
        raise RuntimeError(f"{tag} failed (exit {proc.returncode}); log "
                           "tail:\n" + "\n".join(lines[-40:]))
    result["wall_seconds"] = time.perf_counter() - t0
    return result


# ------------------------------------------------------------------ PSS
def _load_by_path(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _listening(pids) -> list:
    """Listening TCP addresses of these processes (`ss -tlnpH`)."""
    try:
        text = subprocess.run(["ss", "-tlnpH"], capture_output=True,
                              text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    out = []
    for line in text.splitlines():
        found = re.findall(r"pid=(\d+)", line)
        if any(int(p) in pids for p in found):
            out.append(line.split()[3])
    return sorted(set(out))


def _vm_hwm(pid: int):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def run_pss(args, ctx, workers: int, ps: int, with_unique: bool) -> dict:
    """TFRA on a fresh local cluster; returns what happened (never raises
    for a TFRA failure: that is the result)."""
    launch = _load_by_path("_tnet_launch", os.path.join(REPO, "tnet",
                                                        "launch.py"))
    bind = launch._bind  # tnet/bind.py, standard library only
    cluster = launch.cluster_spec(ps, workers)  # free ports on 127.0.0.1
    py = tfra_python(args.tfra_venv)
    tag = f"pss-{workers}w{ps}ps-unique{int(with_unique)}"
    record = {"workers": workers, "ps": ps, "with_unique": with_unique,
              "cluster": cluster}
    procs = {}

    def env_for(kind, index):
        env = child_env("tfra")
        env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {
            "type": kind, "index": index}})
        env.update(bind.bind_environment(env))  # listen on 127.0.0.1 only
        env["TNET_BIND_QUIET"] = "1"
        return env

    common = ["--impl", "tfra", "--tables", args.tfra_tables,
              "--optimizer", args.tfra_optimizer,
              "--with_unique", str(int(with_unique))]
    t0 = time.perf_counter()
    try:
        for kind in ("ps", "worker"):
            for i in range(len(cluster[kind])):
                name = f"{kind}{i}"
                procs[name] = _start([py, CHILD, "--mode", "server", *common],
                                     env_for(kind, i), os.path.join(
                                         ctx["tmp"], f"{tag}-{name}.log"))
        deadline = time.monotonic() + min(300.0, args.pss_timeout)
        waiting = set(procs)
        while waiting and time.monotonic() < deadline:
            for name in list(waiting):
                with open(os.path.join(ctx["tmp"], f"{tag}-{name}.log"),
                          errors="replace") as f:
                    if "up at" in f.read():
                        waiting.discard(name)
                if procs[name].poll() is not None:
                    raise RuntimeError(f"{name} exited early")
            time.sleep(0.5)
        if waiting:
            raise RuntimeError(f"servers not up: {sorted(waiting)}")
        chief_log = os.path.join(ctx["tmp"], f"{tag}-chief.log")
        procs["chief"] = chief = _start(
            [py, CHILD, "--mode", "pss_chief", *common, "--data", ctx["data"],
             "--batch", str(args.batch), "--warmup_steps",
             str(args.warmup_steps), "--steps", str(args.pss_steps),
             "--pss_epochs", str(args.pss_epochs), "--pss_batches",
             str(args.pss_batches), "--lr", str(args.lr)],
            env_for("chief", 0), chief_log)
        left = args.pss_timeout - (time.perf_counter() - t0)
        deadline = time.monotonic() + max(left, 30.0)
        listening, last = set(), 0.0
        while chief.poll() is None and time.monotonic() < deadline:
            if time.monotonic() - last > 5:  # the chief's server starts late
                listening.update(_listening({p.pid for p in procs.values()}))
                last = time.monotonic()
            time.sleep(0.5)
        record["listening"] = sorted(listening)
        peaks = {n: _vm_hwm(p.pid) for n, p in procs.items() if n != "chief"}
        if chief.poll() is None:
            record.update({"status": "timeout", "error": (
                f"no result after {args.pss_timeout:.0f}s; stopped")})
        else:
            result, lines = _result_line(chief_log)
            if result is None:
                record.update({"status": "crashed",
                               "exit": chief.returncode,
                               "error": "\n".join(lines[-25:])})
            else:
                record.update(result)
                peaks["chief"] = result["peak_rss_bytes"]
        record["peak_rss_bytes"] = peaks
        dead = {n: p.returncode for n, p in procs.items()
                if n != "chief" and p.poll() is not None}
        if dead:
            record["servers_exited"] = dead
    except RuntimeError as e:
        record.update({"status": "cluster did not start", "error": str(e)})
    finally:
        for proc in procs.values():
            _stop(proc)
    record["wall_seconds"] = time.perf_counter() - t0
    record["logs"] = os.path.join(ctx["tmp"], f"{tag}-*.log")
    return record


# ---------------------------------------------------------------- main
def cached_data(args, tmp: str) -> tuple[str, dict]:
    """(path of the .npz, its facts): from --data_cache when it holds this
    data, else generated into tmp (and copied there)."""
    if not args.data_cache:
        return os.path.join(tmp, "data.npz"), prepare_data(args, tmp)
    os.makedirs(args.data_cache, exist_ok=True)
    stem = os.path.join(args.data_cache, "-".join(str(v) for v in (
        args.config, args.scale, args.train_examples, args.holdout_examples,
        args.batch)))
    if os.path.exists(stem + ".json") and os.path.exists(stem + ".npz"):
        with open(stem + ".json") as f:
            facts = json.load(f)
        _log(f"data: re-used {stem}.npz")
        return stem + ".npz", facts
    facts = prepare_data(args, tmp)
    shutil.move(os.path.join(tmp, "data.npz"), stem + ".npz")
    with open(stem + ".json", "w") as f:
        json.dump(facts, f)
    return stem + ".npz", facts


def prepare_data(args, tmp: str) -> dict:
    """The train and hold-out arrays as one .npz (keys split/column) and
    the facts the report needs (oracle AUC of the scored hold-out)."""
    import numpy as np  # noqa: PLC0415
    from tnet.data.metrics import auc  # noqa: PLC0415
    from tnet.data.synthetic import SyntheticCriteo  # noqa: PLC0415
    t0 = time.perf_counter()
    gen = SyntheticCriteo(seed=0, scale=args.scale,
                          multi_valued=4 if args.config == "sparse_heavy"
                          else 0)
    arrays = {}
    for split, n in (("train", args.train_examples),
                     ("holdout", args.holdout_examples)):
        features, labels, logits = gen.batch(n, split)
        for name, values in features.items():
            arrays[f"{split}/{name}"] = values
        arrays[f"{split}/label"] = labels
        if split == "holdout":
            arrays["holdout/logit"] = logits
    path = os.path.join(tmp, "data.npz")
    np.savez(path, **arrays)
    scored = (args.holdout_examples // args.batch) * args.batch
    facts = {"possible_ids": int(gen.total_ids), "holdout_scored": scored,
             "oracle_auc": auc(arrays["holdout/label"][:scored],
                               arrays["holdout/logit"][:scored]),
             "npz_bytes": os.path.getsize(path)}
    _log(f"data: {args.train_examples:,} train / {args.holdout_examples:,} "
         f"hold-out examples ({gen.total_ids:,} ids possible; oracle AUC "
         f"{facts['oracle_auc']:.4f}), {facts['npz_bytes'] / 2**20:.0f} MiB "
         f"npz, in {time.perf_counter() - t0:.1f}s")
    return facts


def main(argv=None) -> int:
    args = parse_args(argv)
    venv = ensure_tfra_venv(args.tfra_venv, args.tfra_python)
    if args.setup_only:
        return 0
    importlib.import_module("tnet")  # first: selects tf_keras (Keras 2)
    import tools._bench_common as bc  # noqa: PLC0415
    info = bc.run_info()
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, _on_signal)
    atexit.register(_stop_all)
    tmp = tempfile.mkdtemp(prefix="bench_tfra-")
    ctx = {"tmp": tmp}
    try:
        ctx["data"], data_facts = cached_data(args, tmp)
        impls = (["tnet"] if args.tnet_only else ["tfra"] if args.tfra_only
                 else ["tnet", "tfra"] + ([] if args.no_stock else ["stock"]))
        cases = impls + ([] if args.no_dnn else ["dnn_tnet_venv",
                                                 "dnn_tfra_venv"])
        runs = {}
        if not args.no_throughput:
            _log("throughput (examples/s), one process each, alternating:")
            counter = {"n": 0}

            def case(impl):
                def measure():
                    counter["n"] += 1
                    r = run_child(args, ctx, impl, "throughput",
                                  f"throughput-{counter['n']}-{impl}")
                    runs.setdefault(impl, []).append(r)
                    return r["examples_per_sec"]
                return measure

            bc.alternate({key: case(key) for key in cases}, args.repeats)
        quality = {}
        if not args.no_quality:
            for impl in impls:
                q = run_child(args, ctx, impl, "quality", f"quality-{impl}")
                quality[impl] = q
                _log(f"quality {IMPL_NAMES[impl]}: AUC {q['auc']:.4f} after "
                     f"{args.epochs} epoch(s) ({q['train_seconds']:.0f}s), "
                     f"peak RSS {q['peak_rss_bytes'] / 2**30:.2f} GiB")
        pss = []
        if not args.no_pss:
            for workers, ps in args.shape_list:
                for with_unique in (True, False):
                    _log(f"PSS: TFRA on {workers} workers / {ps} ps, "
                         f"with_unique={with_unique} (timeout "
                         f"{args.pss_timeout:.0f}s)")
                    rec = run_pss(args, ctx, workers, ps, with_unique)
                    pss.append(rec)
                    _log(f"PSS: {rec.get('status')}: "
                         + (f"{rec['examples_per_sec']:,.0f} examples/s"
                            if rec.get("status") == "ran"
                            else _first_error_line(rec)))
                    if rec.get("status") == "ran":
                        break  # the default worked: no workaround needed
    finally:
        _stop_all()
        if args.keep_tmp:
            _log(f"kept {tmp} (data and logs)")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    measurements, md = build_report(args, info, venv, data_facts, runs,
                                    quality, pss)
    out = args.out or bc.default_out_path(
        "bench_tfra" + ("" if args.config == "wd400" else "-" + args.config)
        + ("-quick" if args.quick else ""))
    config = {k: v for k, v in vars(args).items() if k != "shape_list"}
    bc.write_results(out, info, measurements, md, extra={
        "config": config, "tfra_venv": venv, "data": data_facts,
        "throughput_runs": runs, "quality": quality, "pss": pss})
    print(md)
    _log(f"results: {out}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as e:
        print(f"bench_tfra: interrupted ({e}); every process it started "
              "is stopped", file=sys.stderr)
        sys.exit(130)
