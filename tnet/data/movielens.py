"""MovieLens 100k for retrieval: interactions with user features, item
genres and each user's recent history, split by the official `ua` split.

Files (in `data_dir`, e.g. `../shared/data/movielens/`):

* `ml-100k_ua.base`, `ml-100k_ua.test`: `user item rating timestamp`,
  tab-separated. `ua.test` holds exactly 10 ratings per user.
* `recbole-whl__ml-100k.user` / `.item`: RecBole atomic files, a header of
  `name:type` fields then tab-separated rows (user: age, gender,
  occupation, zip_code; item: title, release_year, class = genres).

Every rating is one positive (query, candidate) pair; the rating value is
not used (retrieval predicts what a user watches, not how they liked it).

History sequences, and why they do not leak:
* a training example's history is the user's *training* interactions
  before it, in time order (ties broken by file order);
* a test example's history is the user's `ua.base` interactions at or
  before its timestamp (`causal_test_history=True`; with False, all of
  them). Test interactions never enter any history, so nothing of the
  test set is visible to the model.
Histories are truncated to the most recent `history_max_length` ids and
stored left-aligned, oldest kept id first, padded with -1: the same
layout `tn.layers.SequenceEmbeddingFeatures` produces, and a fixed
`[None, L]` shape that a serving signature can take.

Everything is small (100k rows), so the reader works in numpy and hands
out dicts of arrays; `movielens_dataset` turns one into `tf.data`, and
`save_examples` / `load_examples_dataset` write it with `Dataset.save` so
ParameterServerStrategy workers read it with a pure tf.data graph (no
Python, no 40 MB of constants shipped in the dataset function).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Dict, Optional

import numpy as np
import tensorflow as tf

__all__ = ["MovieLens", "load_movielens", "movielens_dataset",
           "save_examples", "load_examples_dataset", "USER_FEATURES",
           "MAX_GENRES", "popularity_recall"]

BASE_FILE = "ml-100k_ua.base"
TEST_FILE = "ml-100k_ua.test"
USER_FILE = "recbole-whl__ml-100k.user"
ITEM_FILE = "recbole-whl__ml-100k.item"
# String features of the user tower (from the .user file).
USER_FEATURES = ("age_bucket", "gender", "occupation", "zip3")
MAX_GENRES = 6  # the most genres any ml-100k movie has
_AGE_EDGES = (18, 25, 35, 45, 50, 56)  # MovieLens-1M style age groups

Examples = Dict[str, np.ndarray]


@dataclasses.dataclass
class MovieLens:
    """Train/test examples and the candidate corpus.

    train / test: {feature: array [N, ...]}: user_id int64, the
      USER_FEATURES (bytes), history int64 [N, L] (-1 padded), item_id
      int64, genres bytes [N, MAX_GENRES] ("" padded), item_prob float32
      (the item's share of training interactions: the sampling
      probability of in-batch negatives, for bias correction).
    items: the same candidate features (item_id, genres, item_prob) for
      every item of the catalogue: what top-K retrieval ranks.
    item_counts: {item id: training interactions}.

    Args:
      train: the training examples.
      test: the held-out examples.
      items: every candidate's features.
      item_counts: training interactions per item.
      history_max_length: L of the histories.

    Example:
        ```python
        data = tn.data.load_movielens("../shared/data/movielens", 20)
        print(len(data.train["item_id"]), len(data.items["item_id"]))   # 90570 1682
        ```
    """

    train: Examples
    test: Examples
    items: Examples
    item_counts: Dict[int, int]
    history_max_length: int

    def user_features(self, user_ids) -> Examples:
        """The query features (no history) of the given users.

        Args:
          user_ids: `[N]` int user ids.
        """
        ids = np.asarray(user_ids, np.int64)
        out = {"user_id": ids}
        for name in USER_FEATURES:
            out[name] = np.array([self._users.get(int(u), {}).get(name, b"")
                                  for u in ids], dtype=object)
        return out

    _users: Dict[int, Dict[str, bytes]] = dataclasses.field(
        default_factory=dict, repr=False)


def _read_ratings(path: str) -> np.ndarray:
    """[N, 4] int64 (user, item, rating, timestamp), file order kept."""
    rows = np.loadtxt(path, dtype=np.int64, delimiter="\t", ndmin=2)
    if rows.shape[1] != 4:
        raise ValueError(f"{path}: expected 4 tab-separated columns (user "
                         f"item rating timestamp), got {rows.shape[1]}")
    return rows


def _read_atomic(path: str):
    """RecBole atomic file -> (field names, list of row field lists)."""
    with open(path, encoding="latin-1") as f:
        header = f.readline().rstrip("\n").split("\t")
        names = [h.split(":", 1)[0] for h in header]
        rows = []
        for number, line in enumerate(f, start=2):
            line = line.rstrip("\n")
            if not line:
                continue
            fields = line.split("\t")
            if len(fields) != len(names):
                raise ValueError(f"{path}:{number}: expected {len(names)} "
                                 f"fields ({names}), got {len(fields)}")
            rows.append(fields)
    return names, rows


def _age_bucket(age: str) -> bytes:
    a = int(age)
    bucket = sum(a >= e for e in _AGE_EDGES)
    return f"age{bucket}".encode()


def _users(path: str) -> Dict[int, Dict[str, bytes]]:
    names, rows = _read_atomic(path)
    col = {n: i for i, n in enumerate(names)}
    out = {}
    for r in rows:
        out[int(r[col["user_id"]])] = {
            "age_bucket": _age_bucket(r[col["age"]]),
            "gender": r[col["gender"]].encode(),
            "occupation": r[col["occupation"]].encode(),
            # zip codes are not all numeric (e.g. Canadian ones): a token
            "zip3": r[col["zip_code"]][:3].encode(),
        }
    return out


def _genres(path: str) -> Dict[int, np.ndarray]:
    names, rows = _read_atomic(path)
    col = {n: i for i, n in enumerate(names)}
    out = {}
    for r in rows:
        tokens = r[col["class"]].split()[:MAX_GENRES]
        g = np.full(MAX_GENRES, b"", dtype=object)
        g[:len(tokens)] = [t.encode() for t in tokens]
        out[int(r[col["item_id"]])] = g
    return out


def _histories(user, order_time, base_user, base_item, base_time, max_len,
               inclusive: bool, exclude_self: bool) -> np.ndarray:
    """For each query row, the user's base items before it (time order).

    Base interactions are sorted by (user, time, file order). A query
    (u, t) takes the base items of u with time < t (or <= t when
    `inclusive`); for training rows, which are themselves the base rows,
    `exclude_self` restricts to rows strictly earlier in that order.
    """
    order = np.lexsort((np.arange(base_user.size), base_time, base_user))
    su, st, si = base_user[order], base_time[order], base_item[order]
    start = np.searchsorted(su, user, side="left")
    if exclude_self:
        # rank of each base row within the sorted order = its position
        rank = np.empty(order.size, np.int64)
        rank[order] = np.arange(order.size)
        end = rank  # query row i == base row i: strictly before itself
    else:
        u_end = np.searchsorted(su, user, side="right")
        end = np.empty(user.size, np.int64)
        for i in range(user.size):  # 10k test rows: a loop is fine
            times = st[start[i]:u_end[i]]
            end[i] = start[i] + np.searchsorted(
                times, order_time[i], side="right" if inclusive else "left")
    out = np.full((user.size, max_len), -1, np.int64)
    for i in range(user.size):
        lo = max(start[i], end[i] - max_len)
        h = si[lo:end[i]]
        out[i, :h.size] = h
    return out


def _examples(ratings, history, users, genres, probs) -> Examples:
    user, item = ratings[:, 0], ratings[:, 1]
    out: Examples = {"user_id": user.astype(np.int64)}
    for name in USER_FEATURES:
        out[name] = np.array([users.get(int(u), {}).get(name, b"")
                              for u in user], dtype=object)
    out["history"] = history
    out["item_id"] = item.astype(np.int64)
    out["genres"] = np.stack([genres[int(i)] for i in item])
    out["item_prob"] = np.array([probs.get(int(i), 0.0) for i in item],
                                np.float32)
    return out


def load_movielens(data_dir: str, history_max_length: int = 50,
                   causal_test_history: bool = True) -> MovieLens:
    """Reads ua.base / ua.test and the user and item files; see the module
    docstring for the history rules.

    Args:
      data_dir: the directory of the four files.
      history_max_length: ids kept per history (the most recent).
      causal_test_history: a test example's history stops at its time.

    Example:
        ```python
        data = tn.data.load_movielens("../shared/data/movielens", history_max_length=20)
        ```
    """
    paths = {n: os.path.join(data_dir, n)
             for n in (BASE_FILE, TEST_FILE, USER_FILE, ITEM_FILE)}
    missing = [p for p in paths.values() if not os.path.exists(p)]
    if missing:
        raise FileNotFoundError(
            f"MovieLens files missing: {missing}; point --movielens_dir (or "
            "data_dir) at the directory holding ua.base/ua.test and the "
            "RecBole .user/.item files")
    if history_max_length < 1:
        raise ValueError("history_max_length must be >= 1, got "
                         f"{history_max_length}")
    base = _read_ratings(paths[BASE_FILE])
    test = _read_ratings(paths[TEST_FILE])
    users = _users(paths[USER_FILE])
    genres = _genres(paths[ITEM_FILE])
    unknown = set(np.unique(np.concatenate([base[:, 1], test[:, 1]]))) - set(genres)
    if unknown:
        raise ValueError(f"{paths[ITEM_FILE]}: no genres for items "
                         f"{sorted(unknown)[:10]}")
    ids, counts = np.unique(base[:, 1], return_counts=True)
    item_counts = {int(i): int(c) for i, c in zip(ids, counts)}
    probs = {i: c / base.shape[0] for i, c in item_counts.items()}
    train_hist = _histories(base[:, 0], base[:, 3], base[:, 0], base[:, 1],
                            base[:, 3], history_max_length, inclusive=False,
                            exclude_self=True)
    test_time = (test[:, 3] if causal_test_history
                 else np.full(test.shape[0], np.iinfo(np.int64).max))
    test_hist = _histories(test[:, 0], test_time, base[:, 0], base[:, 1],
                           base[:, 3], history_max_length, inclusive=True,
                           exclude_self=False)
    catalogue = np.array(sorted(genres), np.int64)
    items = {"item_id": catalogue,
             "genres": np.stack([genres[int(i)] for i in catalogue]),
             "item_prob": np.array([probs.get(int(i), 0.0) for i in catalogue],
                                   np.float32)}
    data = MovieLens(train=_examples(base, train_hist, users, genres, probs),
                     test=_examples(test, test_hist, users, genres, probs),
                     items=items, item_counts=item_counts,
                     history_max_length=history_max_length)
    data._users = users
    return data


def popularity_recall(item_counts: Dict[int, int], test_items,
                      ks=(10, 50, 100)) -> Dict[str, float]:
    """Recall@k of recommending the k most-watched training items to
    everyone: the baseline a retrieval model has to beat.

    Args:
      item_counts: {item id: training interactions}.
      test_items: `[N]` the held-out items.
      ks: the k of recall@k.

    Example:
        ```python
        print(tn.data.popularity_recall(data.item_counts, data.test["item_id"]))
        ```
    """
    ranked = [i for i, _ in sorted(item_counts.items(),
                                   key=lambda kv: (-kv[1], kv[0]))]
    test_items = np.asarray(test_items)
    return {f"recall_at_{k}": float(np.isin(test_items, ranked[:k]).mean())
            for k in ks}


def movielens_dataset(examples: Examples, batch_size: int,
                      shuffle_buffer: int = 0, seed: Optional[int] = None,
                      repeat: bool = False,
                      drop_remainder: bool = False) -> tf.data.Dataset:
    """Batches of feature dicts (in-batch negatives: no labels needed).

    Args:
      examples: {feature: array [N, ...]} (`MovieLens.train` or `.test`).
      batch_size: examples per batch.
      shuffle_buffer: examples shuffled (0: none).
      seed: the shuffle seed.
      repeat: repeat forever.
      drop_remainder: drop a short last batch.

    Example:
        ```python
        model.fit(tn.data.movielens_dataset(data.train, 1024, shuffle_buffer=100_000), epochs=3)
        ```
    """
    ds = tf.data.Dataset.from_tensor_slices(dict(examples))
    if shuffle_buffer:
        ds = ds.shuffle(shuffle_buffer, seed=seed,
                        reshuffle_each_iteration=True)
    if repeat:
        ds = ds.repeat()
    return ds.batch(batch_size, drop_remainder=drop_remainder).prefetch(2)


def save_examples(examples: Examples, path: str) -> str:
    """Writes unbatched examples with `tf.data.Dataset.save` (atomically:
    a temporary sibling renamed into place) and returns the path."""
    if os.path.exists(path):
        return path
    tmp = f"{path}.tmp{os.getpid()}"
    tf.data.Dataset.from_tensor_slices(dict(examples)).save(tmp)
    os.replace(tmp, path)
    return path


def load_examples_dataset(path: str, batch_size: int, shuffle_buffer: int = 0,
                          seed: Optional[int] = None, repeat: bool = False,
                          input_context=None) -> tf.data.Dataset:
    """Reads what `save_examples` wrote, pure tf.data (usable in a
    ParameterServerStrategy dataset_fn); each input pipeline takes its
    shard of the examples."""
    ds = tf.data.Dataset.load(path)
    if input_context is not None and input_context.num_input_pipelines > 1:
        ds = ds.shard(input_context.num_input_pipelines,
                      input_context.input_pipeline_id)
    if shuffle_buffer:
        ds = ds.shuffle(shuffle_buffer, seed=seed,
                        reshuffle_each_iteration=True)
    if repeat:
        ds = ds.repeat()
    return ds.batch(batch_size).prefetch(2)
