"""tests/support/forkrun.py: a command forked from the process that
imported tnet already behaves as the same command started afresh."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support import forkrun

PROGRAM = r"""
import atexit, json, os, sys
import tnet
print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(),
                  "var": os.environ.get("FORKRUN_VAR"),
                  "stdin": sys.stdin.read(),
                  "leak": hasattr(tnet, "_forkrun_leak")}))
tnet._forkrun_leak = True
os.environ["FORKRUN_LEFT"] = "1"
atexit.register(lambda: print("atexit ran", file=sys.stderr))
if sys.argv[1:] == ["abort"]:
    os.abort()
if sys.argv[1:] == ["raise"]:
    raise ValueError("raised")
if sys.argv[1:] == ["message"]:
    sys.exit("a message")
if sys.argv[1:] == ["thread"]:  # a thread still running when main ends
    import threading, time
    threading.Thread(target=lambda: (time.sleep(0.5),
                                     print("thread done", flush=True))).start()
sys.exit(int(sys.argv[1]) if sys.argv[1:] and sys.argv[1].isdigit() else 0)
"""


@pytest.fixture(autouse=True)
def _forking(monkeypatch):
    monkeypatch.delenv("TNET_FORKRUN", raising=False)  # (=0: never forks)


@pytest.fixture
def program(tmp_path):
    path = tmp_path / "program.py"
    path.write_text(PROGRAM)
    return path


def _both(program, *args, **kw):
    cmd = [sys.executable, str(program), *args]
    env = dict(os.environ, FORKRUN_VAR="v")
    kw = dict(kw, env=env, capture_output=True, text=True, timeout=120)
    fresh = subprocess.run(cmd, **kw)
    forked = forkrun.run(cmd, script_imports_tnet=True, **kw)
    return fresh, forked


@pytest.mark.parametrize("args,code", [(("3", "x"), 3), (("raise",), 1),
                                       (("message",), 1), (("thread",), 0),
                                       (("abort",), -signal.SIGABRT)])
def test_status_output_argv_cwd_env_and_stdin_are_the_commands(
        program, tmp_path, args, code):
    fresh, forked = _both(program, *args, cwd=tmp_path, input="in")
    for res in (fresh, forked):
        assert res.returncode == code, res.stderr[-2000:]
        assert res.stdout.splitlines()[0] == (
            '{"argv": %s, "cwd": "%s", "var": "v", "stdin": "in", '
            '"leak": false}' % (str(list(args)).replace("'", '"'), tmp_path))
    assert forked.stdout == fresh.stdout
    assert ("thread done" in forked.stdout) == (args == ("thread",))
    # atexit handlers run, and an exception's traceback or exit message is
    # printed, as in a process of its own (a signal skips them in both).
    assert ("atexit ran" in forked.stderr) == ("atexit ran" in fresh.stderr)
    assert ("ValueError: raised" in forked.stderr) == (args == ("raise",))
    assert ("a message" in forked.stderr) == (args == ("message",))


def test_python_c_code_and_its_arguments(tmp_path):
    code = ("import sys, tnet\nprint(sys.argv, __name__, "
            "sorted(n for n in globals() if not n.startswith('__')))\n"
            "sys.exit(5)")
    cmd = [sys.executable, "-c", code, "a", "b"]
    fresh = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path)
    forked = forkrun.run(cmd, capture_output=True, text=True, cwd=tmp_path,
                         script_imports_tnet=True)
    assert forkrun.last_forked
    assert fresh.returncode == forked.returncode == 5
    assert forked.stdout == fresh.stdout == \
        "['-c', 'a', 'b'] __main__ ['sys', 'tnet']\n"


def test_nothing_a_command_does_reaches_the_next(program, tmp_path):
    first = forkrun.run([sys.executable, str(program)], capture_output=True,
                        text=True, script_imports_tnet=True, cwd=tmp_path)
    second = forkrun.run([sys.executable, str(program)], capture_output=True,
                         text=True, script_imports_tnet=True, cwd=tmp_path)
    assert first.returncode == second.returncode == 0
    assert '"leak": false' in second.stdout
    assert "FORKRUN_LEFT" not in os.environ


def test_a_timeout_kills_the_command_and_the_next_one_runs(tmp_path):
    sleeper = tmp_path / "sleep.py"
    sleeper.write_text("import tnet, time\ntime.sleep(60)\n")
    with pytest.raises(subprocess.TimeoutExpired):
        forkrun.run([sys.executable, str(sleeper)], capture_output=True,
                    timeout=1, script_imports_tnet=True)
    again = tmp_path / "again.py"
    again.write_text("import tnet, sys\nprint('tnet' in sys.modules)\n")
    res = forkrun.run([sys.executable, str(again)], capture_output=True,
                      text=True, script_imports_tnet=True, timeout=60)
    assert res.returncode == 0 and res.stdout == "True\n", res.stderr


@pytest.mark.parametrize("how,forked", [
    ("script that imports tnet", True),
    ("cluster task", False),      # TF_CONFIG: it re-executes itself
    ("script", False),            # not said to import tnet first
    ("-m tnet.serving.checks", False),  # loads exports without tnet
])
def test_only_a_command_that_imports_tnet_first_is_forked(tmp_path, how,
                                                          forked):
    probe = tmp_path / "probe.py"
    probe.write_text("import sys\nprint('tensorflow' in sys.modules)\n")
    cmd, env, imports = [str(probe)], dict(os.environ), True
    if how == "cluster task":
        env["TF_CONFIG"] = "{}"
    elif how == "script":
        imports = False
    elif how.startswith("-m"):
        cmd = ["-m", "tnet.serving.checks", "--help"]
    res = forkrun.run([sys.executable, *cmd], capture_output=True, text=True,
                      env=env, script_imports_tnet=imports, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert forkrun.last_forked is forked
    if cmd[0] == str(probe):  # TensorFlow before its first line: forked
        assert res.stdout == f"{forked}\n"


def test_merged_output_as_subprocess_gives_it(program, tmp_path):
    """stdout=PIPE, stderr=STDOUT: one stream, in the order written."""
    cmd = [sys.executable, str(program), "2"]
    kw = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
              cwd=tmp_path, env=dict(os.environ, FORKRUN_VAR="v"))
    fresh = subprocess.run(cmd, **kw)
    forked = forkrun.run(cmd, script_imports_tnet=True, **kw)
    assert forkrun.last_forked and forked.stderr is None
    assert forked.returncode == fresh.returncode == 2
    assert forked.stdout.splitlines()[-1] == "atexit ran"
    # (the fresh Python also prints TensorFlow's start-up lines, if any)
    assert forked.stdout.splitlines() == [
        line for line in fresh.stdout.splitlines()
        if line.startswith(("{", "atexit"))]


def test_popen_a_command_then_kill_it(tmp_path):
    """A forked Popen is killed from outside as a process of its own is:
    its status says SIGKILL, what it wrote before is in its log, and the
    next command forks."""
    script = tmp_path / "wait.py"
    script.write_text("import sys, time, tnet\nprint('ready', flush=True)\n"
                      "print('to stderr', file=sys.stderr, flush=True)\n"
                      "time.sleep(120)\n")
    log = tmp_path / "log"
    with open(log, "w") as out:
        proc = forkrun.Popen([sys.executable, str(script)], stdout=out,
                             stderr=subprocess.STDOUT,
                             script_imports_tnet=True)
        assert proc._z is not None  # forked
        for _ in range(600):
            if "to stderr" in log.read_text():
                break
            assert proc.poll() is None
            time.sleep(0.05)
        assert proc.poll() is None
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
    assert log.read_text() == "ready\nto stderr\n"
    res = forkrun.run([sys.executable, "-c", "import tnet"],
                      capture_output=True, script_imports_tnet=True)
    assert res.returncode == 0 and forkrun.last_forked
