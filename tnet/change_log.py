"""A SparseTable's change log and its named readers (`table.change_log`).

Each shard of a table (in C++, on its ps) keeps change marks: after
`SparseTable.mark_changes()` it stamps every row it changes above the mark,
counts the changes it cannot stamp and logs the keys it frees (bounded);
`SparseTable.changes()` reads that. Two kinds of readers use it, and each
registers on the table's `change_log` under a name, so what reads a table's
changes, and where each reader stands, is visible on the table:

* `"checkpoint"`: incremental checkpoints (tnet.saving.delta_marks). Its
  cursor is `marks`: the id of the checkpoint last written or restored with
  tracking and each shard's (generation, mark) then. A checkpoint re-marks
  the table after each save and restore (`ChangeLog.mark`), which empties
  the deletion log.
* `"publisher:<export_dir>"`: each delta publisher (tnet.serving.publish).
  Its cursor is how many of each shard's logged freed keys it has read;
  what it read and has not published yet stays in the reader
  (`freed()`), so a re-mark by the checkpoint loses none of it.

`ChangeLog.mark(by, track)` is the one way to re-mark: every other reader
first reads what is left of the log (`catch_up`), then the table is marked
and their cursors restart at the new mark. When the marking reader stops
tracking (`track=False`) and another reader is registered, the table keeps
tracking for it.

A checkpoint also records, per reader that says what it is (`describe`),
the freed keys it holds (a trainer restored from it publishes them); a
restore hands them back (`restored`), and the next reader registered with
the same `handoff` key takes them.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

CHECKPOINT = "checkpoint"


class ChangeReader:
    """One named reader of a table's change log (see the module doc).

    Attributes:
      name: its name on the table ("checkpoint", "publisher:<dir>").
      owner: the object that reads through it (a publisher), or None.
      marks: the checkpoint reader's cursor, (checkpoint id,
        [(generation, mark)] per shard), or None.
      reads_freed: whether it reads the freed keys (publishers) and keeps
        them across re-marks.
      dropped: the log overflowed while it read (some freed keys missed),
        since its last `clear`.
      describe: what a checkpoint records about it besides its freed keys
        (a callable returning a dict), or None: not recorded.
      restored: what the checkpoint the table was restored from recorded
        for this reader's handoff key, if any.
    """

    def __init__(self, log: "ChangeLog", name: str, owner: Any = None,
                 reads_freed: bool = True,
                 describe: Optional[Callable[[], Dict[str, Any]]] = None):
        self.log = log
        self.name = name
        self.owner = owner
        self.reads_freed = reads_freed
        self.describe = describe
        self.marks: Optional[Tuple[str, List[Tuple[int, int]]]] = None
        self.dropped = False
        self.restored: Optional[Dict[str, Any]] = None
        # Per shard ((generation, mark), keys of its log read so far).
        self._cursor: List[Tuple[Tuple[int, int], int]] = []
        self._unread: List[np.ndarray] = []

    @property
    def cursor(self) -> List[Tuple[int, int, int]]:
        """Per shard (generation, mark, freed keys of its log read)."""
        return [(g, m, n) for (g, m), n in self._cursor]

    def catch_up(self, skip: bool = False) -> None:
        """Reads the freed keys logged since the cursor into the reader
        (`skip`: moves the cursor to the log's end without keeping them)."""
        if not self.reads_freed:
            return
        changes = self.log.table.changes()
        cursor = []
        for shard, c in enumerate(changes):
            key = (c["generation"], c["mark"])
            read = self._cursor[shard][1] if shard < len(self._cursor) and \
                self._cursor[shard][0] == key else 0
            deleted = c["deleted"]
            if not skip and len(deleted) > read:
                self._unread.append(np.asarray(deleted[read:], np.int64))
            if c["dropped"] and not skip:
                self.dropped = True
            cursor.append((key, len(deleted)))
        self._cursor = cursor

    def add(self, keys) -> None:
        """Freed keys from elsewhere (a restored checkpoint's record)."""
        keys = np.asarray(keys, np.int64)
        if len(keys):
            self._unread.append(keys)

    def freed(self) -> np.ndarray:
        """Sorted unique keys freed since the last `clear` (reads the log
        first)."""
        self.catch_up()
        return (np.unique(np.concatenate(self._unread)) if self._unread
                else np.zeros(0, np.int64))

    def clear(self) -> None:
        """Forgets the freed keys read so far and `dropped` (after they
        were published)."""
        self._unread = []
        self.dropped = False

    def _restart(self) -> None:
        self._cursor = []  # the log restarts at the new mark

    def __repr__(self) -> str:
        at = self.marks if not self.reads_freed else self.cursor
        return f"ChangeReader({self.name!r}, at={at})"


class ChangeLog:
    """The change log of one SparseTable: its named readers (`readers`),
    the one way to re-mark it (`mark`), and what a restored checkpoint
    recorded for readers to come (`restored`)."""

    def __init__(self, table):
        self._table = weakref.ref(table)
        self.readers: Dict[str, ChangeReader] = {}
        # {handoff key: record} from the checkpoint the table was restored
        # from; a reader registered with that key takes its record.
        self.restored: Dict[str, Dict[str, Any]] = {}

    @property
    def table(self):
        table = self._table()
        if table is None:
            raise RuntimeError("the table of this change log is gone")
        return table

    def register(self, name: str, owner: Any = None, reads_freed: bool = True,
                 describe: Optional[Callable[[], Dict[str, Any]]] = None,
                 handoff: Optional[str] = None) -> ChangeReader:
        """A new reader `name`; it reads the freed keys logged from now on
        (and, with `handoff`, takes what a restored checkpoint recorded
        under that key)."""
        if name in self.readers:
            raise ValueError(f"table {self.table.table_name!r} already has a "
                             f"change-log reader named {name!r}")
        reader = ChangeReader(self, name, owner, reads_freed, describe)
        reader.catch_up(skip=True)
        if handoff is not None:
            reader.restored = self.restored.pop(handoff, None)
        self.readers[name] = reader
        return reader

    def reader(self, name: str) -> Optional[ChangeReader]:
        return self.readers.get(name)

    def unregister(self, name: str) -> None:
        self.readers.pop(name, None)

    def mark(self, by: str, track: bool = True) -> List[Tuple[int, int]]:
        """Re-marks the table for reader `by` (or, track=False, stops its
        tracking); every other reader reads the log first, and while any is
        registered the table keeps tracking. Returns [(generation, mark)]
        per shard."""
        others = [r for n, r in self.readers.items() if n != by]
        for reader in others:
            reader.catch_up()
        marks = self.table.mark_changes(track or bool(others))
        for reader in others:
            reader._restart()  # noqa: SLF001
        return marks

    def __repr__(self) -> str:
        return f"ChangeLog({list(self.readers.values())})"

