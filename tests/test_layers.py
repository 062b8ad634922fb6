"""EmbeddingFeatures and tn.Model against the same model written with dense
tf.Variable embeddings in stock TensorFlow."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import tnet as tn
from tnet import feature_column as fc
from tnet import scopes

DIM = 4
LR = 0.1
B = 16


def _columns():
    a = fc.category_column("a")
    b = fc.category_column("b")
    c = fc.category_column("c", dtype=tf.string)
    return [fc.embedding_column(a, DIM, combiner="mean"),
            fc.embedding_column(b, DIM, combiner="sum", table="bc"),
            fc.embedding_column(c, DIM, combiner="sqrtn", table="bc")]


def _batches(steps, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        a = rng.integers(0, 30, (B, 3))
        a[rng.random((B, 3)) < 0.3] = -1  # padding
        b = rng.integers(0, 20, B)
        c = np.array([f"s{v}" for v in rng.integers(0, 10, B)])
        c[rng.random(B) < 0.2] = ""  # padding: no id
        y = (rng.random(B) < 0.4).astype(np.float32)
        out.append(({"a": a, "b": b, "c": c}, y))
    return out


def _keys(feats):
    """Per-column (keys, example) as the layer computes them (salted)."""
    cols = _columns()
    res = []
    for col, salted in zip(cols, [False, True, True]):
        k, r, _, _ = fc.ids_to_keys(col.categorical_column,
                                    feats[col.categorical_column.key],
                                    salted=salted)
        res.append((k.numpy(), r.numpy()))
    return res


class _Reference:
    """The same model in stock TF: one tf.Variable row per key."""

    def __init__(self, batches, kernel, bias):
        keys = {"a": set(), "bc": set()}
        for feats, _ in batches:
            (ka, _), (kb, _), (kc, _) = _keys(feats)
            keys["a"].update(ka.tolist())
            keys["bc"].update(kb.tolist() + kc.tolist())
        self.index, self.vars = {}, {}
        for name, ks in keys.items():
            ks = np.array(sorted(ks), np.int64)
            init = tn.SparseTable(f"ref_{name}", DIM).pull(ks, training=True)
            self.index[name] = {int(k): i for i, k in enumerate(ks)}
            self.vars[name] = tf.Variable(init)
        self.kernel = tf.Variable(kernel)
        self.bias = tf.Variable(bias)

    def step(self, feats, y):
        cols = _keys(feats)
        tables = ["a", "bc", "bc"]
        combiners = ["mean", "sum", "sqrtn"]
        with tf.GradientTape() as tape:
            parts = []
            for (k, r), t, comb in zip(cols, tables, combiners):
                rows = tf.gather(self.vars[t], [self.index[t][int(x)] for x in k])
                total = tf.math.unsorted_segment_sum(rows, r, B)
                n = np.bincount(r, minlength=B).astype(np.float32)[:, None]
                if comb == "mean":
                    total = tf.math.divide_no_nan(total, n)
                elif comb == "sqrtn":
                    total = tf.math.divide_no_nan(total, np.sqrt(n))
                parts.append(total)
            logits = tf.matmul(tf.concat(parts, 1), self.kernel) + self.bias
            loss = tf.reduce_mean(tf_keras.losses.binary_crossentropy(
                y[:, None], tf.sigmoid(logits)))
        variables = [self.vars["a"], self.vars["bc"], self.kernel, self.bias]
        for v, g in zip(variables, tape.gradient(loss, variables)):
            if isinstance(g, tf.IndexedSlices):
                v.scatter_sub(tf.IndexedSlices(LR * g.values, g.indices))
            else:
                v.assign_sub(LR * g)


def _check_against_reference(model, emb_layer, dense, batches, ref):
    np.testing.assert_allclose(dense.kernel.numpy(), ref.kernel.numpy(),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dense.bias.numpy(), ref.bias.numpy(),
                               rtol=1e-5, atol=1e-6)
    for name in ("a", "bc"):
        keys = np.array(sorted(ref.index[name]), np.int64)
        got = emb_layer.tables[name].pull(keys).numpy()
        want = ref.vars[name].numpy()[[ref.index[name][int(k)] for k in keys]]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _dataset(batches):
    def gen():
        for feats, y in batches:
            yield {"a": feats["a"], "b": feats["b"], "c": feats["c"]}, y
    sig = ({"a": tf.TensorSpec([B, 3], tf.int64), "b": tf.TensorSpec([B], tf.int64),
            "c": tf.TensorSpec([B], tf.string)}, tf.TensorSpec([B], tf.float32))
    return tf.data.Dataset.from_generator(gen, output_signature=sig)


def test_functional_model_matches_dense_variable_reference():
    steps = 5
    batches = _batches(steps)
    inputs = {"a": tf_keras.Input((3,), dtype=tf.int64, name="a"),
              "b": tf_keras.Input((), dtype=tf.int64, name="b"),
              "c": tf_keras.Input((), dtype=tf.string, name="c")}
    emb = tn.layers.EmbeddingFeatures(_columns())
    dense = tf_keras.layers.Dense(1, activation="sigmoid")
    model = tn.Model(inputs, dense(emb(inputs)))
    model.compile(tn.optimizer.SGD(LR), loss="binary_crossentropy")
    ref = _Reference(batches, dense.kernel.numpy(), dense.bias.numpy())
    model.fit(_dataset(batches), epochs=1, verbose=0)
    for feats, y in batches:
        ref.step(feats, y)
    _check_against_reference(model, emb, dense, batches, ref)


class _Ranker(tn.Model):
    """TFRS style: compute_loss gets the dataset element as it is."""

    def __init__(self):
        super().__init__()
        self.emb = tn.layers.EmbeddingFeatures(_columns())
        self.dense = tf_keras.layers.Dense(1)
        self.task = tf_keras.losses.BinaryCrossentropy(from_logits=False)

    def call(self, features, training=False):
        return tf.sigmoid(self.dense(self.emb(features, training=training)))

    def compute_loss(self, inputs, training=False):
        features, labels = inputs
        return self.task(labels[:, None], self(features, training=training))


def test_tfrs_style_model_matches_dense_variable_reference():
    batches = _batches(4, seed=1)
    model = _Ranker()
    model.compile(tn.optimizer.SGD(LR))
    model(batches[0][0])  # build, so the reference can copy the kernel
    for table in model.emb.tables.values():  # building pulled nothing
        assert int(table.size()) == 0
    ref = _Reference(batches, model.dense.kernel.numpy(), model.dense.bias.numpy())
    model.fit(_dataset(batches), epochs=1, verbose=0)
    for feats, y in batches:
        ref.step(feats, y)
    _check_against_reference(model, model.emb, model.dense, batches, ref)


def test_evaluate_and_predict_create_no_rows():
    batches = _batches(3, seed=2)
    model = _Ranker()
    model.compile(tn.optimizer.Adagrad(0.1))
    model.fit(_dataset(batches[:1]), verbose=0)
    sizes = {n: int(t.size()) for n, t in model.emb.tables.items()}
    model.evaluate(_dataset(batches[1:]), verbose=0)
    model.predict(_dataset(batches[1:]).map(lambda f, y: f), verbose=0)
    assert {n: int(t.size()) for n, t in model.emb.tables.items()} == sizes


def test_batch_with_more_unique_ids_than_any_before():
    model = _Ranker()
    model.compile(tn.optimizer.Adagrad(0.1))
    small = _batches(2, seed=3)
    model.fit(_dataset(small), verbose=0)
    big_b = 4096
    rng = np.random.default_rng(4)
    feats = {"a": rng.integers(10**6, 10**12, (big_b, 3)),
             "b": rng.integers(10**6, 10**12, big_b),
             "c": np.array([f"x{v}" for v in rng.integers(0, 10**9, big_b)])}
    y = np.ones(big_b, np.float32)
    model.fit(tf.data.Dataset.from_tensors((feats, y)), verbose=0)
    assert int(model.emb.tables["a"].size()) > 3 * big_b * 0.9


def test_missing_feature_is_an_error_naming_the_column():
    layer = tn.layers.EmbeddingFeatures(_columns())
    with pytest.raises(KeyError, match="'c'"):
        layer({"a": np.zeros((2, 3), np.int64), "b": np.zeros(2, np.int64)})


def test_float_ids_are_an_error_naming_the_column():
    layer = tn.layers.EmbeddingFeatures(_columns()[:1])
    with pytest.raises(TypeError, match="'a'.*float"):
        layer({"a": np.zeros((2, 3), np.float32)})


def test_wrong_rank_is_an_error_naming_the_column():
    layer = tn.layers.EmbeddingFeatures(_columns()[:1])
    with pytest.raises(ValueError, match="'a'.*shape"):
        layer({"a": np.zeros((2, 3, 4), np.int64)})


def test_shared_table_with_different_dims_is_an_error():
    a = fc.embedding_column(fc.category_column("a"), 4, table="t")
    b = fc.embedding_column(fc.category_column("b"), 8, table="t")
    with pytest.raises(ValueError, match="'t'.*a=4, b=8"):
        tn.layers.EmbeddingFeatures([a, b])


def test_ragged_sparse_and_dense_inputs_agree():
    col = fc.embedding_column(fc.category_column("a"), DIM, combiner="mean")
    layer = tn.layers.EmbeddingFeatures([col])
    dense = np.array([[1, 2, -1], [3, -1, -1], [-1, -1, -1]], np.int64)
    ragged = tf.ragged.constant([[1, 2], [3], []], dtype=tf.int64)
    sparse = tf.sparse.from_dense(tf.constant(dense + 1)) 
    sparse = tf.SparseTensor(sparse.indices, sparse.values - 1, sparse.dense_shape)
    a = layer({"a": dense}, training=True).numpy()
    np.testing.assert_array_equal(a, layer({"a": ragged}).numpy())
    np.testing.assert_array_equal(a, layer({"a": sparse}).numpy())
    # padding inside ragged / sparse values reads as nothing (not counted)
    ragged_pad = tf.ragged.constant([[1, -1, 2], [-1, 3], [-1]], dtype=tf.int64)
    np.testing.assert_array_equal(a, layer({"a": ragged_pad}).numpy())
    sparse_pad = tf.sparse.from_dense(tf.constant([[2, 0, 3], [0, 4, 0],
                                                   [0, 0, 0]], tf.int64))
    sparse_pad = tf.SparseTensor(sparse_pad.indices, sparse_pad.values - 1,
                                 sparse_pad.dense_shape)  # [[1, 2], [3], []]
    np.testing.assert_array_equal(a, layer({"a": sparse_pad}).numpy())
    with_pad = tf.SparseTensor([[0, 0], [0, 1], [0, 2], [1, 0], [2, 1]],
                               tf.constant([1, -1, 2, 3, -1], tf.int64), [3, 3])
    np.testing.assert_array_equal(a, layer({"a": with_pad}).numpy())
    np.testing.assert_array_equal(a[2], np.zeros(DIM))  # no ids: zeros
    rows = layer.tables["a"].pull([1, 2, 3]).numpy()
    np.testing.assert_allclose(a[0], rows[:2].mean(0), rtol=1e-6)


def test_sequence_features_truncate_to_most_recent():
    col = fc.embedding_column(fc.sequence_category_column("h", max_length=3), 2)
    layer = tn.layers.SequenceEmbeddingFeatures([col])
    ids = tf.ragged.constant([[1, 2, 3, 4, 5], [7], []], dtype=tf.int64)
    seq, lengths = layer({"h": ids}, training=True)
    rows = layer.tables["h"].pull([3, 4, 5, 7]).numpy()
    np.testing.assert_array_equal(lengths.numpy(), [3, 1, 0])
    np.testing.assert_array_equal(seq[0].numpy(), rows[:3])
    np.testing.assert_array_equal(seq[1].numpy(), [rows[3], [0, 0], [0, 0]])
    np.testing.assert_array_equal(seq[2].numpy(), np.zeros((3, 2)))
    assert int(layer.tables["h"].size()) == 4  # 1 and 2 were never pulled


def test_linear_features_learn_with_ftrl():
    cols = [fc.category_column("a"), fc.category_column("b")]
    inputs = {"a": tf_keras.Input((3,), dtype=tf.int64, name="a"),
              "b": tf_keras.Input((), dtype=tf.int64, name="b")}
    lin = tn.layers.LinearFeatures(cols)
    assert lin.tables == {} and lin._rule.name == "ftrl"  # the default
    # ... at lr 0.1 with its accumulators from 2.5e-4 (issue 54), not 0.1.
    assert lin._rule.initial_accumulator_value == 2.5e-4
    assert lin._rule.learning_rate == 0.1
    lin = tn.layers.LinearFeatures(cols, optimizer=tn.optimizer.sparse.Ftrl(1.0))
    model = tn.Model(inputs, tf_keras.layers.Activation("sigmoid")(lin(inputs)))
    model.compile(tn.optimizer.Adam(0.01), loss="binary_crossentropy")
    rng = np.random.default_rng(0)
    n = 2048
    b = rng.integers(0, 50, n)
    feats = {"a": rng.integers(0, 50, (n, 3)), "b": b}
    y = (b % 2).astype(np.float32)  # the label is a function of b's id
    hist = model.fit(feats, y, batch_size=128, epochs=6, verbose=0)
    assert hist.history["loss"][-1] < 0.5 * hist.history["loss"][0]
    # The learned weight of b's id follows its parity (salted key of col b).
    keys, _, _, _ = fc.ids_to_keys(cols[1], np.arange(50), salted=True)
    w = lin.tables["linear_features"].pull(keys).numpy()[:, 0]
    assert np.all(w[1::2] > 0) and np.all(w[0::2] < 0)


def test_batch_with_only_padding_reads_zeros_and_trains():
    model = _Ranker()
    model.compile(tn.optimizer.Adagrad(0.1))
    feats = {"a": np.full((4, 3), -1), "b": np.full(4, -1), "c": np.array([""] * 4)}
    out = model.emb(feats, training=True).numpy()
    np.testing.assert_array_equal(out, np.zeros((4, 3 * DIM)))
    model.fit(tf.data.Dataset.from_tensors((feats, np.ones(4, np.float32))),
              verbose=0)
    assert all(int(t.size()) == 0 for t in model.emb.tables.values())


def test_sample_weight_and_regularization_losses():
    """Zero sample weights leave tables and kernel untouched; an L2 kernel
    regularizer then moves the kernel by exactly lr * 2 * l2 * w (SGD)."""
    l2 = 0.01
    inputs = {"a": tf_keras.Input((3,), dtype=tf.int64, name="a")}
    emb = tn.layers.EmbeddingFeatures(_columns()[:1])
    dense = tf_keras.layers.Dense(
        1, activation="sigmoid",
        kernel_regularizer=tf_keras.regularizers.L2(l2))
    model = tn.Model(inputs, dense(emb(inputs)))
    model.compile(tn.optimizer.SGD(LR), loss="binary_crossentropy")
    feats = {"a": np.arange(12).reshape(4, 3)}
    y = np.ones(4, np.float32)
    model.fit(feats, y, sample_weight=np.ones(4, np.float32), verbose=0)
    rows = emb.tables["a"].pull(np.arange(12)).numpy()
    kernel = dense.kernel.numpy()
    model.fit(feats, y, sample_weight=np.zeros(4, np.float32), verbose=0)
    np.testing.assert_array_equal(emb.tables["a"].pull(np.arange(12)).numpy(), rows)
    np.testing.assert_allclose(dense.kernel.numpy(),
                               kernel - LR * 2 * l2 * kernel, rtol=1e-6)


class _Bias(tf_keras.layers.Layer):
    """x + b: a trainable variable that leaves d(out)/dx = 1."""

    def build(self, input_shape):
        self.b = self.add_weight(name="b", shape=(1,), initializer="zeros")

    def call(self, x):
        return x + self.b


def test_layer_own_schedule_follows_the_model_steps():
    """A layer given its own sparse rule with a schedule updates its table
    with that schedule at the model's step (it used to fall back to the
    model optimizer's rate). Loss = sum of the embedding, so each pushed
    gradient is exactly 1 and SGD moves the row by -lr(step)."""
    schedule = tf_keras.optimizers.schedules.PiecewiseConstantDecay(
        [0], [0.5, 0.05])  # step 0: 0.5, later: 0.05
    col = fc.embedding_column(fc.category_column("a"), DIM,
                              initializer="zeros")
    inputs = {"a": tf_keras.Input((), dtype=tf.int64, name="a")}
    emb = tn.layers.EmbeddingFeatures([col],
                                      optimizer=tn.optimizer.sparse.SGD(schedule))
    summed = tf_keras.layers.Lambda(
        lambda e: tf.reduce_sum(e, axis=1, keepdims=True))(emb(inputs))
    # A dense bias so the model optimizer has a variable (its iterations,
    # the step, advance only when it applies gradients).
    out = _Bias()(summed)
    model = tn.Model(inputs, out)
    model.compile(tn.optimizer.SGD(LR), loss=lambda y, p: tf.reduce_sum(p))
    feats = {"a": np.array([7])}
    table = next(iter(emb.tables.values()))
    keys, _, _, _ = fc.ids_to_keys(col.categorical_column, np.array([7]))
    seen = []
    for _ in range(3):
        model.fit(feats, np.zeros(1, np.float32), batch_size=1, verbose=0)
        seen.append(table.pull(keys).numpy()[0])
    np.testing.assert_allclose(seen[0], np.full(DIM, -0.5), rtol=1e-6)
    np.testing.assert_allclose(seen[1], np.full(DIM, -0.55), rtol=1e-6)
    np.testing.assert_allclose(seen[2], np.full(DIM, -0.60), rtol=1e-6)


def _recorded_step(layer, feats, upstream):
    """One traced training call of a one-table layer under a recording
    tape, loss sum(out * upstream): numpy (output, the lookup's unique
    keys, its pulled rows E, dE)."""
    from tnet import scopes

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            with scopes.recording(tape) as rec:
                out = layer(feats, training=True)
                loss = tf.reduce_sum(out * upstream)
        lk = rec.lookups[0]
        return out, lk.keys, lk.embeddings, tf.convert_to_tensor(
            tape.gradient(loss, lk.embeddings))

    return tuple(t.numpy() for t in step())


@pytest.mark.parametrize("order", [("d1", "r1", "d2", "r2"),
                                   ("r1", "d1", "d2", "r2"),
                                   ("r1", "r2", "d1", "d2"),
                                   ("d2", "d1", "r2", "r1")])
def test_dense_and_ragged_columns_in_any_order(order):
    """One shared table, dense-block and ragged columns in any order: every
    column's output and every row's gradient are exactly the same (the
    table's columns go through one combine, in the layer's column order)."""
    feats = {"d1": np.array([[1, -1], [2, 3], [-1, -1]], np.int64),
             "d2": np.array([5, 1, 7], np.int64),
             "r1": tf.ragged.constant([[1, 2, -1, 2], [], [4, -1]],
                                      dtype=tf.int64),
             "r2": tf.ragged.constant([[9], [1, 5], [3, 3]], dtype=tf.int64)}
    combiners = {"d1": "mean", "d2": "sum", "r1": "sqrtn", "r2": "mean"}
    rng = np.random.default_rng(0)
    weights = {n: rng.normal(size=(3, DIM)).astype(np.float32) for n in feats}

    def run(names):
        cols = [fc.embedding_column(fc.category_column(n), DIM,
                                    combiner=combiners[n], table="t")
                for n in names]
        layer = tn.layers.EmbeddingFeatures(cols)
        w = tf.constant(np.concatenate([weights[n] for n in names], 1))
        out, keys, _, grad = _recorded_step(layer, feats, w)
        per_col = {n: out[:, i * DIM:(i + 1) * DIM] for i, n in enumerate(names)}
        return per_col, dict(zip(keys.tolist(), grad))

    want_out, want_grad = run(("d1", "d2", "r1", "r2"))  # joined as is
    got_out, got_grad = run(order)
    for n in feats:
        np.testing.assert_array_equal(got_out[n], want_out[n])
    assert len(want_grad) == 13  # each column's keys are salted apart
    assert set(got_grad) == set(want_grad)
    for k, g in want_grad.items():
        np.testing.assert_array_equal(got_grad[k], g)
    assert np.abs(np.stack(list(want_grad.values()))).sum() > 0


@pytest.mark.parametrize("kinds", [
    ("b", "b1", "b", "b1"),          # [B] / [B, 1] only: the block combine
    ("b", "r", "p", "b1", "r"),      # blocks, ragged and padded mixed
    ("r", "p", "r"),                 # no block
    ("r",),                          # one column: unsalted
    ("b1",)])
def test_int_columns_keyed_in_one_op_exactly_as_per_column(kinds, monkeypatch):
    """TnetFlattenKeys (one op for all int columns of a table) gives the
    keys, the pull order, the outputs and every row's gradient of the
    per-column ops it replaces, bit for bit; its batch-size check names
    the features."""
    from tnet.layers import embedding_features as ef
    rng = np.random.default_rng(len(kinds))
    b = 37
    feats, cols = {}, []
    for j, kind in enumerate(kinds):
        name = f"{kind}{j}"
        ids = rng.integers(0, 9, (b, 6))
        ids[rng.random((b, 6)) < 0.3] = -1
        ids[3] = -1  # an example with no id
        if kind == "b":
            feats[name] = ids[:, 0]
        elif kind == "b1":
            feats[name] = tf.constant(ids[:, :1].astype(np.int32))
        elif kind == "p":
            feats[name] = ids
        else:
            feats[name] = tf.ragged.constant(
                [list(r[: rng.integers(0, 7)]) for r in ids], dtype=tf.int64)
        cols.append(fc.embedding_column(
            fc.category_column(name), DIM, table="t",
            combiner=("sum", "mean", "sqrtn")[j % 3]))
    upstream = rng.normal(size=(b, len(kinds) * DIM)).astype(np.float32)

    def run(fused):
        if not fused:
            monkeypatch.setattr(ef, "_int_pieces", lambda *a: None)
        layer = tn.layers.EmbeddingFeatures(cols)
        got = _recorded_step(layer, feats, upstream)
        types = {op.type for op in tf.function(lambda: layer(
            feats, training=True)).get_concrete_function().graph
            .get_operations()}
        monkeypatch.undo()
        assert ("TnetFlattenKeys" in types) == fused
        return got

    want, got = run(False), run(True)
    for w, g in zip(want, got):
        np.testing.assert_array_equal(g, w)
    assert np.abs(got[0]).sum() > 0 and np.abs(got[3]).sum() > 0

    if len(kinds) > 1:  # columns of different batch sizes: one clear error
        short = dict(feats)
        short[f"{kinds[-1]}{len(kinds) - 1}"] = (
            feats[f"{kinds[-1]}{len(kinds) - 1}"][:5])
        layer = tn.layers.EmbeddingFeatures(cols)
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=r"feature '\w+' has \d+ examples but "
                                 r"feature '\w+' has \d+"):
            layer(short, training=True)


@pytest.mark.parametrize("dtype", [tf.int64, tf.string])
def test_padded_columns_take_the_ragged_path_exactly(dtype):
    """A [B, L] column padded with -1 / "" is compacted (TnetCompactIds) and
    combined as the same ids given ragged: the layer output and every
    row's gradient are bit-identical; a serving export uses stock ops."""
    rng = np.random.default_rng(5)
    b = 9
    pad = rng.integers(0, 6, (b, 5))
    pad[rng.random((b, 5)) < 0.5] = -1
    pad[2] = -1  # an all-padding row
    lists = [[i for i in row if i >= 0] for row in pad]
    conv = (lambda a: np.where(a < 0, "", a.astype(str)).astype(object)) \
        if dtype == tf.string else (lambda a: a)
    single = rng.integers(0, 4, b)
    forms = {"padded": tf.constant(conv(pad), dtype),
             "ragged": tf.ragged.constant(
                 [list(conv(np.array(r, np.int64))) for r in lists],
                 dtype=dtype, ragged_rank=1)}
    upstream = rng.normal(size=(b, 2 * DIM)).astype(np.float32)
    got = {}
    for form, ids in forms.items():
        cols = [fc.embedding_column(fc.category_column("m", dtype=dtype), DIM,
                                    combiner="mean", table="t"),
                fc.embedding_column(fc.category_column("one"), DIM,
                                    table="t")]
        layer = tn.layers.EmbeddingFeatures(cols)
        out, keys, rows, grad = _recorded_step(
            layer, {"m": ids, "one": single}, upstream)
        got[form] = (out, dict(zip(keys.tolist(), grad)))
        if form == "padded":
            graph = tf.function(lambda: layer(
                {"m": ids, "one": single}, training=True)
            ).get_concrete_function().graph
            types = {op.type for op in graph.get_operations()}
            # int ids: every column keyed by one TnetFlattenKeys (which
            # drops the padding); strings: compacted per column.
            assert ("TnetFlattenKeys" if dtype == tf.int64
                    else "TnetCompactIds") in types
            assert "TnetEmbedCombine" not in types
    np.testing.assert_array_equal(got["padded"][0], got["ragged"][0])
    assert got["padded"][1].keys() == got["ragged"][1].keys()
    for k, g in got["ragged"][1].items():
        np.testing.assert_array_equal(got["padded"][1][k], g)
    assert np.abs(got["padded"][0]).sum() > 0
    assert not got["padded"][0][2, :DIM].any()  # all padding: zeros

    column = fc.category_column("m", dtype=dtype)

    def op_types():
        graph = tf.function(lambda: fc.padded_to_keys(
            column, forms["padded"])[0]).get_concrete_function().graph
        return {op.type for op in graph.get_operations()}

    assert "TnetCompactIds" in op_types()
    with scopes.serving_lookups({object(): None}):  # any table: serving
        assert "TnetCompactIds" not in op_types()
        served = fc.padded_to_keys(column, forms["padded"])
    trained = fc.padded_to_keys(column, forms["padded"])
    for a, c in zip(served[:3], trained[:3]):
        np.testing.assert_array_equal(a.numpy(), c.numpy())


