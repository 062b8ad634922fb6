"""The CSV/TSV kernels of the feature-spec reader against the stock ops they
replace: TnetDecodeRows' row check against RE2's full match of the row
pattern (on good, mutated and hostile lines), its values against the
per-column string ops, TnetSplitLines against join/split/strip, and whole
reads through both paths."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

import tnet  # noqa: F401
from tnet import _ops
from tnet.data import _rows
from tnet.data import readers
from tnet.data.readers import _common, delimited
from tnet.data import spec as spec_lib

# Every column kind: label, dense and weight (int and float), int and string
# ids, int and string id lists, a group key, and a column no feature reads.
SPEC = {"features": [
    {"name": "label", "kind": "label", "dtype": "float32"},
    {"name": "d_int", "kind": "dense", "dtype": "int64", "default": 7},
    {"name": "d_num", "kind": "dense"},
    {"name": "w", "kind": "weight"},
    {"name": "uid", "kind": "id"},
    {"name": "city", "kind": "id", "dtype": "string", "default": "none"},
    {"name": "hist", "kind": "ids", "separator": "|", "max_length": 5},
    {"name": "tags", "kind": "ids", "dtype": "string", "separator": ";"},
    {"name": "grp", "kind": "group", "column": "uid"},
]}
COLUMNS = ["label", "d_int", "d_num", "w", "uid", "city", "hist", "tags", "extra"]


def _format(tmp_path, delim="\t", spec=SPEC, columns=COLUMNS):
    path = tmp_path / "h.txt"
    path.write_text(delim.join(columns) + "\n")
    s = spec_lib.from_dict(spec, source="test")
    return s, delimited._delimited_format(s, str(path), delim, True)


GOOD = {
    "label": ["0", "1", "0.5", ".25", "1.000", "0.", "1."],
    "d_int": ["", "0", "-12", "123456789012345678"],
    "d_num": ["", "1.5", "-0.25", ".5", "-.5", "1e5", "1E-3", "2.", "123456789012345678.9e+12"],
    "w": ["", "0", "2.5", "1e2"],
    "uid": ["", "5", "-7", "000123", "123456789012345678"],
    "city": ["", "Paris", "caf\u00e9", "a b", "\u4e2d", "\U0001f600"],
    "hist": ["", "1", "1|2|3", "-5|0|123456789012345678"],
    "tags": ["", "a", "a;b", ";a;;b;"],
    "extra": ["", "anything", "x y"],
}
# Cells that break a column's pattern (for the column named), and raw lines.
BAD = {
    "label": ["", "2", "-0", "0.5.5", "1.5", "1.01", ".", " 1", "1 "],
    "d_int": ["1.5", "--1", "+1", "1234567890123456789", " 1", "0x1", "\u0661"],
    "d_num": [".", "-", "1e", "1e123", "1e+", "e5", "1..2", "+1", "1.5x", "inf", "nan"],
    "w": ["-1", "-0.5", "1e"],
    "uid": ["1.0", "-", "1234567890123456789", "1e3", "abc"],
    "city": ["a\rb", "\xff", "caf\xc3", "\xc0\x80", "\xf5\x80\x80\x80",
             "\xf4\x90\x80\x80", "\xe0\x80\x80", "\xed\xa0\x80", "\x80"],
    "hist": ["|", "1|", "|1", "1||2", "1|x", "1 |2", "1,2", "+1",
             "1|1234567890123456789"],
    "tags": ["a\rb", "\xfe"],
    "extra": ["\r", "\xff\xfe"],
}
RAW_BAD = ["", "\t", "0", "0\t\t\t\t\t\t\t\t\t", "\t".join(["0"] * 8),
           "1\t2\t3\t4\t5\tx\t1\ta\tz\r", "\t".join(["0"] * 10)]


def _line(rng, bad_column=None, bad_cell=None):
    cells = [GOOD[c][rng.integers(len(GOOD[c]))] for c in COLUMNS]
    if bad_column is not None:
        cells[COLUMNS.index(bad_column)] = bad_cell
    return "\t".join(cells)


def _lines(seed=0):
    rng = np.random.default_rng(seed)
    out = [_line(rng) for _ in range(300)]
    out += [_line(rng, c, cell) for c, cells in BAD.items() for cell in cells]
    out += RAW_BAD
    # Random byte damage: a byte replaced, inserted or removed.
    alphabet = list("0123456789.-+eE|;\t\r x") + ["\xff", "\xc3", "\xa9"]
    for _ in range(400):
        chars = list(_line(rng))
        i = int(rng.integers(len(chars) + 1))
        op = rng.integers(3)
        if op == 0 and i < len(chars):
            chars[i] = alphabet[rng.integers(len(alphabet))]
        elif op == 1:
            chars.insert(i, alphabet[rng.integers(len(alphabet))])
        elif i < len(chars):
            del chars[i]
        out.append("".join(chars))
    # Random bytes in the string columns: UTF-8 lead and continuation
    # bytes in every combination RE2 may or may not accept.
    edges = [0x00, 0x41, 0x0D, 0x7F, 0x80, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0,
             0xED, 0xEF, 0xF0, 0xF4, 0xF5, 0xFF]
    for _ in range(600):
        cell = "".join(chr(edges[j]) for j in rng.integers(0, len(edges),
                                                         int(rng.integers(1, 6))))
        out.append(_line(rng, ["city", "tags", "extra"][rng.integers(3)], cell))
    # latin-1 keeps each char one byte: "\xff" is the byte 0xFF (not UTF-8).
    return [s.encode("latin-1") if all(ord(ch) < 256 for ch in s) else s.encode()
            for s in out]


def _assert_same(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    elif isinstance(a, tf.RaggedTensor):
        assert isinstance(b, tf.RaggedTensor) and a.dtype == b.dtype
        np.testing.assert_array_equal(a.row_splits.numpy(), b.row_splits.numpy())
        np.testing.assert_array_equal(a.values.numpy(), b.values.numpy())
    else:
        assert a.dtype == b.dtype and a.shape == b.shape
        x, y = a.numpy(), b.numpy()
        if x.dtype.kind == "f":  # the same bits, not just close
            np.testing.assert_array_equal(x.view(np.uint8), y.view(np.uint8))
        else:
            np.testing.assert_array_equal(x, y)


def test_row_check_is_the_row_regex_and_values_are_the_stock_ops(tmp_path):
    _, fmt = _format(tmp_path)
    assert fmt.decode_lines is not None
    lines = tf.constant(_lines())
    ok, got = fmt.decode_lines(lines)
    want_ok = _rows._valid(fmt, lines).numpy()
    bad = np.flatnonzero(ok.numpy() != want_ok)
    assert bad.size == 0, [lines.numpy()[i] for i in bad[:5]]
    assert want_ok.sum() >= 300 and (~want_ok).sum() >= 300  # both kinds
    # Values of the good lines: the per-column string ops' result.
    good = tf.boolean_mask(lines, want_ok)
    _, got = fmt.decode_lines(good)
    _assert_same(got, _rows._decode_good(fmt, good, tf.ones_like(good, tf.bool)))


def test_csv_delimiter_and_unknown_columns_alone(tmp_path):
    spec = {"features": [{"name": "y", "kind": "label"},
                         {"name": "a", "kind": "id"}]}
    _, fmt = _format(tmp_path, ",", spec, ["x", "a", "y", "z"])
    cells = ["", "1", "a\tb", "\xe9".encode().decode("latin-1"), "\xff", "1,2", "\r"]
    lines = [",".join([x, a, y, z]) for x in cells for a in ["", "3", "x"]
             for y in ["0", "1", "2"] for z in cells[:3]]
    lines = tf.constant([s.encode("latin-1") for s in lines])
    ok, got = fmt.decode_lines(lines)
    np.testing.assert_array_equal(ok.numpy(), _rows._valid(fmt, lines).numpy())
    good = tf.boolean_mask(lines, ok)
    _assert_same(fmt.decode_lines(good)[1],
                 _rows._decode_good(fmt, good, tf.ones_like(good, tf.bool)))


def _stock_split(carry, block, last):
    """The string-op chain TnetSplitLines replaced."""
    text = tf.strings.join([carry, block])
    parts = tf.strings.split(text, "\n")
    partial = parts[-1]
    n = tf.size(parts) - 1 + tf.cast(last & (tf.strings.length(partial) > 0), tf.int32)
    lines = parts[:n]
    has_cr = tf.size(tf.strings.split(text, "\r")) > 1
    lines = tf.cond(has_cr, lambda: tf.strings.regex_replace(lines, "\r$", ""),
                    lambda: lines)
    return lines, tf.where(last, "", partial)


def test_split_lines_matches_the_string_ops():
    rng = np.random.default_rng(5)
    pieces = ["a", "bc", "\n", "\r\n", "\r", "\r\r\n", "", "x\ty"]
    cases = [("", "", True), ("", "", False), ("ab", "", True), ("ab\r", "\n", False),
             ("ab\r", "", True), ("", "\n", True), ("", "\n\n", False)]
    for _ in range(300):
        carry = "".join(rng.choice(["a", "b\r", "\r", ""], int(rng.integers(0, 3))))
        block = "".join(rng.choice(pieces, int(rng.integers(0, 8))))
        cases.append((carry, block, bool(rng.integers(2))))
    for carry, block, last in cases:
        got = _ops.tnet_split_lines(carry, block, last)
        want = _stock_split(tf.constant(carry), tf.constant(block), tf.constant(last))
        assert got[0].numpy().tolist() == want[0].numpy().tolist(), (carry, block, last)
        assert got[1].numpy() == want[1].numpy(), (carry, block, last)


def _both_paths(fmt, paths, batch, **kw):
    old = dataclasses.replace(fmt, decode_lines=None)
    return [list(_rows.read_rows(f, paths, batch, **kw)) for f in (fmt, old)]


@pytest.mark.parametrize("bad_rows", ["fail", "skip"])
def test_reads_through_both_paths_are_equal(tmp_path, bad_rows):
    """Files with CRLF, no final newline, tiny blocks (lines cross them) and
    a batch size that does not divide the rows: the same batches."""
    _, fmt = _format(tmp_path)
    rng = np.random.default_rng(9)
    names = []
    for i, (eol, final) in enumerate([("\n", True), ("\r\n", False)]):
        rows = [_line(rng) for _ in range(150 + 20 * i)]
        if bad_rows == "skip":
            rows[7] = _line(rng, "hist", "1||2")
            rows[-1] = "garbage"
        text = "\t".join(COLUMNS) + eol + eol.join(rows) + (eol if final else "")
        path = tmp_path / f"f{i}.tsv"
        path.write_bytes(text.encode())
        names.append(str(path))
    # 97-byte blocks: most lines cross a block (1 MiB blocks are every
    # other reader test's default).
    for drop in (False, True):
        new, old = _both_paths(fmt, names, 64, bad_rows=bad_rows, block_bytes=97,
                               drop_remainder=drop, log_limit=0)
        assert len(new) == len(old) > 3
        _assert_same(new, old)


def test_a_bad_line_still_names_its_file_and_line(tmp_path):
    s, _ = _format(tmp_path)
    rng = np.random.default_rng(2)
    rows = [_line(rng) for _ in range(40)]
    rows[22] = _line(rng, "d_num", "1..2")
    path = tmp_path / "bad.tsv"
    path.write_text("\t".join(COLUMNS) + "\n" + "\n".join(rows) + "\n")
    ds = readers.spec_dataset(s, str(path), "tsv", 16)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"bad\.tsv:24.*d_num"):
        list(ds)


_ONE = {"delimiter": "\t", "kinds": [0], "separators": [""], "pads": [0],
        "num_floats": 0, "num_ints": 0, "num_strings": 0, "num_lists": 0}


@pytest.mark.parametrize("attrs, match", [
    ({"kinds": [10]}, "is not a column kind"),
    ({"kinds": [0, 0], "pads": [0, 0]}, "one entry per column"),
    ({"kinds": [9], "separators": ["\t"], "num_lists": 1}, "other than the delimiter"),
    ({"kinds": [1]}, "must count"),
    ({"delimiter": "ab"}, "one character"),
])
def test_bad_attributes_are_refused_with_a_reason(attrs, match):
    with pytest.raises(tf.errors.InvalidArgumentError, match=match):
        _ops.tnet_decode_rows(tf.constant(["a"]), **{**_ONE, **attrs})


def test_lines_must_be_a_vector():
    with pytest.raises(tf.errors.InvalidArgumentError, match="1-D"):
        _ops.tnet_decode_rows(tf.constant([["a"]]), **_ONE)


def test_the_kernel_is_used_only_for_patterns_it_knows(tmp_path):
    """A format whose field patterns differ from the kinds' (here a changed
    label pattern) falls back to the regex and the per-column ops."""
    s, fmt = _format(tmp_path)
    fields = list(fmt.fields)
    fields[0] = dataclasses.replace(fields[0], pattern="[012]")
    assert delimited._row_decoder(s, COLUMNS, fields, "\t", True) is None
    assert delimited._row_decoder(s, COLUMNS, fmt.fields, "\t", True) is not None


@pytest.mark.parametrize("kind", ["ids", "sequence"])
def test_id_lists_cut_to_max_length_only_when_longer(kind):
    """_common._ids: rows longer than max_length keep their first (ids) or
    last (sequence) max_length ids, in graph mode too (the cut is a cond
    taken only when some row is longer); shorter batches come back as
    they are."""
    spec = spec_lib.from_dict({"features": [
        {"name": "label", "kind": "label"},
        {"name": "h", "kind": kind, "separator": "|", "max_length": 3}]},
        source="test")
    f = next(x for x in spec.features if x.name == "h")
    rows = [[1, 2, 3, 4, 5], [], [6], [7, 8, 9]]
    want = [r[:3] if kind == "ids" else r[-3:] for r in rows]
    ragged = tf.ragged.constant(rows, tf.int64, row_splits_dtype=tf.int64)
    short = tf.ragged.constant(want, tf.int64, row_splits_dtype=tf.int64)
    graph = tf.function(lambda v: _common._ids(f, v))
    for run in (lambda v: _common._ids(f, v), graph):
        assert run(ragged).to_list() == want
        got = run(short)
        assert got.to_list() == want
        np.testing.assert_array_equal(got.row_splits.numpy(), short.row_splits.numpy())
    dense = tf.constant([[1, 2, 3, 4], [5, 6, -1, -1]], tf.int64)
    np.testing.assert_array_equal(_common._ids(f, dense).numpy(),
                                  dense.numpy()[:, :3] if kind == "ids" else dense.numpy()[:, -3:])


def test_numbers_are_tf_to_number_to_the_bit():
    """Dense and weight cells (kinds 4 and 6) of every shape the patterns
    allow: short decimals (decoded by one exact division), 15 to 18 digits,
    up to 22 and more after the point, exponents, -0: the same float64 as
    tf.strings.to_number (absl's correctly rounded parse), bit for bit."""
    rng = np.random.default_rng(11)
    cells = ["0", "-0", "-0.0", "0.", ".5", "-.5", "1.", "2.5e-3", "1E5",
             "0.1", "0.2", "0.3", "9007199254740993", "123456789012345.6",
             "12345678901234.56", "0.000000000000000000001",
             "0.00000000000000000000123", "999999999999999", "1e22", "1e-22"]
    for _ in range(4000):
        digits = "".join(rng.choice(list("0123456789"), int(rng.integers(1, 19))))
        point = int(rng.integers(0, len(digits) + 1))
        cell = digits[:point] + "." + digits[point:] if rng.random() < 0.8 else digits
        if rng.random() < 0.3:
            cell = "-" + cell
        if rng.random() < 0.1:
            cell += "e" + str(int(rng.integers(-30, 30)))
        cells.append(cell)
    for kind in (4, 6):
        lines = [c.lstrip("-") if kind == 6 else c for c in cells]
        want = tf.strings.to_number(tf.constant(lines), tf.float64).numpy()
        ok, floats, *_ = _ops.tnet_decode_rows(
            tf.constant(lines), **{**_ONE, "kinds": [kind], "num_floats": 1})
        assert ok.numpy().all(), [c for c, g in zip(lines, ok.numpy()) if not g][:5]
        np.testing.assert_array_equal(floats[0].numpy().view(np.int64), want.view(np.int64))
