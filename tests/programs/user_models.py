"""Models written the way users write them, for the quality comparisons.

`tests/test_quality_vs_stock.py` and `tools/measure_defaults.py` train
these against the stock `tf_keras` models a competent user writes instead
(int ids reduced with `floormod`, Keras defaults everywhere), on the same
data, with the same optimizer:

- Criteo: a Wide&Deep written from the README (functional `tn.Model`,
  `embedding_column` of dim 1 for the wide part and dim 8 for the deep
  part, every other setting at its default) on the real Criteo rows in
  ../shared/data: train on `train_extra_nonhead.tsv` + the first 8,000
  rows of `dev_head10k.tsv`, score the last 1,999.
- Avazu: the same Wide&Deep over Avazu's 24 string columns (real rows in
  ../shared/data: train on the first 3,000, score the last 856) against
  a stock model hashing the strings with `to_hash_bucket_fast`.
- Multi-valued: a TensorNet-style model (`Input(sparse=True)` VarLen id
  features, a dim-1 wide and a dim-8 deep `embedding_column` per feature)
  on generated data whose label follows a known logistic model of the ids.

`initializer`, `accumulator` and `layer_optimizers` ({"wide" | "deep":
that layer's own in-table optimizer}) are only for measuring candidate
defaults; None leaves each side's default, which is what the tests check.
"""
from __future__ import annotations

import pathlib
from typing import Any, Sequence

import numpy as np

import tnet as tn
import tensorflow as tf
import tf_keras

from tnet import data as tn_data
from tnet import feature_column as fc
from tnet.models.stock import stock_wide_deep

CRITEO_TRAIN_DEV_ROWS = 8000
CRITEO_BATCH = 256
HIDDEN = (256, 128)
NUM_BINS = 2**16          # stock rows per column: few collisions at this size


def optimizer(kind: str, stock: bool, lr: float | None = None,
              accumulator: float | None = None, row: dict | None = None):
    """The same optimizer on both sides: tnet's (dense + in-table rule) or
    the stock tf_keras one, each side's default hyperparameters.

    `accumulator` (Adagrad only, for measuring defaults): stock: Keras'
    initial_accumulator_value (every variable); tnet: the table rows'
    (row_initial_accumulator_value; dense variables keep Keras' 0.1).
    `row` (tnet Adagrad only): its row-only hyperparameters
    (accumulator_floor).
    kind "rowwise_adagrad": tnet's RowwiseAdagrad (one accumulator per
    row, Keras' Adagrad for the dense part); stock: Keras' Adagrad.
    """
    lr = lr if lr is not None else {"adam": 1e-3, "adagrad": 0.05,
                                    "rowwise_adagrad": 0.05}[kind]
    kw = {}
    if accumulator is not None:
        if kind not in ("adagrad", "rowwise_adagrad"):
            raise ValueError("accumulator is an Adagrad setting")
        kw = {("initial_accumulator_value" if stock
               else "row_initial_accumulator_value"): accumulator}
    if row:
        if stock or kind not in ("adagrad", "rowwise_adagrad"):
            raise ValueError("row hyperparameters are tnet Adagrad's")
        kw.update(row)
    if stock:   # Keras has no row-wise Adagrad: a stock user takes Adagrad
        return {"adam": tf_keras.optimizers.Adam,
                "adagrad": tf_keras.optimizers.Adagrad,
                "rowwise_adagrad": tf_keras.optimizers.Adagrad}[kind](lr, **kw)
    return {"adam": tn.optimizer.Adam,
            "adagrad": tn.optimizer.Adagrad,
            "rowwise_adagrad": tn.optimizer.RowwiseAdagrad}[kind](lr, **kw)


