"""Each sparse rule against stock TensorFlow or a numpy reference.

The reference runs the same steps on a dense copy of the rows: Adagrad and
FTRL through TF's own sparse apply ops (after summing duplicate indices, as
Keras does), SGD, row-wise Adagrad and Adam in numpy float32. Several steps,
duplicate keys, several shards; 1e-6 relative tolerance.
"""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tnet as tn

VOCAB = 40
DIM = 5
STEPS = 6


def _batches(seed: int):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(STEPS):
        n = int(rng.integers(10, 30))
        keys = rng.integers(0, VOCAB, size=n).astype(np.int64)  # duplicates
        keys = keys * 7919 - 3 * VOCAB  # spread, include negative keys
        grads = rng.normal(size=(n, DIM)).astype(np.float32)
        out.append((keys, grads))
    return out


def _all_keys():
    return (np.arange(VOCAB, dtype=np.int64) * 7919 - 3 * VOCAB)


def _dedup(keys, grads):
    uniq, idx = np.unique(keys, return_inverse=True)
    summed = np.zeros((len(uniq), grads.shape[1]), np.float32)
    np.add.at(summed, idx, grads)
    return uniq, summed


def _row_index(keys):
    return {int(k): i for i, k in enumerate(_all_keys())}


def _slots_by_key(table):
    keys, _, slots, _ = table.export()
    order = np.argsort(keys.numpy())
    return keys.numpy()[order], slots.numpy()[order]


def _check_weights(table, expected):
    got = table.pull(_all_keys(), training=False).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("num_shards", [1, 3])
def test_adagrad_matches_resource_sparse_apply_adagrad_v2(num_shards):
    lr, init_acc, eps = 0.1, 0.1, 1e-7
    table = tn.SparseTable("adagrad", DIM, tn.optimizer.Adagrad(
        lr, initial_accumulator_value=init_acc, epsilon=eps),
        num_shards=num_shards)
    w0 = table.pull(_all_keys(), training=True).numpy()
    var = tf.Variable(w0)
    acc = tf.Variable(np.full_like(w0, init_acc))
    pos = _row_index(None)
    for keys, grads in _batches(1):
        table.push(keys, grads)
        uniq, summed = _dedup(keys, grads)
        tf.raw_ops.ResourceSparseApplyAdagradV2(
            var=var.handle, accum=acc.handle, lr=np.float32(lr),
            epsilon=np.float32(eps), grad=summed,
            indices=np.array([pos[int(k)] for k in uniq], np.int64))
    _check_weights(table, var.numpy())
    keys, slots = _slots_by_key(table)
    np.testing.assert_allclose(
        slots, acc.numpy()[[pos[int(k)] for k in keys]], rtol=1e-6)


@pytest.mark.parametrize("lr_power,num_shards", [(-0.5, 1), (-0.5, 2),
                                                  (-0.3, 2), (0.0, 1)])
def test_ftrl_matches_resource_sparse_apply_ftrl_v2(lr_power, num_shards):
    lr, l1, l2, shrink, beta, init_acc = 0.2, 0.01, 0.02, 0.03, 0.5, 0.1
    table = tn.SparseTable("ftrl", DIM, tn.optimizer.Ftrl(
        lr, learning_rate_power=lr_power, initial_accumulator_value=init_acc,
        l1_regularization_strength=l1, l2_regularization_strength=l2,
        l2_shrinkage_regularization_strength=shrink, beta=beta),
        initializer="uniform", num_shards=num_shards)
    w0 = table.pull(_all_keys(), training=True).numpy()
    var = tf.Variable(w0)
    acc = tf.Variable(np.full_like(w0, init_acc))
    lin = tf.Variable(np.zeros_like(w0))
    pos = _row_index(None)
    for keys, grads in _batches(2):
        table.push(keys, grads)
        uniq, summed = _dedup(keys, grads)
        # Keras Ftrl folds beta into l2 exactly like this.
        tf.raw_ops.ResourceSparseApplyFtrlV2(
            var=var.handle, accum=acc.handle, linear=lin.handle, grad=summed,
            indices=np.array([pos[int(k)] for k in uniq], np.int64),
            lr=np.float32(lr), l1=np.float32(l1),
            l2=np.float32(l2) + np.float32(beta) / (np.float32(2) * np.float32(lr)),
            l2_shrinkage=np.float32(shrink), lr_power=np.float32(lr_power))
    _check_weights(table, var.numpy())
    keys, slots = _slots_by_key(table)
    rows = [pos[int(k)] for k in keys]
    np.testing.assert_allclose(slots[:, :DIM], acc.numpy()[rows], rtol=1e-6)
    np.testing.assert_allclose(slots[:, DIM:], lin.numpy()[rows], rtol=1e-6,
                               atol=1e-7)


