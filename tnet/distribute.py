"""Distribution: TF_CONFIG clusters and TensorFlow's ParameterServerStrategy.

A tnet cluster is the standard TF_CONFIG layout (as Kubeflow's TFJob sets
it): one `chief` that runs the training program, `worker` tasks that run the
steps, and `ps` tasks that hold the dense variables and one shard of every
tnet table each. ps and worker processes run `python -m tnet.server`; the
chief calls `tn.distribute.ParameterServerStrategy()` and `model.fit`.

Without TF_CONFIG (or with a TF_CONFIG that has no ps job) the same program
runs in one process: `ParameterServerStrategy()` then returns the default
strategy.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import re
import sys
import threading
from typing import Any, Dict, Optional

import tensorflow as tf

from tnet import _ops  # noqa: F401  (load the op library before any server)
from tnet.log import get as _get_logger

_log = _get_logger("distribute")


_M_TOP_PAD = -2                # mallopt parameters (glibc malloc.h)
_M_MMAP_THRESHOLD = -3
DEFAULT_MMAP_THRESHOLD = 128 * 1024
DEFAULT_TOP_PAD = 64 * 1024 * 1024


def _glibc_setting(environ, env_name: str, tunable: str) -> bool:
    """Whether the process's environment set this malloc option itself."""
    return (env_name in environ
            or f"glibc.malloc.{tunable}=" in environ.get("GLIBC_TUNABLES", ""))


class MallocSettingError(ValueError):
    """TNET_TOP_PAD or TNET_MMAP_THRESHOLD is not a byte count (the
    message names the variable, its value and the fix)."""


def pin_mmap_threshold(environ=None) -> dict:
    """Sets two glibc malloc options in a cluster process (ps and worker
    tasks in `python -m tnet.server`, the chief in
    `ParameterServerStrategy()`); returns {option: value set, or None}.

    - M_MMAP_THRESHOLD to TNET_MMAP_THRESHOLD or 128 KiB: fixes the
      threshold (which also turns off glibc's dynamic raising of it), so
      every large transient buffer (checkpoint export chunks, gradients) is
      mmapped and returned to the OS when freed. With the dynamic threshold
      the heap fragments and a cluster process grows with every checkpoint
      (BENCHMARKS "Checkpoint memory").
    - M_TOP_PAD to TNET_TOP_PAD or 64 MiB: a heap that trims keeps that
      much free memory, and a thread's arena keeps an emptied heap rather
      than unmapping it (glibc's heap_trim weighs both against the pad).
      With glibc's 128 KiB, each step's freed tensors and RPC buffers went
      back to the kernel and the next step faulted them in again, zeroed
      page by page: under PSS (SPARSE-HEAVY, 2w/2ps) that was ~30% of a
      worker's CPU per step and ~15% of a ps's (BENCHMARKS "The
      allocator").

    0 in either variable leaves that option alone; so does the
    environment's own setting of it (MALLOC_MMAP_THRESHOLD_ /
    MALLOC_TOP_PAD_, or glibc.malloc tunables in GLIBC_TUNABLES).
    Nothing is set where the C library is not glibc."""
    return _mallopt(("mmap_threshold", "top_pad"), environ)


def set_top_pad(environ=None) -> dict:
    """Sets only M_TOP_PAD (as `pin_mmap_threshold` does, same variables
    and opt-outs); `tn.Model` calls it when it builds its train function,
    so a one-process job keeps its freed step memory too (SPARSE-HEAVY:
    ~3,300 page faults per step without it, ~110 with it; BENCHMARKS
    "One combine per table"). The mmap threshold stays glibc's dynamic
    one. Returns {"top_pad": value set, or None}."""
    return _mallopt(("top_pad",), environ)