# ------------------------------------------------------------------ Criteo
def criteo_data(data_dir: pathlib.Path, seed: int, val_rows: int = 0):
    """(train, eval) datasets of real Criteo rows; with `val_rows`,
    (train, validation, eval): the validation rows are the last
    `val_rows` of the training rows, and training keeps the rest."""
    crit = pathlib.Path(data_dir) / "criteo"
    extra, dev = crit / "train_extra_nonhead.tsv", crit / "dev_head10k.tsv"
    with open(extra, "rb") as f:
        extra_rows = sum(1 for _ in f)
    rows = extra_rows + CRITEO_TRAIN_DEV_ROWS - val_rows
    train = tn_data.criteo_dataset(
        [extra, dev], CRITEO_BATCH, take=rows,
        shuffle_buffer=16_384, seed=seed)
    evals = tn_data.criteo_dataset(dev, 1024, skip=CRITEO_TRAIN_DEV_ROWS)
    if not val_rows:
        return train, evals
    val = tn_data.criteo_dataset([extra, dev], 1024, skip=rows,
                                 take=val_rows)
    return train, val, evals


def criteo_user_wide_deep(initializer: Any = None,
                          hidden: Sequence[int] = HIDDEN,
                          layer_optimizers: dict | None = None) -> tn.Model:
    """Wide&Deep as a user writes it from the README."""
    cats, dense = tn_data.CRITEO_CAT_COLUMNS, tn_data.CRITEO_INT_COLUMNS
    inputs = {c: tf_keras.Input((), dtype=tf.int64, name=c) for c in cats}
    inputs.update({d: tf_keras.Input((), dtype=tf.float32, name=d)
                   for d in dense})
    ids = {c: fc.category_column(c) for c in cats}
    kw = {} if initializer is None else {"initializer": initializer}
    wide = tn.layers.EmbeddingFeatures(
        [fc.embedding_column(ids[c], 1, table="wide", **kw) for c in cats],
        name="wide", optimizer=(layer_optimizers or {}).get("wide"))
    deep = tn.layers.EmbeddingFeatures(
        [fc.embedding_column(ids[c], 8, table="deep", **kw) for c in cats],
        name="deep", optimizer=(layer_optimizers or {}).get("deep"))
    x = tf_keras.layers.Concatenate()(
        [deep({c: inputs[c] for c in cats}),
         tf.stack([inputs[d] for d in dense], axis=1)])
    for units in hidden:
        x = tf_keras.layers.Dense(units, activation="relu")(x)
    wide_logit = tf.reduce_sum(wide({c: inputs[c] for c in cats}), axis=1,
                               keepdims=True)
    logits = tf_keras.layers.Dense(1)(x) + wide_logit
    return tn.Model(inputs, logits)


def criteo_stock_wide_deep(hidden: Sequence[int] = HIDDEN) -> tf_keras.Model:
    return stock_wide_deep(tn_data.CRITEO_CAT_COLUMNS,
                           tn_data.CRITEO_INT_COLUMNS, num_bins=NUM_BINS,
                           hidden_units=hidden, reduce="floormod")


# ------------------------------------------------------------------ Avazu
AVAZU_TRAIN_ROWS = 3000   # of the 3,856 rows in ../shared/data/avazu


def avazu_data(data_dir: pathlib.Path, seed: int, val_rows: int = 0):
    """(train, eval) datasets of the real Avazu rows (string tokens):
    train on the first AVAZU_TRAIN_ROWS, score the rest (later hours).
    With `val_rows`, (train, validation, eval): the validation rows are
    the last `val_rows` of the training rows."""
    path = pathlib.Path(data_dir) / "avazu" / "avazu_train_oct21-22.csv"
    rows = AVAZU_TRAIN_ROWS - val_rows
    train = tn_data.avazu_dataset(path, CRITEO_BATCH, take=rows,
                                  shuffle_buffer=4096, seed=seed)
    evals = tn_data.avazu_dataset(path, 1024, skip=AVAZU_TRAIN_ROWS)
    if not val_rows:
        return train, evals
    val = tn_data.avazu_dataset(path, 1024, skip=rows, take=val_rows)
    return train, val, evals