@pytest.mark.parametrize("num_shards", [1, 2])
def test_sgd_matches_numpy(num_shards):
    lr = np.float32(0.05)
    table = tn.SparseTable("sgd", DIM, tn.optimizer.SGD(float(lr)),
                           num_shards=num_shards)
    w = table.pull(_all_keys(), training=True).numpy()
    pos = _row_index(None)
    for keys, grads in _batches(3):
        table.push(keys, grads)
        uniq, summed = _dedup(keys, grads)
        for k, g in zip(uniq, summed):
            w[pos[int(k)]] -= lr * g
    _check_weights(table, w)


@pytest.mark.parametrize("num_shards", [1, 2])
def test_rowwise_adagrad_matches_numpy(num_shards):
    lr, init_acc, eps = np.float32(0.1), np.float32(0.1), np.float32(1e-7)
    table = tn.SparseTable("rowwise", DIM, tn.optimizer.RowwiseAdagrad(
        float(lr), initial_accumulator_value=float(init_acc),
        epsilon=float(eps)), num_shards=num_shards)
    w = table.pull(_all_keys(), training=True).numpy()
    acc = np.full(VOCAB, init_acc, np.float32)
    pos = _row_index(None)
    for keys, grads in _batches(4):
        table.push(keys, grads)
        uniq, summed = _dedup(keys, grads)
        for k, g in zip(uniq, summed):
            i = pos[int(k)]
            acc[i] += np.float32(np.sum(g * g, dtype=np.float32) / np.float32(DIM))
            w[i] -= (lr / (np.sqrt(acc[i]) + eps)) * g
    _check_weights(table, w)
    keys, slots = _slots_by_key(table)
    np.testing.assert_allclose(slots[:, 0], acc[[pos[int(k)] for k in keys]],
                               rtol=1e-6)


@pytest.mark.parametrize("num_shards", [1, 3])
def test_adam_matches_numpy_with_per_row_step(num_shards):
    lr, b1, b2, eps = (np.float32(x) for x in (0.01, 0.9, 0.999, 1e-7))
    table = tn.SparseTable("adam", DIM, tn.optimizer.Adam(
        float(lr), beta_1=float(b1), beta_2=float(b2), epsilon=float(eps)),
        num_shards=num_shards)
    w = table.pull(_all_keys(), training=True).numpy()
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    t = np.zeros(VOCAB, np.float32)  # each row counts its own updates
    pos = _row_index(None)
    one = np.float32(1)
    for keys, grads in _batches(5):
        table.push(keys, grads)
        uniq, summed = _dedup(keys, grads)
        for k, g in zip(uniq, summed):
            i = pos[int(k)]
            t[i] += 1
            alpha = lr * np.sqrt(one - b2 ** t[i]) / (one - b1 ** t[i])
            m[i] = b1 * m[i] + (one - b1) * g
            v[i] = b2 * v[i] + (one - b2) * g * g
            w[i] -= alpha * m[i] / (np.sqrt(v[i]) + eps)
    _check_weights(table, w)
    keys, slots = _slots_by_key(table)
    rows = [pos[int(k)] for k in keys]
    np.testing.assert_allclose(slots[:, 2 * DIM], t[rows])
    np.testing.assert_allclose(slots[:, :DIM], m[rows], rtol=1e-6, atol=1e-9)


