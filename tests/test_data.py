"""tnet.data: readers against independent Python parses, bad rows, sharding, synthetic data."""
from __future__ import annotations

import csv
import datetime
import math
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.conftest import ROOT, data_file
from tests.support import forkrun
import tnet.data as td
from tnet.data import _rows
from tnet.data.criteo import CRITEO_TSV
from tnet.data.metrics import auc
from tnet.data.synthetic import (BLOCK, CRITEO_KAGGLE_CARDINALITIES, MULTI_VALUED_MAX_LENGTH,
                                 SyntheticCriteo, ZipfRank, read_tsv, synthetic_cardinalities)

import tensorflow as tf  # noqa: E402  (after tnet)

INT, CAT = td.CRITEO_INT_COLUMNS, td.CRITEO_CAT_COLUMNS

from tests.support.readers import (assert_criteo_equal,  # noqa: E402
                                   assert_same_batches, collect,
                                   python_criteo)


@pytest.fixture(scope="module")
def dev_lines() -> list[str]:
    with open(data_file("criteo/dev_head10k.tsv"), encoding="ascii") as f:
        return f.read().splitlines()


# ---------------------------------------------------------------- Criteo

def test_criteo_tsv_matches_python_parse(dev_lines):
    path = data_file("criteo/dev_head10k.tsv")
    feats, labels = collect(td.criteo_dataset(path, 1000))
    dense, cats, exp_labels = python_criteo(dev_lines)
    assert labels.shape == (9999,) and set(np.unique(labels)) == {0.0, 1.0}
    assert_criteo_equal(feats, labels, dense, cats, exp_labels)
    # The sample really exercises empty fields and negative dense values.
    assert (cats == td.CRITEO_MISSING_ID).any() and cats.max() == td.CRITEO_MISSING_ID
    assert any(r.split("\t")[2].startswith("-") for r in dev_lines)
    assert any(r.split("\t")[1] == "" for r in dev_lines)
    assert feats["I1"].dtype == np.float32 and feats["C1"].dtype == np.int64
    assert cats[cats != td.CRITEO_MISSING_ID].max() < 2**32


def test_criteo_unlabeled_and_csv_match_python_parse():
    path = data_file("criteo/criteo_kaggle_test_unlabeled.tsv")
    with open(path) as f:
        lines = f.read().splitlines()
    feats, labels = collect(td.criteo_dataset(path, 512, labeled=False))
    assert labels is None
    assert_criteo_equal(feats, None, *python_criteo(lines, labeled=False))

    path = data_file("criteo/criteo_sample_200.csv")
    with open(path) as f:
        lines = f.read().splitlines()
    feats, labels = collect(td.criteo_csv_dataset(path, 64))
    assert_criteo_equal(feats, labels, *python_criteo(lines[1:], sep=","))


def test_skip_take_select_rows_by_position(dev_lines):
    path = data_file("criteo/dev_head10k.tsv")
    dense, cats, labels = python_criteo(dev_lines)
    train = collect(td.criteo_dataset(path, 1024, take=8000))
    held = collect(td.criteo_dataset(path, 1024, skip=8000))
    assert train[1].shape == (8000,) and held[1].shape == (1999,)
    assert_criteo_equal(*train, dense[:8000], cats[:8000], labels[:8000])
    assert_criteo_equal(*held, dense[8000:], cats[8000:], labels[8000:])
    middle = collect(td.criteo_dataset(path, 7, skip=10, take=20))
    assert_criteo_equal(*middle, dense[10:30], cats[10:30], labels[10:30])
    stats = td.ReadStats()
    collect(td.criteo_dataset(path, 1024, take=8000, stats=stats))  # fail mode counts too
    assert (stats.lines_read, stats.rows, stats.skipped) == (8000, 8000, 0)
    with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
        with pytest.raises(ValueError, match="outside strategy.scope"):
            td.ReadStats()


def test_batch_sizes_epochs_and_drop_remainder():
    path = data_file("criteo/dev_head10k.tsv")
    sizes = [int(y.shape[0]) for _, y in td.criteo_dataset(path, 4096)]
    assert sizes == [4096, 4096, 1807]
    sizes = [int(y.shape[0]) for _, y in td.criteo_dataset(path, 4096, drop_remainder=True)]
    assert sizes == [4096, 4096]
    two = collect(td.criteo_dataset(path, 3000, num_epochs=2))
    one = collect(td.criteo_dataset(path, 3000))
    np.testing.assert_array_equal(two[0]["C3"], np.tile(one[0]["C3"], 2))


