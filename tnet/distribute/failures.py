"""Explaining a failure of the cluster: which task is lost
(`explain_failure`, `tasks_named_in`, `blamed_ps`), how many steps a
restart redoes (`steps_lost_note`), and ending the chief at once
(`exit_now`, with EXIT_RESTART when a restart of the cluster can go on)."""
from __future__ import annotations

import os
import re
import sys
import threading
from typing import Optional

import tensorflow as tf

from tnet.distribute.tf_config import parse_tf_config, unreachable_tasks
from tnet.log import get as _get_logger

_log = _get_logger("distribute")


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
