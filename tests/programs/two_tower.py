"""Two-tower retrieval on generated interactions, for the defaults study.

tnet side: `tn.models.TwoTower` (user id + a user "segment" string +
mean-pooled recent history in the query tower, item id + genres in the
candidate tower, 64-unit MLPs, 32-wide L2-normalized outputs, tfrs
Retrieval: in-batch softmax, temperature 0.1, sampling-bias correction,
accidental hits removed), as tools/bench_retrieval.py and
configs/two_tower_movielens.cfg build it (mean pooling). Stock side: the
same towers and task in tf_keras/tfrs as a competent user writes them:
int ids reduced with `floormod` into `Embedding`s (bins >= ids, so no
collisions), strings hashed (`to_hash_bucket_fast`), Keras' defaults.
Both train with Adagrad (lr 0.1, the two-tower config's) on the same
batches in the same seeded order; the score is hold-out recall@k: the
share of hold-out interactions whose item ranks in the top k among all
NUM_ITEMS items (k = 10 and 50; nothing excluded, as bench_retrieval).

The data are generated (fixed seed, whatever the run's seed): users and
items have latent vectors in LATENT dimensions; a user picks item i with
probability proportional to popularity_i * exp(ALPHA * u.v_i), the
popularity a power law. An item's genres and a user's segment are the
largest components of their vectors (so they carry part of the
structure). Each user's last interaction is held out; every other one is
a training example whose history is the user's HISTORY previous items.
"""
from __future__ import annotations

import numpy as np

import tnet as tn
from tnet import feature_column as fc
import tensorflow as tf
import tensorflow_recommenders as tfrs
import tf_keras

NUM_USERS = 6000
NUM_ITEMS = 4000
LATENT = 8
ALPHA = 0.9
POP_EXPONENT = 0.9
HISTORY = 10
GENRES = 2
DIM = 32
BATCH = 512
LR = 0.1
KS = (10, 50)
USER_BINS = 2**13          # >= NUM_USERS
ITEM_BINS = 2**12          # >= NUM_ITEMS
STRING_BINS = 1024


def _quantize(vectors, prefix, how_many):
    """The `how_many` largest |components| as tokens (index and sign)."""
    order = np.argsort(-np.abs(vectors), axis=1)[:, :how_many]
    sign = np.take_along_axis(vectors, order, axis=1) > 0
    return np.char.add(prefix, (order * 2 + sign).astype(str)).astype(bytes)


def generate():
    """dict of numpy arrays: train and test examples, the item corpus."""
    rng = np.random.default_rng(4321)
    users = rng.normal(0.0, 1.0, (NUM_USERS, LATENT))
    items = rng.normal(0.0, 1.0, (NUM_ITEMS, LATENT))
    pop = 1.0 / rng.permutation(np.arange(1, NUM_ITEMS + 1)) ** POP_EXPONENT
    segment = _quantize(users, "seg", 1)[:, 0]
    genres = _quantize(items, "g", GENRES)
    genres[rng.random(NUM_ITEMS) < 0.4, 1] = b""     # some have one genre
    counts = np.clip(rng.geometric(1 / 12, NUM_USERS) + 2, 3, 60)
    seqs = []
    for u in range(NUM_USERS):
        logits = np.log(pop) + ALPHA * items @ users[u]
        p = np.exp(logits - logits.max())
        seqs.append(rng.choice(NUM_ITEMS, counts[u], p=p / p.sum()))
    train, test = {k: [] for k in ("user_id", "history", "item_id")}, \
        {k: [] for k in ("user_id", "history", "item_id")}
    for u, seq in enumerate(seqs):
        for t, item in enumerate(seq):
            hist = np.full(HISTORY, -1, np.int64)
            prev = seq[max(0, t - HISTORY):t]
            hist[HISTORY - len(prev):] = prev
            out = test if t == len(seq) - 1 else train
            out["user_id"].append(u)
            out["history"].append(hist)
            out["item_id"].append(item)
    data = {}
    for name, part in (("train", train), ("test", test)):
        ex = {k: np.asarray(v, np.int64) for k, v in part.items()}
        ex["segment"] = segment[ex["user_id"]]
        ex["genres"] = genres[ex["item_id"]]
        data[name] = ex
    share = np.bincount(data["train"]["item_id"], minlength=NUM_ITEMS)
    share = share / share.sum()
    for ex in (data["train"], data["test"]):
        ex["item_prob"] = share[ex["item_id"]].astype(np.float32)
    data["items"] = {"item_id": np.arange(NUM_ITEMS, dtype=np.int64),
                     "genres": genres}
    data["item_share"] = share
    return data