def test_shuffle_is_a_seeded_permutation():
    path = data_file("criteo/dev_head10k.tsv")
    plain = collect(td.criteo_dataset(path, 500, take=3000))[0]["C4"]
    ds = td.criteo_dataset(path, 500, take=3000, shuffle_buffer=1000, seed=7)
    a, again = collect(ds)[0]["C4"], collect(ds)[0]["C4"]
    b = collect(td.criteo_dataset(path, 500, take=3000, shuffle_buffer=1000, seed=7))[0]["C4"]
    assert not np.array_equal(a, plain) and not np.array_equal(a, again)  # reshuffled per epoch
    for x in (a, again):  # a permutation within each window of 1000 lines
        for w in range(3):
            np.testing.assert_array_equal(np.sort(x[w * 1000:(w + 1) * 1000]),
                                          np.sort(plain[w * 1000:(w + 1) * 1000]))
    np.testing.assert_array_equal(a, b)


def _rows_multiset(feats, labels):
    cols = [labels] + [feats[c] for c in INT + CAT]
    return sorted(zip(*[c.tolist() for c in cols]))


def test_input_context_shards_rows_disjoint_and_covering(tmp_path, dev_lines):
    path = data_file("criteo/dev_head10k.tsv")
    everything = _rows_multiset(*collect(td.criteo_dataset(path, 512)))
    shards = []
    for i in range(3):  # one file, 3 pipelines: rows are sharded (chunks of 1024 lines)
        ctx = tf.distribute.InputContext(num_input_pipelines=3, input_pipeline_id=i)
        shards.append(_rows_multiset(*collect(td.criteo_dataset(path, 512, input_context=ctx))))
    assert all(len(s) > 0 for s in shards)
    assert sorted(sum(shards, [])) == everything
    # Several files, as many pipelines: whole files go to pipelines.
    files = []
    for k in range(4):
        files.append(tmp_path / f"part-{k}.tsv")
        files[-1].write_text("\n".join(dev_lines[k * 50:(k + 1) * 50]) + "\n")
    got = []
    for i in range(2):
        ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=i)
        got.append(collect(td.criteo_dataset(files, 64, input_context=ctx))[0]["C2"])
    dense, cats, _ = python_criteo(dev_lines[:200])
    np.testing.assert_array_equal(got[0], np.concatenate([cats[0:50, 1], cats[100:150, 1]]))
    np.testing.assert_array_equal(got[1], np.concatenate([cats[50:100, 1], cats[150:200, 1]]))