def test_learning_rate_schedule_is_called_with_step():
    table = tn.SparseTable("sched", 2, tn.optimizer.sparse.SGD(
        lambda step: 0.5 * tf.cast(step, tf.float32)), initializer="zeros")
    table.push([7], [[1.0, 2.0]], step=4)  # lr = 2
    np.testing.assert_array_equal(table.pull([7]).numpy(), [[-2.0, -4.0]])


def test_rules_are_registered_once_and_slot_counts_come_from_the_kernel():
    """Python's rule list, the CLI's choices and the stock-Keras mapping all
    derive from the registrations; each rule's slot count is what its table
    actually exports."""
    from tnet.optimizer import sparse
    assert set(sparse._BY_NAME) == {"sgd", "adagrad", "rowwise_adagrad",
                                    "adam", "ftrl"}
    assert set(tn.optimizer.names()) == set(sparse._BY_NAME)
    for name, cls in sparse._BY_NAME.items():
        assert tn.optimizer.by_name(name).rule_class is cls
        assert isinstance(tn.optimizer.by_name(name)().sparse_rule, cls)
        table = tn.table.SparseTable(f"slots_{name}", dim=3, optimizer=name,
                                     num_shards=1)
        table.pull(tf.constant([5], tf.int64), training=True)
        slots = np.asarray(table.export()[2])
        assert slots.shape == (1, cls().num_slots(3)), name
    assert [sparse.SGD().num_slots(8), sparse.Adagrad().num_slots(8),
            sparse.RowwiseAdagrad().num_slots(8), sparse.Adam().num_slots(8),
            sparse.Ftrl().num_slots(8)] == [0, 8, 1, 17, 16]
    # Stock Keras optimizers map by class to the rule with their settings.
    rule = tn.optimizer.sparse_rule_of(tf_keras_adam(epsilon=0.5))
    assert isinstance(rule, sparse.Adam) and rule.epsilon == 0.5


def tf_keras_adam(**kwargs):
    import tf_keras
    return tf_keras.optimizers.Adam(**kwargs)


def test_unknown_rule_is_rejected_by_the_kernel_with_the_list():
    from tnet import _ops
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="unknown optimizer 'momentum'.*sgd, adagrad"):
        _ops.tnet_sparse_rule_slots(optimizer="momentum", dim=4)
    with pytest.raises(ValueError, match="no tnet optimizer for rule"):
        tn.optimizer.by_name("momentum")


def _first_accumulators(optimizer):
    """The Adagrad accumulator of a new row after one push of gradient 1."""
    table = tn.SparseTable("acc_start", 2, optimizer, num_shards=1)
    key = tf.constant([11], tf.int64)
    table.pull(key, training=True)
    table.push(key, np.ones((1, 2), np.float32))
    return np.asarray(table.export()[2])[0]


