"""Training on files as they land: `stream_dataset` and `FileStream`.

    stream = tn.data.FileStream("gs://bucket/clicks/*.tfrecord.gz")
    data = tn.data.stream_dataset(spec, stream, "tfrecord", 1024)
    model.fit(data, callbacks=[tn.callbacks.StreamCheckpoint("/ckpt", stream,
                                                             every_n_files=10)])

A stream is a directory or glob that a writer keeps adding files to. The
dataset trains every file once, in name order (use names that sort by
time: `events-20261128-081500.tfrecord.gz`), as soon as it has landed:

* `landed="rename"` (default): a file counts when its final name is
  listed, so write it under another name and rename it into place (an
  atomic rename: what `gsutil cp`, `hadoop fs -put` and Spark do). Names
  that start with `.` or `_` and names ending in `.tmp`, `._COPYING_` or
  `.inprogress` are never read.
* `landed="done"`: a file counts once `<file>.done` exists beside it
  (written after the file is complete).
* `landed="success"`: the files of a directory count once `<dir>/_SUCCESS`
  exists (the Hadoop / Spark partition convention; a glob such as
  `DIR/*/part-*` then takes every partition directory that has one).

One listing per poll (the pattern's parent directories, every `poll_seconds`),
never a read of a file that has not landed. Files that land with a name
before files already trained (late files) are trained when they land.

Exactly once: a file is decoded whole before its first batch is trained
(so a damaged file trains nothing), its batches never share a batch with
another file, and `tn.callbacks.StreamCheckpoint` writes the ledger of
trained files (path, size, sha256) into the same atomic checkpoint as the
tables, only at file boundaries. A rerun restores both and trains every
landed file not in the ledger from its start: a file interrupted by a kill
is trained again against the tables as they were before it.

The ledger is bounded: an entry is dropped once the file's modification
time is older than `max_file_age_seconds` (default 7 days), and every file
older than the newest such compaction is taken as done. So a file must land
within that age of its modification time; an older one is named in the
log and not trained.

A file that cannot be read for a while (an I/O error, a file system or
object store that does not answer, the file gone since the listing) is
not damaged: it is named in the log and read again at later polls (after
1, 2, 4 ... up to 60 s), and stays pending until it reads.

Under ParameterServerStrategy, `fit_stream(model, data, callbacks)`
(tnet/data/stream_cluster.py)
trains a stream_dataset on the cluster: the chief reads the files as
above and hands each batch to a worker, joining the workers at each file
end, where the ledger moves and checkpoints are written.

A damaged file (a record that cannot be read or does not match the spec)
is named `file:record: why` and recorded as bad; with `bad_files="skip"`
(default) training goes on, with "fail" the stream stops at the file
boundary before it (`stream.failure` holds the message; the CLI exits
with status 4).
"""
from __future__ import annotations

import fnmatch
import hashlib
import os
import posixpath
import queue
import threading
import time
from typing import Any, Dict, List, Optional

import tensorflow as tf

from tnet import log
from tnet.data.spec import FeatureSpec

__all__ = ["FileStream", "stream_dataset", "LANDED"]

LANDED = ("rename", "done", "success")
DONE_SUFFIX = ".done"
SUCCESS_NAME = "_SUCCESS"
_IN_PROGRESS = (".tmp", "._COPYING_", ".inprogress")
DEFAULT_MAX_AGE = 7 * 86400.0
LEDGER_FORMAT = 1


def _log(message: str) -> None:
    log.get("stream").warning(f"tnet.stream: {message}")


def _split(pattern: str):
    """(directory glob, basename glob) of a stream pattern: a directory
    streams every file in it."""
    pattern = os.fspath(pattern).rstrip("/")
    if not any(c in pattern for c in "*?[") and tf.io.gfile.isdir(pattern):
        return pattern, "*"
    head, tail = posixpath.split(pattern)
    return head or ".", tail