@pytest.mark.parametrize("order", [("d1", "r1", "s1", "d2", "r2", "ds"),
                                   ("r2", "ds", "d2", "s1", "r1", "d1")])
def test_blocks_beside_ragged_and_sparse_columns_match_numpy(order):
    """A table read by dense-block columns ([B], [B, L] padded, strings) and
    ragged and sparse ones at once, in any column order: the layer's output
    and the gradient of each pulled row equal a float64 numpy computation
    from the pulled rows (the layer combines them in one kernel call)."""
    rng = np.random.default_rng(3)
    b = 7
    d1 = rng.integers(0, 5, (b, 3))
    d1[rng.random((b, 3)) < 0.4] = -1
    d1[0] = -1  # an all-padding row: zeros
    ds = np.array([[w] for w in "abcabca"], object)
    r1 = [list(rng.integers(-1, 6, rng.integers(0, 5))) for _ in range(b)]
    r2 = [list(rng.integers(0, 4, rng.integers(1, 3))) for _ in range(b)]
    feats = {"d1": d1, "d2": rng.integers(0, 9, b), "ds": ds,
             "r1": tf.ragged.constant(r1, dtype=tf.int64, ragged_rank=1),
             "r2": tf.ragged.constant(r2, dtype=tf.int64),
             "s1": tf.ragged.constant(r2, dtype=tf.int64).to_sparse()}
    lists = {"d1": [[i for i in row if i >= 0] for row in d1],
             "d2": [[i] for i in feats["d2"]], "ds": [[w] for w in "abcabca"],
             "r1": [[i for i in row if i >= 0] for row in r1],
             "r2": r2, "s1": r2}
    combiners = {"d1": "mean", "d2": "sum", "ds": "sqrtn", "r1": "mean",
                 "r2": "sqrtn", "s1": "sum"}
    cols = [fc.embedding_column(
        fc.category_column(n, dtype=tf.string if n == "ds" else tf.int64),
        DIM, combiner=combiners[n], table="t") for n in order]
    layer = tn.layers.EmbeddingFeatures(cols)
    upstream = rng.normal(size=(b, len(order) * DIM)).astype(np.float32)
    out, keys, rows, grad = _recorded_step(layer, feats, upstream)
    row_of = {k: i for i, k in enumerate(keys.tolist())}

    def key(name, i):
        ids = tf.constant([i], tf.string if name == "ds" else tf.int64)
        return int(fc.keys_of(ids, fc.column_salt(name)).numpy()[0])

    want = np.zeros((b, len(order) * DIM))
    want_grad = np.zeros(rows.shape)
    for j, name in enumerate(order):
        for e in range(b):
            at = [row_of[key(name, i)] for i in lists[name][e]]
            if not at:
                continue
            n = len(at)
            f = {"sum": 1.0, "mean": 1.0 / n, "sqrtn": 1.0 / np.sqrt(n)}[
                combiners[name]]
            want[e, j * DIM:(j + 1) * DIM] = rows[at].astype(np.float64).sum(0) * f
            for r in at:
                want_grad[r] += upstream[e, j * DIM:(j + 1) * DIM] * f
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-6, atol=1e-7)
    assert np.abs(out).sum() > 0 and len(row_of) == len(rows)