def avazu_user_wide_deep(initializer: Any = None,
                         hidden: Sequence[int] = HIDDEN,
                         layer_optimizers: dict | None = None) -> tn.Model:
    """Wide&Deep over Avazu's string columns, written from the README."""
    cats = tn_data.AVAZU_CAT_COLUMNS
    inputs = {c: tf_keras.Input((), dtype=tf.string, name=c) for c in cats}
    ids = {c: fc.category_column(c, dtype=tf.string) for c in cats}
    kw = {} if initializer is None else {"initializer": initializer}
    wide = tn.layers.EmbeddingFeatures(
        [fc.embedding_column(ids[c], 1, table="wide", **kw) for c in cats],
        name="wide", optimizer=(layer_optimizers or {}).get("wide"))
    deep = tn.layers.EmbeddingFeatures(
        [fc.embedding_column(ids[c], 8, table="deep", **kw) for c in cats],
        name="deep", optimizer=(layer_optimizers or {}).get("deep"))
    x = deep(inputs)
    for units in hidden:
        x = tf_keras.layers.Dense(units, activation="relu")(x)
    logits = tf_keras.layers.Dense(1)(x) + tf.reduce_sum(
        wide(inputs), axis=1, keepdims=True)
    return tn.Model(inputs, logits)


class HashedEmbedding(tf_keras.layers.Layer):
    """Stock embedding of string tokens: to_hash_bucket_fast, then gather."""

    def __init__(self, num_bins: int, dim: int, initializer="uniform",
                 **kwargs):
        super().__init__(**kwargs)
        self.num_bins, self.dim, self.initializer = num_bins, dim, initializer

    def build(self, input_shape):
        self.embeddings = self.add_weight(
            "embeddings", (self.num_bins, self.dim),
            initializer=self.initializer)

    def call(self, tokens):
        return tf.gather(self.embeddings, tf.strings.to_hash_bucket_fast(
            tokens, self.num_bins))


def avazu_stock_wide_deep(hidden: Sequence[int] = HIDDEN) -> tf_keras.Model:
    """The stock tf_keras Wide&Deep a user writes for string columns."""
    cats = tn_data.AVAZU_CAT_COLUMNS
    inputs = {c: tf_keras.Input((), dtype=tf.string, name=c) for c in cats}
    deep = [HashedEmbedding(NUM_BINS, 8, name=f"emb_{c}")(inputs[c])
            for c in cats]
    wide = [HashedEmbedding(NUM_BINS, 1, initializer="zeros",
                            name=f"wide_{c}")(inputs[c]) for c in cats]
    x = tf_keras.layers.Concatenate()(deep)
    for units in hidden:
        x = tf_keras.layers.Dense(units, activation="relu")(x)
    logits = tf_keras.layers.Add()([tf_keras.layers.Dense(1)(x)] + wide)
    return tf_keras.Model(inputs, logits)


# ----------------------------------------------------------------- DeepFM
def stock_deepfm(categorical: Sequence[str], dense: Sequence[str] = (),
                 string_ids: bool = False, dim: int = 8,
                 hidden: Sequence[int] = HIDDEN) -> tf_keras.Model:
    """tn.models.DeepFM's architecture as a stock tf_keras user writes it:
    each id column reduced into NUM_BINS rows (floormod for int ids,
    `to_hash_bucket_fast` for strings), a dim-`dim` embedding (Keras'
    uniform) that the FM term and the MLP share, a 1-wide zero-initialized
    one for the first-order term; logits = first order + FM + MLP([the
    embeddings, the dense features])."""
    dtype = tf.string if string_ids else tf.int64
    inputs = {c: tf_keras.Input((), dtype=dtype, name=c) for c in categorical}
    inputs.update({d: tf_keras.Input((), dtype=tf.float32, name=d)
                   for d in dense})
    table = HashedEmbedding if string_ids else SparseEmbedding
    v = [table(NUM_BINS, dim, name=f"emb_{c}")(inputs[c])
         for c in categorical]
    first = [table(NUM_BINS, 1, initializer="zeros",
                   name=f"first_order_{c}")(inputs[c]) for c in categorical]
    stacked = tf.stack(v, axis=1)                       # [B, F, dim]
    fm = 0.5 * tf.reduce_sum(
        tf.square(tf.reduce_sum(stacked, axis=1))
        - tf.reduce_sum(tf.square(stacked), axis=1), axis=1, keepdims=True)
    x = tf_keras.layers.Concatenate()(
        v + ([tf.stack([inputs[d] for d in dense], axis=1)] if dense else []))
    for units in hidden:
        x = tf_keras.layers.Dense(units, activation="relu")(x)
    logits = tf_keras.layers.Add()([tf_keras.layers.Dense(1)(x), fm] + first)
    return tf_keras.Model(inputs, logits)


