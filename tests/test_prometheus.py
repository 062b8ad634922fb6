"""A real Prometheus server scrapes a streaming trainer and a follower.

Debian's `prometheus` package is installed by this test when it is absent
and the test runs as root (`apt-get install -y prometheus`); when it cannot
be installed the test skips with one line saying so (the exposition text
is checked without it in tests/test_monitoring.py). The trainer streams
files that keep landing and publishes deltas; the follower applies them
to the predict server of tests/programs (no tnet in it); Prometheus,
configured to scrape both endpoints on 127.0.0.1 every second, is asked
over its HTTP API for the lag metric (present, and moving between two
queries) and for the version the follower's replica serves.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

import pytest

from support import byod_data as bd

ROOT = pathlib.Path(__file__).resolve().parents[1]
SERVER = ROOT / "tests" / "programs" / "predict_server.py"

pytestmark = pytest.mark.long


def _prometheus() -> str:
    """The prometheus binary, installed from Debian's package if absent
    (as root); skips the test with one line when it cannot be."""
    found = shutil.which("prometheus")
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("prometheus is not installed and this is not root with "
                    "apt-get: `apt-get install prometheus` to run this test")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends",
               "prometheus"]
    res = subprocess.run(install, env=env, capture_output=True, text=True,
                         timeout=900)
    if res.returncode != 0:  # an old package list: update it once
        subprocess.run(["apt-get", "update", "-q"], env=env,
                       capture_output=True, timeout=900)
        res = subprocess.run(install, env=env, capture_output=True,
                             text=True, timeout=900)
    found = shutil.which("prometheus")
    if not found:
        last = (res.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"could not install Debian's prometheus package: {last}")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _land(directory: pathlib.Path, i: int) -> None:
    tmp = directory / f".f-{i:04d}.tmp"
    bd.write_tfrecord(tmp, bd.rows(64, seed=i))
    os.rename(tmp, directory / f"f-{i:04d}.tfrecord")


def _env(tnet: bool = True) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", OMP_NUM_THREADS="1")
    if tnet:
        env["PYTHONPATH"] = str(ROOT)
    return env


def _wait(what, predicate, procs, timeout=300.0):
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        for name, proc, log in procs:
            assert proc.poll() is None, \
                f"{name} exited {proc.returncode}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _port_in(log: pathlib.Path):
    m = re.search(r"metrics on http://[0-9.]+:(\d+)/metrics", log.read_text())
    return int(m.group(1)) if m else None


def _query(port: int, expr: str) -> list:
    url = (f"http://127.0.0.1:{port}/api/v1/query?"
           + urllib.parse.urlencode({"query": expr}))
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]["result"]


def test_prometheus_scrapes_the_trainer_and_the_follower(tmp_path):
    prometheus = _prometheus()
    bd.write_spec(tmp_path / "spec.json")
    data = tmp_path / "in"
    data.mkdir()
    _land(data, 0)
    procs = []
    stop = threading.Event()

    def start(name, cmd, tnet=True):
        log = tmp_path / f"{name}.log"
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=_env(tnet),
                                stdout=open(log, "w"),
                                stderr=subprocess.STDOUT)
        procs.append((name, proc, log))
        return log

    def writer():  # a file a second, so lag and versions keep moving
        i = 1
        while not stop.wait(1.0):
            _land(data, i)
            i += 1

    thread = threading.Thread(target=writer, daemon=True)
    try:
        trainer_log = start("trainer", [
            sys.executable, "-m", "tnet.train",
            f"--feature_spec={tmp_path / 'spec.json'}", "--format=tfrecord",
            f"--stream={data}", f"--checkpoint_dir={tmp_path / 'ckpt'}",
            f"--model_dir={tmp_path / 'run'}", "--hidden_units=8",
            "--batch_size=32", "--shuffle_buffer=0", "--stream_poll_secs=0.2",
            f"--export_dir={tmp_path / 'export'}",
            "--publish_every_seconds=1", "--publish_compact_at=0",
            "--metrics_port=0"])
        trainer_port = _wait("the trainer's metrics port",
                             lambda: _port_in(trainer_log), procs)
        export = _wait("the base export", lambda: sorted(
            (tmp_path / "export").glob("*/export_info.json")), procs)
        export = export[-1].parent
        port_file = tmp_path / "server.port"
        start("server", [sys.executable, str(SERVER), str(export), "ranker",
                         str(port_file)], tnet=False)
        _wait("the server", port_file.exists, procs)
        address = f"127.0.0.1:{port_file.read_text().strip()}"
        follower_log = start("follower", [
            sys.executable, "-m", "tnet.serving.follow",
            "--export_dir", str(export), "--target",
            f"grpc://{address}/ranker", "--interval=0.5",
            "--metrics_port=0", "--metrics_addr=127.0.0.1"])
        follower_port = _wait("the follower's metrics port",
                              lambda: _port_in(follower_log), procs)
        thread.start()
        prom_port = _free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
            "scrape_configs:\n"
            "  - job_name: trainer\n    static_configs:\n"
            f"      - targets: ['127.0.0.1:{trainer_port}']\n"
            "  - job_name: follower\n    static_configs:\n"
            f"      - targets: ['127.0.0.1:{follower_port}']\n")
        start("prometheus", [
            prometheus, f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}"], tnet=False)

        def lag():
            try:
                got = _query(prom_port, 'tnet_stream_lag_seconds{job="trainer"}')
            except OSError:
                return None
            return got and (float(got[0]["value"][0]),
                            float(got[0]["value"][1]))

        first = _wait("the lag metric in Prometheus", lag, procs)
        second = _wait("a later scrape of the lag metric", lambda: (
            (got := lag()) and got[0] >= first[0] + 3 and got), procs)
        assert second[1] != first[1], (first, second)
        assert 0 <= first[1] < 300 and 0 <= second[1] < 300
        # The follower's replica serves what the trainer published.
        served = _wait("the served version in Prometheus", lambda: _query(
            prom_port, "tnet_follow_delta_version >= 1"), procs)
        assert served[0]["metric"]["job"] == "follower"
        assert served[0]["metric"]["target"] == f"grpc://{address}/ranker"
        trained = _query(prom_port, "tnet_stream_files_trained_total")
        assert float(trained[0]["value"][1]) >= 1
        up = _query(prom_port, "up")
        assert sorted((r["metric"]["job"], r["value"][1]) for r in up) == [
            ("follower", "1"), ("trainer", "1")]
    finally:
        stop.set()
        for _, proc, _ in reversed(procs):
            if proc.poll() is None:
                proc.terminate()
        for _, proc, _ in procs:
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
