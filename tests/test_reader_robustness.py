"""Criteo / Avazu readers against generated corpora of malformed files.

tests/test_data.py checks one bad row of each kind at a time. Here a seeded
generator mixes many kinds of damage (wrong field counts, non-hex ids, huge
integers, NaN/inf, CRLF and lone CR, empty and whitespace lines, binary
garbage that may contain newlines, non-UTF-8 and UTF-8 bytes, a truncated
last line, quoting, impossible dates...) into real rows, and an independent
Python model of the row rules (plain string checks, `int(x, 16)`,
`datetime.date`) decides which lines are good. The readers must agree with
it line by line:

* `bad_rows="skip"`: every bad line is counted and reported with its
  file:line, and the good rows come out in exactly the batches of a clean
  file holding only the good lines, equal to the Python parse;
* `bad_rows="fail"`: the error names the first bad line's file:line;
* a short model fit on the corrupted file (skip) and on the clean file gives
  bit-identical weights.
"""
from __future__ import annotations

import datetime
import math
import re

import numpy as np
import pytest

import tnet as tn
import tnet.data as td
from tests.conftest import data_file
from tests.support.readers import assert_same_batches, collect, python_criteo
from tnet.data import _rows
from tnet.data.avazu import AVAZU_CSV, AVAZU_RAW_COLUMNS
from tnet.data.criteo import CRITEO_TSV

import tensorflow as tf  # noqa: E402  (after tnet)
import tf_keras  # noqa: E402

PRINTABLE = frozenset(range(0x20, 0x7F))
HEX = frozenset("0123456789abcdefABCDEF")
DIGITS = frozenset("0123456789")


# ------------------------------------------------------- the Python model
def split_lines(data: bytes) -> list[bytes]:
    """Data lines of a file: split on LF, one trailing CR dropped, a final
    line without newline kept (if not empty)."""
    parts = data.split(b"\n")
    if parts[-1] == b"":
        parts.pop()
    return [p[:-1] if p.endswith(b"\r") else p for p in parts]


def criteo_ok(line: bytes) -> bool:
    """The Criteo TSV row rules, written as plain string checks."""
    if not line or any(b not in PRINTABLE and b != 9 for b in line):
        return False
    f = line.decode("ascii").split("\t")
    if len(f) != 40 or f[0] not in ("0", "1"):
        return False
    for x in f[1:14]:
        digits = x[1:] if x.startswith("-") else x
        if x and not (1 <= len(digits) <= 18 and set(digits) <= DIGITS):
            return False
    return all(x == "" or (len(x) == 8 and set(x) <= HEX) for x in f[14:])


def _real_date(hour: str) -> bool:
    if len(hour) != 8 or not set(hour) <= DIGITS or int(hour[6:]) > 23:
        return False
    try:
        datetime.date(2000 + int(hour[:2]), int(hour[2:4]), int(hour[4:6]))
    except ValueError:
        return False
    return True


def avazu_ok(line: bytes) -> bool:
    """The Avazu CSV row rules: 24 comma-separated tokens of printable
    ASCII without spaces; numeric id, click 0/1, a real YYMMDDHH hour."""
    if any(b not in PRINTABLE for b in line):
        return False
    f = line.decode("ascii").split(",")
    if len(f) != 24 or " " in line.decode("ascii"):
        return False
    return (1 <= len(f[0]) <= 20 and set(f[0]) <= DIGITS and f[1] in ("0", "1")
            and _real_date(f[2]))


def avazu_expected(lines: list[bytes]) -> tuple[dict[str, list[str]], np.ndarray]:
    cols = AVAZU_RAW_COLUMNS
    rows = [dict(zip(cols, l.decode().split(","))) for l in lines]
    feats = {c: [r[c] for r in rows] for c in cols if c not in ("id", "click")}
    feats["hour_of_day"] = [r["hour"][6:] for r in rows]
    feats["weekday"] = [str(datetime.date(2000 + int(r["hour"][:2]), int(r["hour"][2:4]),
                                          int(r["hour"][4:6])).weekday()) for r in rows]
    return feats, np.array([float(r["click"]) for r in rows], np.float32)


# -------------------------------------------------------------- damage
def _set(fields: list[str], i: int, value: str) -> list[str]:
    out = list(fields)
    out[i] = value
    return out


