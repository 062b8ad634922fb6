"""The gRPC channel options every task of a cluster uses
(TF_GRPC_DEFAULT_OPTIONS: keepalive and reconnect backoff)."""
from __future__ import annotations

import os


# gRPC channel options every task of a cluster uses unless the environment
# sets TF_GRPC_DEFAULT_OPTIONS itself (TensorFlow reads it when it opens a
# channel: "name=value,name=value"). Keepalive pings find a peer that went
# silent (cut link, paused host) instead of waiting on its TCP connection
# forever; see docs/DESIGN.md "Failures across hosts" for what was measured.
# Reconnect backoff 2 s (gRPC: a connect attempt may take up to
# min_reconnect_backoff, 20 s by default, and waits grow to 120 s): a
# channel whose connect attempt began during a cut was still failing steps
# 1.3 s after the heal (a step then updated ps:0 and failed on ps:1: one
# update too many), and some heals were followed by 17-19 s without a step.
GRPC_DEFAULT_OPTIONS = ("grpc.keepalive_time_ms=5000,"
                        "grpc.keepalive_timeout_ms=5000,"
                        "grpc.min_reconnect_backoff_ms=2000,"
                        "grpc.max_reconnect_backoff_ms=2000")


def set_grpc_defaults() -> str:
    """Sets TF_GRPC_DEFAULT_OPTIONS to tnet's keepalive defaults unless it is
    set already (empty: TensorFlow's own defaults); returns the value used.
    Called by `python -m tnet.server` and `ParameterServerStrategy()` before
    any channel opens."""
    return os.environ.setdefault("TF_GRPC_DEFAULT_OPTIONS",
                                 GRPC_DEFAULT_OPTIONS)
