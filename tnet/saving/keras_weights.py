"""Keras' own ways of saving and inspecting weights, with the tables in.

`tn.Model` routes these Keras methods through here so that none of them
leaves the tables out silently:

* `save_weights` / `load_weights`, HDF5 (`.h5`, `.weights.h5`): Keras
  writes the dense weights as usual; every table is added to the same file
  under the group `tnet_tables/<table>` (datasets `keys`, `weights`,
  `slots`, `meta` as in tn.saving's part files, written chunk by chunk
  through the export cursor, plus the admission state in `pending_*` and
  `counters`). `load_weights` reads them back: each table is cleared and
  gets exactly the saved rows. A file without that group (written by a
  stock model) is refused for a model with tables.
* `save_weights` / `load_weights`, TensorFlow format: the tables are
  trackables of the model and already travel in the checkpoint (each shard
  as keys / weights / slots / meta / admission state). `load_weights`
  first compares each saved table's slot width with the model's, so a
  checkpoint written with another sparse rule (other optimizer) is refused
  with that cause instead of an op's shape error at the first call.
* `get_weights` / `set_weights`: the dense list Keras returns, as a
  `TableWeights` list that also carries a snapshot of every table;
  `set_weights` of such a list restores the tables too (what
  `EarlyStopping(restore_best_weights=True)` does). Tables above
  `MAX_SNAPSHOT_BYTES` are refused with a pointer to tn.saving; a plain
  list (no snapshot) is refused for a model whose tables hold rows unless
  `set_weights(weights, tables="keep")`.
* `summary()`: a section after Keras' with each table's dim, rows so far
  and their parameter count.
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional

import numpy as np
import tensorflow as tf

from tnet.table import SparseTable

H5_GROUP = "tnet_tables"
# get_weights holds every table in memory as numpy; above this many bytes
# (weights, slots and meta of all tables) it refuses and points to
# tn.saving (checkpoints stream tables in chunks). Settable.
MAX_SNAPSHOT_BYTES = 1 << 30
_CHUNK_ROWS = 1 << 16


class TableWeightsError(ValueError):
    """A Keras weights call that would silently miss table rows."""


# --------------------------------------------------------------- formats
def weights_format(filepath, save_format: Optional[str]) -> str:
    """"h5" or "tf", as tf_keras' save_weights decides it."""
    path = os.fspath(filepath) if not isinstance(filepath, str) else filepath
    if save_format:
        fmt = save_format.lower().strip()
        if fmt in ("h5", "hdf5", "keras"):
            return "h5"
        return "tf"
    if path.endswith((".h5", ".hdf5", ".keras")):
        return "h5"
    return "tf"


def is_h5_file(filepath) -> bool:
    """True for an existing HDF5 file (a TF-format prefix is no file)."""
    import h5py  # noqa: PLC0415
    path = os.fspath(filepath)
    try:
        return os.path.isfile(path) and h5py.is_hdf5(path)
    except OSError:
        return False


def _row_bytes(table: SparseTable) -> int:
    return 8 + 4 * table.dim + 4 * table.num_slots + 24


def _rule_name(table: SparseTable) -> str:
    return table.optimizer.name