def criteo_damage(rng: np.random.Generator) -> dict:
    """name -> function(good line as str) -> damaged line as bytes."""
    def f(line):
        return line.split("\t")

    def j(fields):
        return "\t".join(fields).encode()

    def cat(line):
        return int(rng.integers(14, 40))

    def dense(line):
        return int(rng.integers(1, 14))

    garbage = lambda l: bytes(rng.integers(0, 256, int(rng.integers(1, 60)), dtype=np.uint8))
    return {
        "drop_field": lambda l: j(f(l)[:-1]),
        "extra_field": lambda l: j(f(l) + ["0"]),
        "doubled_tab": lambda l: l.replace("\t", "\t\t", 1).encode(),
        "tabs_as_spaces": lambda l: l.replace("\t", " ").encode(),
        "non_hex_id": lambda l: j(_set(f(l), cat(l), "0a1b2c3g")),
        "short_hex_id": lambda l: j(_set(f(l), cat(l), "0a1b2c3")),
        "long_hex_id": lambda l: j(_set(f(l), cat(l), "0a1b2c3d4")),
        "hex_0x": lambda l: j(_set(f(l), cat(l), "0x1b2c3d")),
        "huge_int": lambda l: j(_set(f(l), dense(l), "9" * int(rng.integers(19, 40)))),
        "int_18_digits": lambda l: j(_set(f(l), dense(l), "9" * 18)),  # valid
        "negative_int": lambda l: j(_set(f(l), dense(l), "-12")),  # valid
        "plus_sign": lambda l: j(_set(f(l), dense(l), "+12")),
        "lone_minus": lambda l: j(_set(f(l), dense(l), "-")),
        "nan": lambda l: j(_set(f(l), dense(l), str(rng.choice(["nan", "NaN", "-nan"])))),
        "inf": lambda l: j(_set(f(l), dense(l), str(rng.choice(["inf", "-inf", "Infinity"])))),
        "float": lambda l: j(_set(f(l), dense(l), "1.5")),
        "exponent": lambda l: j(_set(f(l), dense(l), "1e5")),
        "padded_int": lambda l: j(_set(f(l), dense(l), " 7")),
        "label_2": lambda l: j(_set(f(l), 0, "2")),
        "label_empty": lambda l: j(_set(f(l), 0, "")),
        "empty_line": lambda l: b"",
        "spaces_only": lambda l: b"   ",
        "tab_only": lambda l: b"\t",
        "garbage": garbage,  # may hold LF / CR: more lines, same rules
        "nul_in_field": lambda l: j(_set(f(l), cat(l), "0a1b\x002c3")),
        "latin1": lambda l: "\t".join(_set(f(l), cat(l), "caf\xe9caf\xe9")).encode("latin-1"),
        "utf8": lambda l: j(_set(f(l), cat(l), "caf\u00e9caf")),
        "bom": lambda l: b"\xef\xbb\xbf" + l.encode(),
        "cr_inside": lambda l: l.replace("\t", "\r\t", 1).encode(),
        "double_cr": lambda l: l.encode() + b"\r\r",  # one CR is dropped, one left
        "trailing_space": lambda l: l.encode() + b" ",
    }


