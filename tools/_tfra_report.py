"""bench_tfra's report: the markdown and JSON of one run (build_report),
the names it gives each case, and the informative line of a child's error.
"""
from __future__ import annotations

import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# docs/BENCHMARK_PROTOCOL.md: tnet / TFRA examples/s, per --config
TARGETS = {"wd400": 2.0, "sparse_heavy": 3.0}
TITLES = {"wd400": "WD-400", "sparse_heavy": "SPARSE-HEAVY"}
IMPL_NAMES = {"tnet": "tnet", "tfra": "TFRA", "stock": "stock floormod",
              "dnn_tnet_venv": "DNN-only, tnet venv",
              "dnn_tfra_venv": "DNN-only, TFRA venv"}


def _first_error_line(record: dict) -> str:
    """The informative part of an error: TensorFlow's first lines are often
    "Graph execution error:" and "3 root error(s) found."; the op's message
    and node come after them."""
    lines = [x.strip() for x in record.get("error", "").splitlines()
             if x.strip()]
    kind = record.get("error_type")
    skip = re.compile(r"(.*Graph execution error:|\d+ root error\(s\) "
                      r"found\.)$")
    for i, line in enumerate(lines):
        if skip.match(line):
            continue
        line = re.sub(r"^\(\d+\) [A-Z_]+:\s*", "", line)
        node = re.search(r"\{\{node ([^}]+)\}\}", " ".join(lines[i + 1:i + 2]))
        text = (f"{kind}: " if kind and not line.startswith(kind) else "") \
            + line + (f" (node {node.group(1)})" if node else "")
        return text[:400]
    return ""


