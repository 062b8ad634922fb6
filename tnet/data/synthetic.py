"""Deterministic synthetic Criteo-like data (docs/BENCHMARK_PROTOCOL.md, "Synthetic").

Why synthetic: real Criteo in this repo is 13k rows, far too few to measure
throughput with millions of distinct ids, and a known generating model gives
an oracle AUC to put every model AUC in context.

The generator (`SyntheticCriteo(seed, scale, zipf)`):

* Categorical columns C1..C26. Cardinalities are the Criteo Kaggle ones
  (`CRITEO_KAGGLE_CARDINALITIES`, the per-column distinct counts of the 7-day
  Kaggle train set) scaled so that the largest (C3, 10.1M) becomes 1.5M;
  columns with at most 1,000 values keep their size, larger ones keep at
  least 1,000. Total 5,002,572 ids at `scale=1` (`scale` multiplies every
  cardinality). Ids are per column, 0..card-1 (feature columns mix the column
  into the key when columns share a table).
* Popularity: rank r (0-based) of a column is drawn with probability
  proportional to (r + 1) ** -zipf (zipf = 1.1), a Zipf law truncated to
  the column's cardinality, by exact inverse-CDF sampling (binary search in
  the cumulative weights). Ranks map to ids through a fixed random
  permutation per column, so hot ids are not simply 0, 1, 2, ...
* Dense I1..I13: integer counts floor(exp(N(mu_j, sigma_j))) (I2 shifted by
  -1 so it has -1 values, like Criteo), missing with Criteo-like per-column
  rates (`DENSE_MISSING_RATE`); features are log(1 + x) for x > 0 else 0,
  the transform `criteo_dataset` applies.
* Label: logit = bias + sum_c w_c[id_c] + sum_j v_j * I_j, label ~
  Bernoulli(sigmoid(logit)). Per-id weights w_c ~ N(0, s_c^2) with a
  per-column scale s_c ~ U(0.1, 0.5) (some columns matter more than
  others), dense weights v_j ~ N(0, 0.1^2); all drawn once from the seed.
  `bias` is solved (bisection on 131,072 calibration draws) so that the mean
  click probability is 0.25. Oracle AUC (true logits) is about 0.84.
* Streams: every example is a pure function of (seed, stream, index): block
  `index // 16384` of a stream is drawn from its own PCG64 generator seeded
  with (seed, stream code, block). "train" and "holdout" (or any int >= 0)
  are independent draws from the same hidden model. Same seed -> bit-identical
  data, whatever the batch size or the order in which blocks are requested.
* Multi-valued columns (`multi_valued=k`, default 0: none), M1..Mk, for the
  protocol's SPARSE-HEAVY configuration:
  - ids: Zipf(zipf) over `MULTI_VALUED_CARDINALITY` (1,000,000) ids per
    column at `scale=1` (scaled like the others), each through its own
    random permutation. 1M is about the size of the largest Criteo columns
    and below the 2**20 bins of the stock baselines, so stock's floormod
    has no collisions on them (no quality edge for tnet from collisions).
  - length per row: 1 + BetaBinomial(49, 1.9, 3.0): mean exactly 20,
    standard deviation about 10.3, every length 1..50 possible (min 1, max
    `MULTI_VALUED_MAX_LENGTH` = 50) and no clipping needed. Ids are drawn
    independently, so a row may repeat an id (as real tag lists do).
  - batch form: int64 `[n, 50]`, the row's ids first, then -1 padding
    (numpy has no ragged arrays; tnet's EmbeddingFeatures takes it as is,
    `tf.RaggedTensor.from_tensor(ids, padding=-1)` makes it ragged, the
    form tnet.data's readers give for list cells).
  - label: logit += sum_m mean_{ids of the row} u_m[id], per-id weights
    u_m ~ N(0, t_m^2), t_m ~ U(1.0, 2.0) (a mean of ~20 weights varies
    about 1/sqrt(20) as much as one weight, so the scale is larger than
    the single columns'). The bias is solved with them, so CTR stays 0.25.
  - determinism: column Mi is drawn from generators of its own, seeded with
    (seed, code, block, `_MV_TAG`, i) and (seed, params, 0, `_MV_TAG`, i),
    never from the ones the other columns use: with `multi_valued=0` every
    stream is bit-identical to the generator without the option; with
    k > 0 the 26 columns, dense features and label uniforms are the same
    draws (only the logits, hence some labels, change), and Mi is the same
    whatever k >= i.
  - files: with k > 0, `write_tsv` writes a TSV with a header (decimal ids,
    dense values already transformed, M cells `|`-separated) that
    `read_tsv` (tnet.data.spec_dataset with `feature_spec`, then padded to
    `[B, 50]`, or left ragged) reads back exactly as `batch` gives it:
    Criteo's own format has no room for list cells.

`SyntheticCriteo.dataset` uses `tf.data.Dataset.from_generator`, so it runs
in one process only (it cannot be shipped to ParameterServerStrategy
workers). For a cluster, `write_tsv` writes the same examples as a Criteo TSV
file that `criteo_dataset` reads on every worker.

Speed (this repo's 2-core machine, busy): `batch(2**20)` takes about 1.8 s;
construction at scale 1 (tables, bias) about 0.4 s and ~120 MB of tables.
Each multi-valued column adds ~24 MB of tables and, in a batch, 400 bytes
per row (int64 [n, 50]).
"""
from __future__ import annotations

