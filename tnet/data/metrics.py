"""Exact ROC AUC for reports (numpy; no binning, unlike `tf.keras.metrics.AUC`).

Keras' AUC metric integrates over a fixed number of thresholds (200 by
default), which is an approximation; benchmark reports quote the exact value
so that model AUC and the synthetic oracle AUC are directly comparable.
"""
from __future__ import annotations

import numpy as np


def auc(labels, scores) -> float:
    """Area under the ROC curve, via the rank-sum (Mann-Whitney U) statistic.

    Ties in `scores` get their average rank (they count one half), which is
    what the trapezoidal ROC area gives. `labels` are 0/1 (or bool); raises
    ValueError when only one class is present.

    Args:
      labels: `[N]` 0/1.
      scores: `[N]` floats (any monotone score: logits or probabilities).

    Example:
        ```python
        print(tn.data.auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]))   # 0.75
        ```
    """
    y = np.asarray(labels).reshape(-1).astype(bool)
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    if y.shape != s.shape:
        raise ValueError(f"labels and scores differ in length: {y.size} vs {s.size}")
    if np.isnan(s).any():
        raise ValueError("scores contain NaN")
    n_pos = int(y.sum())
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        raise ValueError(f"AUC needs both classes; got {n_pos} positives and {n_neg} negatives")
    _, inverse, counts = np.unique(s, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)  # 1-based rank of the last member of each tie group
    average_rank = ends - (counts - 1) / 2.0
    rank_sum = average_rank[inverse][y].sum()
    return float((rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def calibration(labels, probabilities, weights=None) -> float:
    """Predicted CTR / observed CTR ("COPC" inverted: 1.0 is calibrated,
    > 1 over-predicts): sum(w * p) / sum(w * y). NaN when no positives.

    Args:
      labels: `[N]` 0/1 (or floats in [0, 1]).
      probabilities: `[N]` predicted probabilities.
      weights: `[N]` example weights, or None.

    Example:
        ```python
        print(tn.data.calibration([0, 1, 1, 0], [0.2, 0.6, 0.8, 0.4]))   # 1.0
        ```
    """
    y = np.asarray(labels, dtype=np.float64).reshape(-1)
    p = np.asarray(probabilities, dtype=np.float64).reshape(-1)
    w = np.ones_like(y) if weights is None else np.asarray(weights, np.float64).reshape(-1)
    clicks = float(np.sum(w * y))
    return float(np.sum(w * p) / clicks) if clicks > 0 else float("nan")


def group_auc(labels, scores, groups) -> tuple[float, int]:
    """Group AUC: the per-group AUC averaged with each group's impressions
    as its weight, over the groups that have both classes (the others have
    no AUC). Returns (gauc, number of groups counted); (nan, 0) if none.

    Vectorized (one lexsort): ranks are taken within each group, ties in
    score within a group get their average rank, as in `auc`.

    Args:
      labels: `[N]` 0/1.
      scores: `[N]` floats.
      groups: `[N]` group keys (e.g. user ids).

    Returns:
      (group AUC, number of groups that counted).

    Example:
        ```python
        gauc, groups = tn.data.group_auc([0, 1, 0, 1], [0.2, 0.9, 0.7, 0.3],
                                         ["a", "a", "b", "b"])   # (0.5, 2)
        ```
    """
    y = np.asarray(labels).reshape(-1).astype(bool)
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    g = np.asarray(groups).reshape(-1)
    if not (y.shape == s.shape == g.shape):
        raise ValueError(f"labels, scores and groups differ in length: "
                         f"{y.size}, {s.size}, {g.size}")
    if y.size == 0:
        return float("nan"), 0
    _, gid = np.unique(g, return_inverse=True)
    order = np.lexsort((s, gid))
    gid, s, y = gid[order], s[order], y[order]
    n = y.size
    new_group = np.r_[True, gid[1:] != gid[:-1]]
    group_start = np.maximum.accumulate(np.where(new_group, np.arange(n), 0))
    new_tie = new_group | np.r_[True, s[1:] != s[:-1]]
    tie_id = np.cumsum(new_tie) - 1
    tie_first = np.flatnonzero(new_tie)
    tie_last = np.r_[tie_first[1:], n] - 1
    avg_pos = (tie_first + tie_last) / 2.0  # average 0-based position per tie
    rank = avg_pos[tie_id] - group_start + 1.0  # 1-based rank in its group
    groups_n = gid.max() + 1
    n_pos = np.bincount(gid, weights=y, minlength=groups_n)
    n_all = np.bincount(gid, minlength=groups_n).astype(np.float64)
    n_neg = n_all - n_pos
    rank_sum = np.bincount(gid, weights=rank * y, minlength=groups_n)
    valid = (n_pos > 0) & (n_neg > 0)
    if not valid.any():
        return float("nan"), 0
    aucs = (rank_sum[valid] - n_pos[valid] * (n_pos[valid] + 1) / 2.0) / (
        n_pos[valid] * n_neg[valid])
    weight = n_all[valid]
    return float(np.sum(aucs * weight) / np.sum(weight)), int(valid.sum())
