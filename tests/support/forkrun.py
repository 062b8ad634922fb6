"""Runs a one-process tnet command in a process forked from one that has
already imported TensorFlow and tnet.

Every Python that starts TensorFlow spends ~3 s of CPU in the suite before
it runs a line of the command (importing TensorFlow, tf_keras and tnet).
`run()` is `subprocess.run` for `[sys.executable, "-m", module, *args]` or
`[sys.executable, script, *args]`: the command gets a process of its own
(its own memory, flags, exit status, stdout and stderr, its atexit
handlers and threads joined at exit), forked from a per-worker "zygote"
that imported tnet once and never ran an op. For tests whose subject is
what a command does after it starts: bad input mid-training, a daily
loop's counts, an export's check.

What happens while a process starts is tested with real processes, never
here: which modules a command imports (test_imports), TensorFlow's
start-up lines (test_imports, test_cli_bad_input), the environment read at
import (malloc options, LD_PRELOAD: test_malloc, test_bind), a cluster
task (it re-executes itself with the bind library). `run()` falls back to
`subprocess.run` for any command with TF_CONFIG, any command not known to
import tnet first, and everything when TNET_FORKRUN=0; commands whose
import-time environment (_START_VARS) differs get a zygote of their own.
"""
from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))

# Read by Python, glibc, the dynamic loader or TensorFlow while a process
# starts: a command whose values differ cannot share the zygote's start.
_START_VARS = ("TF_CPP_MIN_LOG_LEVEL", "TF_CPP_MAX_VLOG_LEVEL",
               "TF_CPP_VMODULE", "TF_ENABLE_ONEDNN_OPTS", "LD_PRELOAD",
               "LD_LIBRARY_PATH", "PYTHONHASHSEED",
               "PYTHONUNBUFFERED", "PYTHONWARNINGS", "PYTHONDONTWRITEBYTECODE",
               "GLIBC_TUNABLES",
               "OPENBLAS_NUM_THREADS", "TF_USE_LEGACY_KERAS",
               "TNET_BIND_REEXEC")

# Commands that import all of tnet first thing, as the zygote did. (Not
# tnet.serving.checks, nor a program that loads an export: their point is
# a process without tnet's ops.)
MODULES = ("tnet.train", "tnet.serving.follow")

_ZYGOTE = r"""
import json, os, runpy, sys
import tnet as tn
tn._load()
import tnet.cli.main, tnet.serving.follow  # noqa: F401 (their imports too)
for name in MODULES:
    sys.modules.pop(name, None)   # run_module runs them afresh as __main__
own = set(os.environ.get("PYTHONPATH", "").split(os.pathsep))
site_path = [p for p in sys.path[1:] if p not in own]
control = os.fdopen(os.dup(1), "w")
null = os.open(os.devnull, os.O_RDWR)
os.dup2(null, 1)


def serve():
    for line in sys.stdin:
        req = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        control.flush()
        pid = os.fork()
        if pid == 0:
            return req
        control.write(json.dumps({"pid": pid}) + "\n")
        control.flush()
        _, status, usage = os.wait4(pid, 0)
        control.write(json.dumps({
            "code": os.waitstatus_to_exitcode(status),
            "cpu": usage.ru_utime + usage.ru_stime}) + "\n")
        control.flush()
    raise SystemExit(0)


# Ends the command as Python's exit does up to its clean-up of every
# module, which is skipped (0.6 s of CPU after a tnet import): threads
# joined, atexit handlers run, stdout and stderr flushed; the status and
# message of an uncaught exception or SystemExit as Python gives them.
def __finish(exc=None):
    import atexit, os, signal, sys, threading  # (globals: the command's)
    code = 0
    if isinstance(exc, SystemExit):
        code = exc.code
        if code is None:
            code = 0
        elif not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
    elif exc is not None:
        sys.excepthook(type(exc), exc, exc.__traceback__)
        code = 1
    try:
        threading._shutdown()
    finally:
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
    if isinstance(exc, KeyboardInterrupt):  # as Python: killed by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


req = serve()
control.close()
os.dup2(os.open(req.get("stdin") or os.devnull, os.O_RDONLY), 0)
os.dup2(os.open(req["stdout"], os.O_WRONLY | os.O_APPEND), 1)
os.dup2(1 if req["stderr"] == req["stdout"] else
        os.open(req["stderr"], os.O_WRONLY | os.O_APPEND), 2)
sys.stdin = open(0, closefd=False)
os.chdir(req["cwd"])
os.environ.clear()
os.environ.update(req["env"])
sys.path[:] = [""] + [p for p in req["env"].get("PYTHONPATH", "").split(
    os.pathsep) if p] + site_path   # as a Python started with its PYTHONPATH
sys.argv = list(req["argv"])
sys.orig_argv = [sys.executable] + list(req["orig"])
try:
    if req["module"]:
        sys.path[0] = os.getcwd()
        runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
    elif req["argv"][0] == "-c":   # the code's globals are __main__'s, as
        __g = sys.modules["__main__"].__dict__   # its own: none of these
        __g["__tnet_code"] = compile(req["code"], "<string>", "exec")
        for __n in [n for n in __g if not n.startswith("__")]:
            del __g[__n]
        del __n
        exec(__g.pop("__tnet_code"), __g.pop("__g"))
    else:
        sys.path[0] = os.path.dirname(os.path.abspath(req["argv"][0]))
        runpy.run_path(req["argv"][0], run_name="__main__")
except BaseException as __e:
    __finish(__e)
__finish()
"""


