"""Every kernel rejects bad input with InvalidArgument and leaves the table
exactly as it was (compared through a full export before and after)."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tnet as tn
from tnet import _ops

DIM = 4
IAE = tf.errors.InvalidArgumentError


@pytest.fixture()
def table():
    t = tn.SparseTable("bad", DIM, "adagrad", num_shards=1)
    keys = np.arange(50)
    t.pull(keys, training=True)
    t.push(keys, np.ones((50, DIM), np.float32), step=3)
    return t


def _snapshot(t):
    keys, w, s, m = (x.numpy() for x in t.export())
    order = np.argsort(keys)
    return [keys[order], w[order], s[order], m[order], int(t.size())]


def _expect_rejected(t, fn, match):
    before = _snapshot(t)
    with pytest.raises(IAE, match=match):
        fn()
    after = _snapshot(t)
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)


def _h(t):
    return t.shards[0].resource_handle


def _push(t, keys, grads, lr=0.1, step=0, shows=(), clicks=(), dim=DIM):
    return _ops.sparse_table_push(
        _h(t), tf.constant(keys, tf.int64), tf.constant(grads, tf.float32),
        tf.constant(lr, tf.float32), tf.constant(step, tf.int64),
        tf.constant(shows, tf.float32, shape=[len(shows)]),
        tf.constant(clicks, tf.float32, shape=[len(clicks)]), dim=dim)


GOOD = np.ones((2, DIM), np.float32)


@pytest.mark.parametrize("name,call,match", [
    ("pull keys rank 2", lambda t: _ops.sparse_table_pull(
        _h(t), tf.constant([[1, 2]], tf.int64), True, dim=DIM), "1-D"),
    ("pull training not scalar", lambda t: _ops.sparse_table_pull(
        _h(t), tf.constant([1], tf.int64), [True, False], dim=DIM), "scalar"),
    ("pull other table's dim", lambda t: _ops.sparse_table_pull(
        _h(t), tf.constant([1, 999], tf.int64), True, dim=8), "dim 4"),
    ("push grads/keys length", lambda t: _push(t, [1, 2, 3], GOOD), r"\[3, 4\]"),
    ("push grads dim", lambda t: _push(t, [1, 2], np.ones((2, 3))), r"\[2, 4\]"),
    ("push other table's dim", lambda t: _push(
        t, [1, 2], np.ones((2, 8)), dim=8), "dim 4"),
    ("push nan grad", lambda t: _push(
        t, [1, 777], [[1, 1, 1, 1], [1, np.nan, 1, 1]]), "finite"),
    ("push inf grad", lambda t: _push(
        t, [1, 2], [[np.inf, 1, 1, 1], [1, 1, 1, 1]]), "finite"),
    ("push negative lr", lambda t: _push(t, [1, 2], GOOD, lr=-0.1), "learning_rate"),
    ("push nan lr", lambda t: _push(t, [1, 2], GOOD, lr=np.nan), "learning_rate"),
    ("push negative step", lambda t: _push(t, [1, 2], GOOD, step=-1), "step"),
    ("push shows length", lambda t: _push(t, [1, 2], GOOD, shows=[1.0]), "shows"),
    ("push negative clicks", lambda t: _push(
        t, [1, 2], GOOD, clicks=[1.0, -1.0]), "clicks"),
    ("export negative max_rows", lambda t: _ops.sparse_table_export(
        _h(t), tf.constant(0, tf.int64), tf.constant(-1, tf.int64), dim=DIM),
     "max_rows"),
    ("export bad cursor", lambda t: _ops.sparse_table_export(
        _h(t), tf.constant(-7, tf.int64), tf.constant(5, tf.int64), dim=DIM),
     "cursor"),
    ("export cursor past stripes", lambda t: _ops.sparse_table_export(
        _h(t), tf.constant(1 << 62, tf.int64), tf.constant(5, tf.int64),
        dim=DIM), "cursor"),
    ("import weights shape", lambda t: _ops.sparse_table_import(
        _h(t), tf.constant([1, 2], tf.int64), tf.ones([2, 3]), tf.ones([2, 4]),
        tf.zeros([2, 3], tf.float64), dim=DIM), "weights"),
    ("import slots shape", lambda t: _ops.sparse_table_import(
        _h(t), tf.constant([1, 2], tf.int64), tf.ones([2, 4]), tf.ones([2, 1]),
        tf.zeros([2, 3], tf.float64), dim=DIM), "slots"),
    ("import bad meta", lambda t: _ops.sparse_table_import(
        _h(t), tf.constant([1, 2], tf.int64), tf.ones([2, 4]), tf.ones([2, 4]),
        tf.constant([[0, 0, 0], [1, 0, -3]], tf.float64), dim=DIM), "meta"),
    ("evict decay > 1", lambda t: t.evict(show_decay_rate=1.5), "decay"),
    ("evict nan threshold", lambda t: t.evict(show_threshold=np.nan), "threshold"),
    ("evict negative ttl", lambda t: t.evict(ttl_steps=-2), "ttl"),
    ("evict negative step", lambda t: t.evict(current_step=-2), "current_step"),
])
def test_bad_input_is_invalid_argument_and_changes_nothing(table, name, call,
                                                           match):
    _expect_rejected(table, lambda: call(table), match)


@pytest.mark.parametrize("flat", [0, 15, 16, 255, 256, 65 * DIM - 1])
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_a_non_finite_gradient_anywhere_is_named_by_its_index(table, flat,
                                                            value):
    """The finiteness check scans 16 floats per step, then the tail: a bad
    value in either part, at either end, is found and named."""
    grads = np.full((65, DIM), 3.4e38, np.float32)  # large but finite
    grads.flat[flat] = value  # 260 floats: 16 blocks of 16, a tail of 4
    _expect_rejected(table, lambda: _push(table, np.arange(65), grads),
                     rf"element {flat} \(flat index\)")


def test_large_finite_gradients_pass_the_check(table):
    grads = np.full((33, DIM), -3.4e38, np.float32)
    grads[::2] = np.float32(1e-45)  # subnormal
    _push(table, np.arange(33), grads)


def test_overflowed_weights_round_trip_through_export_and_import(tmp_path):
    # A finite push can overflow a weight (SGD with lr 3e38): the checkpoint
    # written after it must restore exactly, inf included.
    t = tn.SparseTable("overflow", DIM, "sgd", num_shards=1)
    keys = np.arange(10)
    t.pull(keys, training=True)
    grads = np.full((10, DIM), -1.0, np.float32)
    grads[:3] = 1e10  # rows 0-2 overflow to -inf
    t.push(keys, grads, learning_rate=3e38)
    before = _snapshot(t)
    assert np.isinf(before[1][:3]).all() and np.isfinite(before[1][3:]).all()
    path = tf.train.Checkpoint(table=t).write(str(tmp_path / "ckpt"))
    fresh = tn.SparseTable("overflow", DIM, "sgd", num_shards=1)
    tf.train.Checkpoint(table=fresh).read(path).assert_consumed()
    for a, b in zip(before, _snapshot(fresh)):
        np.testing.assert_array_equal(a, b)
    copy = tn.SparseTable("overflow_copy", DIM, "sgd", num_shards=1)
    copy.import_rows(*t.export())
    for a, b in zip(before, _snapshot(copy)):
        np.testing.assert_array_equal(a, b)


def test_float_keys_are_rejected_with_the_table_name(table):
    with pytest.raises(TypeError, match="'bad'.*int64"):
        table.pull(tf.constant([1.0, 2.0]))
    with pytest.raises((TypeError, IAE)):
        _ops.sparse_table_pull(_h(table), tf.constant([1.0]), True, dim=DIM)


@pytest.mark.parametrize("attrs,match", [
    (dict(dim=0, optimizer="sgd"), "dim"),
    (dict(dim=4, optimizer="rmsprop"), "unknown optimizer"),
    (dict(dim=4, optimizer="adam", beta_1=1.0), "beta_1"),
    (dict(dim=4, optimizer="adam", beta_2=-0.1), "beta_2"),
    (dict(dim=4, optimizer="adagrad", epsilon=0.0,
          initial_accumulator_value=0.0), "divides by zero"),
    (dict(dim=4, optimizer="ftrl", learning_rate_power=0.5),
     "learning_rate_power"),
    (dict(dim=4, optimizer="ftrl", l1_regularization_strength=-1.0), "l1"),
    (dict(dim=4, optimizer="sgd", num_stripes=3), "num_stripes"),
    (dict(dim=4, optimizer="sgd", initializer="xavier"), "unknown initializer"),
    (dict(dim=4, optimizer="sgd", initializer="uniform",
          initializer_params=[1.0, 0.0]), "minval"),
    (dict(dim=4, optimizer="sgd", initializer="constant",
          initializer_params=[1.0, 2.0]), "takes 1"),
    (dict(dim=4, optimizer="sgd", initializer="normal",
          initializer_params=[0.0, -1.0]), "stddev"),
])
def test_bad_table_attrs_are_invalid_argument(attrs, match):
    with pytest.raises(IAE, match=match):
        _ops.sparse_table_handle(shared_name=f"bad_attrs_{match}", **attrs)


def test_ftrl_rejects_zero_learning_rate():
    t = tn.SparseTable("ftrl0", DIM, "ftrl")
    _expect_rejected(t, lambda: _push(t, [1, 2], GOOD, lr=0.0), "> 0")


def test_shared_name_with_other_config_is_rejected():
    _ops.sparse_table_handle(shared_name="clash", dim=4, optimizer="sgd")
    with pytest.raises(IAE, match="already holds"):
        _ops.sparse_table_handle(shared_name="clash", dim=8, optimizer="sgd")


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(dim=0), ValueError, "dim"),
    (dict(dim=4, num_shards=0), ValueError, "num_shards"),
    (dict(dim=4, num_shards=2, devices=["/cpu:0"]), ValueError, "one device"),
    (dict(dim=4, optimizer="lamb"), ValueError, "unknown sparse optimizer"),
])
def test_python_constructor_errors_name_the_problem(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        tn.SparseTable("ctor", **kwargs)


def test_optimizer_hyperparameters_are_checked_in_python():
    with pytest.raises(ValueError, match="learning_rate"):
        tn.optimizer.SGD(-1.0)
    with pytest.raises(TypeError, match="epsilon"):
        tn.optimizer.Adagrad(0.1, epsilon="small")
