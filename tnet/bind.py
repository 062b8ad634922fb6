"""Keeps a task's gRPC port on the address TF_CONFIG names.

`tf.distribute.Server` listens on every interface (`[::]:port`) whatever
host TF_CONFIG gives for the task, so a ps port meant for a private network
is also open on every other network the host has. tnet ships a small
LD_PRELOAD library (`tnet/_lib/libtnet_bind.so`, source
`tnet_ops/bind/bind_shim.c`) that rewrites that one wildcard bind to the
task's own address. A preload only works from the start of a process, so
`python -m tnet.server` and `python -m tnet.train` call `ensure()` first:
it re-executes the process once with the library preloaded, and
`tnet/launch.py` sets the environment before it starts each task.

The policy comes from the environment variable TNET_BIND:

- `auto` (default): listen only on the task's TF_CONFIG address when that
  host resolves to an address of this machine; otherwise warn and listen on
  every interface, as TensorFlow does.
- `strict`: like auto, but refuse to start when the address cannot be used.
- `all`: TensorFlow's behaviour (every interface).

This module uses only the standard library: tnet/launch.py loads it
by path without importing TensorFlow.
"""
from __future__ import annotations

import json
import logging
import os
import pathlib
import socket
import sys
from typing import Dict, List, Optional, Tuple

# Stdlib only: tnet.launch loads this file without importing tnet.
_log = logging.getLogger("tnet.bind")

__all__ = ["BindError", "shim_path", "bind_environment", "ensure"]

_LIB = pathlib.Path(__file__).resolve().parent / "_lib" / "libtnet_bind.so"
_POLICIES = ("auto", "strict", "all")


class BindError(RuntimeError):
    """The task's TF_CONFIG address cannot be bound under TNET_BIND=strict."""


def shim_path() -> pathlib.Path:
    """Path of the preload library (built by setup.py with the ops)."""
    return _LIB


def _policy(env: Dict[str, str]) -> str:
    policy = env.get("TNET_BIND", "auto").strip().lower() or "auto"
    if policy not in _POLICIES:
        raise BindError(f"TNET_BIND={policy!r} is not one of {_POLICIES}: "
                        "use auto (default), strict or all")
    return policy


def _own_address(tf_config: str) -> Optional[Tuple[str, int]]:
    """(host, port) of this task in TF_CONFIG, or None if there is none."""
    try:
        config = json.loads(tf_config)
        task = config["task"]
        address = config["cluster"][task["type"]][int(task.get("index", 0))]
        host, _, port = address.rpartition(":")
        return host.strip("[]"), int(port)
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return None  # tnet.distribute reports a malformed TF_CONFIG


def _local_ip(host: str) -> Tuple[Optional[str], str]:
    """An address of this machine that `host` resolves to, or (None, why)."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        return None, f"{host!r} does not resolve ({e.strerror})"
    for family, _, _, _, sockaddr in infos:
        ip = sockaddr[0]
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind((ip, 0))
            return ip, ""
        except OSError:
            continue
    ips = sorted({info[4][0] for info in infos})
    return None, f"{host!r} resolves to {ips}, none of them on this machine"


def bind_environment(env: Optional[Dict[str, str]] = None,
                     warn=None) -> Dict[str, str]:
    """The variables that make a process with `env` bind its TF_CONFIG address.

    Returns {} when there is nothing to do (no TF_CONFIG, TNET_BIND=all, the
    library is not built, or under auto the host is not local: then `warn`
    is called with the reason). Raises BindError under TNET_BIND=strict when
    the address cannot be bound.
    """
    env = dict(os.environ if env is None else env)
    warn = warn or _log.warning
    policy = _policy(env)
    own = _own_address(env.get("TF_CONFIG", ""))
    if policy == "all" or own is None:
        return {}
    host, port = own
    problem = ""
    ip = None
    if not _LIB.exists():
        problem = (f"{_LIB} is missing; rebuild tnet (make build or "
                   "pip install -e . --no-build-isolation)")
    else:
        ip, problem = _local_ip(host)
    if ip is None:
        message = (f"tnet bind: cannot keep port {port} on {host}: {problem}")
        if policy == "strict":
            raise BindError(message + " (TNET_BIND=strict)")
        warn(message + "; listening on every interface (set TNET_BIND=all "
             "to silence this, and see SECURITY.md)")
        return {}
    preload = [p for p in env.get("LD_PRELOAD", "").split(":") if p]
    if str(_LIB) not in preload:
        preload.insert(0, str(_LIB))
    return {"LD_PRELOAD": ":".join(preload), "TNET_BIND_HOST": ip,
            "TNET_BIND_PORTS": str(port)}


def _shim_loaded() -> bool:
    try:
        with open("/proc/self/maps") as maps:
            return any(_LIB.name in line for line in maps)
    except OSError:
        return False


def ensure(argv: Optional[List[str]] = None) -> None:
    """Re-executes this process once with the bind library preloaded.

    Call it first thing in a ps, worker or chief program (before a
    tf.distribute.Server starts). Returns without doing anything when no
    preload is needed or the library is already loaded; exits with status 2
    on a BindError.

    Args:
      argv: the command line to re-execute (default: this process's).

    Example:
        ```python
        # my_chief.py, run with its TF_CONFIG:
        import tnet as tn
        tn.bind.ensure()                    # first: keep ports on TF_CONFIG's host
        strategy = tn.distribute.ParameterServerStrategy()
        ```
    """
    try:
        extra = bind_environment()
    except BindError as e:
        _log.error("%s", e)
        raise SystemExit(2) from None
    if not extra or _shim_loaded():
        return
    if os.environ.get("TNET_BIND_REEXEC") == "1":
        # The preload did not take (e.g. a static or setuid interpreter):
        # never loop; say so and go on with TensorFlow's binding.
        _log.warning("tnet bind: the preload library did not load; "
                     "listening on every interface")
        return
    env = dict(os.environ, TNET_BIND_REEXEC="1", **extra)
    argv = list(sys.orig_argv if argv is None else argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *argv[1:]], env)