def _mallopt(names, environ=None) -> dict:
    environ = os.environ if environ is None else environ
    wanted = {
        "mmap_threshold": (_M_MMAP_THRESHOLD, "TNET_MMAP_THRESHOLD",
                           DEFAULT_MMAP_THRESHOLD, "MALLOC_MMAP_THRESHOLD_"),
        "top_pad": (_M_TOP_PAD, "TNET_TOP_PAD", DEFAULT_TOP_PAD,
                    "MALLOC_TOP_PAD_"),
    }
    wanted = {name: wanted[name] for name in names}
    done = {name: None for name in wanted}
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return done
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    for name, (param, ours, default, theirs) in wanted.items():
        raw = environ.get(ours, default)
        try:
            value = int(raw)
        except ValueError:
            value = -1
        if not 0 <= value < 2**31:
            raise MallocSettingError(
                f"{ours}={raw!r}: expected a whole number of bytes below "
                "2 GiB (0 leaves glibc's default)")
        if value == 0 or _glibc_setting(environ, theirs, name):
            continue
        if mallopt(param, value) == 1:
            done[name] = value
    return done


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


# The chief's exit status when the job cannot go on but a restart of the
# whole cluster can (a lost ps, a step that never returns): "restart me".
# 138 because Kubeflow's training operator restarts a replica with
# `restartPolicy: ExitCode` only for exit codes it calls retryable: 128-255
# now (pkg/util/train/train_util.go: `exitCode >= 128`), and 130, 137, 138
# and 143 in earlier releases, where 138 (128 + SIGUSR1) is the one set
# aside for a program's own retryable errors; 1-127 are permanent there.
# 1 (an unexpected error), 2 (bad flags or TF_CONFIG) and 4 (bad input)
# stay permanent: a restart would fail the same way. docs/DESIGN.md "Failures
# across hosts".
EXIT_RESTART = 138


# How long the chief lets closures fail on a ps that does not answer (link
# down, host paused) before it gives up on the job (TNET_PS_TIMEOUT). A ps
# that refuses connections (its process is gone) ends the job at once.
# 120 s: after a 20 s ps cut (tests/test_hosts.py) training went on 1-2 s
# after the link returned in about half of the runs and 17-19 s after it in
# the others (a call made during the cut stays stuck in TensorFlow's
# remote function removal that long); with 60 s, one CI run of five gave
# up on a ps that came back.
DEFAULT_PS_TIMEOUT = 120.0


def ps_timeout() -> float:
    return float(os.environ.get("TNET_PS_TIMEOUT", DEFAULT_PS_TIMEOUT))


# The policy's failure clock, for through_ps_cut: "note" and "answered".
_ps_clock: Dict[str, Any] = {}


