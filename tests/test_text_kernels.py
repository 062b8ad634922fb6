"""TnetDecodeIdLists (multi-valued CSV/TSV cells -> ragged int64) against
the stock chain it replaces: tf.strings.split, drop empty parts,
tf.strings.to_number(int64). Same values and row splits for every cell the
stock chain accepts; an error for every batch it rejects."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tnet  # noqa: F401
from tnet import _ops

EDGE = ["", "|", "||", "1", "|1|", "1||2", " 7 ", "\t8|9\n", "-0", "00012",
        "9223372036854775807", "-9223372036854775808",
        "9223372036854775808", "-9223372036854775809", "+5", "+-5", "-+5", "+", "--5", "-",
        " ", "1 2", "1e3", "0x10", "x", "5|x|6", "١٢", "12345678901234567890"]


def _stock(cells, sep):
    parts = tf.strings.split(tf.constant(cells, tf.string), sep)
    parts = tf.ragged.boolean_mask(parts, tf.strings.length(parts) > 0)
    r = tf.strings.to_number(parts, tf.int64)
    return r.values.numpy(), r.row_splits.numpy()


def _check(cells, sep="|"):
    try:
        want = _stock(cells, sep)
    except tf.errors.InvalidArgumentError:
        want = None
    if want is None:
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match="could not correctly convert"):
            _ops.tnet_decode_id_lists(cells, separator=sep)
        return False
    values, splits = _ops.tnet_decode_id_lists(cells, separator=sep)
    np.testing.assert_array_equal(values.numpy(), want[0])
    np.testing.assert_array_equal(splits.numpy(), want[1])
    return True


@pytest.mark.parametrize("cell", EDGE)
def test_each_edge_cell_alone_matches_stock(cell):
    _check([cell])


def _token(rng):
    """Mostly an int64 (signs, padding blanks, leading zeros), sometimes
    a random piece of digits, signs and blanks."""
    if rng.random() < 0.9:
        v = int(rng.integers(-2**63, 2**63 - 1, dtype=np.int64))
        text = str(v) if rng.random() < 0.8 else str(abs(v) % 1000).zfill(5)
        if v >= 0 and rng.random() < 0.1:
            text = "+" + text
        return " " * int(rng.integers(0, 2)) + text + "\t" * int(rng.integers(0, 2))
    return "".join(rng.choice(list("0123456789 -+x"), int(rng.integers(0, 6))))


def test_random_cells_match_stock():
    rng = np.random.default_rng(3)
    accepted = rejected = 0
    for trial in range(300):
        cells = ["|".join(_token(rng) for _ in range(int(rng.integers(0, 6))))
                 for _ in range(int(rng.integers(0, 4)))]
        if _check(cells, "|"):
            accepted += 1
        else:
            rejected += 1
    assert accepted > 30 and rejected > 30  # both paths were exercised


def test_large_batch_of_ids_matches_stock_with_comma():
    rng = np.random.default_rng(4)
    cells = [",".join(str(x) for x in rng.integers(-10**12, 10**12,
                                                   int(rng.integers(0, 50))))
             for _ in range(5000)]
    assert _check(cells, ",")


def test_bad_input_is_an_error_not_a_crash():
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError),
                       match="one character"):
        _ops.tnet_decode_id_lists(["1|2"], separator="ab")
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError),
                       match="1-D|rank"):
        _ops.tnet_decode_id_lists([["1|2"]], separator="|")
    with pytest.raises(tf.errors.InvalidArgumentError, match='"x".*row 1'):
        _ops.tnet_decode_id_lists(["1", "2|x"], separator="|")