# ------------------------------------------------------------ multi-valued
MV_FEATURES = ("tags", "history", "query_terms", "slot_ids")
MV_SINGLE = ("user", "ad")
MV_VOCAB = 5000
MV_BINS = 2**14          # stock rows per feature: every id its own row


def multi_valued_data(seed: int, train_rows: int = 24_000,
                      eval_rows: int = 8_000, batch: int = 256,
                      val_rows: int = 0):
    """Generated VarLen ids with a known label model.

    Each example has one id for each MV_SINGLE feature and 1..12 ids for
    each MV_FEATURES feature, drawn from a power law over MV_VOCAB ids.
    Every id has a true weight; the label is Bernoulli(sigmoid(sum of the
    single ids' weights + the mean weight of each multi-valued feature)).
    The data are fixed (seed 1234); `seed` only orders the training rows.
    With `val_rows`, (train, validation, eval): the validation rows are
    the last `val_rows` of the training rows, and training keeps the rest.
    """
    rng = np.random.default_rng(1234)
    rows = train_rows + eval_rows
    weights = {n: rng.normal(0.0, 0.8, MV_VOCAB)
               for n in MV_FEATURES + MV_SINGLE}
    zipf = 1.0 / np.arange(1, MV_VOCAB + 1) ** 1.1
    zipf /= zipf.sum()
    features, logit = {}, np.full(rows, -0.5)
    for n in MV_SINGLE:
        ids = rng.choice(MV_VOCAB, rows, p=zipf)
        features[n] = ids.astype(np.int64)
        logit += weights[n][ids]
    for n in MV_FEATURES:
        lengths = rng.integers(1, 13, rows)
        flat = rng.choice(MV_VOCAB, lengths.sum(), p=zipf)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        logit += np.add.reduceat(weights[n][flat], starts) / lengths
        features[n] = (flat.astype(np.int64), lengths)
    label = (rng.random(rows) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)

    def dataset(lo, hi, shuffle):
        def gen():
            order = np.arange(lo, hi)
            if shuffle:
                np.random.default_rng(seed).shuffle(order)
            for start in range(0, len(order), batch):
                idx = order[start:start + batch]
                out = {n: features[n][idx] for n in MV_SINGLE}
                for n in MV_FEATURES:
                    flat, lengths = features[n]
                    offsets = np.concatenate([[0], np.cumsum(lengths)])
                    out[n] = tf.RaggedTensor.from_row_lengths(
                        np.concatenate([flat[offsets[i]:offsets[i + 1]]
                                        for i in idx]),
                        lengths[idx]).to_sparse()
                yield out, label[idx]
        spec = {n: tf.TensorSpec([None], tf.int64) for n in MV_SINGLE}
        spec.update({n: tf.SparseTensorSpec([None, None], tf.int64)
                     for n in MV_FEATURES})
        return tf.data.Dataset.from_generator(
            gen, output_signature=(spec, tf.TensorSpec([None], tf.float32))
        ).cache()

    if val_rows:
        return (dataset(0, train_rows - val_rows, True),
                dataset(train_rows - val_rows, train_rows, False),
                dataset(train_rows, rows, False))
    return dataset(0, train_rows, True), dataset(train_rows, rows, False)


def _mv_inputs():
    inputs = {n: tf_keras.Input((), dtype=tf.int64, name=n) for n in MV_SINGLE}
    inputs.update({n: tf_keras.Input((None,), dtype=tf.int64, sparse=True,
                                      name=n) for n in MV_FEATURES})
    return inputs


def multi_valued_user_model(initializer: Any = None,
                            hidden: Sequence[int] = (64, 32),
                            layer_optimizers: dict | None = None) -> tn.Model:
    """TensorNet-style: sparse VarLen inputs, dim-1 wide + dim-8 deep."""
    inputs = _mv_inputs()
    names = MV_SINGLE + MV_FEATURES
    ids = {n: fc.category_column(n) for n in names}
    kw = {} if initializer is None else {"initializer": initializer}
    wide = tn.layers.EmbeddingFeatures(
        [fc.embedding_column(ids[n], 1, table="wide", **kw) for n in names],
        name="wide", optimizer=(layer_optimizers or {}).get("wide"))
    deep = tn.layers.EmbeddingFeatures(
        [fc.embedding_column(ids[n], 8, table="deep", **kw) for n in names],
        name="deep", optimizer=(layer_optimizers or {}).get("deep"))
    x = deep(inputs)
    for units in hidden:
        x = tf_keras.layers.Dense(units, activation="relu")(x)
    logits = tf_keras.layers.Dense(1)(x) + tf.reduce_sum(
        wide(inputs), axis=1, keepdims=True)
    return tn.Model(inputs, logits)