def test_concat_dense_is_a_dense_layer_over_the_concat(tmp_path):
    """tn.models' first MLP layer reads [embeddings, dense] as their concat
    without building it: output and every gradient match a Dense layer on
    the concat with the same weights, and a checkpoint of the plain Dense
    MLP (as tnet wrote before) restores into it."""
    import tf_keras
    from tnet.models.base import ConcatDense, mlp
    rng = np.random.default_rng(3)
    a = tf.constant(rng.normal(size=(33, 48)).astype(np.float32))
    b = tf.constant(rng.normal(size=(33, 13)).astype(np.float32))
    old = tf_keras.Sequential([tf_keras.layers.Dense(16, activation="relu"),
                               tf_keras.layers.Dense(1)])
    old(tf.concat([a, b], 1))
    tf.train.Checkpoint(deep=old).write(str(tmp_path / "ck"))
    new = mlp((16,), "deep")
    assert isinstance(new.layers[0], ConcatDense)
    new([a, b])
    tf.train.Checkpoint(deep=new).read(
        str(tmp_path / "ck")).assert_existing_objects_matched()
    grads = []
    for model in (old, new):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch([a, b])
            out = (model(tf.concat([a, b], 1)) if model is old
                   else model([a, b]))
            loss = tf.reduce_sum(out * out)
        grads.append((out, *tape.gradient(loss, [a, b]),
                      *tape.gradient(loss, model.trainable_weights)))
    assert np.abs(grads[0][0].numpy()).sum() > 0
    for want, got in zip(*grads):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=2e-5,
                                   atol=2e-5)
    single = mlp((8,), "single")  # one tensor in: a plain Dense
    np.testing.assert_array_equal(
        single(tf.concat([a, b], 1)).shape, (33, 1))