import functools
import os
from typing import Iterator

import numpy as np
import tensorflow as tf

from tnet.data.criteo import CRITEO_CAT_COLUMNS, CRITEO_INT_COLUMNS
from tnet.data.metrics import auc

# Distinct values per column in the Criteo Kaggle train set (C1..C26).
CRITEO_KAGGLE_CARDINALITIES: tuple[int, ...] = (
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593,
    3194, 27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572)
# Fraction of empty values per dense column, roughly as in Criteo Kaggle.
DENSE_MISSING_RATE: tuple[float, ...] = (
    0.45, 0.0, 0.21, 0.22, 0.03, 0.22, 0.04, 0.0, 0.04, 0.45, 0.04, 0.77, 0.22)
_DENSE_MU = (0.6, 2.0, 2.3, 1.6, 8.0, 4.0, 1.5, 2.4, 4.0, 0.2, 0.8, 0.2, 2.0)
_DENSE_SIGMA = (1.0, 1.5, 1.3, 1.0, 1.6, 1.6, 1.3, 1.0, 1.3, 0.6, 0.8, 0.8, 1.1)
BLOCK = 1 << 14
TARGET_CTR = 0.25
_LARGEST = 1_500_000
_STREAMS = {"train": 0, "holdout": 1}
_CALIBRATION = 2
_PARAMS = 3
# Multi-valued columns (see the module docstring).
MULTI_VALUED_CARDINALITY = 1_000_000
MULTI_VALUED_MAX_LENGTH = 50
_MV_BETA = (1.9, 3.0)  # 1 + BetaBinomial(49, a, b): mean 1 + 49 a / (a + b) = 20
_MV_WEIGHT_SCALE = (1.0, 2.0)
_MV_TAG = 0x6D76  # last SeedSequence word of the multi-valued draws; never 0
_MV_SEPARATOR = "|"


def synthetic_cardinalities(scale: float = 1.0) -> tuple[int, ...]:
    """Per-column cardinalities of the generator (see the module docstring).

    Args:
      scale: multiplies every column's cardinality.

    Example:
        ```python
        print(len(tn.data.synthetic_cardinalities()))   # 26 categorical columns
        ```
    """
    factor = _LARGEST / max(CRITEO_KAGGLE_CARDINALITIES)
    base = [c if c <= 1000 else max(1000, round(c * factor)) for c in CRITEO_KAGGLE_CARDINALITIES]
    return tuple(max(1, round(c * scale)) for c in base)


def multi_valued_columns(k: int) -> tuple[str, ...]:
    """Names of the multi-valued columns of `SyntheticCriteo(multi_valued=k)`."""
    return tuple(f"M{i}" for i in range(1, int(k) + 1))


def _stream_code(stream: str | int) -> int:
    if isinstance(stream, str):
        if stream not in _STREAMS:
            raise ValueError(f"stream must be 'train', 'holdout' or an int >= 0, got {stream!r}")
        return _STREAMS[stream]
    if int(stream) < 0:
        raise ValueError(f"an int stream must be >= 0, got {stream}")
    return 16 + int(stream)


