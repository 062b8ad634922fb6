"""Per-thread scopes that change what a tnet lookup does.

- `recording(tape)`: opened by `tn.Model.train_step`; each training lookup
  inside registers a `tnet.layers.lookup.Lookup` (the rows the tape
  watches, the keys a push needs) with the innermost recorder.
- `serving_lookups(overrides)`: opened by `tn.serving.export_for_serving`;
  lookups of the given tables call stock-TF callables instead of the table
  op, and combiners use stock ops (`serving_active`).

Thread-local because Keras traces train_step and the export traces the
model on the calling thread; nothing else reads this state.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Iterator, List, Optional

_STATE = threading.local()


class Recorder:
    """The lookups (tnet.layers.lookup.Lookup) of one training step, and
    the number of examples in its batch (an int64 scalar tensor, or None
    when unknown): the pulls and pushes of the step send it to the tables,
    which scale the accumulator start of the rows they insert by it."""

    def __init__(self, tape, batch_size=None):
        self.tape = tape
        self.batch_size = batch_size
        self.lookups: List = []


@contextlib.contextmanager
def recording(tape, batch_size=None) -> Iterator[Recorder]:
    """Records the training lookups made inside the scope; `batch_size`:
    the step's examples (see Recorder)."""
    stack = getattr(_STATE, "stack", None)
    if stack is None:
        stack = _STATE.stack = []
    recorder = Recorder(tape, batch_size)
    stack.append(recorder)
    try:
        yield recorder
    finally:
        stack.pop()


@contextlib.contextmanager
def serving_lookups(overrides: dict) -> Iterator[None]:
    """While open, lookups of the given tables (SparseTable -> callable
    keys [U] -> rows [U, dim]) use the callables instead of the table ops.
    tn.serving.export_for_serving traces the model inside this scope."""
    previous = getattr(_STATE, "serving", None)
    _STATE.serving = {id(t): fn for t, fn in overrides.items()}
    try:
        yield
    finally:
        _STATE.serving = previous


def serving_active() -> bool:
    """True while export_for_serving traces the model: layers then build
    the serving graph from stock ops only."""
    return bool(getattr(_STATE, "serving", None))


def serving_override(table):
    overrides = getattr(_STATE, "serving", None)
    return overrides.get(id(table)) if overrides else None


def active_recorder() -> Optional[Recorder]:
    stack = getattr(_STATE, "stack", None)
    return stack[-1] if stack else None
