"""Probe: what one chief-side call leaves on each ps (RSS KB per call).

    python -m tnet.launch --ps 2 --workers 1 -- \
        python tools/probe_ps_memory.py --modes nothing,marks,size,save

Run as the chief of a local cluster. It trains the soak's Wide&Deep for 2
epochs (tables of ~160k rows), then for each mode calls the same thing
`--calls` times and prints, per ps task, the RSS growth per call after the
first 100 calls (start-up effects excluded). Modes: nothing, marks
(`mark_changes(False)`, which every save does), marks_on, changes, stats,
evict (nothing evicted), size, iters (the step read), save (a full
`tn.saving.save`, keep 2). This is how the per-save residue of issue 13
was located (BENCHMARKS.md, Reliability: checkpoint memory).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))

import tnet as tn  # noqa: E402  (first: selects tf_keras)
import tf_keras  # noqa: E402

from _soak_chief import CATS, DENSE, make_dataset  # noqa: E402
from tnet.models import WideDeep  # noqa: E402
from tnet.saving import delta_marks  # noqa: E402


def _rss_kb(pid) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(f.read().split("VmRSS:")[1].split()[0])


def _ps_pids() -> list:
    """The ps tasks started by the same launcher (siblings), by index."""
    found = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) != os.getppid():
                    continue
            with open(f"/proc/{p}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        for e in env:
            if e.startswith(b"TF_CONFIG="):
                task = json.loads(e[len(b"TF_CONFIG="):])["task"]
                if task["type"] == "ps":
                    found.append((task["index"], int(p)))
    return [pid for _, pid in sorted(found)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default="nothing,marks,size,iters,save")
    ap.add_argument("--calls", type=int, default=601)
    args = ap.parse_args()
    strategy = tn.distribute.ParameterServerStrategy()
    with strategy.scope():
        model = WideDeep(CATS, DENSE, embedding_dim=16, hidden_units=[64, 32])
        model.compile(tn.optimizer.Adagrad(0.05))
    data = tf_keras.utils.experimental.DatasetCreator(
        lambda ctx: make_dataset(20000, 512, ctx.input_pipeline_id))
    model.fit(data, epochs=2, steps_per_epoch=50, verbose=0)
    ps = _ps_pids()
    tables = list(model.tables().values())
    directory = tempfile.mkdtemp(prefix="tnet_probe_")
    calls = {
        "nothing": lambda: None,
        "marks": lambda: [delta_marks._set_marks(t, None) for t in tables],
        "marks_on": lambda: [t.mark_changes(True) for t in tables],
        "changes": lambda: [t.changes() for t in tables],
        "stats": lambda: [t.stats() for t in tables],
        "evict": lambda: [int(t.evict(1.0, 0.0, 0, 1, compact=False))
                          for t in tables],
        "size": lambda: [int(t.size()) for t in tables],
        "iters": lambda: int(model.optimizer.iterations.numpy()),
    }
    step = 0
    for mode in args.modes.split(","):
        base = None
        for i in range(args.calls):
            if mode == "save":
                step += 1
                tn.saving.save(model, directory, step=step, keep=2,
                               progress=lambda s: None)
            else:
                calls[mode]()
            if i == 100:
                base = [_rss_kb(p) for p in ps]
            if i % 100 == 0:
                print(f"{mode} call {i}: ps RSS KB {[_rss_kb(p) for p in ps]}",
                      flush=True)
        end = [_rss_kb(p) for p in ps]
        per_call = [round((e - b) / (args.calls - 101), 2)
                    for e, b in zip(end, base)]
        print(f"RESULT {mode}: ps RSS KB per call after 100 calls: {per_call}",
              flush=True)


if __name__ == "__main__":
    main()