class SyntheticCriteo:
    """Criteo-like examples from a hidden logistic model; see the module docstring.

    `batch(n, stream, start)` returns examples `start .. start+n-1` of a
    stream as numpy arrays: `(features, labels, logits)` with the same keys
    and dtypes as `criteo_dataset` ("I1".."I13" float32, "C1".."C26" int64),
    plus "M1".."Mk" int64 [n, 50] padded with -1 when `multi_valued=k`.

    Args:
      seed: the generator's seed (the same seed, the same data).
      scale: multiplies the id cardinalities.
      zipf: the ids' Zipf exponent.
      multi_valued: ids per example of each categorical column (0: one).

    Example:
        ```python
        gen = tn.data.SyntheticCriteo(seed=0)
        data = gen.dataset(65_536, batch_size=512)
        print(gen.oracle_auc())      # the best AUC any model can reach
        ```
    """

    def __init__(self, seed: int = 0, scale: float = 1.0, zipf: float = 1.1,
                 multi_valued: int = 0):
        if zipf <= 0:
            raise ValueError(f"zipf must be > 0, got {zipf}")
        if isinstance(multi_valued, bool) or int(multi_valued) != multi_valued \
                or multi_valued < 0:
            raise ValueError(f"multi_valued must be an int >= 0, got {multi_valued!r}")
        self.seed, self.scale, self.zipf = int(seed), float(scale), float(zipf)
        self.multi_valued_columns = multi_valued_columns(multi_valued)
        self.cardinalities = synthetic_cardinalities(scale)
        rng = self._rng(_PARAMS, 0)
        self._rank, self._perm, self._weight = [], [], []
        self.column_scale = rng.uniform(0.1, 0.5, len(self.cardinalities))
        for card, s in zip(self.cardinalities, self.column_scale):
            self._rank.append(ZipfRank(card, self.zipf))
            self._perm.append(rng.permutation(card).astype(np.int64))
            self._weight.append(rng.normal(0.0, s, card))
        self.dense_weight = rng.normal(0.0, 0.1, len(CRITEO_INT_COLUMNS))
        # Multi-valued parameters: one generator per column, of their own
        # (see the docstring), so Mi does not depend on k either.
        card = self.multi_valued_cardinality = max(1, round(MULTI_VALUED_CARDINALITY * scale))
        self._mv_rank = ZipfRank(card, self.zipf) if self.multi_valued_columns else None
        self._mv_perm, self._mv_weight, scales = [], [], []
        for m in range(len(self.multi_valued_columns)):
            mv = self._rng(_PARAMS, 0, _MV_TAG, m + 1)
            scales.append(mv.uniform(*_MV_WEIGHT_SCALE))
            self._mv_perm.append(mv.permutation(card).astype(np.int64))
            self._mv_weight.append(mv.normal(0.0, scales[-1], card))
        self.multi_valued_scale = np.array(scales)
        self.bias = 0.0
        z = np.concatenate([self._make_block(_CALIBRATION, b)[2] for b in range(8)])
        self.bias = _solve_bias(z, TARGET_CTR)
        # Per instance: consecutive batches usually fall in the same block.
        self._block = functools.lru_cache(maxsize=4)(self._make_block)

    @property
    def total_ids(self) -> int:
        """Distinct ids possible over all id columns (multi-valued included)."""
        return (sum(self.cardinalities)
                + self.multi_valued_cardinality * len(self.multi_valued_columns))

    def _rng(self, code: int, block: int, *tag: int) -> np.random.Generator:
        entropy = np.random.SeedSequence([self.seed, code, block, *tag])
        return np.random.Generator(np.random.PCG64(entropy))

    def _make_block(self, code: int, block: int):
        """One block: (features, labels, logits, dense raw ints, dense missing)."""
        rng = self._rng(code, block)
        logits = np.full(BLOCK, self.bias)
        features: dict[str, np.ndarray] = {}
        raw = np.empty((BLOCK, len(CRITEO_INT_COLUMNS)), np.int64)
        missing = np.empty_like(raw, dtype=bool)
        for j, name in enumerate(CRITEO_INT_COLUMNS):
            x = np.floor(np.exp(rng.normal(_DENSE_MU[j], _DENSE_SIGMA[j], BLOCK))).astype(np.int64)
            raw[:, j] = x - 1 if name == "I2" else x
            missing[:, j] = rng.random(BLOCK) < DENSE_MISSING_RATE[j]
            value = np.where(missing[:, j], 0.0, np.log1p(np.maximum(raw[:, j], 0)))
            features[name] = value.astype(np.float32)
            logits += self.dense_weight[j] * value
        for c, name in enumerate(CRITEO_CAT_COLUMNS):
            ids = self._perm[c][self._rank[c](rng.random(BLOCK))]
            features[name] = ids
            logits += self._weight[c][ids]
        if self.multi_valued_columns:
            self._multi_valued_block(code, block, features, logits)
        labels = (rng.random(BLOCK) < 1.0 / (1.0 + np.exp(-logits))).astype(np.float32)
        return features, labels, logits.astype(np.float32), raw, missing

    def _multi_valued_block(self, code: int, block: int, features: dict,
                            logits: np.ndarray) -> None:
        """Adds M1..Mk of one block to `features` and their term to `logits`."""
        width = MULTI_VALUED_MAX_LENGTH
        rows = np.arange(BLOCK)
        for m, name in enumerate(self.multi_valued_columns):
            rng = self._rng(code, block, _MV_TAG, m + 1)
            lengths = 1 + rng.binomial(width - 1, rng.beta(*_MV_BETA, BLOCK))
            ids = self._mv_perm[m][self._mv_rank(rng.random(int(lengths.sum())))]
            padded = np.full((BLOCK, width), -1, np.int64)
            padded[np.arange(width) < lengths[:, None]] = ids  # row-major: each row's first L
            features[name] = padded
            sums = np.bincount(np.repeat(rows, lengths), weights=self._mv_weight[m][ids],
                               minlength=BLOCK)
            logits += sums / lengths

    def _range(self, code: int, start: int, n: int) -> Iterator[tuple]:
        """Pieces (block outputs sliced) covering examples start .. start+n-1."""
        end = start + n
        while start < end:
            block, offset = divmod(start, BLOCK)
            stop = min(BLOCK, offset + end - start)
            parts = self._block(code, block)
            yield tuple({k: v[offset:stop] for k, v in p.items()} if isinstance(p, dict)
                        else p[offset:stop] for p in parts)
            start += stop - offset

    def batch(self, n: int, stream: str | int = "train", start: int = 0):
        """Examples start .. start+n-1 of `stream`: (features, labels, logits).

        Args:
          n: examples.
          stream: "train", "holdout" or an int stream id (independent draws).
          start: the first example's index in the stream.
        """
        pieces = list(self._range(_stream_code(stream), int(start), int(n)))
        if not pieces:
            raise ValueError(f"n must be >= 1, got {n}")
        features = {k: np.concatenate([p[0][k] for p in pieces]) for k in pieces[0][0]}
        return (features, np.concatenate([p[1] for p in pieces]),
                np.concatenate([p[2] for p in pieces]))

    def dataset(self, num_examples: int, batch_size: int, stream: str | int = "train", *,
                start: int = 0, drop_remainder: bool = False) -> tf.data.Dataset:
        """`(features, label)` batches like `criteo_dataset` (one process only).

        The examples depend only on (seed, stream, index), not on batch_size.
        Built on `from_generator`: not usable inside a ParameterServerStrategy
        `dataset_fn`; use `write_tsv` + `criteo_dataset` there.

        Args:
          num_examples: examples in all.
          batch_size: examples per batch.
          stream: as for `batch`.
          start: as for `batch`.
          drop_remainder: drop a short last batch.
        """
        code = _stream_code(stream)
        total, batch_size = int(num_examples), int(batch_size)

        def generate():
            for first in range(start, start + total, batch_size):
                n = min(batch_size, start + total - first)
                if n < batch_size and drop_remainder:
                    return
                pieces = list(self._range(code, first, n))
                features = {k: np.concatenate([p[0][k] for p in pieces]) for k in pieces[0][0]}
                yield features, np.concatenate([p[1] for p in pieces])

        spec = {c: tf.TensorSpec([None], tf.float32) for c in CRITEO_INT_COLUMNS}
        spec.update({c: tf.TensorSpec([None], tf.int64) for c in CRITEO_CAT_COLUMNS})
        spec.update({c: tf.TensorSpec([None, MULTI_VALUED_MAX_LENGTH], tf.int64)
                     for c in self.multi_valued_columns})
        signature = (spec, tf.TensorSpec([None], tf.float32))
        return tf.data.Dataset.from_generator(generate, output_signature=signature).prefetch(2)

    def oracle_auc(self, stream: str | int = "holdout", n: int = 1 << 20) -> float:
        """AUC of the true logits on examples 0 .. n-1 of `stream`.

        Args:
          stream: as for `batch`.
          n: examples scored.
        """
        _, labels, logits = self.batch(n, stream)
        return auc(labels, logits)

    def write_tsv(self, path: str | os.PathLike, num_examples: int,
                  stream: str | int = "train", start: int = 0) -> None:
        """Writes the examples as a Criteo Kaggle TSV file (ids as 8-hex).

        `criteo_dataset(path)` then yields the same features and labels as
        `batch` (dense values up to float rounding of log1p), from a pure
        tf.data pipeline that runs on ParameterServerStrategy workers.

        With multi-valued columns the file is not Criteo's format (it has no
        room for list cells): a header line `label, I1..I13, C1..C26,
        M1..Mk`, dense values already transformed (float32, shortest
        round-trip text), decimal ids, the ids of an M cell separated by
        "|". `read_tsv(path, batch_size, k)` reads it back exactly as
        `batch` gives it.

        Args:
          path: the file written (Criteo's TSV layout).
          num_examples: rows.
          stream: as for `batch`.
          start: as for `batch`.
        """
        code = _stream_code(stream)
        multi = self.multi_valued_columns
        with open(path, "wb") as out:
            if multi:
                out.write("\t".join(("label",) + CRITEO_INT_COLUMNS + CRITEO_CAT_COLUMNS
                                    + multi).encode() + b"\n")
            for features, labels, _, raw, missing in self._range(code, int(start),
                                                                 int(num_examples)):
                columns = [labels.astype(np.int64).astype("S1")]
                if multi:
                    columns += [features[name].astype("S16") for name in CRITEO_INT_COLUMNS]
                    columns += [features[name].astype("S20") for name in CRITEO_CAT_COLUMNS]
                    columns += [_join_ids(features[name]) for name in multi]
                else:
                    for j in range(raw.shape[1]):
                        columns.append(np.where(missing[:, j], b"", raw[:, j].astype("S20")))
                    for name in CRITEO_CAT_COLUMNS:
                        columns.append(_hex8(features[name]))
                rows = columns[0]
                for col in columns[1:]:
                    rows = np.char.add(np.char.add(rows, b"\t"), col)
                out.write(b"\n".join(rows.tolist()) + b"\n")