def _install_ps_failure_policy() -> None:
    """Replaces ClusterCoordinator's count of ignored ps failures by a time
    budget.

    TensorFlow ignores the first TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES
    (3) closure failures that name a ps over the whole job, then fails it.
    A ps cut off for 20 s makes every worker's closures fail every few
    seconds (keepalive), so the count runs out during one partition and the
    job dies, or survives, by chance. tnet's rule instead: a ps that refuses
    connections is dead (fail now); a ps that does not answer is retried
    while it has been failing for less than `ps_timeout()` seconds with no
    step finishing in between; past that the chief exits EXIT_RESTART
    (138) naming it. A failure counts against the ps its error blames
    (`blamed_ps`), not every ps it mentions (TensorFlow's count): a
    reachable ps that passed the cut one's error on is not failing.
    Setting TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES keeps TensorFlow's
    rule."""
    from tensorflow.python.distribute.coordinator import (  # noqa: PLC0415
        cluster_coordinator as cc)
    if getattr(cc.Cluster, "_tnet_policy", False) or \
            "TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES" in os.environ:
        return
    import time  # noqa: PLC0415
    import queue  # noqa: PLC0415
    addresses = (parse_tf_config() or {}).get("cluster", {}).get("ps", [])
    lock = threading.Lock()
    streaks: Dict[int, list] = {}   # ps index -> [first, last, error]
    # The errors kept here are dropped by a thread of their own: an error's
    # traceback holds the worker's old dataset functions (rebuilt after the
    # failure), and freeing a function removes it from every remote task
    # with one blocking call each, which took 17-19 s after a healed 20 s
    # ps cut (a closure thread stalled in mark_finished, measured).
    graveyard: "queue.SimpleQueue" = queue.SimpleQueue()

    def reap():
        while True:
            graveyard.get()

    threading.Thread(target=reap, name="tnet-error-reaper", daemon=True).start()

    def note(tasks, e) -> bool:
        """Counts a failure against `tasks`; False once one of them has
        been failing for longer than the budget."""
        now, budget = time.monotonic(), ps_timeout()
        with lock:
            for t in tasks:
                streak = streaks.get(t)
                if streak is None:
                    streak = streaks[t] = [now, now, e]
                graveyard.put(streak[2])
                streak[1], streak[2] = now, e
                if now - streak[0] > budget:
                    return False
        return bool(tasks)

    def answered(tasks) -> None:
        """`tasks` answered the chief's own call (through_ps_cut)."""
        with lock:
            for t in tasks:
                if t in streaks:
                    graveyard.put(streaks.pop(t))

    def ignore_transient_ps_failure(self, e):
        return note(silent_ps(e, addresses), e)

    # A step that finishes clears every streak: each step reads every ps.
    finished = cc._CoordinatedClosureQueue.mark_finished  # noqa: SLF001

    def mark_finished(self):
        if streaks:
            with lock:
                graveyard.put(list(streaks.values()))
                streaks.clear()
        return finished(self)

    # Failures against a silent ps come only every ~20 s (gRPC's connect
    # timeout), so the budget is also checked by the clock: once a ps has
    # failed steps for longer than it with no step finishing since, the
    # chief prints the lost-task line (from the last error) and exits
    # EXIT_RESTART.
    def watch():
        while True:
            time.sleep(1.0)
            with lock:
                overdue = [(t, s[2]) for t, s in streaks.items()
                           if time.monotonic() - s[0] > ps_timeout()]
            if overdue:
                lost = explain_failure(overdue[0][1]) or (
                    f"lost parameter server task(s) ps:{overdue[0][0]}: "
                    + " ".join(str(overdue[0][1]).split())[:300])
                exit_now(EXIT_RESTART, f"tnet: {lost} (no step finished for "
                         f"TNET_PS_TIMEOUT={ps_timeout():g} s)")

    _ps_clock.update(note=note, answered=answered)
    cc.Cluster._record_and_ignore_transient_ps_failure = (  # noqa: SLF001
        ignore_transient_ps_failure)
    cc._CoordinatedClosureQueue.mark_finished = mark_finished  # noqa: SLF001
    cc.Cluster._tnet_policy = True  # noqa: SLF001
    threading.Thread(target=watch, name="tnet-ps-timeout", daemon=True).start()

    # A step that failed on a ps is put back and run again, but the worker's
    # dataset iterator it was reading from may have been cancelled in the
    # middle of a GetNext; such an iterator answers "End of sequence" from
    # then on, and fit died with "input ran out of data" (measured, ps cut
    # 20 s). After such a failure tnet rebuilds that worker's resources (its
    # datasets and iterators, as TensorFlow does for a recovered worker)
    # before it runs the step again.
    original = cc.WorkerPreemptionHandler.wait_on_failure

    def wait_on_failure(self, on_failure_fn=None, on_transient_failure_fn=None,
                        on_recovery_fn=None, worker_device_name="(unknown)"):
        def transient():
            if on_transient_failure_fn is not None:
                on_transient_failure_fn()
            try:
                index = int(worker_device_name.rsplit(":", 1)[1])
                worker = self._cluster.workers[index]  # noqa: SLF001
            except (ValueError, IndexError, AttributeError):
                return
            worker._on_worker_recovery()  # noqa: SLF001
        return original(self, on_failure_fn, transient, on_recovery_fn,
                        worker_device_name)

    cc.WorkerPreemptionHandler.wait_on_failure = wait_on_failure


def silent_ps(error: BaseException, addresses=None) -> list:
    """The ps task indices a failure blames when it is a ps that does not
    answer (a cut link, a paused host: TensorFlow's "ps failure", an
    `UnavailableError` or `AbortedError` from a remote ps), [] for any
    other error, including a ps that refuses connections (its process is
    gone: no wait brings it back). `addresses`: TF_CONFIG's ps list."""
    from tensorflow.python.distribute.coordinator import (  # noqa: PLC0415
        cluster_coordinator as cc)
    if not cc._is_ps_failure(error):  # noqa: SLF001
        return []
    text = str(error)
    if "Connection refused" in text or "connection refused" in text:
        return []
    if addresses is None:
        addresses = (parse_tf_config() or {}).get("cluster", {}).get("ps", [])
    return ([int(t.split(":")[1]) for t in blamed_ps(error, addresses)]
            or sorted(cc._extract_failed_ps_instances(text)))  # noqa: SLF001