# ----------------------------------------------------------- HDF5 write
def write_tables_h5(model, path: str) -> None:
    """Adds every table of `model` to the HDF5 file Keras just wrote."""
    import h5py  # noqa: PLC0415
    tables = model.tables()
    with h5py.File(path, "a") as f:
        if H5_GROUP in f:
            del f[H5_GROUP]
        root = f.create_group(H5_GROUP)
        root.attrs["tables"] = ",".join(sorted(tables))
        for name, table in sorted(tables.items()):
            g = root.create_group(name)
            g.attrs["dim"] = table.dim
            g.attrs["num_slots"] = table.num_slots
            g.attrs["optimizer"] = _rule_name(table)
            dim, s = table.dim, table.num_slots
            chunk = max(1, min(_CHUNK_ROWS, (1 << 19) // (4 * max(dim, s, 6))))
            sets = {
                "keys": g.create_dataset("keys", (0,), np.int64,
                                         maxshape=(None,), chunks=(chunk,)),
                "weights": g.create_dataset("weights", (0, dim), np.float32,
                                            maxshape=(None, dim),
                                            chunks=(chunk, dim)),
                "slots": g.create_dataset("slots", (0, s), np.float32,
                                          maxshape=(None, s),
                                          chunks=(chunk, s) if s else None),
                "meta": g.create_dataset("meta", (0, 3), np.float64,
                                         maxshape=(None, 3),
                                         chunks=(chunk, 3)),
            }
            rows = 0
            for k, w, sl, m in table.export_chunks(chunk_rows=_CHUNK_ROWS):
                n = int(k.shape[0])
                if not n:
                    continue
                for key, value in zip(("keys", "weights", "slots", "meta"),
                                      (k, w, sl, m)):
                    ds = sets[key]
                    ds.resize(rows + n, axis=0)
                    if key != "slots" or s:
                        ds[rows:rows + n] = value.numpy()
                rows += n
            g.attrs["rows"] = rows
            pending = table.export_pending()
            for key in ("keys", "counts", "ages"):
                g.create_dataset(f"pending_{key}", data=pending[key])
            g.create_dataset("counters", data=pending["counters"])


# ------------------------------------------------------------ HDF5 read
def _rules_with_slots(dim: int, num_slots: int) -> str:
    from tnet.optimizer import sparse  # noqa: PLC0415
    names = sorted(n for n, cls in sparse._BY_NAME.items()
                   if cls().num_slots(dim) == num_slots)
    return " or ".join(names) if names else "unknown"


def _mismatch(what: str, name: str, saved_slots: int, saved_rule,
              table, model) -> TableWeightsError:
    if saved_rule is None:
        saved_rule = _rules_with_slots(table.dim, saved_slots)
    compiled = getattr(model, "optimizer", None) is not None
    hint = ("compile() this model with the optimizer it was trained with "
            "(the same sparse rule) before load_weights" if compiled else
            "this model is not compiled yet, so its tables use Adagrad: "
            "compile() it with the optimizer it was trained with, then "
            "load_weights")
    return TableWeightsError(
        f"{what}: table {name!r} was saved with {saved_slots} optimizer slot "
        f"values per row (rule {saved_rule}), this model's table has "
        f"{table.num_slots} (rule {_rule_name(table)}): the weights were "
        f"saved with a different optimizer; {hint}.")


def read_tables_h5(model, path: str, apply: bool = True) -> None:
    """Restores every table of `model` from the group write_tables_h5
    added; checks everything before changing any table (apply=False: only
    checks)."""
    import h5py  # noqa: PLC0415
    tables = model.tables()
    if not tables:
        return
    with h5py.File(path, "r") as f:
        if H5_GROUP not in f:
            raise TableWeightsError(
                f"{path}: this HDF5 file holds no tnet tables (it was not "
                "written by a tn.Model's save_weights), so load_weights "
                f"would leave the tables {sorted(tables)} as they are. "
                "Save the weights from the tn.Model, or restore a "
                "tn.saving checkpoint.")
        root = f[H5_GROUP]
        saved = set(root.keys())
        missing = sorted(set(tables) - saved)
        if missing:
            raise TableWeightsError(
                f"{path}: tables {missing} of this model are not in the file "
                f"(it holds {sorted(saved)}); it was saved from another "
                "model.")
        for name, table in tables.items():
            g = root[name]
            if int(g.attrs["dim"]) != table.dim:
                raise TableWeightsError(
                    f"{path}: table {name!r} was saved with dim "
                    f"{int(g.attrs['dim'])}, this model's has dim "
                    f"{table.dim}; it was saved from another model.")
            if int(g.attrs["num_slots"]) != table.num_slots:
                raise _mismatch(path, name, int(g.attrs["num_slots"]),
                                str(g.attrs["optimizer"]), table, model)
        if not apply:
            return
        for name, table in tables.items():
            g = root[name]
            clear_table(table)
            rows = int(g["keys"].shape[0])
            for a in range(0, rows, _CHUNK_ROWS):
                b = min(rows, a + _CHUNK_ROWS)
                slots = (g["slots"][a:b] if table.num_slots
                         else np.zeros([b - a, 0], np.float32))
                table.import_rows(g["keys"][a:b], g["weights"][a:b], slots,
                                  g["meta"][a:b])
            table.import_pending(g["pending_keys"][:], g["pending_counts"][:],
                                 g["pending_ages"][:], g["counters"][:])


def clear_table(table: SparseTable) -> None:
    """Frees every row of every shard."""
    table.evict(show_decay_rate=0.0, show_threshold=1.0)


# --------------------------------------------------- TF-format precheck
def check_tf_checkpoint(model, prefix: str) -> None:
    """Refuses a TF-format weights checkpoint whose tables' slot widths or
    dims differ from the model's (or would, once its tables are created),
    before any of it is restored."""
    try:
        entries = tf.train.list_variables(prefix)
    except (tf.errors.OpError, ValueError):
        return  # not a readable checkpoint: Keras says so itself
    saved: Dict[str, Dict[str, List[int]]] = {}
    for key, shape in entries:
        parts = key.split("/")
        if ".ATTRIBUTES" not in parts or "shards" not in parts:
            continue
        i = parts.index("shards")
        attr = parts[-1]
        if i < 1 or attr not in ("slots", "weights"):
            continue
        saved.setdefault(parts[i - 1], {})[attr] = list(shape)
    if not saved:
        return
    for name, (dim, num_slots, rule) in expected_tables(model).items():
        got = saved.get(_escape(name))
        if got is None:
            continue
        if "weights" in got and len(got["weights"]) == 2 \
                and got["weights"][1] != dim:
            raise TableWeightsError(
                f"{prefix}: table {name!r} was saved with dim "
                f"{got['weights'][1]}, this model's has dim {dim}; it was "
                "saved from another model.")
        if "slots" in got and len(got["slots"]) == 2 \
                and got["slots"][1] != num_slots:
            table = _TableLike(dim, num_slots, rule)
            raise _mismatch(prefix, name, got["slots"][1], None,
                            table, model)


def _escape(name: str) -> str:
    # tf.train checkpoint keys escape "/" and "." in object names.
    return name.replace(".", "..").replace("/", "./")


class _TableLike:
    def __init__(self, dim, num_slots, rule):
        self.dim, self.num_slots, self.optimizer = dim, num_slots, rule


def expected_tables(model) -> Dict[str, tuple]:
    """{table: (dim, num_slots, rule)} of the model's tables, created or
    not (a layer not built yet creates them with its rule, or Adagrad
    before compile)."""
    out = {}
    for layer in model.tnet_layers():
        if layer.tables:
            for name, t in layer.tables.items():
                out[name] = (t.dim, t.num_slots, t.optimizer)
            continue
        for name, cols in layer._groups.items():
            dim = cols[0][1].dimension
            rule = layer._table_rule(dim)
            out[name] = (dim, rule.num_slots(dim), rule)
    return out


# ------------------------------------------------- get / set weights
class TableWeights(list):
    """What tn.Model.get_weights returns: Keras' list of dense weights (same
    length and order as `model.weights`), with `.tables`, a snapshot of
    every table's rows: {name: {"keys", "weights", "slots", "meta",
    "pending_keys", "pending_counts", "pending_ages", "counters"}}."""

    tables: Dict[str, Dict[str, np.ndarray]]


def snapshot_tables(model) -> Dict[str, Dict[str, np.ndarray]]:
    tables = model.tables()
    total = sum(int(t.size()) * _row_bytes(t) for t in tables.values())
    if total > MAX_SNAPSHOT_BYTES:
        raise TableWeightsError(
            f"get_weights: the tables {sorted(tables)} hold {total >> 20} MB "
            f"of rows, more than tnet.saving.keras_weights.MAX_SNAPSHOT_BYTES "
            f"({MAX_SNAPSHOT_BYTES >> 20} MB) to copy into numpy. Save them "
            "with tn.saving.save(model, dir) / tn.callbacks.Checkpoint "
            "(streamed in chunks), or raise MAX_SNAPSHOT_BYTES.")
    out = {}
    for name, table in tables.items():
        keys, weights, slots, meta = (x.numpy() for x in table.export())
        snap = {"keys": keys, "weights": weights, "slots": slots,
                "meta": meta}
        pending = table.export_pending()
        snap.update({"pending_keys": pending["keys"],
                     "pending_counts": pending["counts"],
                     "pending_ages": pending["ages"],
                     "counters": pending["counters"]})
        out[name] = snap
    return out


def restore_snapshot(model, snapshot: Dict[str, Dict[str, np.ndarray]],
                     apply: bool = True) -> None:
    """Sets every table to its snapshot; checks all first (apply=False:
    only checks)."""
    tables = model.tables()
    missing = sorted(set(tables) - set(snapshot))
    if missing:
        raise TableWeightsError(
            f"set_weights: the weights hold no rows for tables {missing} "
            f"(they hold {sorted(snapshot)}); they come from another model.")
    for name, table in tables.items():
        snap = snapshot[name]
        if snap["weights"].shape[1:] != (table.dim,):
            raise TableWeightsError(
                f"set_weights: table {name!r} has dim {table.dim}, the "
                f"weights' rows have {snap['weights'].shape[1]}; they come "
                "from another model.")
        if snap["slots"].shape[1:] != (table.num_slots,):
            raise _mismatch("set_weights", name, snap["slots"].shape[1],
                            None, table, model)
    if not apply:
        return
    for name, table in tables.items():
        snap = snapshot[name]
        clear_table(table)
        table.import_rows(snap["keys"], snap["weights"], snap["slots"],
                          snap["meta"])
        table.import_pending(snap["pending_keys"], snap["pending_counts"],
                             snap["pending_ages"], snap["counters"])


def tables_hold_rows(model) -> bool:
    return any(int(t.size()) for t in model.tables().values())


# ------------------------------------------------------------- summary
def table_summary_lines(model) -> List[str]:
    tables = model.tables()
    if not tables:
        names = sorted(expected_tables(model))
        if not names:
            return []
        return [f"tnet tables {names}: not created yet (rows are created as "
                "training sees new ids)"]
    lines = ["tnet tables (rows grow as training sees new ids; the counts "
             "above leave them out):",
             f"  {'table':<24}{'dim':>6}{'rows':>14}{'params':>16}  rule"]
    total = 0
    for name, t in sorted(tables.items()):
        rows = int(t.size())
        total += rows * t.dim
        lines.append(f"  {name:<24}{t.dim:>6}{rows:>14,}{rows * t.dim:>16,}"
                     f"  {_rule_name(t)} ({t.num_slots} slot values a row)")
    lines.append(f"Table params so far: {total:,} (rows x dim, slots not "
                 "counted)")
    return lines
