"""Independent models of the readers' output, shared by test_data.py and
test_reader_robustness.py."""
from __future__ import annotations

import csv
import math

import numpy as np

import tnet.data as td

INT, CAT = td.CRITEO_INT_COLUMNS, td.CRITEO_CAT_COLUMNS


def collect(ds) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
    """Concatenates all batches of a (features, label) or features dataset."""
    feats: dict[str, list] = {}
    labels = []
    for element in ds:
        f, y = element if isinstance(element, tuple) else (element, None)
        for k, v in f.items():
            feats.setdefault(k, []).append(v.numpy())
        if y is not None:
            labels.append(y.numpy())
    out = {k: np.concatenate(v) for k, v in feats.items()}
    return out, (np.concatenate(labels) if labels else None)


def python_criteo(lines: list[str], labeled: bool = True, sep: str = "\t"):
    """Independent parse: csv module, int(x, 16), math.log1p."""
    rows = list(csv.reader(lines, delimiter=sep))
    o = 1 if labeled else 0
    dense = np.array([[np.float32(math.log1p(float(x))) if x and float(x) > 0 else np.float32(0)
                       for x in r[o:o + 13]] for r in rows], np.float32)
    cats = np.array([[int(x, 16) if x else 2**32 for x in r[o + 13:]] for r in rows], np.int64)
    labels = np.array([float(r[0]) for r in rows], np.float32) if labeled else None
    return dense, cats, labels


def assert_criteo_equal(feats, labels, dense, cats, exp_labels):
    got_dense = np.stack([feats[c] for c in INT], 1)
    got_cats = np.stack([feats[c] for c in CAT], 1)
    np.testing.assert_allclose(got_dense, dense, rtol=1e-6, atol=0)
    np.testing.assert_array_equal(got_cats, cats)
    if exp_labels is not None:
        np.testing.assert_array_equal(labels, exp_labels)


def assert_same_batches(ds_a, ds_b):
    a, b = list(ds_a), list(ds_b)
    assert len(a) == len(b)
    for (fa, ya), (fb, yb) in zip(a, b):
        np.testing.assert_array_equal(ya.numpy(), yb.numpy())
        for k in fa:
            np.testing.assert_array_equal(fa[k].numpy(), fb[k].numpy())
