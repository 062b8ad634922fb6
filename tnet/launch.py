"""Starts a whole tnet cluster on 127.0.0.1 and runs a program as its chief.

    python -m tnet.launch --ps 2 --workers 2 -- \
        python -m tnet.train --flagfile=configs/wide_deep_synthetic.cfg

(`python tools/launch_local.py ...` in a checkout runs this file without
importing tnet, so the launcher itself never loads TensorFlow.)

Picks free ports, writes each task's TF_CONFIG, starts the ps and worker
tasks (`python -m tnet.server`) and then the chief command, prefixes every
output line with its task (`[ps:0] ...`), and stops every process it
started when the chief exits, on Ctrl-C or SIGTERM. Its exit status is the
chief's, or 1 if the chief succeeded but a ps/worker task died on its own.

Each task's pid is printed as `[launch] <task> pid=<pid>` (tests use it to
inject faults). Traffic stays on 127.0.0.1, and every task listens only on
127.0.0.1 (tnet/bind.py preloads a bind library; TNET_BIND=all turns that
off; see SECURITY.md).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import importlib.util
import pathlib
import time
from typing import Dict, List, Optional

HOST = "127.0.0.1"
HERE = pathlib.Path(__file__).resolve().parent   # the tnet package


def _load_bind():
    """tnet/bind.py without importing tnet (and so TensorFlow) here."""
    spec = importlib.util.spec_from_file_location("_tnet_bind",
                                                  HERE / "bind.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_bind = _load_bind()


def free_ports(n: int) -> List[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind((HOST, 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def cluster_spec(num_ps: int, num_workers: int) -> Dict[str, List[str]]:
    ports = free_ports(1 + num_ps + num_workers)
    addr = [f"{HOST}:{p}" for p in ports]
    return {"chief": addr[:1], "worker": addr[1:1 + num_workers],
            "ps": addr[1 + num_workers:]}


class Task:
    def __init__(self, name: str, cmd: List[str], env: Dict[str, str]):
        self.name = name
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True, bufsize=1, text=True, errors="replace")
        self.stopping = False
        print(f"[launch] {name} pid={self.proc.pid}", flush=True)
        self.reader = threading.Thread(target=self._pump, daemon=True)
        self.reader.start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            sys.stdout.write(f"[{self.name}] {line}")
            sys.stdout.flush()

    def stop(self, grace: float = 10.0) -> None:
        if self.proc.poll() is not None:
            return
        self.stopping = True
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()


def run(num_ps: int, num_workers: int, command: List[str],
        timeout: Optional[float] = None) -> int:
    if num_ps < 1 or num_workers < 1:
        print("[launch] need --ps >= 1 and --workers >= 1", file=sys.stderr)
        return 2
    if not command:
        print("[launch] give the chief command after --", file=sys.stderr)
        return 2
    cluster = cluster_spec(num_ps, num_workers)
    print(f"[launch] cluster {json.dumps(cluster)}", flush=True)
    servers: List[Task] = []
    chief: Optional[Task] = None
    interrupted = {"signal": None}

    def _on_signal(signum, frame):
        interrupted["signal"] = signum

    old = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}

    def env_for(kind: str, index: int) -> Dict[str, str]:
        env = dict(os.environ)
        env["TF_CONFIG"] = json.dumps(
            {"cluster": cluster, "task": {"type": kind, "index": index}})
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
        env["PYTHONUNBUFFERED"] = "1"
        # Preload the bind library now (each task would re-exec otherwise).
        env.update(_bind.bind_environment(env))
        env.setdefault("TNET_BIND_QUIET", "1")
        return env

    status = 1
    try:
        for kind in ("ps", "worker"):
            for i in range(len(cluster[kind])):
                servers.append(Task(f"{kind}:{i}",
                                    [sys.executable, "-m", "tnet.server"],
                                    env_for(kind, i)))
        chief = Task("chief", command, env_for("chief", 0))
        start = time.monotonic()
        while chief.proc.poll() is None:
            if interrupted["signal"] is not None:
                print(f"[launch] got signal {interrupted['signal']}; stopping "
                      "the cluster", flush=True)
                status = 130
                break
            if timeout and time.monotonic() - start > timeout:
                print(f"[launch] chief still running after {timeout:.0f}s; "
                      "stopping the cluster", flush=True)
                status = 124
                break
            time.sleep(0.1)
        else:
            status = chief.proc.returncode
            died = [t for t in servers if t.proc.poll() not in (None, 0)
                    and not t.stopping]
            for t in died:
                print(f"[launch] {t.name} exited with {t.proc.returncode} "
                      "during the run", flush=True)
            if status == 0 and died:
                status = 1
    finally:
        for task in ([chief] if chief else []) + servers:
            task.stop()
        for task in ([chief] if chief else []) + servers:
            task.reader.join(timeout=2)
        for s, handler in old.items():
            signal.signal(s, handler)
    print(f"[launch] done, exit {status}", flush=True)
    return status


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:
        split = argv.index("--")
        argv, command = argv[:split], argv[split + 1:]
    else:
        command = []
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ps", type=int, default=2, help="ps tasks")
    parser.add_argument("--workers", type=int, default=2, help="worker tasks")
    parser.add_argument("--timeout", type=float, default=None,
                        help="stop everything after this many seconds")
    args = parser.parse_args(argv)
    return run(args.ps, args.workers, command, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