def _file_mtime(path: str) -> float:
    """Modification time (tf.io.gfile.stat reads whole seconds of a
    local file: os.stat there)."""
    if "://" not in path:
        return os.stat(path).st_mtime
    return tf.io.gfile.stat(path).mtime_nsec / 1e9


# Errors of reading a file that say nothing about its bytes: the file is
# read again later, never recorded as bad.
_TRANSIENT = (OSError, tf.errors.UnavailableError, tf.errors.NotFoundError,
              tf.errors.DeadlineExceededError, tf.errors.AbortedError,
              tf.errors.ResourceExhaustedError,
              tf.errors.PermissionDeniedError, tf.errors.CancelledError)
RETRY_MAX_SECONDS = 60.0


def _is_data_name(base: str) -> bool:
    return not (base.startswith((".", "_")) or base.endswith(_IN_PROGRESS)
                or base.endswith(DONE_SUFFIX))


class Ledger:
    """The files a stream has trained (or found bad), by path.

    `entries[path]` = {"size", "sha256", "mtime", "status" ("ok"|"bad"),
    "examples", "consumed_unix"} (+ "where" for a bad file, "skipped_rows"
    when bad rows were skipped). `horizon`: files modified before it are
    taken as done (their entries were compacted away)."""

    def __init__(self, entries: Optional[Dict[str, dict]] = None,
                 horizon: float = 0.0):
        self.entries: Dict[str, dict] = dict(entries or {})
        self.horizon = float(horizon)

    def to_json(self) -> dict:
        return {"format": LEDGER_FORMAT, "horizon": self.horizon,
                "files": dict(sorted(self.entries.items()))}

    @classmethod
    def from_json(cls, data: Optional[dict]) -> "Ledger":
        if not data:
            return cls()
        if data.get("format") != LEDGER_FORMAT:
            raise ValueError(f"stream ledger format {data.get('format')!r}; "
                             f"this tnet reads {LEDGER_FORMAT}")
        return cls(data.get("files") or {}, data.get("horizon", 0.0))

    def compact(self, now: float, max_age: float) -> int:
        """Drops entries of files modified more than max_age ago; returns
        how many."""
        horizon = now - max_age
        old = [p for p, e in self.entries.items() if e["mtime"] < horizon]
        for path in old:
            del self.entries[path]
        if old:
            self.horizon = max(self.horizon, horizon)
        return len(old)

    def __contains__(self, path: str) -> bool:
        return path in self.entries

    def __len__(self) -> int:
        return len(self.entries)