def batches(examples, seed):
    """Whole batches in a seeded shuffled order (one epoch)."""
    n = examples["item_id"].shape[0]
    order = np.random.default_rng(seed).permutation(n)
    n = (n // BATCH) * BATCH
    return tf.data.Dataset.from_tensor_slices(
        {k: v[order[:n]].reshape((-1, BATCH) + v.shape[1:])
         for k, v in examples.items()}).prefetch(2)


def tnet_model(accumulator: float | None = None, initializer=None):
    """`initializer` (probes only): every table's, in place of TwoTower's
    default (Keras' uniform +-0.05 since the two-tower gap was traced to
    tnet's table default normal(0, 0.01))."""
    kw = ({} if accumulator is None
          else {"row_initial_accumulator_value": accumulator})
    init = ({} if initializer is None
            else {"embedding_initializer": initializer})
    model = tn.models.TwoTower(
        user_features=("segment",), history="history",
        history_max_length=HISTORY, pooling="mean", embedding_dim=DIM,
        output_dim=DIM, hidden_units=(64,), temperature=0.1,
        sampling_probability_key="item_prob", **init)
    model.compile(tn.optimizer.Adagrad(LR, **kw))
    return model


def _mlp(name):
    return tf_keras.Sequential([tf_keras.layers.Dense(64, activation="relu"),
                                tf_keras.layers.Dense(DIM)], name=name)


class StockTwoTower(tfrs.models.Model):
    """The same two-tower in stock tf_keras: floormod ids, hashed strings,
    Keras' Embedding defaults."""

    def __init__(self, initializer="uniform"):
        super().__init__()
        emb = lambda n, d: tf_keras.layers.Embedding(  # noqa: E731
            n, d, embeddings_initializer=initializer)
        self.user_emb = emb(USER_BINS, DIM)
        self.segment_emb = emb(STRING_BINS, DIM)
        self.history_emb = emb(ITEM_BINS, DIM)
        self.item_emb = emb(ITEM_BINS, DIM)
        self.genre_emb = emb(STRING_BINS, DIM)
        self.query_tower = _mlp("query_tower")
        self.candidate_tower = _mlp("candidate_tower")
        self.task = tfrs.tasks.Retrieval(temperature=0.1,
                                         remove_accidental_hits=True)

    def query_embedding(self, f, training=False):
        user = self.user_emb(tf.math.floormod(f["user_id"], USER_BINS))
        seg = self.segment_emb(tf.strings.to_hash_bucket_fast(
            f["segment"], STRING_BINS))
        h = f["history"]
        valid = tf.cast(tf.not_equal(h, -1), tf.float32)[:, :, tf.newaxis]
        seq = self.history_emb(tf.math.floormod(tf.maximum(h, 0), ITEM_BINS))
        pooled = tf.math.divide_no_nan(tf.reduce_sum(seq * valid, axis=1),
                                       tf.reduce_sum(valid, axis=1))
        x = tf.concat([user, seg, pooled], axis=1)
        return tf.math.l2_normalize(self.query_tower(x), axis=1)

    def candidate_embedding(self, f, training=False):
        item = self.item_emb(tf.math.floormod(f["item_id"], ITEM_BINS))
        g = f["genres"]
        valid = tf.cast(tf.not_equal(g, b""), tf.float32)[:, :, tf.newaxis]
        genres = tf.math.divide_no_nan(
            tf.reduce_sum(self.genre_emb(tf.strings.to_hash_bucket_fast(
                g, STRING_BINS)) * valid, axis=1),
            tf.reduce_sum(valid, axis=1))
        x = tf.concat([item, genres], axis=1)
        return tf.math.l2_normalize(self.candidate_tower(x), axis=1)

    def compute_loss(self, f, training=False):
        return self.task(self.query_embedding(f), self.candidate_embedding(f),
                         candidate_sampling_probability=tf.maximum(
                             f["item_prob"], 1e-9),
                         candidate_ids=f["item_id"], compute_metrics=False)


def _keras_initializer(spec):
    """A tools/measure_defaults.py CANDIDATES value as a Keras initializer
    (probes of the stock side; None: Keras' Embedding default)."""
    if spec is None:
        return "uniform"
    if isinstance(spec, dict):
        return tf_keras.initializers.RandomNormal(stddev=spec["stddev"])
    if spec == "truncated_normal":
        return tf_keras.initializers.TruncatedNormal(stddev=DIM ** -0.5)
    return spec


def stock_model(accumulator: float | None = None, initializer=None):
    """`initializer` (probes only): every Embedding's, in place of Keras'
    uniform +-0.05."""
    model = StockTwoTower(_keras_initializer(initializer))
    kw = ({} if accumulator is None
          else {"initial_accumulator_value": accumulator})
    model.compile(tf_keras.optimizers.Adagrad(LR, **kw))
    return model


# ------------------------------------------- the two sides from one start
# (tools/two_tower_agreement.py, tests/test_two_tower_agreement.py)

def _import(table, keys, weights, accumulator):
    keys = tf.constant(keys, tf.int64)
    n = int(keys.shape[0])
    table.import_rows(keys, weights,
                      np.full((n, table.num_slots), accumulator, np.float32),
                      np.zeros((n, 3), np.float64))


def _string_keys(strings, column):
    return fc.keys_of(tf.constant(strings), fc.column_salt(column)).numpy()


def id_keys(data):
    """{table: [(stock Embedding attribute, ids into it, tnet keys)]}."""
    users = np.arange(NUM_USERS, dtype=np.int64)
    items = np.arange(NUM_ITEMS, dtype=np.int64)
    segs = np.unique(data["train"]["segment"])
    genres = np.unique(data["items"]["genres"])
    genres = genres[genres != b""]
    bucket = lambda s: tf.strings.to_hash_bucket_fast(  # noqa: E731
        s, STRING_BINS).numpy()
    return {
        "user": [("user_emb", users % USER_BINS,
                  users ^ fc.column_salt("user_id")),
                 ("segment_emb", bucket(segs), _string_keys(segs, "segment"))],
        "history_item": [("history_emb", items % ITEM_BINS, items)],
        "item": [("item_emb", items % ITEM_BINS,
                  items ^ fc.column_salt("item_id")),
                 ("genre_emb", bucket(genres),
                  _string_keys(genres, "genres"))],
    }


def aligned_pair(data, seed=0, accumulator=0.1, source="stock"):
    """(stock, tnet) with the same initial weights: the stock model's
    (source "stock": its Embedding rows imported into tnet's tables) or
    tnet's (source "tnet": the rows tnet's initializer gives every id,
    written into the stock Embeddings; "tnet_lazy": the same, but tnet's
    table rows are created by training, as in a normal run). Towers: the
    stock model's."""
    tf_keras.utils.set_random_seed(seed)
    stock = stock_model(accumulator)
    tnet_side = tnet_model(accumulator)
    first = {k: tf.constant(v[:BATCH]) for k, v in data["train"].items()}
    for m in (stock, tnet_side):
        m.query_embedding(first)
        m.candidate_embedding(first)
    for src, dst in ((stock.query_tower, tnet_side.query_tower),
                     (stock.candidate_tower, tnet_side.candidate_tower)):
        dst.set_weights(src.get_weights())
    tables = tnet_side.tables()
    twin = None
    if source == "tnet_lazy":
        twin = tnet_model(accumulator)
        twin.query_embedding(first)
        twin.candidate_embedding(first)
        twin = twin.tables()
    for name, parts in id_keys(data).items():
        table = tables[name]
        if source == "stock":
            _import(table, np.concatenate([k for _, _, k in parts]),
                    np.concatenate([getattr(stock, a).embeddings.numpy()[i]
                                    for a, i, _ in parts]), accumulator)
            continue
        for attr, index, keys in parts:
            # a training pull inserts each key's row as its initializer
            # draws it; then the accumulators are set to `accumulator`.
            # "tnet_lazy": the rows are drawn in a twin model's table, and
            # tnet's own table creates them when training first meets them.
            rows = (twin or tables)[name].pull(tf.constant(keys),
                                               training=True).numpy()
            if source == "tnet":
                _import(table, keys, rows, accumulator)
            var = getattr(stock, attr).embeddings
            var.scatter_update(tf.IndexedSlices(tf.constant(rows),
                                                tf.constant(index)))
    return stock, tnet_side


def tower_difference(a, b) -> float:
    """Largest |difference| between the two models' tower weights."""
    return max(float(np.max(np.abs(x - y))) for x, y in
               zip(a.query_tower.get_weights() + a.candidate_tower.get_weights(),
                   b.query_tower.get_weights() + b.candidate_tower.get_weights()))


def recall(model, data, ks=KS) -> dict:
    """recall@k over all items: the true item's score strictly beaten by
    fewer than k items."""
    cand = np.asarray(model.candidate_embedding(
        {k: tf.constant(v) for k, v in data["items"].items()}))
    test = data["test"]
    ranks = []
    for i in range(0, test["item_id"].size, 2048):
        f = {k: tf.constant(v[i:i + 2048]) for k, v in test.items()}
        q = np.asarray(model.query_embedding(f))
        scores = q @ cand.T
        true = scores[np.arange(len(q)), test["item_id"][i:i + 2048]]
        ranks.append((scores > true[:, None]).sum(axis=1))
    ranks = np.concatenate(ranks)
    return {f"recall_at_{k}": float((ranks < k).mean()) for k in ks}


def reference_recall(data, ks=KS) -> dict:
    """Popularity (training counts) and the generator's own scores."""
    rng = np.random.default_rng(4321)
    users = rng.normal(0.0, 1.0, (NUM_USERS, LATENT))
    items = rng.normal(0.0, 1.0, (NUM_ITEMS, LATENT))
    pop = 1.0 / rng.permutation(np.arange(1, NUM_ITEMS + 1)) ** POP_EXPONENT
    test = data["test"]
    out = {}
    share = data["item_share"]
    true = share[test["item_id"]]
    pop_rank = (share[None, :] > true[:, None]).sum(axis=1)
    oracle = np.log(pop)[None, :] + ALPHA * users[test["user_id"]] @ items.T
    o_true = oracle[np.arange(len(true)), test["item_id"]]
    o_rank = (oracle > o_true[:, None]).sum(axis=1)
    for k in ks:
        out[f"popularity_recall_at_{k}"] = float((pop_rank < k).mean())
        out[f"oracle_recall_at_{k}"] = float((o_rank < k).mean())
    return out


def run(side: str, seed: int, epochs: int = 2,
        accumulator: float | None = None, initializer=None,
        curve: list | None = None) -> dict:
    """One trained model's hold-out recall@k (side "tnet" | "stock";
    `initializer`: every table's or Embedding's, None for the side's
    default; `curve`: a list that
    gets recall@50 after every epoch)."""
    data = generate()
    tf_keras.utils.set_random_seed(seed)
    model = (tnet_model(accumulator, initializer) if side == "tnet"
             else stock_model(accumulator, initializer))
    for epoch in range(epochs):
        model.fit(batches(data["train"], seed * 1000 + epoch), epochs=1,
                  verbose=0)
        if curve is not None:
            curve.append(recall(model, data, (50,))["recall_at_50"])
    return recall(model, data)
