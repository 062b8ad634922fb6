"""Several "hosts" on one machine: Linux network namespaces on a bridge.

`Hosts(["chief0", "ps0", "worker0", ...])` makes, for each name, a network
namespace with its own address on a private bridge (10.231.0.10, .11, ...
on 10.231.0.0/24; a second address per host on 10.231.1.0/24, which no
task is told about, to check what a task listens on). Nothing is routed:
the bridge has no address in the root namespace, so traffic stays between
the namespaces this harness made. A partition is `cut(name)`: the host's
veth is set down on the bridge side (`heal(name)` sets it up again), as a
pulled cable or a dead switch port; packets are dropped, no RST is sent.

Everything is named `tnh<pid>...` (pid of the process that made it):
`close()` (the context manager, and an atexit hook) kills the processes
left in the namespaces and removes namespaces, veths and the bridge, and
`cleanup_leftovers()` removes those of processes that no longer exist
(a killed test run). Needs root and `ip`; `skip_reason()` says why not
(tests skip with it, and fail under CI=true).
"""
from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import subprocess
import time
from typing import Dict, List, Optional

import pytest

SUBNET = "10.231.0"       # the hosts' addresses (TF_CONFIG)
SIDE_SUBNET = "10.231.1"  # a second address per host, never in TF_CONFIG
_NAME = re.compile(r"^tnh(\d+)")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and res.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {res.stderr.strip()}")
    return res


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_namespace_processes(ns: str) -> None:
    res = _ip("netns", "pids", ns, check=False)
    for pid in res.stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def cleanup_leftovers() -> List[str]:
    """Removes namespaces and links named tnh<pid>... whose pid is gone."""
    removed = []
    if shutil.which("ip") is None:
        return removed
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        ns = line.split()[0] if line.split() else ""
        m = _NAME.match(ns)
        if m and not _alive(int(m.group(1))):
            _kill_namespace_processes(ns)
            _ip("netns", "del", ns, check=False)
            removed.append(ns)
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        parts = line.split(":")
        if len(parts) < 2:
            continue
        link = parts[1].strip().split("@")[0]
        m = _NAME.match(link)
        if m and not _alive(int(m.group(1))):
            _ip("link", "del", link, check=False)
            removed.append(link)
    return removed


def skip_reason() -> Optional[str]:
    """Why network namespaces cannot be made here, or None."""
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"tnh{os.getpid()}probe"
    res = _ip("netns", "add", probe, check=False)
    if res.returncode != 0:
        return f"cannot create a network namespace: {res.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    res = _ip("link", "add", f"tnh{os.getpid()}pb", "type", "bridge",
              check=False)
    if res.returncode != 0:
        return f"cannot create a bridge: {res.stderr.strip()}"
    _ip("link", "del", f"tnh{os.getpid()}pb", check=False)
    return None


def require() -> None:
    """Skips the test (fails it under CI=true) when namespaces cannot be made."""
    reason = skip_reason()
    if reason is None:
        return
    message = f"no multi-host harness: {reason}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