def through_ps_cut(fn, what: str):
    """Returns `fn()`, run on the chief; while it fails because a ps does
    not answer (`silent_ps`), runs it again, for up to `ps_timeout()`
    seconds from its first failure, then lets the last error propagate
    (`explain_failure` names the ps; the chief's exit is 138).

    The steps themselves wait out a ps cut in ClusterCoordinator (tnet's
    policy above); this is the same budget for the chief's own reads and
    writes of ps state between steps, such as an epoch end's step recount
    and checkpoint: a 20 s cut that came while the chief saved ended the
    job (measured: 3 of 5 CI runs of the ps cut scenario, where an epoch
    took ~1 s). `fn` must be safe to run again after a failure part way
    (a checkpoint is: it publishes whole or not at all). The failures
    count on the policy's clock as a step's do, so its watch thread ends
    the chief once the ps has been silent for the budget, even while an
    attempt is still blocked. Without tnet's policy (one process, or
    TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES set) `fn` runs once.

    Args:
      fn: a function of no arguments, safe to run again after a failure.
      what: what it does, for the progress lines ("epoch 2's checkpoint").

    Example:
        ```python
        path = tn.distribute.through_ps_cut(
            lambda: tn.saving.save(model, "/ckpt"), "the final checkpoint")
        ```
    """
    from tensorflow.python.distribute.coordinator import (  # noqa: PLC0415
        cluster_coordinator as cc)
    if not getattr(cc.Cluster, "_tnet_policy", False):
        return fn()
    import time  # noqa: PLC0415
    first, failed = None, set()
    while True:
        try:
            result = fn()
            if first is not None:
                _log.warning(f"tnet: {what}: done, "
                             f"{time.monotonic() - first:.1f} s after the "
                             "first failure")
                if "answered" in _ps_clock:
                    _ps_clock["answered"](failed)
            return result
        except tf.errors.OpError as e:
            tasks = silent_ps(e)
            if not tasks:
                raise
            # The policy's clock too: its watch ends the chief at the budget
            # even while a call blocks on the silent ps (up to gRPC's connect
            # timeout, ~20 s), as it does for steps.
            failed.update(tasks)
            if "note" in _ps_clock:
                _ps_clock["note"](tasks, e)
            now = time.monotonic()
            if first is None:
                first = now
                names = ", ".join(f"ps:{t}" for t in tasks)
                _log.warning(f"tnet: {what}: {names} does not answer; trying "
                             "again for up to "
                             f"TNET_PS_TIMEOUT={ps_timeout():g} s")
            elif now - first > ps_timeout():
                raise
        time.sleep(1.0)


DEFAULT_STEP_TIMEOUT = 600.0
_watchdog = {"installed": False}


