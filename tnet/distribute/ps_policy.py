"""The chief's policy for a ps that stops answering: closures fail on it
for up to `ps_timeout()` (TNET_PS_TIMEOUT) before the job ends with
EXIT_RESTART; `through_ps_cut` runs the chief's own ps reads and writes
under the same budget; a step watchdog ends the chief when no step
finishes for TNET_STEP_TIMEOUT."""
from __future__ import annotations

import os
import threading
from typing import Any, Dict

import tensorflow as tf

from tnet.distribute.failures import (EXIT_RESTART, blamed_ps, exit_now,
                                      explain_failure)
from tnet.distribute.tf_config import parse_tf_config
from tnet.log import get as _get_logger

_log = _get_logger("distribute")


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