class _Zygote:
    def __init__(self, key: tuple, env: dict):
        self.key = key
        # Its own output (an import that fails) is kept for the error.
        self._log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _ZYGOTE.replace("MODULES", repr(MODULES))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self._log, text=True,
            cwd=ROOT, env=env, start_new_session=True)
        self._buf = b""
        self.busy = False  # running a command (one at a time)

    def line(self, timeout: Optional[float]) -> dict:
        """The zygote's next reply, waiting up to `timeout` seconds."""
        fd = self.proc.stdout.fileno()
        end = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = None if end is None else max(0.0, end - time.monotonic())
            if select.select([fd], [], [], left)[0]:
                chunk = os.read(fd, 4096)
                if not chunk:
                    self._log.seek(0)
                    said = self._log.read()[-3000:].decode("utf-8", "replace")
                    raise RuntimeError("the forking process died (status "
                                       f"{self.proc.wait()}):\n{said}")
                self._buf += chunk
            elif left is not None and time.monotonic() >= end:
                raise subprocess.TimeoutExpired("forkrun", timeout)
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.alive():
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


_lock = threading.Lock()
_zygotes: dict = {}  # by the import-time environment
#: CPU seconds of the forked commands (tests/support/cpu_time.py adds them
#: to the test's children, as it counts a subprocess's).
child_cpu = 0.0
#: Whether the last run() forked its command (False: subprocess.run).
last_forked = False


@atexit.register
def _stop() -> None:
    for z in _zygotes.values():
        z.close()


def _key(env: dict) -> tuple:
    malloc = sorted((k, v) for k, v in env.items() if k.startswith("MALLOC_"))
    return tuple(env.get(k) for k in _START_VARS), tuple(malloc)


def _parse(cmd, scripts: bool) -> Optional[tuple]:
    """(module or None, sys.argv, the command after the interpreter), or
    None for a command this does not run."""
    cmd = [str(c) for c in cmd]
    if len(cmd) < 2 or cmd[0] != sys.executable:
        return None
    if cmd[1] == "-m":
        if len(cmd) > 2 and cmd[2] in MODULES:
            return cmd[2], [cmd[2], *cmd[3:]], cmd[1:]
        return None
    if scripts and cmd[1] == "-c" and len(cmd) > 2:
        return None, ["-c", *cmd[3:]], cmd[1:]
    if scripts and not cmd[1].startswith("-"):
        return None, cmd[1:], cmd[1:]
    return None


def _forkable(cmd, env: dict, scripts: bool) -> Optional[tuple]:
    parsed = _parse(cmd, scripts)
    if (parsed is None or "TF_CONFIG" in env
            or os.environ.get("TNET_FORKRUN") == "0"):
        return None
    return parsed


def _begin(parsed: tuple, env: dict, cwd, stdin: Optional[str],
           stdout: str, stderr: str) -> Optional[tuple]:
    """Forks the command: (zygote, pid), or None when the zygote for its
    environment is running another command (a Popen still alive)."""
    key = _key(env)
    with _lock:
        z = _zygotes.get(key)
        if z is None or not z.alive():
            z = _zygotes[key] = _Zygote(key, env)
        if z.busy:
            return None
        z.busy = True
    module, argv, orig = parsed
    request = {"module": module, "argv": argv, "orig": orig,
               "code": orig[1] if argv[0] == "-c" else None,
               "cwd": os.path.abspath(str(cwd or os.getcwd())),
               "env": env, "stdout": stdout, "stderr": stderr,
               "stdin": stdin}
    z.proc.stdin.write(json.dumps(request) + "\n")
    z.proc.stdin.flush()
    return z, z.line(600)["pid"]