def _install_step_watchdog() -> None:
    """Ends the chief when no step of any worker has finished for
    TNET_STEP_TIMEOUT seconds (default 600; 0 turns it off) while steps are
    running: the job is stuck (a remote call that never returns), and a
    restart from the newest checkpoint (tnet.launch --restarts, a TFJob
    restart policy) is the way on. Prints one line naming the workers whose
    step has been running that long, then exits with EXIT_RESTART (138).

    A worker that is lost for good does not trip it while the others keep
    finishing steps (ClusterCoordinator waits up to an hour for a lost
    worker to come back)."""
    timeout = float(os.environ.get("TNET_STEP_TIMEOUT", DEFAULT_STEP_TIMEOUT))
    if timeout <= 0 or _watchdog["installed"]:
        return
    _watchdog["installed"] = True
    import time  # noqa: PLC0415
    from tensorflow.python.distribute.coordinator import (  # noqa: PLC0415
        cluster_coordinator as cc)
    running: Dict[int, float] = {}
    last = {"finished": time.monotonic()}
    original = cc.Worker._process_closure  # noqa: SLF001

    def process_closure(self, closure):
        running[self.worker_index] = time.monotonic()
        try:
            return original(self, closure)
        finally:
            running.pop(self.worker_index, None)
            last["finished"] = time.monotonic()

    cc.Worker._process_closure = process_closure  # noqa: SLF001

    def watch():
        while True:
            time.sleep(min(5.0, timeout / 4))
            now = time.monotonic()
            stuck = sorted(i for i, t in list(running.items())
                           if now - t > timeout)
            if stuck and now - last["finished"] > timeout:
                names = ", ".join(f"worker:{i}" for i in stuck)
                exit_now(EXIT_RESTART,
                         f"tnet: no step finished for "
                         f"{now - last['finished']:.0f} s (TNET_STEP_TIMEOUT="
                         f"{timeout:g}); the step on {names} never returned. "
                         "Stopping the chief: restart the cluster (tnet.launch"
                         " --restarts N, or a TFJob restartPolicy) to resume "
                         "from the newest checkpoint.")

    threading.Thread(target=watch, name="tnet-step-watchdog",
                     daemon=True).start()


def set_grpc_defaults() -> str:
    """Sets TF_GRPC_DEFAULT_OPTIONS to tnet's keepalive defaults unless it is
    set already (empty: TensorFlow's own defaults); returns the value used.
    Called by `python -m tnet.server` and `ParameterServerStrategy()` before
    any channel opens."""
    return os.environ.setdefault("TF_GRPC_DEFAULT_OPTIONS",
                                 GRPC_DEFAULT_OPTIONS)


class ClusterConfigError(ValueError):
    """TF_CONFIG is malformed or describes an unusable cluster.

    Example:
        ```python
        try:
            tn.distribute.parse_tf_config('{"cluster": {}}')
        except tn.distribute.ClusterConfigError as e:
            print(e)          # the reason and the fix, one line
        ```
    """


def parse_tf_config(raw: Optional[str] = None) -> Optional[Dict[str, Any]]:
    """Parses and validates TF_CONFIG (the environment's by default).

    Returns None when TF_CONFIG is unset or empty. Raises ClusterConfigError
    with the reason and the fix for bad JSON, a missing cluster, a missing
    chief or ps job, an unknown task type, or an index out of range.

    Args:
      raw: a TF_CONFIG JSON string (default: the environment's TF_CONFIG).

    Returns:
      The parsed dict (`cluster`, `task`), or None.

    Example:
        ```python
        config = tn.distribute.parse_tf_config(
            '{"cluster": {"chief": ["h0:2222"], "ps": ["h1:2222"],'
            ' "worker": ["h2:2222"]}, "task": {"type": "chief", "index": 0}}')
        print(config["task"])        # {'type': 'chief', 'index': 0}
        ```
    """
    raw = os.environ.get("TF_CONFIG", "") if raw is None else raw
    if not raw.strip():
        return None
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ClusterConfigError(
            f"TF_CONFIG is not valid JSON ({e.msg} at line {e.lineno} column "
            f"{e.colno}): {raw[:200]!r}") from None
    if not isinstance(config, dict) or not isinstance(config.get("cluster"), dict):
        raise ClusterConfigError(
            'TF_CONFIG needs a "cluster" object, e.g. {"cluster": {"chief": '
            '["host:port"], "worker": [...], "ps": [...]}, "task": {"type": '
            '"chief", "index": 0}}')
    cluster = config["cluster"]
    for job, addresses in cluster.items():
        if (not isinstance(addresses, list) or not addresses
                or not all(isinstance(a, str) and ":" in a for a in addresses)):
            raise ClusterConfigError(
                f"TF_CONFIG cluster job {job!r} must be a non-empty list of "
                f"'host:port' strings, got {addresses!r}")
    if "ps" not in cluster:
        raise ClusterConfigError(
            "TF_CONFIG has no 'ps' job: ParameterServerStrategy needs at "
            "least one ps task (unset TF_CONFIG to train in one process)")
    if "worker" not in cluster:
        raise ClusterConfigError("TF_CONFIG has no 'worker' job: add at "
                                 "least one worker task")
    if "chief" not in cluster:
        raise ClusterConfigError("TF_CONFIG has no 'chief' job: the chief "
                                 "runs the training program")
    if len(cluster["chief"]) != 1:
        raise ClusterConfigError("TF_CONFIG must have exactly one chief")
    task = config.get("task")
    if not isinstance(task, dict) or "type" not in task:
        raise ClusterConfigError('TF_CONFIG needs "task": {"type": ..., '
                                 '"index": ...}')
    kind, index = task.get("type"), task.get("index", 0)
    if kind not in cluster:
        raise ClusterConfigError(
            f"TF_CONFIG task type {kind!r} is not a job of the cluster "
            f"({sorted(cluster)})")
    if not isinstance(index, int) or not 0 <= index < len(cluster[kind]):
        raise ClusterConfigError(
            f"TF_CONFIG task index {index!r} is out of range for job {kind!r} "
            f"with {len(cluster[kind])} task(s)")
    return config


