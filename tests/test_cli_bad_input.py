"""Bad input on every path of `python -m tnet.train` (one process; the
cluster variants are long tests): a damaged or truncated file, a record
that is not a tf.Example (text or binary), a CSV row that does not match
the spec, in --train_files, --eval_files and the daily loop. Fail mode:
exit status 4 and one line naming the FIRST bad file:record in file order
(whatever the shuffled pipeline met first) and the fix, no traceback.
Skip mode: every bad row counted per file in the log, summary.json and
days.json; the example counts exclude them.

Where the damage is comes from how each file was written here (and, for
a truncated gzip, from walking the TFRecord framing of what zlib can still
decompress), never from tnet's readers."""
from __future__ import annotations

import json
import os
import pathlib
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest
import tensorflow as tf

import tnet as tn
from tnet.data import spec as spec_lib
from support import byod_data as bd
from tests.support import forkrun

ROOT = pathlib.Path(__file__).resolve().parents[1]
BINARY = bytes(range(256)) * 3 + b"\xff\xfe"  # not UTF-8, not a tf.Example


def _train(tmp_path, *args, launch=False, timeout=400, fork=True):
    """tnet.train (under tnet.launch with `launch`) on tmp_path's spec; a
    one-process run is forked from a process that imported tnet already
    (tests/support/forkrun.py) unless `fork` is False."""
    spec = ([] if any(a.startswith("--data=") for a in args)
            else [f"--feature_spec={tmp_path / 'spec.json'}"])
    cmd = [sys.executable, "-m", "tnet.train", *spec,
           f"--model_dir={tmp_path / 'run'}", "--hidden_units=8",
           "--batch_size=64", *args]
    if launch:
        cmd = [sys.executable, "-m", "tnet.launch", "--ps", "1", "--workers",
               "2", "--", *cmd]
    env = dict(os.environ, PYTHONPATH=str(ROOT), CI="true",
               TF_CPP_MIN_LOG_LEVEL="2")
    run = forkrun.run if fork and not launch else subprocess.run
    return run(cmd, cwd=tmp_path, env=env, capture_output=True, timeout=timeout)


def _one_line(res, launch=False) -> str:
    """Exit 4, no traceback, exactly one `tnet.train:` line: returned."""
    out = (res.stdout + res.stderr).decode("utf-8", "replace")
    assert res.returncode == 4, out[-4000:]
    # (progress lines of the daily loop go to stdout; errors to stderr,
    # which the launcher passes on prefixed with the task)
    prefix = "[chief] tnet.train:" if launch else "tnet.train:"
    err = out if launch else res.stderr.decode("utf-8", "replace")
    lines = [line for line in err.splitlines() if line.startswith(prefix)
             and "day" not in line.split(":")[1]]
    assert len(lines) == 1, out[-4000:]
    if not launch:  # (under a cluster TF's coordinator logs the remote error)
        assert "Traceback" not in out, out[-4000:]
    return lines[0]


def _tfrecord_spans(data: bytes) -> int:
    """Complete TFRecord records in `data` (length, crc, payload, crc)."""
    pos = n = 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack("<Q", data[pos:pos + 8])
        if pos + 12 + length + 4 > len(data):
            break
        pos += 12 + length + 4
        n += 1
    return n