def test_autograph_converts_a_users_call_but_not_tnets_code():
    """tnet is among AutoGraph's do-not-convert modules (its graph code
    needs no conversion, and converting it cost seconds per process); a
    user's own subclassed model, with a Python `if` on a tensor that only
    AutoGraph can turn into a graph branch, still trains through fit."""
    from tensorflow.python.autograph.impl import conversion  # noqa: PLC0415
    from tnet.layers import embedding_features  # noqa: PLC0415
    assert conversion.is_allowlisted(embedding_features.EmbeddingFeatures.call)

    class Gated(tn.Model):
        def __init__(self):
            super().__init__()
            self.emb = tn.layers.EmbeddingFeatures(_columns())
            self.out = tf_keras.layers.Dense(1)

        def call(self, features):
            x = self.emb(features)
            if tf.reduce_sum(x) > 1e9:  # a graph branch only by AutoGraph
                x = x * 0.0
            return self.out(x)

    assert not conversion.is_allowlisted(Gated.call)
    model = Gated()
    model.compile(optimizer=tf_keras.optimizers.SGD(LR),
                  loss=tf_keras.losses.BinaryCrossentropy(from_logits=True))
    feats, y = _batches(1)[0]
    before = model(feats).numpy()
    model.fit(tf.data.Dataset.from_tensors((feats, y)).repeat(3), verbose=0)
    after = model(feats).numpy()
    assert np.isfinite(after).all() and not np.allclose(before, after)