def ParameterServerStrategy(variable_partitioner=None,  # noqa: N802
                            tf_config: Optional[str] = None):
    """The strategy for this process's TF_CONFIG.

    With a ps cluster: a `tf.distribute.ParameterServerStrategy` built from
    TF_CONFIG (the caller must be the chief). `variable_partitioner`
    optionally shards large dense variables over the ps tasks, e.g.
    `tf.distribute.experimental.partitioners.MinSizePartitioner(...)`.
    Without TF_CONFIG: the default (one-process) strategy.

    The chief sets glibc's mmap threshold and top pad (`pin_mmap_threshold`):
    measured, 300 full saves from a chief grew it ~40 KB a save without the
    mmap pin and left it flat with it.

    Args:
      variable_partitioner: optional partitioner of large dense variables
        over the ps tasks (None: each dense variable on one ps).
      tf_config: a TF_CONFIG JSON string to use instead of the environment's.

    Returns:
      A `tf.distribute.ParameterServerStrategy` under a cluster, else the
      default strategy.

    Example:
        ```python
        strategy = tn.distribute.ParameterServerStrategy()
        with strategy.scope():
            model = tn.models.WideDeep(["user_id"], [], embedding_dim=8)
            model.compile(tn.optimizer.Adagrad(0.05))
        model.fit(tf.keras.utils.experimental.DatasetCreator(dataset_fn),
                  epochs=2, steps_per_epoch=100)
        ```
    """
    config = parse_tf_config(tf_config)
    if config is None:
        return tf.distribute.get_strategy()
    if config["task"]["type"] != "chief":
        raise ClusterConfigError(
            f"this process is {config['task']['type']}:"
            f"{config['task'].get('index', 0)} in TF_CONFIG; only the chief "
            "builds the strategy. Start ps and worker tasks with "
            "`python -m tnet.server`.")
    pin_mmap_threshold()
    set_grpc_defaults()
    _install_ps_failure_policy()
    _install_step_watchdog()
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    return tf.distribute.ParameterServerStrategy(
        resolver, variable_partitioner=variable_partitioner)


def unreachable_tasks(config: Optional[Dict[str, Any]] = None,
                      jobs=("ps", "worker"), timeout: float = 2.0):
    """Tasks of TF_CONFIG whose address refuses a TCP connection now.

    Used after a failed step to name the lost task in the error. Connects
    to the address as written in TF_CONFIG.
    """
    import socket  # noqa: PLC0415
    config = config or parse_tf_config()
    lost = []
    for job in jobs:
        for index, address in enumerate(config["cluster"].get(job, [])):
            host, _, port = address.rpartition(":")
            try:
                with socket.create_connection((host.strip("[]"), int(port)),
                                              timeout=timeout):
                    pass
            except OSError as e:
                lost.append((f"{job}:{index}", address, str(e)))
    return lost


class LostTaskError(RuntimeError):
    """A ps task of the cluster died or is cut off; the job cannot go on
    without it. `tasks` names them ("ps:1").

    Args:
      message: the line naming the lost task(s) and what a restart redoes.
      tasks: the lost tasks, e.g. `("ps:1",)`.

    Example:
        ```python
        try:
            model.fit(data, epochs=3)
        except tn.distribute.LostTaskError as e:
            tn.distribute.exit_now(tn.distribute.EXIT_RESTART, str(e))
        ```
    """

    def __init__(self, message: str, tasks=()):
        super().__init__(message)
        self.tasks = list(tasks)