class FileStream:
    """Finds the files of `pattern` that have landed and not been trained.

    Args:
      pattern: a directory, or a glob whose last part matches the files
        (`DIR/*.tfrecord.gz`, `gs://b/clicks/*/part-*`); any tf.io.gfile
        path.
      landed: "rename", "done" or "success" (see the module docstring).
      poll_seconds: how often to list when there is nothing to read.
      idle_seconds: end the stream after this long without a new file
        (None: never; a SIGTERM or `stop()` ends it).
      max_file_age_seconds: the ledger keeps files modified within this
        age; older files are taken as done (named once in the log).
      bad_files: "skip" (record a damaged file as bad, go on) or "fail"
        (stop before it, `failure` names it).

    Example:
        ```python
        stream = tn.data.FileStream("/landing/*.tfrecord.gz", idle_seconds=600)
        data = tn.data.stream_dataset(spec, stream, "tfrecord", 512)
        model.fit(data, callbacks=[tn.callbacks.StreamCheckpoint("/ckpt", stream)])
        ```
    """

    def __init__(self, pattern: str, *, landed: str = "rename",
                 poll_seconds: float = 1.0,
                 idle_seconds: Optional[float] = None,
                 max_file_age_seconds: float = DEFAULT_MAX_AGE,
                 bad_files: str = "skip"):
        if landed not in LANDED:
            raise ValueError(f"landed must be one of {list(LANDED)}, got "
                             f"{landed!r}")
        if bad_files not in ("skip", "fail"):
            raise ValueError(f"bad_files must be 'skip' or 'fail', got "
                             f"{bad_files!r}")
        if float(poll_seconds) <= 0:
            raise ValueError(f"poll_seconds must be > 0, got {poll_seconds!r}")
        if float(max_file_age_seconds) <= 0:
            raise ValueError("max_file_age_seconds must be > 0, got "
                             f"{max_file_age_seconds!r}")
        self.pattern = os.fspath(pattern)
        self.landed = landed
        self.poll_seconds = float(poll_seconds)
        self.idle_seconds = (float(idle_seconds) if idle_seconds else None)
        self.max_file_age = float(max_file_age_seconds)
        self.bad_files = bad_files
        self.ledger = Ledger()
        self.failure: Optional[str] = None  # a damaged file, bad_files="fail"
        self.error: Optional[str] = None  # the reader thread itself failed
        self.on_consume = None  # called (path, entry) as each file is done
        self.stop_reason: Optional[str] = None
        self.listings = 0
        # Training is behind when 2 or more landed files wait: said in the
        # log at most every behind_log_seconds.
        self.behind_log_seconds = 60.0
        self._behind_said = -float("inf")
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._ready.set()
        self._tracked = False
        self._too_old: set = set()
        self._mtimes: Dict[str, float] = {}
        self.pending: List[str] = []  # landed, not trained, in name order
        self._dir_glob, self._base_glob = _split(self.pattern)
        # Counters (for logs, summary.json and metrics).
        self.files_consumed = 0
        self.entries_consumed = 0  # files trained or recorded as bad
        self.examples_consumed = 0
        self.bad_files_found = 0
        self.read_retries = 0  # reads that failed for a while (retried)
        self.newest_consumed: Optional[str] = None
        self.newest_trained_mtime: Optional[float] = None
        # Set by stream_dataset(event_time_feature=...): the lag is then
        # now minus the newest event time of the files trained in this run.
        self.event_time_feature: Optional[str] = None
        self.newest_trained_event_time: Optional[float] = None
        self._future_said = False

    # --------------------------------------------------------- control
    def stop(self, reason: str = "stop requested") -> None:
        """Ends the stream at the next file boundary (thread- and
        signal-safe).

        Args:
          reason: logged when the stream ends.
        """
        if self.stop_reason is None:
            self.stop_reason = reason
        self._stop.set()

    @property
    def stopping(self) -> bool:
        """True once `stop()` was called (or a SIGTERM came)."""
        return self._stop.is_set()

    def attach(self) -> None:
        """Called by a checkpoint callback: the stream waits for
        `start(ledger)` (after the restore) before it lists anything."""
        self._tracked = True
        self._ready.clear()

    def start(self, ledger: Optional[Ledger] = None) -> None:
        """Starts listing `pattern` (`stream_dataset` calls it).

        Args:
          ledger: the trained files to skip (a restored checkpoint's), or None.
        """
        with self._lock:
            if ledger is not None:
                self.ledger = ledger
        self._ready.set()

    # --------------------------------------------------------- listing
    def list_landed(self) -> List[str]:
        """One listing: the files of the pattern that have landed, in name
        order (whatever the ledger says)."""
        listing = tf.io.gfile.glob(posixpath.join(self._dir_glob, "*"))
        self.listings += 1
        names = set(listing)
        out = []
        for path in listing:
            parent, base = posixpath.split(path)
            if not fnmatch.fnmatchcase(base, self._base_glob):
                continue
            if not _is_data_name(base):
                continue
            if self.landed == "done" and path + DONE_SUFFIX not in names:
                continue
            if (self.landed == "success"
                    and posixpath.join(parent, SUCCESS_NAME) not in names):
                continue
            out.append(path)
        return sorted(out)

    def _mtime(self, path: str) -> float:
        if path not in self._mtimes:
            self._mtimes[path] = _file_mtime(path)
        return self._mtimes[path]

    def poll(self) -> List[str]:
        """Lists once; returns the landed files not trained yet (name
        order). Files older than the ledger's horizon are named once and
        left out."""
        landed = self.list_landed()
        with self._lock:
            known = self.ledger.entries
            fresh = []
            for path in landed:
                if path in known or path in self._too_old:
                    continue
                try:
                    mtime = self._mtime(path)
                except (tf.errors.NotFoundError, OSError):
                    continue  # gone since the listing
                if mtime < self.ledger.horizon:
                    self._too_old.add(path)
                    _log(f"{path}: modified before the ledger's horizon "
                         f"(max file age {self.max_file_age:.0f} s); taken "
                         "as trained, not read")
                    continue
                fresh.append(path)
            self.pending = fresh
        return fresh

    # ------------------------------------------------------- accounting
    def _consume(self, entry: dict) -> None:
        with self._lock:
            entry = dict(entry, consumed_unix=round(time.time(), 3))
            self.ledger.entries[entry["path"]] = {
                k: v for k, v in entry.items() if k != "path"}
            self.entries_consumed += 1
            if entry["status"] == "ok":
                self.files_consumed += 1
                self.examples_consumed += entry["examples"]
                if (self.newest_consumed is None
                        or entry["path"] > self.newest_consumed):
                    self.newest_consumed = entry["path"]
                if entry.get("mtime") and (
                        self.newest_trained_mtime is None
                        or entry["mtime"] > self.newest_trained_mtime):
                    self.newest_trained_mtime = entry["mtime"]
                newest = entry.get("event_time_max")
                if newest is not None and (
                        self.newest_trained_event_time is None
                        or newest > self.newest_trained_event_time):
                    self.newest_trained_event_time = newest
                    if newest > time.time() + 86400 and not self._future_said:
                        self._future_said = True
                        _log(f"{entry['path']}: event time feature "
                             f"{self.event_time_feature!r} holds {newest:.0f}, "
                             "more than a day ahead of now: it must be unix "
                             "seconds (not milliseconds); the lag reads 0")
            if entry["path"] in self.pending:
                self.pending.remove(entry["path"])
        if self.on_consume is not None:
            self.on_consume(entry["path"], entry)

    def lag_reference(self) -> Optional[float]:
        """The time the input lag counts from (lag = now minus it): the
        newest event time trained in this run with an event-time feature,
        else the newest trained file's modification time; None before the
        first file of this run is trained."""
        if self.event_time_feature is not None:
            return self.newest_trained_event_time
        return self.newest_trained_mtime

    def _say_if_behind(self) -> None:
        n, oldest = self.pending_state()
        now = time.monotonic()
        if n < 2 or now - self._behind_said < self.behind_log_seconds:
            return
        self._behind_said = now
        wall = time.time()
        since = self.lag_reference()
        lag = (f"{wall - since:.1f} s" if since is not None
               else "no file yet")
        what = ("the newest event time trained" if self.event_time_feature
                else "the newest trained file's time")
        _log(f"training is behind: {n} landed files not trained, the oldest "
             f"written {wall - (oldest or wall):.1f} s ago; lag (now minus "
             f"{what}) {lag}. Nothing is dropped: they are trained in name "
             "order")

    def pending_state(self):
        """(files landed and not trained at the newest listing, the oldest
        one's modification time or None)."""
        with self._lock:
            times = [self._mtimes[p] for p in self.pending if p in self._mtimes]
            return len(self.pending), (min(times) if times else None)

    def ledger_state(self) -> dict:
        """The ledger as a checkpoint stores it (compacted first)."""
        with self._lock:
            dropped = self.ledger.compact(time.time(), self.max_file_age)
            if dropped:
                _log(f"ledger: {dropped} entries older than "
                     f"{self.max_file_age:.0f} s compacted")
            return self.ledger.to_json()