def test_adagrad_rows_start_near_zero_dense_keeps_keras_start():
    """Default: dense accumulators start at Keras' 0.1 (the Keras optimizer
    itself), table rows at 1e-6 (issue 54: chosen for one pass and early
    stopping); initial_accumulator_value given sets both
    (as in Keras), row_initial_accumulator_value the rows alone; the
    setting survives get_config/from_config; a stock tf_keras Adagrad maps
    to the row default unless its value is not Keras' own."""
    import tf_keras
    from tnet.optimizer import sparse

    def starts(opt):
        dense = opt.get_config()["initial_accumulator_value"]
        return dense, opt.sparse_rule.initial_accumulator_value

    assert sparse.ROW_INITIAL_ACCUMULATOR_VALUE == 1e-6
    assert starts(tn.optimizer.Adagrad(0.05)) == (0.1, 1e-6)
    assert starts(tn.optimizer.RowwiseAdagrad(0.05)) == (0.1, 1e-6)
    assert starts(tn.optimizer.Adagrad(
        0.05, initial_accumulator_value=0.1)) == (0.1, 0.1)
    assert starts(tn.optimizer.Adagrad(
        0.05, initial_accumulator_value=0.3)) == (0.3, 0.3)
    keras_rows = tn.optimizer.Adagrad(0.05, row_initial_accumulator_value=0.1)
    assert starts(keras_rows) == (0.1, 0.1)
    assert starts(tn.optimizer.Adagrad.from_config(
        keras_rows.get_config())) == (0.1, 0.1)
    assert starts(tn.optimizer.Adagrad.from_config(
        tn.optimizer.Adagrad(0.05).get_config())) == (0.1, 1e-6)
    assert sparse.Adagrad().initial_accumulator_value == 1e-6
    assert tn.optimizer.sparse_rule_of(tf_keras.optimizers.Adagrad(
        0.05)).initial_accumulator_value == 1e-6
    assert tn.optimizer.sparse_rule_of(tf_keras.optimizers.Adagrad(
        0.05, initial_accumulator_value=0.3)).initial_accumulator_value == 0.3
    # FTRL rows keep Keras' start (not changed: see BENCHMARKS.md).
    assert tn.optimizer.Ftrl(0.1).sparse_rule.initial_accumulator_value == 0.1
    # The rows really start there: 1.000001 and 1.1 after one push of 1.
    np.testing.assert_allclose(
        _first_accumulators(tn.optimizer.Adagrad(0.05)), [1.000001] * 2,
        rtol=1e-6)
    np.testing.assert_allclose(_first_accumulators(keras_rows), [1.1] * 2,
                               rtol=1e-6)
    # The dense half is Keras' Adagrad with its own start.
    var = tf.Variable([1.0, 2.0])
    opt = tn.optimizer.Adagrad(0.05)
    opt.apply_gradients([(tf.constant([1.0, 1.0]), var)])
    np.testing.assert_allclose(opt.variables()[-1].numpy(), [1.1, 1.1],
                               rtol=1e-6)


def test_keras_row_settings_give_a_keras_embeddings_update():
    """Rows at Keras' settings (start 0.1, start_reference_batch=None)
    against a tf_keras Embedding under tf_keras Adagrad, from the same
    values, under a softmax loss summed over a batch of 512 with repeated
    ids (what tfrs' Retrieval does): equal to float rounding after every
    step. At tnet's row defaults (1e-6, scaled by the batch) they part."""
    import tf_keras
    rng = np.random.default_rng(0)
    vocab, dim, batch = 50, 4, 512
    ids = rng.zipf(1.5, size=(4, batch)) % vocab
    query = tf.constant(rng.normal(size=(batch, dim)).astype(np.float32))

    def loss(rows):
        logits = tf.matmul(query, rows, transpose_b=True)
        return tf.reduce_sum(tf.nn.softmax_cross_entropy_with_logits(
            tf.eye(batch), logits))

    def worst_difference(optimizer):
        table = tn.SparseTable("rows", dim, optimizer.sparse_rule,
                               initializer="uniform", num_shards=1)
        keys = tf.constant(np.arange(vocab, dtype=np.int64))
        start = table.pull(keys, training=True).numpy()
        emb = tf_keras.layers.Embedding(vocab, dim, embeddings_initializer=(
            tf_keras.initializers.Constant(start)))
        emb.build((None,))
        keras_opt = tf_keras.optimizers.Adagrad(0.1)
        worst = 0.0
        for step in ids:
            step = tf.constant(step.astype(np.int64))
            with tf.GradientTape(persistent=True) as tape:
                rows = table.pull(step, training=True, batch_size=batch)
                tape.watch(rows)
                mine, stock = loss(rows), loss(emb(step))
            table.push(step, tape.gradient(mine, rows), learning_rate=0.1,
                       batch_size=batch)
            keras_opt.apply_gradients(
                [(tape.gradient(stock, emb.embeddings), emb.embeddings)])
            worst = max(worst, float(np.abs(
                table.pull(keys).numpy() - emb.embeddings.numpy()).max()))
        return worst

    assert worst_difference(tn.optimizer.Adagrad(
        0.1, row_initial_accumulator_value=0.1,
        start_reference_batch=None)) < 1e-6
    assert worst_difference(tn.optimizer.Adagrad(0.1)) > 1e-3