_TASK_IN_ERROR = re.compile(r"/job:(ps|worker|chief)/replica:\d+/task:(\d+)")
_REMOTE_TARGET = re.compile(
    r"remote target /job:(ps|worker|chief)/replica:\d+/task:(\d+)")


def _relays(text: str, end: int) -> bool:
    """Whether the remote target whose mention ends at `end` only passed on
    another task's error: the gRPC error it answered with (the `{...}`
    after the mention) names a further remote target before it closes."""
    payload = text.find("{", end)
    if payload < 0:
        return False
    close = text.find("}", payload)
    further = text.find("remote target", payload)
    return further >= 0 and (close < 0 or further < close)


def tasks_named_in(error: BaseException, job: str = "ps"):
    """Tasks of `job` an error's text names ("ps:1"), in order, without
    repeats: those it names as the gRPC remote target that failed
    (TensorFlow's "GRPC error information from remote target
    /job:ps/replica:0/task:1 while calling ...", followed by that task's
    own error), leaving out a remote target that only passed another
    task's error on (measured with ps:1 cut off: the error ps:0 answered
    with was ps:1's, from its own RecvTensor call to ps:1); when that leaves
    none, every task it names as a remote target; when it names none that
    way, every task of `job` it mentions (an error from a cut ps also
    mentions the other ps tasks, whose ops of the same step were
    cancelled)."""
    text = str(error)
    failed, targets = [], []
    for m in _REMOTE_TARGET.finditer(text):
        kind, name = m.group(1), f"{m.group(1)}:{m.group(2)}"
        if kind != job:
            continue
        if name not in targets:
            targets.append(name)
        if name not in failed and not _relays(text, m.end()):
            failed.append(name)
    if failed or targets:
        return failed or targets
    out = []
    for kind, index in _TASK_IN_ERROR.findall(text):
        name = f"{kind}:{index}"
        if kind == job and name not in out:
            out.append(name)
    return out


def blamed_ps(error: BaseException, addresses) -> list:
    """The ps tasks ("ps:1") a failed step's error blames: those
    `tasks_named_in` finds, narrowed to the ones whose address (TF_CONFIG's
    `addresses`) gRPC names as the one it could not reach ("ipv4:10.0.0.7:
    2222") when the text has any. Both the lost-task line and the ps
    timeout's clock go by it."""
    named = [t for t in tasks_named_in(error, "ps")
             if int(t.split(":")[1]) < len(addresses)]
    text = str(error)
    unreachable = [t for t in named if addresses[int(t.split(":")[1])] in text]
    return unreachable or named


_CLUSTER_ERRORS = (tf.errors.UnavailableError, tf.errors.AbortedError,
                   tf.errors.CancelledError, tf.errors.InternalError,
                   tf.errors.NotFoundError, tf.errors.InvalidArgumentError,
                   tf.errors.DeadlineExceededError, tf.errors.UnknownError,
                   tf.errors.FailedPreconditionError)


def explain_failure(error: BaseException) -> Optional[LostTaskError]:
    """If a cluster failure was caused by a lost (dead or unreachable) ps
    task, a LostTaskError naming it and what to do; otherwise None.

    The task is the one TensorFlow's error names (its text carries
    `/job:ps/replica:0/task:N`); only an error that names no ps task falls
    back to probing each ps address with a TCP connection."""
    if not isinstance(error, _CLUSTER_ERRORS):
        return None
    config = parse_tf_config()
    if config is None:
        return None
    ps = config["cluster"].get("ps", [])
    named = blamed_ps(error, ps)
    if named and (isinstance(error, (tf.errors.UnavailableError,
                                     tf.errors.DeadlineExceededError,
                                     tf.errors.AbortedError))
                  or "GRPC error information from remote target /job:ps"
                  in str(error) or "unreachable" in str(error).lower()):
        lost = [(t, ps[int(t.split(":")[1])], "named in the error")
                for t in named]
    else:
        lost = unreachable_tasks(config, jobs=("ps",))
    if not lost:
        return None
    names = ", ".join(f"{name} ({address})" for name, address, _ in lost)
    first = " ".join(str(error).split())[:300]
    return LostTaskError(
        f"lost parameter server task(s) {names}: dead or cut off from the "
        "cluster. The tables and dense variables on a ps cannot be rebuilt "
        "from the other tasks, so training cannot continue: restart the "
        "whole cluster (tnet.launch --restarts N, or a TFJob restartPolicy "
        "of ExitCode or OnFailure on the chief); with checkpoints enabled "
        "training resumes "
        f"from the newest one. Original error: {type(error).__name__}: "
        f"{first}", [name for name, _, _ in lost])