def _checksum(path: str):
    """(size, sha256 hex) of the file's bytes."""
    digest = hashlib.sha256()
    size = 0
    with tf.io.gfile.GFile(path, "rb") as f:
        while True:
            chunk = f.read(1 << 22)
            if not chunk:
                break
            size += len(chunk)
            digest.update(chunk)
    return size, digest.hexdigest()


def element_spec(spec: FeatureSpec, with_group: bool = False,
                 drop: Optional[str] = None):
    """The element the spec readers yield: (features, label[, weight]),
    without feature `drop`."""
    features = {}
    for f in spec.features:
        if f.name == drop:
            continue
        if f.is_id and f.multi:
            features[f.name] = tf.RaggedTensorSpec([None, None], f.tf_dtype, 1,
                                                   tf.int64)
        elif f.is_id:
            features[f.name] = tf.TensorSpec([None], f.tf_dtype)
        elif f.kind == "dense":
            features[f.name] = tf.TensorSpec([None], tf.float32)
        elif f.kind == "group" and with_group:
            features[f.name] = tf.TensorSpec([None], f.tf_dtype)
    label = tf.TensorSpec([None], tf.float32)
    if spec.weight is None:
        return features, label
    return features, label, tf.TensorSpec([None], tf.float32)


class _Reader:
    """Decodes one landed file whole (so a damaged file trains nothing)."""

    def __init__(self, spec, format, batch_size, bad_rows, shuffle_buffer,
                 seed, compression, with_group, event_time=None):
        self.spec, self.format, self.batch_size = spec, format, batch_size
        self.bad_rows, self.shuffle_buffer = bad_rows, shuffle_buffer
        self.seed, self.compression = seed, compression
        self.with_group = with_group
        self.event_time = event_time  # a dense feature, read as float64

    def read(self, path: str):
        """(entry, [flat numpy batch, ...]); entry["status"] is "bad" (with
        "where") when the file cannot be read whole."""
        from tnet.data import readers  # noqa: PLC0415
        from tnet.data._rows import ReadStats  # noqa: PLC0415
        entry: Dict[str, Any] = {"path": path}
        try:
            entry["mtime"] = _file_mtime(path)
            entry["size"], entry["sha256"] = _checksum(path)
        except _TRANSIENT as e:
            return dict(entry, status="retry", error=_first_line(e)), []
        except tf.errors.OpError as e:
            return dict(entry, status="bad", size=0, sha256="", mtime=0.0,
                        examples=0, where=f"{path}: unreadable: {e}"), []
        stats = ReadStats(max_examples=0) if self.bad_rows == "skip" else None
        # The seed of a file's shuffle comes from its name, so a rerun
        # (after a kill) draws the same order.
        seed = None
        if self.shuffle_buffer:
            seed = (int(self.seed or 0) + int.from_bytes(
                hashlib.sha256(path.encode()).digest()[:4], "little")) % (1 << 31)
        batches, examples, newest = [], 0, None
        try:
            data = readers.spec_dataset(
                self.spec, [path], self.format, self.batch_size,
                bad_rows=self.bad_rows, shuffle_buffer=self.shuffle_buffer,
                seed=seed, stats=stats, with_group=self.with_group,
                compression=self.compression, log_limit=0)
            for element in data:
                if self.event_time is not None:
                    # Taken out of the batch (the model does not get it);
                    # its max on this thread, once per batch.
                    times = element[0].pop(self.event_time).numpy()
                    if times.size:
                        top = float(times.max())
                        newest = top if newest is None else max(newest, top)
                flat = tf.nest.flatten(element, expand_composites=True)
                batches.append(tuple(t.numpy() for t in flat))
                examples += int(flat[len(flat) - (2 if self.spec.weight
                                                  is not None else 1)].shape[0])
        except _TRANSIENT as e:
            return dict(entry, status="retry", error=_first_line(e)), []
        except Exception as e:  # noqa: BLE001  (named below, never raised)
            where = _where(self.spec, path, self.format, self.compression, e)
            return dict(entry, status="bad", examples=0, where=where), []
        entry.update(status="ok", examples=examples)
        if newest is not None:
            entry["event_time_max"] = newest
        if stats is not None and stats.skipped:
            entry["skipped_rows"] = int(stats.skipped)
        return entry, batches


