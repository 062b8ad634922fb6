"""Change marks: what lets a delta checkpoint read only the changed rows.

After every checkpoint it writes or restores with tracking, the process
calls `SparseTable.mark_changes()`: each shard (in C++, on its ps) records a
mark, the largest last_step any of its rows has, and from then on stamps
every changed row above it, counts the changes it cannot stamp (untracked)
and logs the keys it frees (bounded). The chief keeps only, per live table,
the checkpoint id and each shard's (generation, mark), as the `marks` of
the "checkpoint" reader on the table's change log (`table.change_log`,
tnet/change_log.py): a few bytes, never a per-row index. A delta then
exports `since_step=mark` per shard and writes the deletion log; see
checkpoint.py's module docstring for the rules.
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional, Tuple

import numpy as np

from tnet.change_log import CHECKPOINT
from tnet.table import SparseTable


def _set_marks(table: SparseTable, ckpt_id: Optional[str]) -> None:
    """Marks `table` at checkpoint `ckpt_id`, or (None) stops tracking,
    through its change log's "checkpoint" reader (whose `marks` the next
    delta checks); the table's other readers (delta publishers) read what
    is left of the log first and keep it tracking."""
    log = table.change_log
    if ckpt_id is None:
        log.mark(CHECKPOINT, False)
        log.unregister(CHECKPOINT)
        return
    reader = log.reader(CHECKPOINT) or log.register(CHECKPOINT,
                                                    reads_freed=False)
    reader.marks = (ckpt_id, log.mark(CHECKPOINT, True))


def _table_changes(table: SparseTable, tname: str, parent: str,
                   parent_id: str) -> Tuple[Optional[List[Dict]],
                                            Optional[str]]:
    """(per-shard changes since `parent`, None), or (None, why a delta on
    `parent` would not be exact)."""
    name = os.path.basename(parent)
    reader = table.change_log.reader(CHECKPOINT)
    marks = reader.marks if reader is not None else None
    if marks is None or marks[0] != parent_id:
        return None, (f"this process holds no change marks of {name} for "
                      f"table {tname!r} (it did not write it or restore it "
                      "with track_changes=True)")
    changes = table.changes()
    if len(changes) != len(marks[1]):
        return None, f"table {tname!r} changed its shard count since {name}"
    for shard, (c, (generation, mark)) in enumerate(zip(changes, marks[1])):
        if c["generation"] != generation or c["mark"] != mark or mark < 0:
            return None, (f"table {tname!r} shard {shard}: change tracking "
                          f"was reset since {name}")
        if c["untracked"]:
            return None, (
                f"table {tname!r}: {c['untracked']} row changes since {name} "
                f"without a training push above step {mark} (an eviction "
                "with show decay, imported rows, or pushes with an older "
                "step)")
        if c["dropped"]:
            return None, (
                f"table {tname!r}: more rows were freed since {name} than "
                f"the deletion log holds ({len(c['deleted']):,} logged, "
                f"{c['dropped']:,} more)")
    return changes, None


def _deleted_keys(changes: List[Dict], written: np.ndarray) -> np.ndarray:
    """Sorted unique keys freed since the parent and not live now (a key
    freed and inserted again is in `written`, the delta's rows)."""
    logs = [c["deleted"] for c in changes if len(c["deleted"])]
    if not logs:
        return np.zeros(0, np.int64)
    deleted = np.unique(np.concatenate(logs))
    if len(written):
        deleted = deleted[~np.isin(deleted, written)]
    return deleted.astype(np.int64, copy=False)