def steps_lost_note(model=None, checkpoint=None, timeout: float = 3.0) -> str:
    """What a restart will redo, for the lost-task line: the newest
    checkpoint (`checkpoint`: the tn.callbacks.Checkpoint of the run) and,
    when `optimizer.iterations` can still be read from the ps that holds it
    (within `timeout` s), the step training had reached."""
    saved = getattr(checkpoint, "last_saved_step", None)
    reached = None
    if model is not None and getattr(model, "optimizer", None) is not None:
        box = {}

        def read():
            try:
                box["step"] = int(model.optimizer.iterations.numpy())
            except Exception:  # noqa: BLE001  (the ps holding it is gone)
                pass

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(timeout)
        reached = box.get("step")
    if checkpoint is None:
        note = "no checkpoints in this run: a restart starts from step 0"
        return note + (f" (training had reached step {reached})"
                       if reached is not None else "")
    if saved is None:
        note = "no checkpoint saved yet: a restart starts from step 0"
        return note + (f", {reached} steps lost" if reached is not None else "")
    note = f"newest checkpoint ckpt-{saved}"
    if reached is not None and reached >= saved:
        note += (f"; training had reached step {reached}: a restart redoes "
                 f"{reached - saved} steps (steps lost: {reached - saved})")
    return note


_exiting = threading.Lock()  # taken by exit_now, never given back


def exit_now(code: int, message: Optional[str] = None) -> None:
    """Prints `message` (if any) on stderr, flushes stdout/stderr and ends
    the process at once with `code`.

    Only the first caller prints and exits: a thread that calls it while
    another is exiting waits for the end of the process. So the chief
    prints one lost-task line even when its ps-timeout watch and its main
    thread (a failed `fit`) give up on the same ps at the same time.

    A normal interpreter exit on a cluster's chief tears down the eager
    context, which removes every function from every remote task and waits
    on a task that is gone (after a lost ps: 1 s, 10 s or 100 s, reported)
    or was cut off during the run (measured: 38 s once in 5 worker
    partitions). A chief program whose work is written (checkpoints,
    exports, summaries) has nothing left to clean up: `tnet.train` ends
    with it under a cluster, and a program of your own can too.

    Args:
      code: the exit status (0 done, `EXIT_RESTART` = 138 restart the
        cluster, 2 bad flags, 4 bad input, 1 other errors).
      message: a line for stderr, or None.

    Example:
        ```python
        model.fit(data, epochs=3)
        tn.saving.export_for_serving(model, "/export/1")
        tn.distribute.exit_now(0)        # the chief's work is written
        ```
    """
    _exiting.acquire()
    if message is not None:
        try:
            _log.error(message)
        except (OSError, ValueError):
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def is_parameter_server_strategy(strategy=None) -> bool:
    strategy = strategy or tf.distribute.get_strategy()
    return isinstance(strategy, tf.distribute.ParameterServerStrategy)


def num_ps(strategy=None) -> int:
    """Number of ps tasks of the current strategy (0 in one process).

    Args:
      strategy: a strategy (default: the current one, if any).

    Example:
        ```python
        strategy = tn.distribute.ParameterServerStrategy()
        print(tn.distribute.num_ps(strategy))    # 0 without TF_CONFIG
        ```
    """
    strategy = strategy or (tf.distribute.get_strategy()
                            if tf.distribute.has_strategy() else None)
    return int(getattr(getattr(strategy, "extended", None), "_num_ps", 0) or 0)