def test_truncated_gzip_and_binary_records_name_the_first_in_file_order(tmp_path):
    bd.write_spec(tmp_path / "spec.json")
    rs = bd.rows(400, seed=1)
    good = bd.write_tfrecord(tmp_path / "eval.tfrecord", rs[:100])
    # A gzip TFRecord cut in half: the first unreadable record is the one
    # after the last complete record zlib can still give back.
    whole = bd.write_tfrecord(tmp_path / "whole.tfrecord.gz", rs, gzip_it=True)
    cut = tmp_path / "cut.tfrecord.gz"
    cut.write_bytes(whole.read_bytes()[:len(whole.read_bytes()) // 2])
    inflated = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(cut.read_bytes())
    first_bad = _tfrecord_spans(inflated) + 1
    assert 1 < first_bad < 400
    line = _one_line(_train(tmp_path, "--format=tfrecord",
                            f"--train_files={good},{cut}", f"--eval_files={good}"))
    assert f"cut.tfrecord.gz:{first_bad}: unreadable TFRecord record" in line, line
    assert "Rewrite or remove the file" in line
    assert "or pass --bad_rows=skip" not in line  # not skippable: one remedy
    # Binary junk at records 151 and 301 (1-based), with shuffling on: the
    # shuffled pipeline may meet either first; the message names 151.
    binary = bd.write_tfrecord(tmp_path / "bin.tfrecord", rs,
                               damaged={150: BINARY, 300: BINARY})
    line = _one_line(_train(tmp_path, "--format=tfrecord", "--shuffle_buffer=400",
                            f"--train_files={binary}", f"--eval_files={good}"))
    assert f"bin.tfrecord:151: not a serialized tf.Example ({len(BINARY)} bytes" in line
    assert "--bad_rows=skip" in line


@pytest.mark.long  # make test-long; the train-file cases stay
def test_eval_file_text_record_and_csv_rows_name_file_and_feature(tmp_path):
    bd.write_spec(tmp_path / "spec.json")
    rs = bd.rows(300, seed=2)
    train = bd.write_tfrecord(tmp_path / "train.tfrecord", rs)
    bad_eval = bd.write_tfrecord(tmp_path / "eval.tfrecord", rs[:120],
                                 damaged={77: b"plain text, not a proto"})
    line = _one_line(_train(tmp_path, "--format=tfrecord", f"--train_files={train}",
                            f"--eval_files={bad_eval}"))
    assert "eval.tfrecord:78: not a serialized tf.Example" in line, line
    # CSV: data row i is line i + 2 (the header is line 1).
    damaged = {i: bd.csv_line(dict(rs[i], user_id="u9"), ",") for i in (260, 40, 150)}
    csv = bd.write_csv(tmp_path / "train.csv", rs, damaged=damaged)
    good_csv = bd.write_csv(tmp_path / "eval.csv", rs[:50])
    line = _one_line(_train(tmp_path, "--format=csv", "--shuffle_buffer=300",
                            f"--train_files={csv}", f"--eval_files={good_csv}"))
    assert "train.csv:42: user_id `u9` is not an int64 id" in line, line
    # A spec error: non-zero, one line, no traceback.
    (tmp_path / "spec.json").write_text(json.dumps(
        {"features": [{"name": "click", "kind": "label"},
                      {"name": "u", "kind": "id", "dim": 0}]}))
    line = _one_line(_train(tmp_path, "--format=csv", f"--train_files={csv}",
                            f"--eval_files={good_csv}"))
    assert "spec.json: feature 'u': dim must be a positive integer" in line


def test_skip_counts_every_bad_row_per_file(tmp_path):
    """7 bad CSV rows in one file (5 logged, the rest announced), 2 in
    another: the log, summary.json and the example count agree with where
    they were written."""
    bd.write_spec(tmp_path / "spec.json")
    rs = bd.rows(3000, seed=3)
    # 5 in the first 1024-line chunk, then 2 more much later: the notice of
    # unlogged rows must still come.
    bad_a = [3, 10, 20, 30, 40, 2500, 2990]
    a = bd.write_csv(tmp_path / "a.csv", rs, damaged={
        i: bd.csv_line(dict(rs[i], click=7), ",") for i in bad_a})
    b = bd.write_csv(tmp_path / "b.csv", rs[:500], damaged={
        i: "1,2" for i in (0, 499)})
    good = bd.write_csv(tmp_path / "eval.csv", rs[:200])
    res = _train(tmp_path, "--format=csv", "--bad_rows=skip",
                 f"--train_files={a},{b}", f"--eval_files={good}")
    err = res.stderr.decode("utf-8", "replace")
    assert res.returncode == 0, err[-4000:]
    logged = [line for line in err.splitlines() if "skipping bad train row" in line]
    assert [line.split("row ")[1].split(":")[1] for line in logged] == [
        str(i + 2) for i in bad_a[:5]]
    assert f"{a}: 7 of 3,000 rows skipped as bad" in err
    assert f"{b}: 2 of 500 rows skipped as bad" in err
    assert "4 more bad train rows skipped without logging" in err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["bad_rows_skipped"]["train"] == {
        "skipped": 9, "files": {str(a): 7, str(b): 2}}
    assert summary["bad_rows_skipped"]["eval"]["skipped"] == 0
    assert summary["train_examples"] == 3000 + 500 - 9
    # One process: Keras' own step count says how many rows fit saw.
    assert summary["train"]["steps"] == -(-(3500 - 9) // 64)


def test_daily_loop_fails_with_status_4_and_counts_skips(tmp_path):
    bd.write_spec(tmp_path / "spec.json")
    days = ["2026-11-01", "2026-11-02"]
    for i, day in enumerate(days):
        bd.write_tfrecord(tmp_path / "data" / day / "a.tfrecord", bd.rows(300, i))
    bd.write_tfrecord(tmp_path / "data" / days[1] / "b.tfrecord", bd.rows(200, 5),
                      damaged={9: BINARY, 120: bd.example(dict(bd.rows(1, 6)[0], click=4))})
    args = ["--format=tfrecord", f"--days={days[0]}..{days[1]}",
            f"--day_pattern={tmp_path}/data/{{day}}/*"]
    res = _train(tmp_path, *args, f"--checkpoint_dir={tmp_path / 'ck'}")
    line = _one_line(res)
    assert f"{days[1]}/b.tfrecord:10: not a serialized tf.Example" in line, line
    state = json.loads((tmp_path / "ck" / "days.json").read_text())["days"]
    assert sorted(state) == days[:1]  # day 1 trained and kept
    res = _train(tmp_path, *args, f"--checkpoint_dir={tmp_path / 'ck2'}",
                 "--bad_rows=skip")
    err = res.stderr.decode("utf-8", "replace")
    assert res.returncode == 0, err[-4000:]
    assert "b.tfrecord:10: not a serialized tf.Example" in err
    assert "b.tfrecord:121: feature 'click' value 4.0 is not a label in [0, 1]" in err
    state = json.loads((tmp_path / "ck2" / "days.json").read_text())["days"]
    assert state[days[0]]["bad_rows"] == {"skipped": 0, "files": {}}
    assert state[days[1]]["bad_rows"] == {
        "skipped": 2, "files": {str(tmp_path / "data" / days[1] / "b.tfrecord"): 2}}
    assert state[days[1]]["examples"] == 300 + 200 - 2
    assert state[days[1]]["eval_before_training"]["examples"] == 498


def _bad_day_file(kind: str, folder: pathlib.Path, rng) -> tuple:
    """Writes one damaged file of `kind` into a day's folder; returns its
    path and what the one-line message must say, where the damage is
    computed here from how the file was written."""
    rs = bd.rows(300, seed=int(rng.integers(1 << 30)))
    at = int(rng.integers(5, 295))  # 0-based row of the damage
    if kind == "truncated_gz":
        whole = bd.write_tfrecord(folder / "whole.tfrecord.gz.tmp", rs,
                                  gzip_it=True).read_bytes()
        (folder / "whole.tfrecord.gz.tmp").unlink()
        cut = folder / "b.tfrecord.gz"
        cut.write_bytes(whole[:int(len(whole) * rng.uniform(0.2, 0.8))])
        inflated = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(
            cut.read_bytes())
        first_bad = _tfrecord_spans(inflated) + 1
        assert 1 < first_bad < 300
        return cut, f"b.tfrecord.gz:{first_bad}: unreadable TFRecord record"
    if kind == "text":
        path = bd.write_tfrecord(folder / "b.tfrecord", rs,
                                 damaged={at: b"plain text, not a proto"})
        return path, f"b.tfrecord:{at + 1}: not a serialized tf.Example"
    if kind == "csv":
        path = bd.write_csv(folder / "b.csv", rs, damaged={
            at: bd.csv_line(dict(rs[at], user_id="u9"), ",")})
        # data row i is line i + 2 (the header is line 1)
        return path, f"b.csv:{at + 2}: user_id `u9` is not an int64 id"
    if kind == "parquet":
        path = bd.write_parquet(folder / "b.parquet",
                                rs[:at] + [dict(rs[at], click=4)] + rs[at + 1:])
        return path, (f"b.parquet:{at + 1}: feature 'click' is not a label "
                      "in [0, 1]")
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", [
    "truncated_gz", "csv", "parquet",
    # a text record takes the binary record's path (the daily test above)
    pytest.param("text", marks=pytest.mark.long)])
def test_daily_loop_names_each_kind_of_bad_input(tmp_path, kind):
    """The daily loop (--day_pattern) with a truncated .tfrecord.gz, a text
    record, a CSV row that does not match the spec, a Parquet label out
    of range, on day 2 (read first by day 2's evaluation before training)
    beside a good file: exit 4, one line naming file:record (file:line),
    no traceback; day 1 stays trained. Where the damage sits is drawn
    from FUZZ_SEED."""
    from tests.conftest import fuzz_seed  # noqa: PLC0415
    if kind == "parquet":
        pytest.importorskip("pyarrow")
    rng = np.random.default_rng([fuzz_seed(), 26])
    bd.write_spec(tmp_path / "spec.json")
    days = ["2026-11-01", "2026-11-02"]
    ext = {"csv": "csv", "parquet": "parquet"}.get(kind, "tfrecord")
    writer = {"csv": bd.write_csv, "parquet": bd.write_parquet}.get(
        kind, bd.write_tfrecord)
    for i, day in enumerate(days):
        writer(tmp_path / "data" / day / f"a.{ext}", bd.rows(200, i))
    path, expect = _bad_day_file(kind, tmp_path / "data" / days[1], rng)
    res = _train(tmp_path, f"--format={ext}", f"--days={days[0]}..{days[1]}",
                 f"--day_pattern={tmp_path}/data/{{day}}/*",
                 f"--checkpoint_dir={tmp_path / 'ck'}")
    line = _one_line(res)
    assert f"{days[1]}/{expect}" in line, line
    assert "Rewrite or remove the file" in line or "--bad_rows=skip" in line
    state = json.loads((tmp_path / "ck" / "days.json").read_text())["days"]
    assert sorted(state) == days[:1]


# make test-long: test_daily_loop_names_each_kind_of_bad_input[parquet] stays.
@pytest.mark.long
def test_parquet_bad_input_through_the_cli(tmp_path):
    """--format=parquet with --train_files: a label out of range in a later
    row group, a column of another type, a truncated file: exit 4, one
    line naming the file (and the 1-based row), no traceback."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq  # noqa: PLC0415
    bd.write_spec(tmp_path / "spec.json")
    rs = bd.rows(400, seed=11)
    good = bd.write_parquet(tmp_path / "eval.parquet", rs[:100])
    bad = bd.write_parquet(tmp_path / "bad.parquet",
                           rs[:250] + [dict(rs[250], click=3)] + rs[251:],
                           row_group_size=64)
    line = _one_line(_train(tmp_path, "--format=parquet",
                            f"--train_files={good},{bad}",
                            f"--eval_files={good}"))
    assert "bad.parquet:251: feature 'click' is not a label in [0, 1]" in line, line
    # user_id written as strings where the spec says int64
    typed = tmp_path / "typed.parquet"
    table = pq.read_table(str(good))
    table = table.set_column(table.schema.get_field_index("user_id"), "user_id",
                             pa.array([f"u{r['user_id']}" for r in rs[:100]]))
    pq.write_table(table, str(typed))
    line = _one_line(_train(tmp_path, "--format=parquet",
                            f"--train_files={typed}", f"--eval_files={good}"))
    assert "typed.parquet" in line and "user_id" in line, line
    # a copy cut short: no footer
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(bad.read_bytes()[:bad.stat().st_size // 2])
    line = _one_line(_train(tmp_path, "--format=parquet",
                            f"--train_files={good},{cut}",
                            f"--eval_files={good}"))
    assert "cut.parquet" in line, line


@pytest.mark.long
@pytest.mark.parametrize("mode", ["fail", "skip"])
def test_bad_input_under_a_cluster(tmp_path, mode):
    bd.write_spec(tmp_path / "spec.json")
    rs = bd.rows(600, seed=4)
    bad = bd.write_tfrecord(tmp_path / "bin.tfrecord", rs,
                            damaged={450: BINARY, 151: BINARY})
    good = bd.write_tfrecord(tmp_path / "eval.tfrecord", rs[:100])
    res = _train(tmp_path, "--format=tfrecord", f"--bad_rows={mode}",
                 f"--train_files={bad}", f"--eval_files={good}", launch=True,
                 timeout=600)
    if mode == "fail":
        line = _one_line(res, launch=True)
        assert "bin.tfrecord:152: not a serialized tf.Example" in line, line
        return
    out = res.stdout.decode("utf-8", "replace")
    assert res.returncode == 0, out[-4000:]
    assert f"{bad}: 2 of 600 rows skipped as bad" in out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["bad_rows_skipped"]["train"]["files"] == {str(bad): 2}
    assert summary["train_examples"] == 598
    assert summary["train"]["steps"] == -(-598 // 64)  # steps from good rows


# ------------------------------------------------ the readers' own logging
def test_the_unlogged_rows_notice_always_comes(tmp_path, capfd):
    """5 bad rows in the first chunk fill the log limit; the 2 in a later
    chunk must still be announced (and all 7 counted)."""
    spec = spec_lib.load(bd.write_spec(tmp_path / "spec.json"))
    rs = bd.rows(3000, seed=7)
    bad = [1, 2, 3, 4, 5, 2000, 2999]
    csv = bd.write_csv(tmp_path / "d.csv", rs, damaged={i: "x" for i in bad})
    stats = tn.data.ReadStats()
    n = sum(int(label.shape[0]) for _, label in
            spec.dataset(str(csv), "csv", 256, bad_rows="skip", stats=stats))
    err = capfd.readouterr().err
    assert (n, stats.skipped) == (3000 - 7, 7)
    assert err.count("skipping malformed CSV") == 5
    assert err.count("more malformed CSV") == 1
    records = bd.write_tfrecord(tmp_path / "d.tfrecord", rs,
                                damaged={i: BINARY for i in bad})
    stats = tn.data.ReadStats()
    n = sum(int(label.shape[0]) for _, label in spec.dataset(
        str(records), "tfrecord", 256, bad_rows="skip", stats=stats, log_limit=2))
    err = capfd.readouterr().err
    assert (n, stats.skipped) == (3000 - 7, 7)
    assert err.count("more bad tf.Example records are skipped") == 1


def test_scan_files_counts_per_file(tmp_path):
    spec = spec_lib.load(bd.write_spec(tmp_path / "spec.json"))
    rs = bd.rows(500, seed=8)
    a = bd.write_tfrecord(tmp_path / "a.tfrecord", rs, damaged={0: BINARY, 499: b"x"})
    b = bd.write_tfrecord(tmp_path / "b.tfrecord", rs[:10])
    found = tn.data.scan_files(spec, [str(a), str(b)], "tfrecord")
    assert [(f.records, f.skipped, f.rows) for f in found] == [(500, 2, 498), (10, 0, 10)]
    assert [e.split(": ")[0] for e in found[0].first] == [f"{a}:1", f"{a}:500"]
    first = tn.data.scan_files(spec, [str(b), str(a)], "tfrecord", stop_at_first=True)
    assert first[-1].first[0].startswith(f"{a}:1: not a serialized tf.Example")
    if pytest.importorskip("pyarrow"):
        p = bd.write_parquet(tmp_path / "p.parquet", rs, row_group_size=100,
                             null_label_rows=(0, 250, 251))
        found = tn.data.scan_files(spec, str(p), "parquet")
        assert (found[0].records, found[0].skipped) == (500, 3)


def test_damaged_parquet_is_named(tmp_path):
    """A Parquet file cut short (no footer) or with a damaged page: the
    readers raise one BadDataError naming the file (and, for a page, the
    first row of its row group, taken from the file's own metadata), and
    scan_files reports it as damaged."""
    pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq  # noqa: PLC0415
    from tnet.data import readers  # noqa: PLC0415
    spec = spec_lib.load(bd.write_spec(tmp_path / "spec.json"))
    p = bd.write_parquet(tmp_path / "p.parquet", bd.rows(400, seed=12),
                         row_group_size=64)
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(p.read_bytes()[:p.stat().st_size // 2])
    with pytest.raises(readers.BadDataError,
                       match=r"cut.parquet: unreadable Parquet file"):
        readers.count_records(str(cut), "parquet")
    assert "cut.parquet: unreadable" in tn.data.scan_files(
        spec, str(cut), "parquet")[0].damaged
    # Garbage over the pages of row group 3 (rows 129-192).
    meta = pq.ParquetFile(str(p)).metadata.row_group(2)
    start = min(meta.column(i).data_page_offset for i in range(meta.num_columns))
    end = max(meta.column(i).data_page_offset + meta.column(i).total_compressed_size
              for i in range(meta.num_columns))
    data = bytearray(p.read_bytes())
    data[start:end] = b"\xab" * (end - start)
    page = tmp_path / "page.parquet"
    page.write_bytes(bytes(data))
    found = tn.data.scan_files(spec, str(page), "parquet")[0]
    assert found.damaged.startswith(f"{page}:129: unreadable Parquet file"), \
        found.damaged
    assert found.records == 128


def test_gzip_cut_at_a_record_boundary_is_named(tmp_path):
    """A gzip TFRecord whose stream stops at a record boundary without its
    end marker (a copy cut short): TF's reader returns the intact records
    and no error; count_records and scan_files name the file anyway. Also
    concatenated gzip members (valid) read whole."""
    spec = spec_lib.load(bd.write_spec(tmp_path / "spec.json"))
    rs = bd.rows(120, seed=3)
    plain = bd.write_tfrecord(tmp_path / "plain.tfrecord", rs).read_bytes()
    deflate = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    stream = deflate.compress(plain) + deflate.flush(zlib.Z_SYNC_FLUSH)
    cut = tmp_path / "cut.tfrecord.gz"
    cut.write_bytes(stream)  # every record, no end marker
    assert sum(1 for _ in tf.data.TFRecordDataset(str(cut), "GZIP")) == 120
    with pytest.raises(tf.errors.DataLossError,
                       match=r"cut.tfrecord.gz:121: unreadable TFRecord record "
                             r"\(the gzip stream ends before its end marker\)"):
        tn.data.count_records(str(cut), "tfrecord")
    found = tn.data.scan_files(spec, str(cut), "tfrecord")
    assert found[0].records == 120 and "cut.tfrecord.gz:121" in found[0].damaged
    whole = stream + deflate.flush()
    joined = tmp_path / "joined.tfrecord.gz"
    joined.write_bytes(whole + whole)
    assert tn.data.count_records(str(joined), "tfrecord") == 240
    assert tn.data.scan_files(spec, str(joined), "tfrecord")[0].damaged is None


# make test-long: test_skip_counts_every_bad_row_per_file stays.
@pytest.mark.long
def test_criteo_skip_counts_the_train_and_holdout_windows(tmp_path):
    """--data=criteo with --train_rows: the first N lines train, the rest
    are the hold-out; bad lines are counted in the window they fall in."""
    from tests.conftest import data_file  # noqa: PLC0415
    lines = data_file("criteo/dev_head10k.tsv").read_text().splitlines()[:1400]
    bad = {99: "garbage", 1000: "1\t2", 1300: "x" * 50}  # 0-based line indexes
    a = tmp_path / "a.tsv"
    a.write_text("\n".join(bad.get(i, t) for i, t in enumerate(lines[:1200])) + "\n")
    b = tmp_path / "b.tsv"
    b.write_text("\n".join(bad.get(1200 + i, t) for i, t in enumerate(lines[1200:])) + "\n")
    res = _train(tmp_path, "--data=criteo", f"--train_files={a},{b}",
                 "--train_rows=1250", "--bad_rows=skip")
    err = res.stderr.decode("utf-8", "replace")
    assert res.returncode == 0, err[-4000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["bad_rows_skipped"] == {
        "train": {"skipped": 2, "files": {str(a): 2}},
        "eval": {"skipped": 1, "files": {str(b): 1}}}
    assert summary["train_examples"] == 1250 - 2
    assert summary["eval"]["examples"] == 1400 - 1250 - 1
    assert f"{a}:100: expected 40 fields" in err and f"{b}:101:" in err


@pytest.mark.parametrize("args,says", [
    (["--epoch=2"], "Unknown command line flag 'epoch'. Did you mean: "
     "epochs"),
    (["--model=foo"], "flag --model=foo: value should be one of"),
    (["--days=2026-01-01..2026-01-02"], "--days needs --feature_spec"),
    (["epochs=2"], "unexpected arguments ['epochs=2']"),
])
def test_bad_flags_exit_2_with_one_line(tmp_path, args, says):
    """A flag typo, a bad value, a flag combination that cannot work and a
    stray argument exit 2 (absl's own status is 1, which `tnet.launch
    --restarts` and a TFJob would restart) with one line, no traceback."""
    # (its own Python: flags are read before TensorFlow loads)
    res = _train(tmp_path, "--data=synthetic", *args, timeout=120, fork=False)
    err = res.stderr.decode("utf-8", "replace")
    assert res.returncode == 2, err[-3000:]
    lines = [line for line in err.splitlines()
             if line.startswith("tnet.train:")]
    assert len(lines) == 1 and says in lines[0], err[-3000:]
    assert "Traceback" not in err