def feature_spec(multi_valued: int):
    """The tnet.data.spec.FeatureSpec of `write_tsv`'s file with k > 0
    multi-valued columns (label, dense I*, id C*, ids M* with max_length 50)."""
    from tnet.data import spec  # noqa: PLC0415
    features = [{"name": "label", "kind": "label", "dtype": "int64"}]
    features += [{"name": n, "kind": "dense"} for n in CRITEO_INT_COLUMNS]
    features += [{"name": n, "kind": "id"} for n in CRITEO_CAT_COLUMNS]
    features += [{"name": n, "kind": "ids", "separator": _MV_SEPARATOR,
                  "max_length": MULTI_VALUED_MAX_LENGTH}
                 for n in multi_valued_columns(multi_valued)]
    return spec.from_dict({"features": features},
                          source=f"SyntheticCriteo(multi_valued={multi_valued})")


def read_tsv(paths, batch_size: int, multi_valued: int = 0, *, take: int = -1,
             ragged: bool = False, **kwargs) -> tf.data.Dataset:
    """`(features, label)` batches of `write_tsv` files, as `batch` gives
    them: pure tf.data (runs in a ParameterServerStrategy `dataset_fn`).

    multi_valued=0: `criteo_dataset(paths, batch_size, take=take, **kwargs)`.
    k > 0: `spec_dataset(feature_spec(k), paths, "tsv", ...)` with M1..Mk
    padded from ragged to int64 [B, 50] with -1 (`ragged=True`: left as
    the reader's `tf.RaggedTensor` [B, None]); `take` (rows from the
    start, -1: all) is applied after reading; kwargs go to spec_dataset.
    """
    if not multi_valued:
        from tnet.data.criteo import criteo_dataset  # noqa: PLC0415
        return criteo_dataset(paths, batch_size, take=take, **kwargs)
    from tnet.data.readers import spec_dataset  # noqa: PLC0415
    names = multi_valued_columns(multi_valued)
    ds = spec_dataset(feature_spec(multi_valued), paths, "tsv", batch_size, **kwargs)

    def pad(features, label):
        out = dict(features)
        for name in names:
            out[name] = features[name].to_tensor(
                -1, shape=[None, MULTI_VALUED_MAX_LENGTH])
        return out, label

    if not ragged:
        ds = ds.map(pad, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if take >= 0:
        ds = ds.unbatch().take(take).batch(batch_size)
    return ds


def _join_ids(padded: np.ndarray) -> np.ndarray:
    """int64 [n, L] padded with -1 (ids first) -> one "|"-joined cell per row."""
    lengths = (padded >= 0).sum(axis=1)
    flat = padded[padded >= 0].astype("S20").tolist()  # row-major: row by row
    ends = np.cumsum(lengths).tolist()
    cells = [b"|".join(flat[a:b]) for a, b in zip([0] + ends[:-1], ends)]
    return np.array(cells, dtype=bytes)


class ZipfRank:
    """Exact inverse-CDF sampler of a Zipf law truncated to [0, card).

    `sampler(u)` for uniforms u in [0, 1) returns the ranks r with
    P(r) proportional to (r + 1) ** -exponent: exactly
    `np.searchsorted(cdf, u, side="right")` on the cumulative weights, but
    faster. Small tables use a guide table (Chen and Asau's indexed search:
    start at the rank for floor(u * G) / G, then step up while cdf[r] <= u,
    one or two vectorized steps); large ones search with sorted u, which
    keeps the binary searches cache-friendly (measured 1.6x faster).
    """

    _GUIDE_MAX_CARD = 1 << 16

    def __init__(self, card: int, exponent: float):
        cdf = np.cumsum(np.arange(1, card + 1, dtype=np.float64) ** -exponent)
        cdf /= cdf[-1]  # cdf[-1] == 1.0 exactly, so every u < 1 lands in range
        self.cdf = cdf
        self.guide = None
        if card <= self._GUIDE_MAX_CARD:
            self.buckets = 1 << max(10, int(card - 1).bit_length() + 4)  # >= 16 per rank
            edges = np.arange(self.buckets, dtype=np.float64) / self.buckets
            self.guide = np.searchsorted(cdf, edges, side="right")

    def __call__(self, u: np.ndarray) -> np.ndarray:
        if self.guide is None:
            order = np.argsort(u)
            ranks = np.empty(u.size, np.int64)
            ranks[order] = np.searchsorted(self.cdf, u[order], side="right")
            return ranks
        # min(): u * buckets can round up to `buckets` for u just below 1.
        ranks = self.guide[np.minimum((u * self.buckets).astype(np.int64), self.buckets - 1)]
        while True:
            step = self.cdf[ranks] <= u
            if not step.any():
                return ranks
            ranks += step


def _hex8(ids: np.ndarray) -> np.ndarray:
    """uint32 ids -> 8 lowercase hex digits (S8), vectorized."""
    shifts = np.arange(28, -1, -4, dtype=np.int64)
    nibbles = (ids[:, None] >> shifts) & 0xF
    return np.frombuffer(np.frombuffer(b"0123456789abcdef", np.uint8)[nibbles].tobytes(),
                         dtype="S8")


def _solve_bias(z: np.ndarray, target: float) -> float:
    """b with mean(sigmoid(b + z)) == target (bisection; monotone in b)."""
    lo, hi = -30.0, 30.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if np.mean(1.0 / (1.0 + np.exp(-(mid + z)))) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2