class Hosts:
    """Named network namespaces on one bridge; see the module docstring."""

    def __init__(self, names: List[str]):
        self.tag = f"tnh{os.getpid()}"
        self.bridge = f"{self.tag}br"
        self.names = list(names)
        self.address: Dict[str, str] = {}
        self.side_address: Dict[str, str] = {}
        self._veth: Dict[str, str] = {}
        self._closed = False
        cleanup_leftovers()
        atexit.register(self.close)
        try:
            self._make()
        except Exception:
            self.close()
            raise

    def ns(self, name: str) -> str:
        return f"{self.tag}-{name}"

    def _make(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("link", "set", self.bridge, "up")
        for i, name in enumerate(self.names):
            ns, host_end, peer = self.ns(name), f"{self.tag}h{i}", f"{self.tag}n{i}"
            _ip("netns", "add", ns)
            _ip("link", "add", host_end, "type", "veth", "peer", "name", peer)
            _ip("link", "set", peer, "netns", ns)
            _ip("-n", ns, "link", "set", peer, "name", "eth0")
            _ip("link", "set", host_end, "master", self.bridge)
            _ip("link", "set", host_end, "up")
            self.address[name] = f"{SUBNET}.{10 + i}"
            self.side_address[name] = f"{SIDE_SUBNET}.{10 + i}"
            _ip("-n", ns, "addr", "add", f"{self.address[name]}/24", "dev", "eth0")
            _ip("-n", ns, "addr", "add", f"{self.side_address[name]}/24",
                "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            self._veth[name] = host_end

    def prefix(self, name: str) -> List[str]:
        """Command prefix that runs a command on host `name`."""
        return ["ip", "netns", "exec", self.ns(name)]

    def run(self, name: str, cmd: List[str], **kwargs) -> subprocess.CompletedProcess:
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.prefix(name) + list(cmd), **kwargs)

    def cut(self, name: str) -> None:
        """Partition host `name` from all others (its link goes down)."""
        _ip("link", "set", self._veth[name], "down")

    def heal(self, name: str) -> None:
        _ip("link", "set", self._veth[name], "up")

    def wait_reachable(self, src: str, dst: str, port: int,
                       timeout: float = 30) -> bool:
        """True once `src` can open a TCP connection to `dst`:`port`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.connect(src, self.address[dst], port, 1.0) == "open":
                return True
            time.sleep(0.2)
        return False

    def connect(self, src: str, address: str, port: int,
                timeout: float = 2.0) -> str:
        """'open', 'refused' or 'timeout'/'error: ...': a TCP connect from
        host `src` to address:port."""
        code = ("import socket,sys\n"
                "s=socket.socket();s.settimeout(float(sys.argv[3]))\n"
                "try:\n s.connect((sys.argv[1],int(sys.argv[2])));print('open')\n"
                "except ConnectionRefusedError:print('refused')\n"
                "except socket.timeout:print('timeout')\n"
                "except OSError as e:print('error: '+str(e))\n")
        res = self.run(src, ["python3", "-c", code, address, str(port),
                             str(timeout)], timeout=timeout + 30)
        return res.stdout.strip() or res.stderr.strip()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for name in self.names:
            _kill_namespace_processes(self.ns(name))
        for name in self.names:
            _ip("netns", "del", self.ns(name), check=False)
        for veth in self._veth.values():
            _ip("link", "del", veth, check=False)
        _ip("link", "del", self.bridge, check=False)
        try:
            atexit.unregister(self.close)
        except Exception:  # noqa: BLE001
            pass

    def leftovers(self) -> List[str]:
        """Namespaces and links of this harness that still exist."""
        out = [l.split()[0] for l in _ip("netns", "list", check=False)
               .stdout.splitlines() if l.startswith(self.tag + "-")]
        out += [l.split(":")[1].strip().split("@")[0] for l in
                _ip("-o", "link", "show", check=False).stdout.splitlines()
                if l.split(":")[1].strip().startswith(self.tag)]
        return out

    def __enter__(self) -> "Hosts":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def cluster_hosts(ps: int, workers: int) -> List[str]:
    return ["chief0"] + [f"ps{i}" for i in range(ps)] + \
        [f"worker{i}" for i in range(workers)]


def tf_cluster(hosts: Hosts, ps: int, workers: int,
               port: int = 2222) -> Dict[str, List[str]]:
    """TF_CONFIG's cluster: every task on its own host, all on `port`."""
    return {"chief": [f"{hosts.address['chief0']}:{port}"],
            "ps": [f"{hosts.address[f'ps{i}']}:{port}" for i in range(ps)],
            "worker": [f"{hosts.address[f'worker{i}']}:{port}"
                       for i in range(workers)]}


def task_prefix(hosts: Hosts) -> str:
    """tnet.launch's --task_prefix for these hosts (ps:0 on host ps0, ...)."""
    return f"ip netns exec {hosts.tag}-{{kind}}{{index}}"