class SparseEmbedding(tf_keras.layers.Layer):
    """Stock embedding of `[B]` or SparseTensor ids reduced by floormod;
    multi-valued ids are averaged (safe_embedding_lookup_sparse)."""

    def __init__(self, num_bins: int, dim: int, initializer="uniform",
                 **kwargs):
        super().__init__(**kwargs)
        self.num_bins, self.dim, self.initializer = num_bins, dim, initializer

    def build(self, input_shape):
        self.embeddings = self.add_weight(
            "embeddings", (self.num_bins, self.dim),
            initializer=self.initializer)

    def call(self, ids):
        if isinstance(ids, tf.SparseTensor):
            ids = tf.SparseTensor(ids.indices,
                                  tf.math.floormod(ids.values, self.num_bins),
                                  ids.dense_shape)
            return tf.nn.safe_embedding_lookup_sparse(
                self.embeddings, ids, combiner="mean")
        return tf.gather(self.embeddings, tf.math.floormod(ids, self.num_bins))


def multi_valued_stock_model(hidden: Sequence[int] = (64, 32)) -> tf_keras.Model:
    inputs = _mv_inputs()
    names = MV_SINGLE + MV_FEATURES
    deep = [SparseEmbedding(MV_BINS, 8, name=f"emb_{n}")(inputs[n])
            for n in names]
    wide = [SparseEmbedding(MV_BINS, 1, initializer="zeros",
                            name=f"wide_{n}")(inputs[n]) for n in names]
    x = tf_keras.layers.Concatenate()(deep)
    for units in hidden:
        x = tf_keras.layers.Dense(units, activation="relu")(x)
    logits = tf_keras.layers.Add()([tf_keras.layers.Dense(1)(x)] + wide)
    return tf_keras.Model(inputs, logits)


# ------------------------------------------------------------- train+score
def fit_and_score(model, opt, train, evals, epochs: int) -> float:
    """Fits with binary cross-entropy on logits; hold-out AUC."""
    from tnet.data.metrics import auc
    model.compile(opt, loss=tf_keras.losses.BinaryCrossentropy(from_logits=True))
    model.fit(train, epochs=epochs, verbose=0)
    labels, scores = [], []
    for features, y in evals:
        scores.append(np.asarray(model(features, training=False)).reshape(-1))
        labels.append(np.asarray(y).reshape(-1))
    return float(auc(np.concatenate(labels), np.concatenate(scores)))


def run(case: str, side: str, seed: int, kind: str = "adam",
        initializer: Any = None, epochs: int = 2,
        data_dir: pathlib.Path | None = None,
        accumulator: float | None = None, row: dict | None = None) -> float:
    """One trained model's hold-out AUC. case: "criteo" | "multi_valued" |
    "avazu"; side: "tnet" | "stock"; `row`: tnet Adagrad's row-only
    hyperparameters (see `optimizer`)."""
    tf_keras.utils.set_random_seed(seed)
    if case == "avazu":
        train, evals = avazu_data(data_dir, seed)
        model = (avazu_user_wide_deep(initializer) if side == "tnet"
                 else avazu_stock_wide_deep())
    elif case == "criteo":
        train, evals = criteo_data(data_dir, seed)
        model = (criteo_user_wide_deep(initializer) if side == "tnet"
                 else criteo_stock_wide_deep())
    elif case == "multi_valued":
        train, evals = multi_valued_data(seed)
        model = (multi_valued_user_model(initializer) if side == "tnet"
                 else multi_valued_stock_model())
    else:
        raise ValueError(f"unknown case {case!r}")
    return fit_and_score(model, optimizer(kind, side == "stock",
                                          accumulator=accumulator, row=row),
                         train, evals, epochs)
