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
inject faults). `LocalCluster` below runs the launcher in the background
from Python (tests, soak and benchmarks share it). Traffic stays on 127.0.0.1, and every task listens only on
127.0.0.1 (tnet/bind.py preloads a bind library; TNET_BIND=all turns that
off; see SECURITY.md).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, List, Optional, TextIO, Tuple

HOST = "127.0.0.1"
HERE = pathlib.Path(__file__).resolve().parent   # the tnet package


def _load(name: str):
    """tnet/<name>.py without importing tnet (and so TensorFlow) here."""
    spec = importlib.util.spec_from_file_location(f"_tnet_{name}",
                                                  HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_bind = _load("bind")
_tnet_log = _load("log")
_log = logging.getLogger("tnet.launch")  # the "[launch] ..." lines


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
        _log.info(f"[launch] {name} pid={self.proc.pid}")
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


# Chief exit statuses that a restart cannot fix: a bad command line or
# TF_CONFIG (2), bad input data (4), a signal or the launcher's timeout.
# Everything else is restarted: 138 (tn.distribute.EXIT_RESTART, a lost ps
# or a stuck step) and also 1 (an unexpected error), which a TFJob with
# restartPolicy ExitCode would not restart.
_NO_RESTART = (0, 2, 4, 124, 130)


def run(num_ps: int, num_workers: int, command: List[str],
        timeout: Optional[float] = None, restarts: int = 0,
        cluster: Optional[Dict[str, List[str]]] = None,
        task_prefix: Optional[str] = None,
        restart_delay: float = 2.0) -> int:
    """Runs the cluster (and again, up to `restarts` times, after a failure).

    `cluster`: explicit addresses ({"chief": [...], "worker": [...], "ps":
    [...]}) instead of free ports on 127.0.0.1. `task_prefix`: a command
    prefix for each task, formatted with {kind} and {index} (e.g. `ip netns
    exec host-{kind}{index}` runs every task in its own network namespace).
    With `restarts`, a chief that fails (exit status other than 0, 2, 4, or
    a stop by signal or timeout) makes the launcher stop every task and
    start the whole cluster again, so a
    program with checkpoints resumes from the newest one (as a TFJob does
    with restartPolicy ExitCode on the chief for its exit 138, or
    OnFailure). The chief sees the attempt number in TNET_LAUNCH_ATTEMPT
    (0 first).
    """
    if cluster is None and (num_ps < 1 or num_workers < 1):
        _log.error("[launch] need --ps >= 1 and --workers >= 1")
        return 2
    if not command:
        _log.error("[launch] give the chief command after --")
        return 2
    interrupted = {"signal": None}

    def _on_signal(signum, frame):
        interrupted["signal"] = signum

    old = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    start = time.monotonic()
    try:
        attempt = 0
        while True:
            spec = cluster or cluster_spec(num_ps, num_workers)
            left = None if not timeout else timeout - (time.monotonic() - start)
            status, chief_status = _run_once(spec, command, left, interrupted,
                                             attempt, task_prefix)
            if (chief_status in _NO_RESTART or attempt >= restarts
                    or interrupted["signal"] is not None):
                break
            attempt += 1
            _log.info(f"[launch] restarting the whole cluster (restart {attempt} "
                  f"of {restarts}) after exit {status}")
            time.sleep(restart_delay)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    _log.info(f"[launch] done, exit {status}")
    return status


def _run_once(cluster: Dict[str, List[str]], command: List[str],
              timeout: Optional[float], interrupted: dict, attempt: int,
              task_prefix: Optional[str]) -> Tuple[int, int]:
    """(the launcher's status, the chief's) of one run of the cluster."""
    _log.info(f"[launch] cluster {json.dumps(cluster)}")
    servers: List[Task] = []
    chief: Optional[Task] = None

    def env_for(kind: str, index: int) -> Dict[str, str]:
        env = dict(os.environ)
        env["TF_CONFIG"] = json.dumps(
            {"cluster": cluster, "task": {"type": kind, "index": index}})
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
        env["PYTHONUNBUFFERED"] = "1"
        env["TNET_LAUNCH_ATTEMPT"] = str(attempt)
        if task_prefix:
            # The task's host exists only inside its prefix (e.g. a network
            # namespace): the task itself preloads the bind library.
            return env
        # Preload the bind library now (each task would re-exec otherwise).
        env.update(_bind.bind_environment(env))
        env.setdefault("TNET_BIND_QUIET", "1")
        return env

    def wrap(kind: str, index: int, cmd: List[str]) -> List[str]:
        if not task_prefix:
            return cmd
        return task_prefix.format(kind=kind, index=index).split() + cmd

    status = chief_status = 1
    try:
        for kind in ("ps", "worker"):
            for i in range(len(cluster[kind])):
                servers.append(Task(f"{kind}:{i}",
                                    wrap(kind, i, [sys.executable, "-m",
                                                   "tnet.server"]),
                                    env_for(kind, i)))
        chief = Task("chief", wrap("chief", 0, command), env_for("chief", 0))
        start = time.monotonic()
        while chief.proc.poll() is None:
            if interrupted["signal"] is not None:
                _log.info(f"[launch] got signal {interrupted['signal']}; stopping "
                      "the cluster")
                status = chief_status = 130
                break
            if timeout is not None and time.monotonic() - start > timeout:
                _log.info(f"[launch] chief still running after {timeout:.0f}s; "
                      "stopping the cluster")
                status = chief_status = 124
                break
            time.sleep(0.1)
        else:
            status = chief_status = chief.proc.returncode
            _log.info(f"[launch] chief exited with {status}")
            died = [t for t in servers if t.proc.poll() not in (None, 0)
                    and not t.stopping]
            for t in died:
                _log.info(f"[launch] {t.name} exited with {t.proc.returncode} "
                      "during the run")
            if status == 0 and died:
                status = 1
    finally:
        for task in ([chief] if chief else []) + servers:
            task.stop()
        for task in ([chief] if chief else []) + servers:
            task.reader.join(timeout=2)
    return status, chief_status


_PID_LINE = re.compile(r"\[launch\] (\S+) pid=(\d+)")


def process_running(pid: int) -> bool:
    """True unless the process is gone or a zombie (a killed launcher can no
    longer reap its tasks)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


class LocalCluster:
    """This launcher in the background: a cluster on 127.0.0.1 whose chief
    runs `command`, driven from Python.

    Collects the output (`lines`, `output`) and each task's pid (`pids`) in a
    reader thread; `read_until` waits for a line, `wait` for the end, `stop`
    asks the launcher to stop its tasks (SIGTERM), `kill_all` SIGKILLs every
    process (fault injection). `env` defaults to this process's environment
    without TF_CONFIG; `pythonpath` is prepended to PYTHONPATH; `on_line` is
    called with every line and `log` gets a copy of them. `restarts`,
    `cluster` and `task_prefix` are `run`'s (`pids` holds the newest
    process of each task).

    Args:
      ps: ps tasks.
      workers: worker tasks.
      command: the chief's command line.
      timeout: seconds before everything is stopped (None: none).
      cwd: the tasks' working directory.
      env: extra environment of every task.
      pythonpath: prepended to every task's PYTHONPATH.
      on_line: called with every output line.
      log: a file every output line is written to.
      restarts: `--restarts` of the launcher.
      cluster: given addresses instead of free ports on 127.0.0.1.
      task_prefix: a command prefix for every task.

    Example:
        ```python
        from tnet.launch import LocalCluster
        with LocalCluster(2, 2, [sys.executable, "job.py"]) as cluster:
            cluster.read_until(r"epoch 1", timeout=300)
            print(cluster.wait(600))        # the chief's exit status
        ```
    """

    def __init__(self, ps: int, workers: int, command: List[str], *,
                 timeout: Optional[float] = 600, cwd: Optional[str] = None,
                 env: Optional[Dict[str, str]] = None,
                 pythonpath: Optional[str] = None,
                 on_line: Optional[Callable[[str], None]] = None,
                 log: Optional[TextIO] = None, restarts: int = 0,
                 cluster: Optional[Dict[str, List[str]]] = None,
                 task_prefix: Optional[str] = None):
        env = dict(os.environ if env is None else env)
        env.pop("TF_CONFIG", None)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        if pythonpath:
            env["PYTHONPATH"] = (str(pythonpath) + os.pathsep
                                 + env.get("PYTHONPATH", ""))
        self.command = [sys.executable, str(HERE / "launch.py"),
                        "--ps", str(ps), "--workers", str(workers)]
        if timeout:
            self.command += ["--timeout", str(timeout)]
        if restarts:
            self.command += ["--restarts", str(restarts)]
        if cluster:
            self.command += ["--cluster", json.dumps(cluster)]
        if task_prefix:
            self.command += ["--task_prefix", task_prefix]
        self.command += ["--"] + list(command)
        self.proc = subprocess.Popen(
            self.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, errors="replace", cwd=cwd, env=env,
            start_new_session=True)
        self.lines: List[str] = []
        self.pids: Dict[str, int] = {}
        self._on_line, self._log = on_line, log
        self._changed = threading.Condition()
        self._eof = False
        self._cursor = 0  # read_until goes on after its last match
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            m = _PID_LINE.match(line)
            with self._changed:
                if m:
                    self.pids[m.group(1)] = int(m.group(2))
                self.lines.append(line)
                self._changed.notify_all()
            if self._log is not None:
                self._log.write(line)
            if self._on_line is not None:
                self._on_line(line)
        with self._changed:
            self._eof = True
            self._changed.notify_all()

    def read_until(self, pattern: str, timeout: float) -> Optional[str]:
        """The next output line (after the last one this returned) matching
        `pattern` (a regex), waiting up to `timeout` s; None on timeout or
        when the launcher has exited without printing one.

        Args:
          pattern: a regular expression.
          timeout: seconds to wait.

        Returns:
          The first line matching, or None after `timeout`.
        """
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                while self._cursor < len(self.lines):
                    line = self.lines[self._cursor]
                    self._cursor += 1
                    if regex.search(line):
                        return line
                left = deadline - time.monotonic()
                if self._eof or left <= 0:
                    return None
                self._changed.wait(min(left, 1.0))

    def wait(self, timeout: Optional[float] = None) -> int:
        """The launcher's exit status; SIGKILLs everything on timeout.

        Args:
          timeout: seconds (None: the cluster's own timeout).
        """
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_all()
        self._reader.join(timeout=10)
        return self.proc.returncode

    def stop(self, grace: float = 60.0) -> None:
        """SIGTERM to the launcher (it stops its tasks, up to 10 s each), then
        SIGKILL to its process group if it is still there after `grace`.

        Args:
          grace: seconds between SIGTERM and SIGKILL.
        """
        if self.proc.poll() is not None:
            return
        try:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            _killpg(self.proc.pid)
            self.proc.wait()
        except ProcessLookupError:
            pass

    def kill_all(self, settle: float = 10.0) -> List[str]:
        """SIGKILLs the launcher and every task it started; returns the
        tasks still running after `settle` seconds (none, normally).

        Args:
          settle: seconds to wait for the processes to go.
        """
        for pid in [self.proc.pid] + list(self.pids.values()):
            _killpg(pid)
        self.proc.wait()
        deadline = time.monotonic() + settle
        alive = self.alive()
        while alive and time.monotonic() < deadline:
            time.sleep(0.2)
            alive = self.alive()
        return alive

    def alive(self) -> List[str]:
        """Names of the tasks whose process is still running."""
        return [n for n, pid in self.pids.items() if process_running(pid)]

    @property
    def output(self) -> str:
        with self._changed:
            return "".join(self.lines)

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
        self._reader.join(timeout=10)


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:
        split = argv.index("--")
        argv, command = argv[:split], argv[split + 1:]
    else:
        command = []
    parser = argparse.ArgumentParser(prog="python -m tnet.launch",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--ps", type=int, default=2, help="ps tasks")
    parser.add_argument("--workers", type=int, default=2, help="worker tasks")
    parser.add_argument("--timeout", type=float, default=None,
                        help="stop everything after this many seconds")
    parser.add_argument("--restarts", type=int, default=0,
                        help="restart the whole cluster up to this many times "
                        "after a failed chief or a dead task (resumes from "
                        "the newest checkpoint)")
    parser.add_argument("--restart_delay", type=float, default=2.0,
                        help="seconds between a failure and the restart")
    parser.add_argument("--cluster", default=None,
                        help="explicit cluster addresses as TF_CONFIG's "
                        "'cluster' JSON (default: free ports on 127.0.0.1)")
    parser.add_argument("--task_prefix", default=None,
                        help="command prefix for every task, with {kind} and "
                        "{index}, e.g. 'ip netns exec host-{kind}{index}'")
    _tnet_log.add_verbosity_flag(parser)
    args = parser.parse_args(argv)  # bad flags: usage and exit 2
    _tnet_log.install()
    _tnet_log.set_verbosity(args.verbosity)
    # The tasks inherit it: no TensorFlow start-up lines unless asked for.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    cluster = None
    if args.cluster:
        try:
            cluster = json.loads(args.cluster)
            if not isinstance(cluster, dict):
                raise ValueError("not a JSON object")
        except ValueError as e:
            _log.error(f"[launch] --cluster must be TF_CONFIG's 'cluster' JSON "
                  f"object ({{\"chief\": [...], \"worker\": [...], \"ps\": "
                  f"[...]}}): {e}")
            return 2
    if args.restarts < 0:
        _log.error("[launch] --restarts must be >= 0")
        return 2
    return run(args.ps, args.workers, command, args.timeout, args.restarts,
               cluster, args.task_prefix, args.restart_delay)


if __name__ == "__main__":
    sys.exit(main())