def make_corpus(good: list[str], damage: dict, rng, every: int = 3,
                crlf_share: float = 0.3, truncate: bool = True,
                header: str | None = None) -> bytes:
    """Good lines with damaged copies of random good lines inserted between
    them; random CRLF line ends; a truncated last line."""
    kinds = sorted(damage)
    out: list[bytes] = [] if header is None else [header.encode()]
    for i, line in enumerate(good):
        if i % every == 1:
            out.append(damage[kinds[(i // every) % len(kinds)]](good[int(rng.integers(len(good)))]))
        out.append(line.encode())
    data = b"".join(l + (b"\r\n" if rng.random() < crlf_share else b"\n") for l in out)
    if truncate:
        data += good[int(rng.integers(len(good)))][:-int(rng.integers(1, 30))].encode()
    return data


def reference(data: bytes, ok, header: bool = False):
    """(numbered lines, [(line_no, line, good)]) per the Python model."""
    lines = split_lines(data)
    start = 1
    if header:
        lines, start = lines[1:], 2
    return [(n, l, ok(l)) for n, l in enumerate(lines, start)]


def _example_lines(stats: td.ReadStats, path) -> list[int]:
    out = []
    for e in stats.examples:
        m = re.match(re.escape(str(path)) + r":(\d+): ", e)
        assert m, e
        out.append(int(m.group(1)))
    return out


# ---------------------------------------------------------------- Criteo
@pytest.fixture(scope="module")
def criteo_lines() -> list[str]:
    with open(data_file("criteo/dev_head10k.tsv"), encoding="ascii") as f:
        return f.read().splitlines()[:400]


@pytest.mark.parametrize("seed,block", [(0, 1 << 20), (1, 97)])
def test_criteo_corpus_skip_matches_python_model(tmp_path, criteo_lines, seed, block):
    rng = np.random.default_rng(seed)
    good = criteo_lines[seed * 150:seed * 150 + 150]
    data = make_corpus(good, criteo_damage(rng), rng)
    path = tmp_path / "damaged.tsv"
    path.write_bytes(data)
    ref = reference(data, criteo_ok)
    bad = [n for n, _, ok in ref if not ok]
    kept = [l.decode() for _, l, ok in ref if ok]
    assert len(bad) > 45 and len(kept) >= 150  # a real mix (a few damages are valid)
    clean = tmp_path / "clean.tsv"
    clean.write_text("".join(l + "\n" for l in kept))

    stats = td.ReadStats(max_examples=1000)
    damaged = _rows.read_rows(CRITEO_TSV, path, 16, bad_rows="skip", stats=stats,
                              block_bytes=block)
    assert_same_batches(damaged, td.criteo_dataset(clean, 16))
    assert (stats.lines_read, stats.rows, stats.skipped) == (len(ref), len(kept), len(bad))
    assert _example_lines(stats, path) == bad  # every skipped row, in order
    feats, labels = collect(td.criteo_dataset(path, 64, bad_rows="skip"))
    from tests.support.readers import assert_criteo_equal
    assert_criteo_equal(feats, labels, *python_criteo(kept))


def test_criteo_damage_fails_at_its_line(tmp_path, criteo_lines):
    """fail mode: kinds of damage not in tests/test_data.py, each alone at a
    random line of the second of two files: the error names that file and
    line (garbage may hold newlines: the line is the model's first bad one)."""
    rng = np.random.default_rng(7)
    first = tmp_path / "first.tsv"
    first.write_text("\n".join(criteo_lines[:30]) + "\n")
    damage = criteo_damage(rng)
    for kind in ("garbage", "bom", "cr_inside", "double_cr", "hex_0x", "plus_sign",
                 "nul_in_field", "utf8"):
        lines = [l.encode() for l in criteo_lines[:12]]
        at = int(rng.integers(0, 12))
        lines[at] = damage[kind](criteo_lines[at])
        data = b"\n".join(lines) + b"\n"
        bad = [n for n, _, ok in reference(data, criteo_ok) if not ok]
        assert bad, kind
        path = tmp_path / f"{kind}.tsv"
        path.write_bytes(data)
        with pytest.raises(tf.errors.InvalidArgumentError) as err:
            collect(td.criteo_dataset([first, path], 8))
        assert f"{path}:{bad[0]}: " in err.value.message, (kind, err.value.message[:500])
        assert "bad_rows=skip" in err.value.message


def _fit_snapshot(model_fn, ds) -> list[bytes]:
    tf_keras.utils.set_random_seed(0)
    model = model_fn()
    model.fit(ds, epochs=1, verbose=0)
    out = [v.numpy().tobytes() for v in model.variables + model.optimizer.variables]
    for name, table in sorted(model.tables().items()):
        keys, weights, slots, meta = (t.numpy() for t in table.export())
        order = np.argsort(keys)
        out += [a[order].tobytes() for a in (keys, weights, slots, meta)]
    return out


def test_criteo_fit_on_damaged_file_equals_fit_on_clean(tmp_path, criteo_lines):
    rng = np.random.default_rng(11)
    data = make_corpus(criteo_lines[:160], criteo_damage(rng), rng)
    path = tmp_path / "damaged.tsv"
    path.write_bytes(data)
    clean = tmp_path / "clean.tsv"
    clean.write_text("".join(l.decode() + "\n" for _, l, ok in reference(data, criteo_ok) if ok))

    def model():
        m = tn.models.WideDeep(list(td.CRITEO_CAT_COLUMNS), list(td.CRITEO_INT_COLUMNS),
                               embedding_dim=4, hidden_units=[8])
        m.compile(tn.optimizer.Adagrad(0.05))
        return m

    a = _fit_snapshot(model, td.criteo_dataset(path, 32, bad_rows="skip"))
    b = _fit_snapshot(model, td.criteo_dataset(clean, 32))
    assert len(a) == len(b) and all(x == y for x, y in zip(a, b))


CSV_HEADER = ",".join(["label", *td.CRITEO_INT_COLUMNS, *td.CRITEO_CAT_COLUMNS])
CSV_NUMBERS = ["1.", "1.e5", ".5", "-.5", "1E+05", "-0", "9" * 18 + "e99", "1e-99",
               "1." + "9" * 3000, "0." + "0" * 3000 + "1", "123456789012345678"]
CSV_NOT_NUMBERS = ["nan", "inf", "-inf", "1e999", "1_000", "+1", " 1", "1.5.5", "0x10",
                   "1e", ".", "1" * 19]


def test_criteo_csv_numbers_match_python_float_and_junk_is_named(tmp_path):
    """CSV dense values: every accepted spelling decodes like float(); the
    rest (NaN, inf, 3-digit exponents, Python-only spellings) are bad rows
    named by line and column."""
    rows = [(t, True) for t in CSV_NUMBERS] + [(t, False) for t in CSV_NOT_NUMBERS]
    np.random.default_rng(3).shuffle(rows)
    path = tmp_path / "n.csv"
    path.write_text(CSV_HEADER + "\n" + "".join(
        ",".join(["1", t] + ["3"] * 12 + ["0a0b0c0d"] * 26) + "\n" for t, _ in rows))
    stats = td.ReadStats(max_examples=100)
    feats, _ = collect(td.criteo_csv_dataset(path, 4, bad_rows="skip", stats=stats))
    good = [t for t, ok in rows if ok]
    want = [np.float32(math.log1p(float(t))) if float(t) > 0 else np.float32(0) for t in good]
    np.testing.assert_allclose(feats["I1"], want, rtol=1e-6)
    bad_lines = [n for n, (_, ok) in enumerate(rows, 2) if not ok]
    assert _example_lines(stats, path) == bad_lines
    assert all(" I1 `" in e and "is not a number or empty" in e for e in stats.examples)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"{re.escape(str(path))}:{bad_lines[0]}: I1 "):
        collect(td.criteo_csv_dataset(path, 4))


@pytest.mark.parametrize("reader,header", [
    (td.criteo_csv_dataset, CSV_HEADER), (td.avazu_dataset, ",".join(AVAZU_RAW_COLUMNS))])
def test_header_only_and_empty_files_yield_no_rows(tmp_path, reader, header):
    files = []
    for name, data in (("empty", b""), ("header", header.encode()),
                       ("header_lf", header.encode() + b"\n"),
                       ("header_crlf", header.encode() + b"\r\n")):
        files.append(tmp_path / f"{name}.csv")
        files[-1].write_bytes(data)
    for mode in ("fail", "skip"):
        stats = td.ReadStats()
        assert collect(reader(files, 4, bad_rows=mode, stats=stats))[1] is None
        assert (stats.lines_read, stats.skipped) == (0, 0)
    # A header with a byte-order mark is not the header: named at line 1.
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + header.encode() + b"\n")
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"{re.escape(str(bom))}:1: header does not match"):
        collect(reader([files[1], bom], 4, bad_rows="skip"))


# ----------------------------------------------------------------- Avazu
@pytest.fixture(scope="module")
def avazu_lines() -> tuple[str, list[str]]:
    with open(data_file("avazu/avazu_train_oct21-22.csv"), encoding="ascii") as f:
        lines = f.read().splitlines()
    return lines[0], lines[1:301]


def avazu_damage(rng) -> dict:
    def f(line):
        return line.split(",")

    def j(fields):
        return ",".join(fields).encode()

    def token(line):
        return int(rng.integers(3, 24))

    return {
        "drop_field": lambda l: j(f(l)[:-1]),
        "extra_field": lambda l: j(f(l) + ["x"]),
        "quoted_comma": lambda l: j(_set(f(l), token(l), '"a,b"')),
        "space_in_token": lambda l: j(_set(f(l), token(l), "a b")),
        "tab_in_token": lambda l: j(_set(f(l), token(l), "a\tb")),
        "id_not_digits": lambda l: j(_set(f(l), 0, "1e3")),
        "click_2": lambda l: j(_set(f(l), 1, "2")),
        "hour_24": lambda l: j(_set(f(l), 2, "14102124")),
        "month_13": lambda l: j(_set(f(l), 2, "14132100")),
        "feb_30": lambda l: j(_set(f(l), 2, "14023005")),
        "feb_29_not_leap": lambda l: j(_set(f(l), 2, "15022905")),
        "feb_29_leap": lambda l: j(_set(f(l), 2, "16022905")),  # valid
        "apr_31": lambda l: j(_set(f(l), 2, "14043105")),
        "dec_31": lambda l: j(_set(f(l), 2, "14123123")),  # valid
        "short_hour": lambda l: j(_set(f(l), 2, "1410210")),
        "empty_line": lambda l: b"",
        "garbage": lambda l: bytes(rng.integers(0, 256, int(rng.integers(1, 60)), dtype=np.uint8)),
        "latin1": lambda l: ",".join(_set(f(l), token(l), "caf\xe9")).encode("latin-1"),
        "utf8": lambda l: j(_set(f(l), token(l), "caf\u00e9")),
        "cr_inside": lambda l: l.replace(",", "\r,", 1).encode(),
        "header_again": lambda l: ",".join(AVAZU_RAW_COLUMNS).encode(),
    }


@pytest.mark.parametrize("seed", [1])
def test_avazu_corpus_skip_matches_python_model(tmp_path, avazu_lines, seed):
    header, lines = avazu_lines
    rng = np.random.default_rng(seed)
    data = make_corpus(lines[:200], avazu_damage(rng), rng, header=header)
    path = tmp_path / "damaged.csv"
    path.write_bytes(data)
    ref = reference(data, avazu_ok, header=True)
    bad = [n for n, _, ok in ref if not ok]
    kept = [l for _, l, ok in ref if ok]
    assert len(bad) > 60 and len(kept) >= 200
    clean = tmp_path / "clean.csv"
    clean.write_bytes(header.encode() + b"\n" + b"".join(l + b"\n" for l in kept))

    stats = td.ReadStats(max_examples=1000)
    damaged = _rows.read_rows(AVAZU_CSV, path, 16, bad_rows="skip", stats=stats,
                              block_bytes=(1 << 20) if seed == 0 else 113)
    assert_same_batches(damaged, td.avazu_dataset(clean, 16))
    assert (stats.lines_read, stats.rows, stats.skipped) == (len(ref), len(kept), len(bad))
    assert _example_lines(stats, path) == bad
    feats, labels = collect(td.avazu_dataset(path, 64, bad_rows="skip"))
    want, want_labels = avazu_expected(kept)
    for c, values in want.items():
        assert [v.decode() for v in feats[c]] == values, c
    np.testing.assert_array_equal(labels, want_labels)

    first_bad = bad[0]
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"{re.escape(str(path))}:"
                       rf"{first_bad}: "):
        collect(td.avazu_dataset(path, 16))