def _first_line(error) -> str:
    text = getattr(error, "message", None) or str(error) or repr(error)
    return (text.strip().splitlines() or [repr(error)])[0][:300]


def _where(spec, path, format, compression, error) -> str:
    """file:record: why, for a file that failed to read."""
    from tnet.data.readers import scan  # noqa: PLC0415
    try:
        for found in scan.scan_files(spec, [path], format, compression,
                                     max_examples=1, stop_at_first=True):
            if found.first:
                return found.first[0]
            if found.damaged:
                return found.damaged
    except Exception:  # noqa: BLE001
        pass
    return f"{path}: {scan._tf_text(error)}"  # noqa: SLF001


_END = object()


class _Feed:
    """One iteration of a stream dataset: a producer thread lists and
    decodes files into a bounded queue; the generator yields their batches
    and records where each file ends (in batches yielded), which
    `StreamCheckpoint` compares with the steps trained."""

    def __init__(self, stream: FileStream, reader: _Reader,
                 queue_batches: int):
        self.stream = stream
        self.reader = reader
        self.queue: "queue.Queue" = queue.Queue(maxsize=max(2, queue_batches))
        self.yielded = 0
        self.ends: List[tuple] = []  # (entry, batches yielded at its end)
        self.last_end = -1
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._produce, daemon=True,
                                       name="tnet-stream")
        self.closed = threading.Event()
        self.inflight: set = set()  # queued by this feed, not in the ledger
        self.retry: Dict[str, tuple] = {}  # path -> (failures, next try)

    def _put(self, item) -> bool:
        while not self.closed.is_set():
            try:
                self.queue.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def _produce(self) -> None:
        stream = self.stream
        try:
            while not stream._ready.wait(0.2):  # noqa: SLF001
                if self.closed.is_set():
                    return
            last_new = time.monotonic()
            while not stream.stopping and not self.closed.is_set():
                now = time.monotonic()
                todo = [p for p in stream.poll() if p not in self.inflight
                        and self.retry.get(p, (0, 0.0))[1] <= now]
                stream._say_if_behind()  # noqa: SLF001
                if not todo and not self.queue.empty():
                    last_new = time.monotonic()  # idle once training caught up
                if not todo:
                    if (stream.idle_seconds is not None and time.monotonic()
                            - last_new >= stream.idle_seconds):
                        stream.stop(f"no new file for {stream.idle_seconds:g} s")
                        break
                    stream._stop.wait(stream.poll_seconds)  # noqa: SLF001
                    continue
                last_new = time.monotonic()
                for path in todo:
                    if stream.stopping or self.closed.is_set():
                        break
                    entry, batches = self.reader.read(path)
                    if entry["status"] == "retry":
                        failures = self.retry.get(path, (0, 0.0))[0] + 1
                        wait = min(RETRY_MAX_SECONDS,
                                   stream.poll_seconds * 2 ** (failures - 1))
                        self.retry[path] = (failures, time.monotonic() + wait)
                        stream.read_retries += 1
                        _log(f"{path}: cannot read it now ({entry['error']}); "
                             f"not a damaged file: reading it again in "
                             f"{wait:g} s (attempt {failures + 1})")
                        continue  # trained when it reads, as a late file
                    if self.retry.pop(path, None) is not None:
                        _log(f"{path}: read after earlier failures")
                    self.inflight.add(path)
                    if entry["status"] == "bad":
                        stream.bad_files_found += 1
                        if stream.bad_files == "fail":
                            stream.failure = (
                                f"bad input: {entry['where']}. Fix or move the "
                                "file away (or pass --bad_files=skip to record "
                                "it as bad and go on)")
                            stream.stop("a damaged file (--bad_files=fail)")
                            break
                        _log(f"bad file, recorded and skipped: {entry['where']}")
                    if not self._put((entry, len(batches))):
                        return
                    for batch in batches:
                        if not self._put(batch):
                            return
                # Idle from now on. One listing per poll: files that landed
                # meanwhile (late names too) are in the next listing.
                last_new = time.monotonic()
        except BaseException as e:  # noqa: BLE001  (ends the dataset)
            stream.error = f"the stream's reader failed: {e!r}"
            stream.stop("the stream's reader failed")
        finally:
            self._put(_END)

    def generate(self):
        self.thread.start()
        try:
            while True:
                item = self.queue.get()
                if item is _END:
                    return
                entry, n = item
                if (self.stream.stopping and self.stream.failure is None
                        and self.stream.error is None):
                    # Stop at this file boundary: what is queued is not
                    # trained (and not in the ledger: the next run reads it).
                    return
                with self.lock:
                    self.ends.append((entry, self.yielded + n))
                    self.last_end = self.yielded + n
                for _ in range(n):
                    batch = self.queue.get()
                    self.yielded += 1
                    yield batch
                if not self.stream._tracked:  # noqa: SLF001
                    self.consume_through(self.yielded)
        finally:
            self.closed.set()

    def caught_up(self, trained: int) -> bool:
        """Whether `trained` steps are every batch yielded, at a file end,
        with nothing read ahead and no landed file waiting: training has
        caught up with the stream. (With a backlog of landed files, a
        reader slower than training empties its queue at every file end:
        that is not caught up.)"""
        return (self.last_end == trained == self.yielded
                and self.queue.empty() and not self.stream.pending)

    def consume_through(self, trained: int) -> int:
        """Moves every file whose batches are all trained into the ledger;
        returns the batch count of the last file boundary reached."""
        done = []
        with self.lock:
            while self.ends and self.ends[0][1] <= trained:
                done.append(self.ends.pop(0))
        for entry, _ in done:
            self.stream._consume(entry)  # noqa: SLF001
        return done[-1][1] if done else -1