@pytest.mark.parametrize("pipes", [2, 3])
def test_pipelines_of_one_file_get_their_runs_of_lines(tmp_path, dev_lines, pipes):
    """One file, several input pipelines: pipeline p reads the runs of
    chunk = 1024 lines whose number r has r % pipes == p, in file order
    (the assignment of rebatch(chunk).shard(pipes, p) over every line),
    through blocks that cut lines anywhere, CRLF and no final newline; an
    error names its line in the file."""
    n = 2600
    path = tmp_path / "one.tsv"
    path.write_bytes(("\r\n".join(dev_lines[:n])).encode())
    dense, cats, labels = python_criteo(dev_lines[:n])
    rows = np.arange(n)
    for p in range(pipes):
        ctx = tf.distribute.InputContext(num_input_pipelines=pipes, input_pipeline_id=p)
        mine = (rows // 1024) % pipes == p
        for block in (1 << 20, 997):
            ds = _rows.read_rows(CRITEO_TSV, path, 64, block_bytes=block,
                                 input_context=ctx)
            assert_criteo_equal(*collect(ds), dense[mine], cats[mine], labels[mine])
    bad = tmp_path / "bad.tsv"
    bad.write_text("\n".join(dev_lines[:1500] + ["1\t2"] + dev_lines[1501:n]) + "\n")
    for p in range(pipes):  # line 1501 is in run 1
        ctx = tf.distribute.InputContext(num_input_pipelines=pipes, input_pipeline_id=p)
        ds = td.criteo_dataset(bad, 64, input_context=ctx)
        if p == 1:
            with raises_at(bad, 1501, "expected 40 fields"):
                collect(ds)
        else:
            assert len(collect(ds)[1]) == int(((rows // 1024) % pipes == p).sum())


def test_pipelines_of_one_headed_file_split_its_data_lines(tmp_path):
    """A file with a header (the feature-spec TSV): its data lines are cut
    into runs, the header checked by the pipeline of the first run."""
    path = tmp_path / "sh.tsv"
    SyntheticCriteo(seed=3, multi_valued=2).write_tsv(str(path), 2300)
    whole = collect(read_tsv(str(path), 100, 2, ragged=True))
    rows = np.arange(2300)
    for p in range(2):
        ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=p)
        got = collect(read_tsv(str(path), 100, 2, ragged=True, input_context=ctx))
        mine = (rows // 1024) % 2 == p
        np.testing.assert_array_equal(got[1], whole[1][mine])
        np.testing.assert_array_equal(got[0]["C1"], whole[0]["C1"][mine])


def test_blocks_split_lines_anywhere_crlf_and_missing_final_newline(tmp_path, dev_lines):
    """Lines that straddle read blocks, CRLF, no final newline: same tensors as clean."""
    for n, blocks in ((300, (1 << 20, 1000, 97)), (12, (7,))):  # 7: lines span many blocks
        clean = tmp_path / f"clean{n}.tsv"
        clean.write_text("\n".join(dev_lines[:n]) + "\n")
        crlf = tmp_path / f"crlf{n}.tsv"
        crlf.write_bytes(("\r\n".join(dev_lines[:n])).encode())  # no final newline
        expected = python_criteo(dev_lines[:n])
        for path in (clean, crlf):
            for block in blocks:
                ds = _rows.read_rows(CRITEO_TSV, path, 64, block_bytes=block)
                assert_criteo_equal(*collect(ds), *expected)


def test_empty_file_and_line_numbers_across_files(tmp_path, dev_lines):
    empty = tmp_path / "empty.tsv"
    empty.write_bytes(b"")
    assert collect(td.criteo_dataset(empty, 8))[1] is None
    good = tmp_path / "good.tsv"
    good.write_text("\n".join(dev_lines[:5]) + "\n")
    bad = tmp_path / "bad.tsv"
    bad.write_text("\n".join(dev_lines[:3] + ["1\t2"]) + "\n")
    labels = collect(td.criteo_dataset([empty, good, empty], 2))[1]
    assert labels.shape == (5,)
    with raises_at(bad, 4, "expected 40 fields"):
        collect(td.criteo_dataset([good, empty, bad], 2))


def raises_at(path, line: int, reason: str):
    """pytest.raises for a reader error that names `path:line: reason`."""
    return pytest.raises(tf.errors.InvalidArgumentError,
                         match=rf"{re.escape(str(path))}:{line}: {reason}")


def _with_field(line: str, index: int, value: str) -> str:
    fields = line.split("\t")
    fields[index] = value
    return "\t".join(fields)


BAD_ROWS = {  # name -> (bad line from a good one, expected reason in the message)
    "too_few_fields": (lambda l: "\t".join(l.split("\t")[:39]),
                       r"expected 40 fields separated by tabs, found 39"),
    "too_many_fields": (lambda l: l + "\t", r"expected 40 fields separated by tabs, found 41"),
    "non_hex_id": (lambda l: _with_field(l, 16, "68fd1zz4"),
                   r"C3 `68fd1zz4` is not an 8-digit hex id"),
    "short_hex_id": (lambda l: _with_field(l, 14, "68fd1e6"),
                     r"C1 `68fd1e6` is not an 8-digit hex id"),
    "nan_text": (lambda l: _with_field(l, 3, "nan"), r"I3 `nan` is not an integer"),
    "inf_text": (lambda l: _with_field(l, 5, "inf"), r"I5 `inf` is not an integer"),
    "float_dense": (lambda l: _with_field(l, 1, "1.5"), r"I1 `1.5` is not an integer"),
    "huge_dense": (lambda l: _with_field(l, 2, "9" * 19), r"I2 `9{19}` is not an integer"),
    "label_2": (lambda l: _with_field(l, 0, "2"), r"label `2` is not 0 or 1"),
    "empty_line": (lambda l: "", r"empty line"),
    "binary": (lambda l: "\x00\x01garbage\x7f", r"not printable ASCII"),
}


def _corpus(tmp_path, dev_lines, kind: str, bad_line: int = 4):
    lines = [l.encode() for l in dev_lines[:10]]
    make, _ = BAD_ROWS[kind]
    lines[bad_line - 1] = make(dev_lines[bad_line - 1]).encode()
    path = tmp_path / f"{kind}.tsv"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


@pytest.mark.parametrize("kind", sorted(BAD_ROWS))
def test_fail_mode_names_file_line_and_reason(tmp_path, dev_lines, kind):
    path = _corpus(tmp_path, dev_lines, kind)
    with pytest.raises(tf.errors.InvalidArgumentError) as err:
        collect(td.criteo_dataset(path, 4))
    message = err.value.message
    assert f"{path}:4: " in message
    assert re.search(BAD_ROWS[kind][1], message), message
    assert "bad_rows=skip" in message


def test_fail_mode_non_utf8_and_truncated_last_line(tmp_path, dev_lines):
    path = tmp_path / "latin1.tsv"
    lines = [l.encode() for l in dev_lines[:6]]
    lines[2] = _with_field(dev_lines[2], 20, "caf\xe9").encode("latin-1")
    path.write_bytes(b"\n".join(lines) + b"\n")
    with raises_at(path, 3, "contains bytes that are not printable ASCII"):
        collect(td.criteo_dataset(path, 4))
    truncated = tmp_path / "truncated.tsv"
    truncated.write_text("\n".join(dev_lines[:6]) + "\n" + dev_lines[6][:-40])
    with raises_at(truncated, 7, "expected 40 fields"):
        collect(td.criteo_dataset(truncated, 4))


def test_skip_mode_counts_logs_and_keeps_clean_batches(tmp_path, dev_lines, capfd):
    good = dev_lines[:200]
    lines = [l.encode() for l in good]
    bad_at = {}  # 1-based line -> kind, inserted in order
    out = []
    kinds = sorted(BAD_ROWS)
    for i, line in enumerate(lines):
        if i % 20 == 5:
            kind = kinds[len(bad_at) % len(kinds)]
            out.append(BAD_ROWS[kind][0](good[i]).encode())
            bad_at[len(out)] = kind
        out.append(line)
    out.append(b"\xff\xfe\x00 garbage")
    bad_at[len(out)] = "binary"
    path = tmp_path / "mixed.tsv"
    path.write_bytes(b"\r\n".join(out))  # CRLF, no final newline
    clean = tmp_path / "clean.tsv"
    clean.write_text("\n".join(good) + "\n")

    stats = td.ReadStats(max_examples=3)
    capfd.readouterr()
    skipped = td.criteo_dataset(path, 16, bad_rows="skip", stats=stats)
    assert_same_batches(skipped, td.criteo_dataset(clean, 16))
    assert stats.skipped == len(bad_at) == 11
    assert stats.rows == 200 and stats.lines_read == 211
    first = sorted(bad_at)[:3]
    assert [e.split(": ")[0] for e in stats.examples] == [f"{path}:{n}" for n in first]
    err = capfd.readouterr().err
    logged = [l for l in err.splitlines() if l.startswith("W tnet.data: skipping malformed")]
    assert len(logged) == 5  # the first few only
    assert f"{path}:{first[0]}: " in logged[0]
    assert "more malformed Criteo TSV rows are skipped" in err
    stats.reset()
    assert stats.skipped == 0 and stats.examples == []


def test_csv_header_is_checked(tmp_path):
    path = data_file("criteo/criteo_sample_200.csv")
    with open(path) as f:
        lines = f.read().splitlines()
    wrong = tmp_path / "noheader.csv"
    wrong.write_text("\n".join(lines[1:20]) + "\n")
    with raises_at(wrong, 1, "header does not match"):
        collect(td.criteo_csv_dataset(wrong, 8, bad_rows="skip"))


def test_reader_builds_inside_tf_function_without_variables():
    """What a ParameterServerStrategy dataset_fn does: traced, no variables, no py_func."""
    path = data_file("criteo/dev_head10k.tsv")

    def forbid(next_creator, **kwargs):
        raise AssertionError("the reader created a variable")

    with tf.variable_creator_scope(forbid):
        ds = tf.function(lambda: td.criteo_dataset(path, 100, take=300, bad_rows="skip"))()
    assert collect(ds)[1].shape == (300,)


def test_parameter_server_worker_reads_and_reports(tmp_path, dev_lines):
    """In a subprocess: an in-process 1 worker / 1 ps cluster on 127.0.0.1."""
    bad = tmp_path / "bad.tsv"
    bad.write_text("\n".join(dev_lines[:3] + ["1\tzz"] + dev_lines[3:50]) + "\n")
    script = textwrap.dedent(f"""
        import socket
        import tnet, tnet.data as td
        import tensorflow as tf
        def port():
            s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close()
            return p
        spec = tf.train.ClusterSpec({{"worker": [f"127.0.0.1:{{port()}}"],
                                     "ps": [f"127.0.0.1:{{port()}}"]}})
        servers = [tf.distribute.Server(spec, job_name=j, task_index=0, start=True)
                   for j in ("worker", "ps")]
        strategy = tf.distribute.ParameterServerStrategy(
            tf.distribute.cluster_resolver.SimpleClusterResolver(spec, rpc_layer="grpc"))
        coord = tf.distribute.coordinator.ClusterCoordinator(strategy)
        @tf.function
        def step(it):
            f, y = next(it)
            return tf.size(y)
        def run(bad_rows):
            ds = coord.create_per_worker_dataset(
                lambda: td.criteo_dataset({str(bad)!r}, 10, bad_rows=bad_rows))
            it = iter(ds)
            return [int(coord.schedule(step, args=(it,)).fetch()) for _ in range(5)]
        print("SIZES", run("skip"), flush=True)
        try:
            run("fail")
        except tf.errors.InvalidArgumentError as e:
            print("ERROR", str(e).count({str(bad) + ':4: expected 40 fields'!r}) > 0, flush=True)
    """)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = forkrun.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=240,
                       script_imports_tnet=True)
    assert "SIZES [10, 10, 10, 10, 10]" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    assert "ERROR True" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    assert f"skipping malformed Criteo TSV row {bad}:4:" in proc.stderr


# ---------------------------------------------------------------- Avazu

def _avazu_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _check_avazu(feats, labels, rows):
    assert set(feats) == set(td.AVAZU_CAT_COLUMNS) and "id" not in feats
    for c in td.AVAZU_CAT_COLUMNS[:-2]:
        assert [v.decode() for v in feats[c]] == [r[c] for r in rows], c
    days = [datetime.date(2000 + int(r["hour"][:2]), int(r["hour"][2:4]), int(r["hour"][4:6]))
            for r in rows]
    assert [v.decode() for v in feats["weekday"]] == [str(d.weekday()) for d in days]
    assert [v.decode() for v in feats["hour_of_day"]] == [r["hour"][6:] for r in rows]
    if labels is not None:
        np.testing.assert_array_equal(labels, [float(r["click"]) for r in rows])


def test_avazu_matches_csv_module(tmp_path):
    path = data_file("avazu/avazu_train_oct21-22.csv")
    rows = _avazu_rows(path)
    feats, labels = collect(td.avazu_dataset(path, 1000))
    assert len(rows) == 3856 and feats["C1"].dtype == object
    _check_avazu(feats, labels, rows)
    assert {d for d in feats["weekday"]} == {b"1", b"2"}  # 2014-10-21/22: Tue, Wed
    # The test-file layout (no click), and a calendar check across months/years.
    cols = [c for c in rows[0] if c != "click"]
    extra = [dict(rows[0], hour=h) for h in ("15022823", "16022900", "14123112")]
    test_rows = rows[:30] + extra
    test = tmp_path / "test.csv"
    body = "".join(",".join(r[c] for c in cols) + "\n" for r in test_rows)
    test.write_text(",".join(cols) + "\n" + body)
    feats, labels = collect(td.avazu_dataset(test, 16, labeled=False))
    assert labels is None
    _check_avazu(feats, None, test_rows)


def test_avazu_bad_rows(tmp_path):
    path = data_file("avazu/avazu_train_oct21-22.csv")
    with open(path) as f:
        lines = f.read().splitlines()
    body = lines[:12]
    body[5] = body[5].replace(",14102100,", ",14102199,", 1)
    body[8] = body[8] + ",extra"
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join(body) + "\n")
    with raises_at(bad, 6, "hour `14102199` is not a YYMMDDHH"):
        collect(td.avazu_dataset(bad, 4))
    stats = td.ReadStats()
    feats, labels = collect(td.avazu_dataset(bad, 4, bad_rows="skip", stats=stats))
    assert stats.skipped == 2 and labels.shape == (9,)
    assert "9: expected 24 fields separated by commas, found 25" in stats.examples[1]


# ---------------------------------------------------------------- synthetic

@pytest.fixture(scope="module")
def small_gen():
    return SyntheticCriteo(seed=3, scale=0.02)


def test_synthetic_cardinalities_from_config():
    cards = synthetic_cardinalities(1.0)
    assert len(cards) == 26 and 4.9e6 <= sum(cards) <= 5.1e6
    assert max(cards) == 1_500_000 and cards.index(max(cards)) == 2  # C3, as in Criteo
    kaggle = CRITEO_KAGGLE_CARDINALITIES
    assert all(cards[i] <= cards[j] for i in range(26) for j in range(26) if kaggle[i] <= kaggle[j])
    assert sum(synthetic_cardinalities(0.5)) == pytest.approx(sum(cards) / 2, rel=0.01)


def test_synthetic_is_deterministic(small_gen):
    again = SyntheticCriteo(seed=3, scale=0.02)
    a_f, a_y, a_z = small_gen.batch(5000, "train", start=BLOCK - 2000)  # spans two blocks
    b_f, b_y, b_z = again.batch(5000, "train", start=BLOCK - 2000)
    for k in a_f:
        np.testing.assert_array_equal(a_f[k], b_f[k])
    np.testing.assert_array_equal(a_z, b_z)
    np.testing.assert_array_equal(a_y, b_y)
    # An example depends on its index only, not on how it is requested.
    part = small_gen.batch(100, "train", start=BLOCK + 50)[0]["C7"]
    np.testing.assert_array_equal(part, a_f["C7"][2050:2150])
    other = SyntheticCriteo(seed=4, scale=0.02).batch(5000, "train", start=BLOCK - 2000)
    assert not np.array_equal(other[0]["C3"], a_f["C3"])
    holdout = small_gen.batch(5000, "holdout", start=BLOCK - 2000)
    assert not np.array_equal(holdout[0]["C3"], a_f["C3"])


def test_synthetic_dataset_matches_batch_and_reader_structure(small_gen):
    ds = small_gen.dataset(3000, 1024, stream="holdout")
    feats, labels = collect(ds)
    want_f, want_y, _ = small_gen.batch(3000, "holdout")
    np.testing.assert_array_equal(labels, want_y)
    for k in want_f:
        np.testing.assert_array_equal(feats[k], want_f[k])
    reader = td.criteo_dataset(data_file("criteo/dev_head10k.tsv"), 8)
    assert tf.nest.map_structure(lambda s: s.dtype, ds.element_spec) == \
        tf.nest.map_structure(lambda s: s.dtype, reader.element_spec)
    assert [int(y.shape[0]) for _, y in ds] == [1024, 1024, 952]


def test_synthetic_write_tsv_round_trips_through_reader(tmp_path, small_gen):
    path = tmp_path / "synthetic.tsv"
    small_gen.write_tsv(path, 1500, stream="train", start=BLOCK - 700)
    feats, labels = collect(td.criteo_dataset(path, 512))
    want_f, want_y, _ = small_gen.batch(1500, "train", start=BLOCK - 700)
    np.testing.assert_array_equal(labels, want_y)
    for k in CAT:
        np.testing.assert_array_equal(feats[k], want_f[k])
    for k in INT:
        np.testing.assert_allclose(feats[k], want_f[k], rtol=1e-6)


def test_synthetic_ctr_oracle_auc_and_zipf():
    gen = SyntheticCriteo(seed=0)
    feats, labels, logits = gen.batch(1 << 17, "holdout")
    assert 0.2 <= labels.mean() <= 0.3
    assert auc(labels, logits) > 0.75
    assert set(feats) == set(INT) | set(CAT)
    for c, card in zip(CAT, gen.cardinalities):
        assert 0 <= feats[c].min() and feats[c].max() < card
    # Zipf(1.1): the hottest id of C3 (1.5M ids) has probability 1 / H, H = sum (r+1)^-1.1.
    n, card = labels.size, gen.cardinalities[2]
    p_top = 1.0 / np.sum(np.arange(1, card + 1, dtype=np.float64) ** -1.1)
    counts = np.sort(np.unique(feats["C3"], return_counts=True)[1])[::-1]
    for rank in range(3):
        p = p_top * (rank + 1) ** -1.1
        assert abs(counts[rank] - n * p) < 5 * math.sqrt(n * p * (1 - p)), (rank, counts[:3], n * p)
    assert feats["I2"].min() == 0.0 and (feats["I12"] == 0).mean() > 0.7


def test_zipf_rank_is_exact_inverse_cdf():
    rng = np.random.default_rng(0)
    for card in (1, 2, 1000, 1 << 16, (1 << 16) + 1, 300_000):
        sampler = ZipfRank(card, 1.1)
        u = rng.random(20000)
        u[:2] = [0.0, np.nextafter(1.0, 0.0)]
        np.testing.assert_array_equal(sampler(u), np.searchsorted(sampler.cdf, u, side="right"))


# ------------------------------------------------- synthetic, multi-valued

# sha256 of the streams below as the generator wrote them before the
# multi-valued option existed (commit 27bc1fe): with the option off, every
# stream must stay bit-identical.
_SYNTHETIC_DIGEST_BEFORE_MULTI_VALUED = \
    "90e908eed15ac8abe24acead73cab6b98d7439b3934495df292817aadb53b0d2"
MV = ("M1", "M2", "M3", "M4")


def _synthetic_digest(gen, tmp_path) -> str:
    import hashlib
    h = hashlib.sha256()
    for stream, start, n in (("train", BLOCK - 2000, 5000), ("holdout", 0, 3000), (5, 17, 100)):
        f, y, z = gen.batch(n, stream, start)
        for k in sorted(f):
            h.update(k.encode())
            h.update(np.ascontiguousarray(f[k]).tobytes())
        h.update(y.tobytes())
        h.update(z.tobytes())
    h.update(np.float64(gen.bias).tobytes())
    path = tmp_path / "digest.tsv"
    gen.write_tsv(path, 700, "train", BLOCK - 300)
    h.update(path.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def mv_gen():
    return SyntheticCriteo(seed=3, scale=0.02, multi_valued=4)


def test_synthetic_without_multi_valued_is_unchanged(tmp_path, small_gen, mv_gen):
    want = _SYNTHETIC_DIGEST_BEFORE_MULTI_VALUED
    assert _synthetic_digest(small_gen, tmp_path) == want
    assert _synthetic_digest(SyntheticCriteo(seed=3, scale=0.02, multi_valued=0), tmp_path) == want
    # With the option on, the other columns are the same draws; only the
    # logits (and so a few labels) move.
    a_f, a_y, a_z = small_gen.batch(5000, "train", start=BLOCK - 2000)
    b_f, b_y, b_z = mv_gen.batch(5000, "train", start=BLOCK - 2000)
    assert set(b_f) == set(a_f) | set(MV)
    for k in a_f:
        np.testing.assert_array_equal(a_f[k], b_f[k])
    assert not np.array_equal(a_z, b_z) and 0.5 < (a_y == b_y).mean() < 1.0
    with pytest.raises(ValueError, match="multi_valued"):
        SyntheticCriteo(scale=0.02, multi_valued=-1)


def test_synthetic_multi_valued_is_deterministic(mv_gen):
    a = mv_gen.batch(5000, "train", start=BLOCK - 2000)
    b = SyntheticCriteo(seed=3, scale=0.02, multi_valued=4).batch(5000, "train",
                                                                  start=BLOCK - 2000)
    for k in MV:
        assert a[0][k].shape == (5000, MULTI_VALUED_MAX_LENGTH) and a[0][k].dtype == np.int64
        np.testing.assert_array_equal(a[0][k], b[0][k])
    np.testing.assert_array_equal(a[1], b[1])
    np.testing.assert_array_equal(a[2], b[2])
    part = mv_gen.batch(100, "train", start=BLOCK + 50)[0]["M3"]
    np.testing.assert_array_equal(part, a[0]["M3"][2050:2150])
    # Mi does not depend on how many columns there are; columns, seeds and
    # streams differ from each other.
    one = SyntheticCriteo(seed=3, scale=0.02, multi_valued=1).batch(5000, "train",
                                                                    start=BLOCK - 2000)
    np.testing.assert_array_equal(one[0]["M1"], a[0]["M1"])
    assert "M2" not in one[0]
    assert not np.array_equal(a[0]["M1"], a[0]["M2"])
    other = SyntheticCriteo(seed=4, scale=0.02, multi_valued=4).batch(5000, "train",
                                                                      start=BLOCK - 2000)
    assert not np.array_equal(other[0]["M1"], a[0]["M1"])
    holdout = mv_gen.batch(5000, "holdout", start=BLOCK - 2000)
    assert not np.array_equal(holdout[0]["M1"], a[0]["M1"])


def test_synthetic_multi_valued_lengths_ids_and_padding(mv_gen):
    feats, _, _ = mv_gen.batch(1 << 16, "train")
    card = mv_gen.multi_valued_cardinality
    for k in MV:
        ids = feats[k]
        valid = ids >= 0
        lengths = valid.sum(axis=1)
        # ids first, then only -1
        np.testing.assert_array_equal(valid, np.arange(MULTI_VALUED_MAX_LENGTH) < lengths[:, None])
        assert (ids[~valid] == -1).all() and ids[valid].max() < card
        # 1 + BetaBinomial(49, 1.9, 3.0): mean 20, sd ~10.3, 1..50
        assert lengths.min() == 1 and lengths.max() == MULTI_VALUED_MAX_LENGTH
        assert abs(lengths.mean() - 20.0) < 0.25, lengths.mean()
        assert 9.5 < lengths.std() < 11.0, lengths.std()
        # Zipf over the ids: the hottest id takes about 1/H of all draws.
        p_top = 1.0 / np.sum(np.arange(1, card + 1, dtype=np.float64) ** -1.1)
        top = np.unique(ids[valid], return_counts=True)[1].max() / valid.sum()
        assert abs(top - p_top) < 0.1 * p_top, (top, p_top)


def test_synthetic_label_depends_on_multi_valued_ids():
    gen = SyntheticCriteo(seed=0, scale=0.2, multi_valued=4)
    base = SyntheticCriteo(seed=0, scale=0.2)
    feats, labels, logits = gen.batch(1 << 16, "holdout")
    _, _, base_logits = base.batch(1 << 16, "holdout")
    assert 0.2 <= labels.mean() <= 0.3
    # The multi-valued term alone (everything else is the same draws)
    # predicts the label, and the oracle gets better with it.
    term = logits - base_logits
    assert term.std() > 0.5
    assert auc(labels, term) > 0.6
    assert auc(labels, logits) > auc(labels, base_logits) + 0.005
    assert gen.oracle_auc(n=1 << 16) == pytest.approx(auc(labels, logits))
    # The documented model: bias + ... + sum over columns of the mean of
    # the row's per-id weights (the bias is solved again with them).
    expected = gen.bias - base.bias
    for m, k in enumerate(MV):
        ids = feats[k]
        w = np.where(ids >= 0, gen._mv_weight[m][np.maximum(ids, 0)], 0.0)
        expected = expected + w.sum(axis=1) / (ids >= 0).sum(axis=1)
    np.testing.assert_allclose(term, expected, atol=1e-4)


def test_synthetic_multi_valued_dataset_and_tsv_round_trip(tmp_path, mv_gen):
    want_f, want_y, _ = mv_gen.batch(3000, "holdout")
    feats, labels = collect(mv_gen.dataset(3000, 1024, stream="holdout"))
    np.testing.assert_array_equal(labels, want_y)
    for k in want_f:
        np.testing.assert_array_equal(feats[k], want_f[k])
    path = tmp_path / "mv.tsv"
    mv_gen.write_tsv(path, 1500, stream="train", start=BLOCK - 700)
    want_f, want_y, _ = mv_gen.batch(1500, "train", start=BLOCK - 700)
    feats, labels = collect(read_tsv(path, 512, 4))
    np.testing.assert_array_equal(labels, want_y)
    assert set(feats) == set(want_f)
    for k in want_f:  # exact, dense values included
        assert feats[k].dtype == want_f[k].dtype, k
        np.testing.assert_array_equal(feats[k], want_f[k], err_msg=k)
    ds = read_tsv(path, 512, 4, ragged=True, take=1000)
    got = [f["M2"] for f, _ in ds]
    assert all(isinstance(m, tf.RaggedTensor) for m in got)
    np.testing.assert_array_equal(
        np.concatenate([m.to_tensor(-1, shape=[None, MULTI_VALUED_MAX_LENGTH]).numpy()
                        for m in got]), want_f["M2"][:1000])
    # multi_valued=0: the Criteo reader, unchanged.
    plain = tmp_path / "plain.tsv"
    SyntheticCriteo(seed=3, scale=0.02).write_tsv(plain, 600)
    assert_same_batches(read_tsv(plain, 256, take=500), td.criteo_dataset(plain, 256, take=500))


# ---------------------------------------------------------------- AUC

def test_auc_matches_pairwise_definition_with_ties():
    rng = np.random.default_rng(1)
    y = rng.random(300) < 0.3
    s = np.round(rng.normal(size=300) + y, 1)  # many ties
    pos, neg = s[y], s[~y]
    wins = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    pairwise = wins / (pos.size * neg.size)
    assert auc(y, s) == pytest.approx(pairwise, abs=1e-12)
    assert auc([0, 1], [0.2, 0.1]) == 0.0 and auc([0, 1, 1], [0.5, 0.5, 0.9]) == 0.75
    with pytest.raises(ValueError, match="both classes"):
        auc([1, 1], [0.1, 0.2])
