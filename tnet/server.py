"""The ps / worker process: python -m tnet.server

Loads tnet's op library (before the server starts: graphs that reach this
task need the ops registered), starts a tf.distribute.Server for this task
of TF_CONFIG and serves until SIGTERM/SIGINT, then exits 0. The server
listens only on this task's TF_CONFIG address (see tnet/bind.py; TNET_BIND=all
restores TensorFlow's every-interface listening).

The server joins in a daemon thread so the main thread stays free to handle
signals (a Python signal handler never runs while the main thread is blocked
in server.join()).

Memory: the process sets two glibc malloc options
(`tnet.distribute.pin_mmap_threshold`; the chief sets them too). The mmap
threshold is pinned so that every large transient buffer (checkpoint
export chunks, pushed gradients) is mmapped and returned to the OS when
freed. With glibc's default dynamic threshold, the first large free raises
the threshold to up to 32 MiB, later buffers come from the heap, and the
heap fragments: a ps grew ~0.5 MB per checkpoint without bound in a
30-minute soak (measured: +95 MB over 120 saves; flat with the threshold
pinned). The top pad (64 MiB) keeps what a step frees for the next step
instead of handing it back to the kernel after every step.
"""
from __future__ import annotations

import argparse
import signal
import sys
import threading

import tnet  # noqa: F401  (selects tf_keras before TensorFlow loads)
import tensorflow as tf

from tnet import _ops  # noqa: F401  (registers the ops in this process)
from tnet import bind, distribute
from tnet.distribute import pin_mmap_threshold
from tnet import log as tnet_log

_log = tnet_log.get("server")


def _parse_args(argv):
    """tnet.server takes only --verbosity (TF_CONFIG says everything else);
    anything else is a usage error: exit 2, never a silently ignored
    typo."""
    parser = argparse.ArgumentParser(
        prog="python -m tnet.server",
        description="A ps or worker task of the TF_CONFIG cluster: serves "
                    "until SIGTERM / SIGINT.")
    tnet_log.add_verbosity_flag(parser)
    args = parser.parse_args(argv)
    tnet_log.set_verbosity(args.verbosity)
    return args


def main(argv=None) -> int:
    _parse_args(sys.argv[1:] if argv is None else argv)
    try:
        pin_mmap_threshold()   # flat RSS, no page faults per step (see above)
    except distribute.MallocSettingError as e:
        _log.error(f"tnet.server: {e}")
        return 2
    distribute.set_grpc_defaults()  # keepalive: find silent peers
    # TF_CONFIG is checked before bind.ensure() may re-execute the process
    # (a bad one fails at once, not after a second start of Python).
    try:
        config = distribute.parse_tf_config()
    except distribute.ClusterConfigError as e:
        _log.error(f"tnet.server: {e}")
        return 2
    if config is None:
        _log.error("tnet.server: TF_CONFIG is not set; a ps or worker task needs "
              "it (tnet.launch sets it for local clusters)")
        return 2
    kind, index = config["task"]["type"], config["task"].get("index", 0)
    if kind not in ("ps", "worker"):
        _log.error(f"tnet.server: this task is {kind}:{index}; only ps and worker "
              "tasks run tnet.server (the chief runs the training program)")
        return 2
    bind.ensure()  # listen on TF_CONFIG's address only (TNET_BIND, SECURITY.md)
    cluster = tf.train.ClusterSpec(config["cluster"])
    server = tf.distribute.Server(cluster, job_name=kind, task_index=index,
                                  protocol=config.get("rpc_layer", "grpc"),
                                  start=True)
    stop = threading.Event()

    def _on_signal(signum, frame):
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    threading.Thread(target=server.join, daemon=True).start()
    _log.info(f"tnet.server: {kind}:{index} serving at {server.target}")
    while not stop.wait(1.0):
        pass
    _log.info(f"tnet.server: {kind}:{index} stopping")
    return 0


if __name__ == "__main__":
    sys.exit(main())