def check_event_time_feature(spec: FeatureSpec, name: str) -> None:
    """Raises ValueError (one line) unless `name` is a dense feature of
    `spec` (an event time in unix seconds).

    Args:
      spec: the `FeatureSpec`.
      name: the feature's name.
    """
    dense = [f.name for f in spec.features if f.kind == "dense"]
    found = [f for f in spec.features if f.name == name]
    if not found:
        raise ValueError(
            f"event time feature {name!r} is not a feature of the spec "
            f"{spec.source}; its dense features: {dense or 'none'}. Add "
            "it as {\"kind\": \"dense\", \"dtype\": \"int64\"} (unix "
            "seconds) or name one of those")
    if found[0].kind != "dense":
        raise ValueError(
            f"event time feature {name!r} is of kind {found[0].kind!r} in "
            f"the spec {spec.source}; it must be a dense feature (unix "
            f"seconds); its dense features: {dense or 'none'}")


def stream_dataset(spec: FeatureSpec, pattern, format: str, batch_size: int,
                   *, bad_rows: str = "fail", shuffle_buffer: int = 0,
                   seed: Optional[int] = None, compression: Optional[str] = None,
                   with_group: bool = False, queue_batches: int = 64,
                   event_time_feature: Optional[str] = None,
                   **stream_args) -> tf.data.Dataset:
    """A dataset of the batches of `pattern`'s files as they land.

    `pattern`: a `FileStream`, or a directory / glob (then `stream_args`
    are FileStream's: landed, poll_seconds, idle_seconds,
    max_file_age_seconds, bad_files). Elements are those of
    `tn.data.spec_dataset` in `format`; a batch never holds rows of two
    files (a file's last batch may be short). `shuffle_buffer` shuffles
    within a file (seeded by `seed` and the file's name). Reading runs
    ahead of training by at most `queue_batches` batches; files that land
    faster than training wait where they are (nothing is dropped).

    The dataset ends when the stream stops (`stream.stop()`, its
    idle_seconds, or a damaged file under bad_files="fail"). Its reader is
    a Python thread of this process: under ParameterServerStrategy train
    it with `tn.data.fit_stream` (the chief reads, the workers train).
    `.stream` is the FileStream; give it to `tn.callbacks.StreamCheckpoint`
    for exactly-once training across restarts.

    `event_time_feature`: a dense feature of the spec holding each
    example's event time in unix seconds. It is read at full precision
    and taken out of the elements (the model does not get it; declare a
    second feature on the same column to give it to the model too), and
    the stream's input lag (`stream.lag_reference()`, the metrics and the
    "training is behind" log line) becomes now minus the newest event time
    of the files trained, instead of the newest trained file's
    modification time.

    Args:
      spec: the `FeatureSpec`.
      pattern: see above.
      format: "tfrecord", "csv", "tsv" or "parquet".
      batch_size: examples per batch.
      bad_rows: "fail" or "skip".
      shuffle_buffer: see above.
      seed: see above.
      compression: "GZIP" or None (from the name).
      with_group: also return the spec's group feature.
      queue_batches: see above.
      event_time_feature: see above (None: the lag counts from the files'
        modification times).
      **stream_args: FileStream's arguments when `pattern` is a path.

    Example:
        ```python
        data = tn.data.stream_dataset(spec, "/landing/", "tfrecord", 512,
                                      landed="done", idle_seconds=3600)
        model.fit(data, callbacks=[tn.callbacks.StreamCheckpoint("/ckpt", data.stream)])
        ```
    """
    stream = (pattern if isinstance(pattern, FileStream)
              else FileStream(pattern, **stream_args))
    if isinstance(pattern, FileStream) and stream_args:
        raise ValueError(f"stream_dataset: {sorted(stream_args)} are "
                         "FileStream's arguments; pass them to the FileStream")
    from tnet.data.readers import FORMATS  # noqa: PLC0415
    if format not in FORMATS:
        raise ValueError(f"format must be one of {list(FORMATS)}, got {format!r}")
    if bad_rows not in ("fail", "skip"):
        raise ValueError(f"bad_rows must be 'fail' or 'skip', got {bad_rows!r}")
    if int(batch_size) < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
    read_spec = spec
    if event_time_feature is not None:
        check_event_time_feature(spec, event_time_feature)
        read_spec = FeatureSpec(spec.features, spec.source)
        read_spec.float64_features = frozenset([event_time_feature])
        stream.event_time_feature = event_time_feature
    structure = element_spec(spec, with_group, drop=event_time_feature)
    flat_specs = tuple(tf.nest.flatten(structure, expand_composites=True))
    reader = _Reader(read_spec, format, int(batch_size), bad_rows,
                     int(shuffle_buffer), seed, compression, with_group,
                     event_time_feature)
    feeds: List[_Feed] = []

    def generate():
        feed = _Feed(stream, reader, queue_batches)
        feeds.append(feed)
        stream._feed = feed  # noqa: SLF001  (the one StreamCheckpoint reads)
        yield from feed.generate()

    data = tf.data.Dataset.from_generator(generate,
                                          output_signature=flat_specs)
    data = data.map(lambda *flat: tf.nest.pack_sequence_as(
        structure, list(flat), expand_composites=True))
    data.stream = stream
    # What fit_stream needs to read the stream without tf.data (the chief
    # of a cluster schedules each batch itself).
    data._tnet_stream_parts = (reader, queue_batches, structure,  # noqa: SLF001
                               flat_specs)
    return data