def build_report(args, info, venv, data_facts, runs, quality, pss):
    import tools._bench_common as bc  # noqa: PLC0415
    measurements = []
    section = f"{TITLES[args.config]} one process"
    if runs:
        eps = {k: [r["examples_per_sec"] for r in v] for k, v in runs.items()}
        tf_tnet = info["versions"]["tensorflow"]
        tf_tfra = "2.16.2"
        for key in ("dnn_tnet_venv", "dnn_tfra_venv"):
            if key in eps:
                measurements.append(bc.Measurement(
                    section, f"{IMPL_NAMES[key]} (TF "
                    f"{tf_tnet if key == 'dnn_tnet_venv' else tf_tfra})",
                    "examples/s", eps[key],
                    note="constant input: the dense part's limit"))
        if "stock" in eps:
            measurements.append(bc.Measurement(
                section, "stock floormod WD, Adagrad (TFRA venv)",
                "examples/s", eps["stock"], note=f"TF {tf_tfra}, sanity "
                "anchor"))
        measurements.append(bc.Measurement(
            section, "TFRA WD (cuckoo tables), Adagrad", "examples/s",
            eps["tfra"], note=f"{args.tfra_tables} tables, "
            f"{args.tfra_optimizer} tf_keras Adagrad, TF {tf_tfra}"))
        for key, name in (("stock", "stock floormod (TFRA venv)"),
                          ("dnn_tfra_venv", "DNN-only, TFRA venv")):
            if key in eps:
                measurements.append(bc.Measurement(
                    section, "TFRA WD, Adagrad", "examples/s", eps["tfra"],
                    name, bc.paired_ratios(eps["tfra"], eps[key]),
                    note="same venv and TF"))
        measurements.append(bc.Measurement(
            section, "tnet WD, Adagrad", "examples/s", eps["tnet"], "TFRA",
            bc.paired_ratios(eps["tnet"], eps["tfra"]),
            target=TARGETS[args.config],
            note=f"tnet on TF {tf_tnet}, TFRA on TF {tf_tfra}"))
        if "dnn_tnet_venv" in eps:
            measurements.append(bc.Measurement(
                section, "tnet WD, Adagrad", "examples/s", eps["tnet"],
                "DNN-only, tnet venv",
                bc.paired_ratios(eps["tnet"], eps["dnn_tnet_venv"]),
                note="same venv and TF"))
        for key, rs in runs.items():
            measurements.append(bc.Measurement(
                "peak RSS", f"{IMPL_NAMES[key]}, throughput child", "bytes",
                [float(r["peak_rss_bytes"]) for r in rs]))
    if quality:
        for impl, q in quality.items():
            measurements.append(bc.Measurement(
                "quality", f"hold-out AUC, {IMPL_NAMES[impl]}", "AUC",
                [q["auc"]], note=f"oracle {data_facts['oracle_auc']:.4f}"))
        for impl, q in quality.items():
            measurements.append(bc.Measurement(
                "peak RSS", f"{IMPL_NAMES[impl]}, quality child", "bytes",
                [float(q["peak_rss_bytes"])],
                note=f"after {args.epochs} epoch(s), "
                f"{_rows_text(q.get('table_rows'))}"))
        if "tnet" in quality and "tfra" in quality:
            diff = quality["tnet"]["auc"] - quality["tfra"]["auc"]
            measurements.append(bc.Measurement(
                "quality", "hold-out AUC, tnet - TFRA", "AUC", [diff],
                note="target >= 0: " + ("reached" if diff >= 0 else
                                        "missed")))
    for rec in pss:
        if rec.get("status") == "ran":
            measurements.append(bc.Measurement(
                f"PSS {rec['workers']}w/{rec['ps']}ps (TFRA)",
                f"TFRA WD, with_unique={rec['with_unique']}", "examples/s",
                [rec["examples_per_sec"]],
                note="every process on the same cores"))

    title = f"bench_tfra: {TITLES[args.config]}, tnet vs TFRA 0.8.1" + (
        " (quick)" if args.quick else "")
    md = bc.header_markdown(info, title)
    md += (f"\n- TFRA venv: {venv.get('versions', '?')} at "
           f"{os.path.relpath(venv['path'], REPO)}")
    md += "\n\n" + bc.markdown_table(measurements)
    md += (f"\n\nData: SyntheticCriteo(seed=0, scale={args.scale:g}), "
           f"{data_facts['possible_ids']:,} ids possible; "
           f"{args.train_examples:,} training / {args.holdout_examples:,} "
           f"hold-out examples, batch {args.batch}. Throughput: one process "
           f"per figure, {' / '.join(IMPL_NAMES[k] for k in runs)} "
           f"alternating, {args.repeats} repeat(s), {args.warmup_steps} "
           f"warm-up steps then {args.steps} timed steps of the Keras train "
           "function over in-memory batches, no metrics. "
           f"Optimizers: tnet tn.optimizer.Adagrad({args.lr:g}"
           + ("" if args.tnet_accumulator is None else
              f", initial_accumulator_value={args.tnet_accumulator:g}")
           + ") (dense and "
           "deep rows; wide rows tnet's default in-table FTRL)"
           + "".join(f", {k}={getattr(args, k)}" for k in (
               "tnet_row_accumulator", "tnet_wide_accumulator",
               "tnet_row_epsilon", "tnet_wide_rule", "tnet_wide_lr",
               "tnet_wide_epsilon", "tnet_init_stddev",
               "tnet_start_reference_batch")
               if getattr(args, k, None) is not None)
           + "; TFRA "
           f"de.DynamicEmbeddingOptimizer(tf_keras Adagrad({args.lr:g})) for "
           "the dense layers and the rows; stock tf_keras "
           f"Adagrad({args.lr:g}).")
    if quality:
        parts = ", ".join(f"{IMPL_NAMES[k]} {q['auc']:.4f}"
                          for k, q in quality.items())
        md += (f"\n\nQuality after {args.epochs} epoch(s) over "
               f"{args.train_examples:,} examples (hold-out "
               f"{data_facts['holdout_scored']:,}): {parts}; oracle "
               f"{data_facts['oracle_auc']:.4f}.")
    if pss:
        md += ("\n\nTFRA under ParameterServerStrategy: a local cluster on "
               "127.0.0.1 (chief, workers and ps tasks all processes of the "
               "TFRA venv, all on the same cores), the same TFRA model built "
               "in the strategy's scope with its tables on the ps tasks "
               "(`devices=`, TFRA's default id-mod-shards partitioner), Keras "
               f"fit over per-worker datasets cycling {args.pss_batches} "
               f"in-memory batches of {args.batch}; {args.warmup_steps} "
               f"warm-up steps, then 1 + {args.pss_epochs} epochs of "
               f"{args.pss_steps} steps timed after the first. Attempts:\n")
        for rec in pss:
            head = (f"- {rec['workers']} workers / {rec['ps']} ps, "
                    f"with_unique={rec['with_unique']}: ")
            if rec.get("status") == "ran":
                head += (f"ran, {rec['examples_per_sec']:,.0f} examples/s "
                         f"({args.pss_epochs} x {args.pss_steps} steps)")
            else:
                head += (f"**{rec.get('status')}**"
                         + (f" in {rec['stage']}" if rec.get("stage") else "")
                         + f": `{_first_error_line(rec)}`")
            peaks = {k: v for k, v in (rec.get("peak_rss_bytes") or {}).items()
                     if v}
            if peaks:
                head += "; peak RSS " + ", ".join(
                    f"{k} {v / 2**30:.2f}" for k, v in sorted(peaks.items())
                ) + " GiB"
            addrs = rec.get("listening") or []
            if addrs:
                wild = [a for a in addrs if not a.startswith("127.0.0.1:")
                        and not a.startswith("[::ffff:127.0.0.1]:")]
                head += ("; listening only on 127.0.0.1" if not wild else
                         f"; listening on {', '.join(wild)}")
            md += head + "\n"
        if any(not r["with_unique"] and r.get("status") == "ran" for r in pss):
            dev = next((r.get("shadow_ids_device") for r in pss
                        if r.get("shadow_ids_device")), "?")
            md += ("\nCaveat on `with_unique=False` (the workaround users "
                   "report in TFRA's issue #401): the layer's per-step state "
                   "(TFRA's ShadowVariable: the current batch's ids and "
                   f"rows) is one variable, placed on `{dev}`, that the "
                   "steps of both workers use. The failure with unique ids "
                   "reads as two workers' steps meeting there (a gradient "
                   "for one batch's unique ids partitioned by another's); "
                   "without unique every step has the same shape (batch x "
                   "26 ids), so that check cannot fire and nothing here "
                   "verifies that each worker's gradient lands on its own "
                   "ids. Running is not evidence of correct updates.\n")
    md += ("\nTFRA venv: " + (
        f"created by this run in {venv['install_seconds']} s"
        if venv.get("created_now") else "re-used (created earlier in "
        f"{venv.get('install_seconds', '?')} s)")
        + f", {int(venv.get('size_bytes', 0)) / 2**30:.2f} GiB on disk.")
    return measurements, md


def _rows_text(rows) -> str:
    if not rows:
        return "dense tables"
    return f"{sum(rows.values()):,} rows in {len(rows)} table(s)"