def _end(z: _Zygote, timeout: Optional[float]) -> int:
    """Waits up to `timeout` s for the forked command: its exit status."""
    global child_cpu
    done = z.line(timeout)
    z.busy = False
    child_cpu += done["cpu"]
    return done["code"]


def run(cmd, *, env: Optional[dict] = None, cwd=None,
        timeout: Optional[float] = None, capture_output: bool = False,
        text: bool = False, input=None, check: bool = False,
        script_imports_tnet: bool = False,
        **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run(cmd, ...) for `python -m` one of MODULES, or for
    `python script.py ...` / `python -c code ...` when the caller says the
    program imports tnet first thing (`script_imports_tnet`), its output
    captured (capture_output, or stdout=PIPE with stderr=STDOUT); any
    other command goes to subprocess.run itself."""
    global last_forked
    env = dict(os.environ if env is None else env)
    merged = kwargs == {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT}
    parsed = _forkable(cmd, env, script_imports_tnet)
    last_forked = False
    if parsed is not None and (capture_output and not kwargs or merged):
        with tempfile.TemporaryDirectory(prefix="forkrun") as tmp:
            paths = {n: os.path.join(tmp, n)
                     for n in ("stdin", "stdout", "stderr")}
            for n in ("stdout", "stderr"):
                open(paths[n], "wb").close()
            if input is not None:
                with open(paths["stdin"], "wb") as f:
                    f.write(input.encode() if isinstance(input, str)
                            else input)
            started = _begin(parsed, env, cwd,
                             paths["stdin"] if input is not None else None,
                             paths["stdout"],
                             paths["stdout" if merged else "stderr"])
            if started is not None:
                last_forked = True
                z, pid = started
                try:
                    code = _end(z, timeout)
                except subprocess.TimeoutExpired:
                    os.kill(pid, signal.SIGKILL)
                    _end(z, 60)
                    raise subprocess.TimeoutExpired(cmd, timeout) from None
                out = open(paths["stdout"], "rb").read()
                err = None if merged else open(paths["stderr"], "rb").read()
                if text:
                    out, err = (None if b is None
                                else b.decode("utf-8", "replace")
                                for b in (out, err))
                res = subprocess.CompletedProcess(cmd, code, out, err)
                if check:
                    res.check_returncode()
                return res
    return subprocess.run(cmd, env=env, cwd=cwd, timeout=timeout,
                          capture_output=capture_output, text=text,
                          input=input, check=check, **kwargs)


class Popen:
    """subprocess.Popen(cmd, stdout=<an open file>, stderr=STDOUT or
    another open file, ...) for a command run() would fork, started
    forked: pid, poll(), wait(), send_signal(), kill(), terminate(),
    returncode. Anything else (or the zygote busy with another Popen)
    is a real subprocess.Popen."""

    def __init__(self, cmd, *, stdout, stderr=None, cwd=None,
                 env: Optional[dict] = None, script_imports_tnet=False):
        env = dict(os.environ if env is None else env)
        self.args, self.returncode = cmd, None
        self._z = self._proc = None
        parsed = _forkable(cmd, env, script_imports_tnet)
        named = hasattr(stdout, "name") and (
            stderr == subprocess.STDOUT or hasattr(stderr, "name"))
        if parsed is not None and named:
            stdout.flush()
            err = stdout if stderr == subprocess.STDOUT else stderr
            started = _begin(parsed, env, cwd, None, stdout.name, err.name)
            if started is not None:
                self._z, self.pid = started
                return
        self._proc = subprocess.Popen(cmd, stdout=stdout, stderr=stderr,
                                      cwd=cwd, env=env)
        self.pid = self._proc.pid

    def poll(self) -> Optional[int]:
        if self._proc is not None:
            self.returncode = self._proc.poll()
        elif self.returncode is None:
            try:
                self.returncode = _end(self._z, 0)
            except subprocess.TimeoutExpired:
                pass
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        if self._proc is not None:
            self.returncode = self._proc.wait(timeout)
        elif self.returncode is None:
            try:
                self.returncode = _end(self._z, timeout)
            except subprocess.TimeoutExpired:
                raise subprocess.TimeoutExpired(self.args, timeout) from None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)
