"""The bind library keeps gRPC ports on the TF_CONFIG address (tnet/bind.py).

The listening address is read from /proc/net/tcp{,6} of the server process's
network namespace; no traffic leaves 127.0.0.1.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from tnet import bind

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tf_config(host: str, port: int, kind: str = "ps") -> str:
    cluster = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"],
               "ps": ["127.0.0.1:3"]}
    cluster[kind] = [f"{host}:{port}"]
    return json.dumps({"cluster": cluster, "task": {"type": kind, "index": 0}})


def _listeners(port: int) -> list[str]:
    """Local addresses listening on `port`: 'ANY', '127.0.0.1', ... ."""
    found = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(name) as f:
            next(f)
            for line in f:
                fields = line.split()
                addr, hexport = fields[1].split(":")
                if fields[3] != "0A" or int(hexport, 16) != port:
                    continue
                raw = bytes.fromhex(addr)
                # Each 32-bit word is in host (little-endian) order.
                raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                if not any(raw):
                    found.append("ANY")
                elif len(raw) == 16 and raw[:12] == b"\0" * 10 + b"\xff\xff":
                    found.append(socket.inet_ntop(socket.AF_INET, raw[12:]))
                elif len(raw) == 16:
                    found.append(socket.inet_ntop(socket.AF_INET6, raw))
                else:
                    found.append(socket.inet_ntop(socket.AF_INET, raw))
    return found


def _wait_listening(port: int, proc: subprocess.Popen, timeout=240.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = _listeners(port)
        if found:
            return found
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            pytest.fail(f"server exited with {proc.returncode}:\n{out}")
        time.sleep(0.2)
    pytest.fail(f"nothing listens on port {port} after {timeout}s")


_SERVER = textwrap.dedent("""
    import os, time
    import tensorflow as tf
    port = int(os.environ["PORT"])
    tf.distribute.Server(tf.train.ClusterSpec({"ps": [f"127.0.0.1:{port}"]}),
                         job_name="ps", task_index=0, start=True)
    print("up", flush=True)
    time.sleep(120)
""")


def _run_server(env: dict, port: int) -> list[str]:
    env = dict(env, PORT=str(port), TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.Popen([sys.executable, "-c", _SERVER], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        return _wait_listening(port, proc)
    finally:
        proc.kill()
        proc.wait()


def test_environment_for_a_local_address():
    env = {"TF_CONFIG": _tf_config("localhost", 4242)}
    extra = bind.bind_environment(env)
    assert extra["TNET_BIND_PORTS"] == "4242"
    assert extra["TNET_BIND_HOST"] in ("127.0.0.1", "::1")
    assert extra["LD_PRELOAD"].split(":")[0] == str(bind.shim_path())
    # An existing preload is kept, after ours.
    env["LD_PRELOAD"] = "/x/other.so"
    assert bind.bind_environment(env)["LD_PRELOAD"].endswith(":/x/other.so")


def test_nothing_to_do_without_tf_config_or_with_all():
    assert bind.bind_environment({}) == {}
    assert bind.bind_environment({"TF_CONFIG": _tf_config("127.0.0.1", 1),
                                  "TNET_BIND": "all"}) == {}


def test_non_local_host_warns_under_auto_and_fails_under_strict():
    # 192.0.2.0/24 is TEST-NET-1: never an address of this machine.
    env = {"TF_CONFIG": _tf_config("192.0.2.7", 4242)}
    warnings = []
    assert bind.bind_environment(env, warn=warnings.append) == {}
    assert "192.0.2.7" in warnings[0] and "every interface" in warnings[0]
    with pytest.raises(bind.BindError, match="192.0.2.7.*strict"):
        bind.bind_environment(dict(env, TNET_BIND="strict"))
    with pytest.raises(bind.BindError, match="TNET_BIND='sometimes'"):
        bind.bind_environment(dict(env, TNET_BIND="sometimes"))


def test_stock_server_listens_everywhere_and_the_shim_narrows_it():
    port = _free_port()
    assert _run_server(dict(os.environ), port) == ["ANY"]
    port = _free_port()
    env = dict(os.environ, TF_CONFIG=_tf_config("127.0.0.1", port))
    env.update(bind.bind_environment(env))
    assert _run_server(env, port) == ["127.0.0.1"]


def test_tnet_server_reexecs_with_the_shim_and_still_serves():
    port = _free_port()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TNET_BIND") and k != "LD_PRELOAD"}
    env.update(TF_CONFIG=_tf_config("127.0.0.1", port, kind="worker"),
               TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO)
    proc = subprocess.Popen([sys.executable, "-m", "tnet.server"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        assert _wait_listening(port, proc) == ["127.0.0.1"]
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # still reachable on the TF_CONFIG address
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out
    assert "listening only on 127.0.0.1" in out