def test_avazu_fit_on_damaged_file_equals_fit_on_clean(tmp_path, avazu_lines):
    header, lines = avazu_lines
    rng = np.random.default_rng(5)
    data = make_corpus(lines, avazu_damage(rng), rng, header=header)
    path = tmp_path / "damaged.csv"
    path.write_bytes(data)
    kept = [l for _, l, ok in reference(data, avazu_ok, header=True) if ok]
    clean = tmp_path / "clean.csv"
    clean.write_bytes(header.encode() + b"\n" + b"".join(l + b"\n" for l in kept))

    def model():
        m = tn.models.WideDeep(list(td.AVAZU_CAT_COLUMNS), [], embedding_dim=4,
                               hidden_units=[8], string_ids=True)
        m.compile(tn.optimizer.Adagrad(0.05))
        return m

    a = _fit_snapshot(model, td.avazu_dataset(path, 32, bad_rows="skip"))
    b = _fit_snapshot(model, td.avazu_dataset(clean, 32))
    assert len(a) == len(b) and all(x == y for x, y in zip(a, b))


def test_avazu_hour_accepts_exactly_the_real_dates():
    """The hour pattern against the calendar for every YYMMDD of 2000-2099
    (and days 00/32, months 00/13): no impossible date gets a weekday."""
    hour = next(f for f in AVAZU_CSV.fields if f.name == "hour")
    texts = [f"{y:02d}{m:02d}{d:02d}{h:02d}" for y in range(100) for m in range(0, 14)
             for d in range(0, 33) for h in (0, 23, 24)]
    got = tf.strings.regex_full_match(tf.constant(texts), hour.pattern).numpy()
    want = np.array([_real_date(t) for t in texts])
    bad = [t for t, g, w in zip(texts, got, want) if g != w]
    assert not bad, bad[:10]
    assert want.sum() == 36525 * 2  # every day of 2000-2099, hours 00 and 23
