"""Fresh models in serving: an updatable export, published deltas, a follower.

A README-style `tn.Model` subclass (int user ids, string city ids) trains a
few steps at a time; after each `publish_delta` and follower step, the
served model (a SavedModel loaded with tf.saved_model.load, and in the gRPC
test one served by a process that never imports tnet) must predict what
the training model predicts on a fixed probe set. Evicted keys read zero,
and a delta applied twice, out of order, with a gap, or corrupted is
refused without changing what is served.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_recommenders as tfrs

import tnet as tn
from tnet import feature_column as fc
from tnet.serving import deltas, op_check, publish, update_key, updatable
from tnet.serving import follow
from tests.support import forkrun

TOL = 1e-5
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _columns():
    user = fc.category_column("user_id")
    city = fc.category_column("city", dtype=tf.string)
    return [fc.embedding_column(user, 8),
            fc.embedding_column(city, 8, table="shared")]


class Ranker(tn.Model):
    def __init__(self):
        super().__init__()
        self.embed = tn.layers.EmbeddingFeatures(_columns())
        self.mlp = tf.keras.Sequential([tf.keras.layers.Dense(16, "relu"),
                                        tf.keras.layers.Dense(1)])
        self.task = tfrs.tasks.Ranking(
            loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))

    def call(self, features, training=False):
        return self.mlp(self.embed(features, training=training))

    def compute_loss(self, inputs, training=False):
        features, labels = inputs
        return self.task(labels=labels, predictions=self(features, training))


def _batch(rng, n, lo=0, hi=200):
    users = rng.integers(lo, hi, n).astype(np.int64)
    cities = np.array([f"c{v}".encode() for v in rng.integers(0, 30, n)],
                      dtype=object)
    labels = (rng.random(n) < 0.3).astype(np.float32)
    return {"user_id": users, "city": cities}, labels


def _fit(model, rng, steps, lo=0, hi=200):
    feats, labels = _batch(rng, 32 * steps, lo, hi)
    model.fit(tf.data.Dataset.from_tensor_slices((feats, labels)).batch(32),
              epochs=1, verbose=0)


def _probe():
    users = np.concatenate([np.arange(0, 400, 7), [10 ** 9]]).astype(
        np.int64)
    cities = np.array([f"c{i % 35}".encode() for i in range(len(users))],
                      dtype=object)
    return {"user_id": users, "city": cities}


def _served(loaded, probe):
    out = loaded.signatures["serving_default"](
        **{k: tf.constant(v) for k, v in probe.items()})
    return out["prediction"].numpy().reshape(-1)


def _trained(model, probe):
    return model({k: tf.constant(v) for k, v in probe.items()},
                 training=False).numpy().reshape(-1)


@pytest.fixture()
def setup(tmp_path):
    tf.keras.utils.set_random_seed(7)
    rng = np.random.default_rng(7)
    model = Ranker()
    model.compile(tn.optimizer.Adagrad(0.1))
    _fit(model, rng, 3)
    export = str(tmp_path / "ranker" / "1")
    tn.serving.export_for_serving(model, export, updatable=True)
    return model, rng, export


def test_publish_apply_matches_training_and_refuses_bad_deltas(setup):
    model, rng, export = setup
    assert not op_check.tnet_ops_in(export)
    info = json.load(open(os.path.join(export, "export_info.json")))
    assert set(info["updatable"]["signatures"]) == {
        "apply_delta", "apply_rows", "serving_version"}
    loaded = tf.saved_model.load(export)
    target = follow.InProcessTarget(loaded)
    follower = follow.Follower(export, [target], say=lambda m: None)
    probe = _probe()
    np.testing.assert_allclose(_served(loaded, probe),
                               _trained(model, probe), atol=TOL)
    for k in range(3):
        # New users each round: rows the base never had.
        _fit(model, rng, 2, lo=0, hi=200 + 60 * (k + 1))
        before = _served(loaded, probe)
        tn.serving.publish_delta(model, export, compact_at=None)
        assert follower.step() == {target.name: k + 1}
        got, want = _served(loaded, probe), _trained(model, probe)
        np.testing.assert_allclose(got, want, atol=TOL)
        assert np.max(np.abs(got - before)) > 1e-4  # the update changed it
    assert follow.serving_version(target)[0] == 3

    # Eviction: every user row not touched in the newest 2 steps goes.
    table = model.tables()["user_id"]
    step = int(model.optimizer.iterations.numpy())
    evicted = int(table.evict(ttl_steps=1, current_step=step))
    assert evicted > 0
    path = tn.serving.publish_delta(model, export, compact_at=None)
    manifest = json.load(open(os.path.join(path, deltas.MANIFEST)))
    assert manifest["tables"]["user_id"]["deleted"] == evicted
    follower.step()
    np.testing.assert_allclose(_served(loaded, probe),
                               _trained(model, probe), atol=TOL)
    gone = np.load(os.path.join(path, deltas.PAYLOAD))[
        f"{info['updatable']['tables']['user_id']['prefix']}_deleted"]
    assert len(gone) == evicted
    handle = loaded.tables["user_id"].overlay.resource_handle
    found = tf.raw_ops.LookupTableFindV2(
        table_handle=handle, keys=tf.constant(gone),
        default_value=tf.fill([9], -1.0))
    assert np.all(found.numpy()[:, 0] == 2)   # state: freed
    assert np.all(found.numpy()[:, 1:] == 0)  # reads the zero row

    # Applied twice: the model itself refuses; nothing changes.
    state = _served(loaded, probe)
    payload = deltas.load_delta(export, 4)
    with pytest.raises(tf.errors.InvalidArgumentError, match="serving_version"):
        follower.apply(target, 4, payload)
    with pytest.raises(tf.errors.InvalidArgumentError):
        follower.apply(target, 7, payload)  # out of order
    np.testing.assert_array_equal(_served(loaded, probe), state)

    # Corrupted / truncated / gap: the follower refuses with one line.
    _fit(model, rng, 2)
    path = tn.serving.publish_delta(model, export, compact_at=None)
    payload_file = os.path.join(path, deltas.PAYLOAD)
    good = open(payload_file, "rb").read()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF
    open(payload_file, "wb").write(bytes(bad))
    with pytest.raises(deltas.DeltaError, match="checksum mismatch"):
        follower.step()
    open(payload_file, "wb").write(good[:-10])
    with pytest.raises(deltas.DeltaError, match="checksum mismatch"):
        follower.step()
    np.testing.assert_array_equal(_served(loaded, probe), state)
    assert follow.serving_version(target)[0] == 4
    open(payload_file, "wb").write(good)
    gap = os.path.join(deltas.deltas_dir(export), deltas.delta_name(7))
    shutil.copytree(path, gap)
    with pytest.raises(deltas.DeltaError, match="gap"):
        follower.step()
    assert follow.serving_version(target)[0] == 5  # 5 applied, 7 refused
    shutil.rmtree(gap)
    np.testing.assert_allclose(_served(loaded, probe),
                               _trained(model, probe), atol=TOL)

    # A replica that restarts (back at the base) is replayed to the end.
    fresh_replica = follow.InProcessTarget(tf.saved_model.load(export))
    follow.Follower(export, [fresh_replica], say=lambda m: None).step()
    np.testing.assert_allclose(_served(fresh_replica.loaded, probe),
                               _trained(model, probe), atol=TOL)


SERVER = os.path.join(os.path.dirname(__file__), "programs",
                      "predict_server.py")


def _start_server(export, tmp_path, name="ranker"):
    port_file = str(tmp_path / f"port-{time.monotonic_ns()}")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    proc = subprocess.Popen([sys.executable, SERVER, export, name, port_file],
                            env=env, cwd=str(tmp_path))
    deadline = time.monotonic() + 120
    while not os.path.exists(port_file):
        assert proc.poll() is None, "predict server died"
        assert time.monotonic() < deadline, "predict server did not start"
        time.sleep(0.2)
    return proc, f"127.0.0.1:{open(port_file).read()}"


def _grpc_predict(address, probe):
    return follow.GrpcTarget(address, "ranker").call(
        "serving_default", probe)["prediction"].reshape(-1)


def _follow_cli(export, address, *flags, env_extra=None):
    """`python -m tnet.serving.follow ... --once` in its own process."""
    env = {k: v for k, v in os.environ.items() if k != update_key.ENV_VAR}
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))) + os.pathsep + env.get("PYTHONPATH", "")
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env.update(env_extra or {})
    return forkrun.run(
        [sys.executable, "-m", "tnet.serving.follow", "--export_dir", export,
         "--target", f"grpc://{address}/ranker", "--once", *flags],
        capture_output=True, text=True, env=env, timeout=300)


def _follow_main(export, address, *flags, env_extra=None):
    """The same command line through `follow.main`, the function
    `python -m tnet.serving.follow` runs, in this process (a Python and
    TensorFlow start saved per call; the CLI's own process, its exit code
    and its stderr are checked by _follow_cli runs in
    test_follow_cli_grpc_target_without_tnet and by
    test_follow_error_is_its_only_output_line): its exit code and what
    it wrote to stderr."""
    import contextlib  # noqa: PLC0415
    import io  # noqa: PLC0415
    saved = os.environ.pop(update_key.ENV_VAR, None)
    os.environ.update(env_extra or {})
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            code = follow.main(["--export_dir", export, "--target",
                                f"grpc://{address}/ranker", "--once",
                                *flags])
    finally:
        for k in env_extra or {}:
            os.environ.pop(k, None)
        if saved is not None:
            os.environ[update_key.ENV_VAR] = saved
    return subprocess.CompletedProcess([], code, "", err.getvalue())


def test_follow_cli_grpc_target_without_tnet(setup, tmp_path):
    model, rng, export = setup
    probe = _probe()
    proc, address = _start_server(export, tmp_path)
    try:
        # The CLI in its own process, then the same through follow.main.
        for run in (_follow_cli, _follow_main):
            _fit(model, rng, 2, hi=300)
            tn.serving.publish_delta(model, export, compact_at=None)
            done = run(export, address)
            assert done.returncode == 0, done.stderr
            np.testing.assert_allclose(_grpc_predict(address, probe),
                                       _trained(model, probe), atol=TOL)
        record = json.load(open(os.path.join(
            deltas.deltas_dir(export), "followers",
            f"grpc___{address.replace(':', '_')}_ranker.json")))
        assert record["version"] == 2
        # Nothing new: a second run applies nothing and changes nothing.
        state = _grpc_predict(address, probe)
        assert _follow_main(export, address).returncode == 0
        np.testing.assert_array_equal(_grpc_predict(address, probe), state)
    finally:
        proc.kill()
        proc.wait()
    # The replica restarts from the base: the follower replays 1 and 2.
    proc, address = _start_server(export, tmp_path)
    try:
        done = _follow_main(export, address)
        assert done.returncode == 0, done.stderr
        np.testing.assert_allclose(_grpc_predict(address, probe),
                                   _trained(model, probe), atol=TOL)
        # A corrupted delta: one line on stderr, exit 1, nothing changed.
        _fit(model, rng, 1)
        path = tn.serving.publish_delta(model, export, compact_at=None)
        with open(os.path.join(path, deltas.PAYLOAD), "r+b") as f:
            f.truncate(100)
        state = _grpc_predict(address, probe)
        done = _follow_cli(export, address)
        assert done.returncode == 1
        assert "checksum mismatch" in done.stderr
        ours = [line for line in done.stderr.splitlines()
                if line.startswith("tnet.serving.follow:")]
        assert len(ours) == 1, done.stderr
        np.testing.assert_array_equal(_grpc_predict(address, probe), state)
    finally:
        proc.kill()
        proc.wait()


# ------------------------------------------------------------ update key
def _the_key(export):
    return update_key.read_key_file(update_key.default_key_file(export))[0]


def _forged(model, info, version, key, dense=False, value=9.0):
    """What an outside client would send: rows of `value` for every key
    the trainer's tables hold (those a probe batch reads), and with
    `dense` every dense variable set to `value` too."""
    inputs = {"version": np.array(version, np.int64)}
    if key is not None:
        inputs[update_key.KEY_INPUT] = np.array(key.encode(), dtype=object)
    for name, e in info["tables"].items():
        keys = model.tables()[name].export()[0].numpy().astype(np.int64)
        inputs[f"{e['prefix']}_keys"] = keys
        inputs[f"{e['prefix']}_rows"] = np.full((len(keys), e["dim"]),
                                                value, np.float32)
        inputs[f"{e['prefix']}_deleted"] = np.zeros(0, np.int64)
    if dense:
        for j, e in enumerate(info["dense"]):
            inputs[f"dense_{j}"] = np.full(e["shape"], value, e["dtype"])
    return inputs


def _overlay_sizes(loaded):
    return {n: int(tf.raw_ops.LookupTableSizeV2(
        table_handle=t.overlay.resource_handle).numpy())
        for n, t in loaded.tables.items()}


def _wrong_keys(key):
    last = "0" if key[-1] != "0" else "1"
    return ["", update_key.new_key(), key[:-1] + last, key + "0", key.upper(),
            "x" * 5000]


def test_sha256_of_the_graph_is_hashlibs():
    """The digest the signatures compute with stock ops is SHA-256: every
    length around the padding boundaries (55/56/64 bytes) and multi-block
    messages."""
    fn = tf.function(update_key.sha256, autograph=False,
                     input_signature=[tf.TensorSpec([], tf.string)])
    rng = np.random.default_rng(5)
    for n in list(range(0, 140)) + [1000, 1059]:
        message = rng.bytes(n)
        np.testing.assert_array_equal(
            fn(tf.constant(message)).numpy(),
            update_key.words_of(hashlib.sha256(message).digest()), str(n))


def test_key_file_is_owner_only_and_the_key_is_in_no_served_file(
        setup, monkeypatch):
    model, rng, export = setup
    base_path = os.path.dirname(export)
    path = update_key.default_key_file(export)
    assert path == base_path + ".update_key"  # beside, not under, the base
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    keys = update_key.read_key_file(path)
    assert len(keys) == 1 and len(bytes.fromhex(keys[0])) == 32
    key = keys[0]
    record = deltas.read_info(export)["update_key"]
    assert set(record) == {"salt", "sha256", "file"} and record["file"] == path
    assert update_key.matches(record, key)
    assert not update_key.matches(record, update_key.new_key())
    # A delta published and applied: deltas/ and the follower's records.
    loaded = tf.saved_model.load(export)
    _fit(model, rng, 2)
    tn.serving.publish_delta(model, export, compact_at=None)
    follow.Follower(export, [follow.InProcessTarget(loaded)],
                    say=lambda m: None).step()
    raw = bytes.fromhex(key)
    forms = [key.encode(), key.upper().encode(), raw,
             base64.b64encode(raw), base64.urlsafe_b64encode(raw)]
    seen = 0
    for d, _, files in os.walk(base_path):
        for f in files:
            data = open(os.path.join(d, f), "rb").read()
            seen += 1
            for form in forms:
                assert form not in data, (os.path.join(d, f), form)
    assert seen >= 5  # saved_model.pb, variables, info, delta, record
    # A second export beside it reuses the key (same file), with its own
    # salt; a rotation puts a new key first and keeps the old one second.
    second = tn.serving.export_for_serving(model, os.path.join(base_path, "2"),
                                          updatable=True)
    r2 = deltas.read_info(second)["update_key"]
    assert update_key.matches(r2, key) and r2["salt"] != record["salt"]
    third = tn.serving.export_for_serving(model, os.path.join(base_path, "3"),
                                         updatable=True,
                                         rotate_update_key=True)
    new = update_key.read_key_file(path)
    assert len(new) == 2 and new[1] == key and new[0] != key
    assert update_key.matches(deltas.read_info(third)["update_key"], new[0])
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    # A rotating export that fails leaves the key file as it was (a retry
    # must not push out the key of the base still served).
    from tnet.serving import export as export_lib  # noqa: PLC0415

    def fail(*args, **kwargs):
        raise RuntimeError("export failed half way")
    monkeypatch.setattr(export_lib, "_write", fail)
    with pytest.raises(RuntimeError, match="half way"):
        tn.serving.export_for_serving(model, os.path.join(base_path, "9"),
                                     updatable=True, rotate_update_key=True)
    monkeypatch.undo()
    assert update_key.read_key_file(path) == new
    with pytest.raises(ValueError, match="inside the export"):
        tn.serving.export_for_serving(
            model, os.path.join(base_path, "4"), updatable=True,
            update_key_file=os.path.join(base_path, "4", "key"))
    with pytest.raises(ValueError, match="32 to 1024"):
        tn.serving.export_for_serving(model, os.path.join(base_path, "5"),
                                     updatable=True, update_key="secret")
    assert not os.path.exists(os.path.join(base_path, "5"))


def test_a_refused_update_changes_nothing(setup):
    """apply_rows / apply_delta without the key, or with a wrong one, fail
    with one line and leave rows, dense weights and version as they were;
    the same request with the key does change what is served (so the
    refusals are the key's doing)."""
    model, rng, export = setup
    info = deltas.read_info(export)
    key = _the_key(export)
    loaded = tf.saved_model.load(export)
    target = follow.InProcessTarget(loaded)
    probe = _probe()
    before = _served(loaded, probe)
    dense = [v.numpy() for v in loaded.dense_variables]
    sizes = _overlay_sizes(loaded)
    for sig in (deltas.APPLY_ROWS, deltas.APPLY_DELTA):
        for bad in _wrong_keys(key):
            with pytest.raises(tf.errors.InvalidArgumentError,
                               match=f"{sig}: refused: bad update key"):
                target.call(sig, _forged(model, info, 1, bad,
                                         dense=sig == deltas.APPLY_DELTA))
        with pytest.raises(TypeError, match=update_key.KEY_INPUT):
            target.call(sig, _forged(model, info, 1, None,
                                     dense=sig == deltas.APPLY_DELTA))
    np.testing.assert_array_equal(_served(loaded, probe), before)
    for v, d in zip(loaded.dense_variables, dense):
        np.testing.assert_array_equal(v.numpy(), d)
    assert _overlay_sizes(loaded) == sizes
    assert follow.serving_version(target)[0] == 0
    # The key with a wrong version: still refused, still nothing changed.
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="serving_version"):
        target.call(deltas.APPLY_DELTA, _forged(model, info, 2, key, True))
    np.testing.assert_array_equal(_served(loaded, probe), before)
    # The control: with the key the forged rows and weights are served.
    target.call(deltas.APPLY_DELTA, _forged(model, info, 1, key, True))
    assert follow.serving_version(target)[0] == 1
    assert np.max(np.abs(_served(loaded, probe) - before)) > 1e-3
    assert all(np.all(v.numpy() == 9.0) for v in loaded.dense_variables)


def test_grpc_anonymous_client_cannot_change_what_is_served(setup,
                                                             tmp_path):
    """Through the PredictionService: the issue's client (asks
    serving_version, sends version + 1 and rows of 9.0 for the probe's
    ids) is refused with and without a key, serving_default and
    serving_version stay open; the follower with the key (file, or
    TNET_UPDATE_KEY) applies deltas as before; with a wrong key it exits 2
    with one line."""
    import grpc  # noqa: PLC0415
    model, rng, export = setup
    info = deltas.read_info(export)
    key_file = update_key.default_key_file(export)
    key = _the_key(export)
    probe = _probe()
    proc, address = _start_server(export, tmp_path)
    try:
        client = follow.GrpcTarget(address, "ranker")
        before = _grpc_predict(address, probe)
        version, base = follow.serving_version(client)
        assert (version, base) == (0, info["base_id"])
        for sig in (deltas.APPLY_ROWS, deltas.APPLY_DELTA):
            dense = sig == deltas.APPLY_DELTA
            with pytest.raises(grpc.RpcError) as e:  # no key at all
                client.call(sig, _forged(model, info, version + 1, None,
                                         dense))
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert update_key.KEY_INPUT in e.value.details()
            for bad in _wrong_keys(key)[:3]:
                with pytest.raises(grpc.RpcError) as e:
                    client.call(sig, _forged(model, info, version + 1, bad,
                                             dense))
                assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert f"{sig}: refused: bad update key" in e.value.details()
        np.testing.assert_array_equal(_grpc_predict(address, probe), before)
        assert follow.serving_version(client)[0] == 0

        # The follower with the key file.
        _fit(model, rng, 2, hi=300)
        tn.serving.publish_delta(model, export, compact_at=None)
        done = _follow_main(export, address, "--update_key_file", key_file)
        assert done.returncode == 0, done.stderr
        np.testing.assert_allclose(_grpc_predict(address, probe),
                                   _trained(model, probe), atol=TOL)
        # The key file gone from where the follower could find it: the
        # key from the environment; then a wrong one.
        hidden = str(tmp_path / "elsewhere")
        os.rename(key_file, hidden)
        _fit(model, rng, 2, hi=300)
        tn.serving.publish_delta(model, export, compact_at=None)
        state = _grpc_predict(address, probe)
        for env in ({}, {update_key.ENV_VAR: update_key.new_key()}):
            done = _follow_main(export, address, env_extra=env)
            assert done.returncode == 2, done.stderr
            ours = [line for line in done.stderr.splitlines()
                    if line.startswith("tnet.serving.follow:")]
            assert len(ours) == 1 and "no update key" in ours[0], \
                done.stderr
            np.testing.assert_array_equal(_grpc_predict(address, probe),
                                          state)
        done = _follow_main(export, address, env_extra={
            update_key.ENV_VAR: f"{update_key.new_key()},{key}"})
        assert done.returncode == 0, done.stderr
        np.testing.assert_allclose(_grpc_predict(address, probe),
                                   _trained(model, probe), atol=TOL)
        assert follow.serving_version(client)[0] == 2
    finally:
        proc.kill()
        proc.wait()


def test_old_export_without_key_loads_and_is_refused_unless_opted_in(
        tmp_path, monkeypatch):
    """An updatable export written before update keys (reproduced here: no
    key input, no digest) still loads and serves; the follower refuses to
    update it unless allow_keyless, and then applies as before."""
    tf.keras.utils.set_random_seed(7)
    rng = np.random.default_rng(7)
    model = Ranker()
    model.compile(tn.optimizer.Adagrad(0.1))
    _fit(model, rng, 3)
    export = str(tmp_path / "ranker" / "1")
    original = updatable.updatable_signatures
    monkeypatch.setattr(updatable, "updatable_signatures",
                        lambda m, s, d, model, record: original(
                            m, s, d, model, None))
    tn.serving.export_for_serving(model, export, updatable=True)
    monkeypatch.undo()
    assert "update_key" not in deltas.read_info(export)
    loaded = tf.saved_model.load(export)
    assert update_key.KEY_INPUT not in loaded.signatures[
        deltas.APPLY_ROWS].structured_input_signature[1]
    probe = _probe()
    np.testing.assert_allclose(_served(loaded, probe),
                               _trained(model, probe), atol=TOL)
    _fit(model, rng, 2, hi=300)
    tn.serving.publish_delta(model, export, compact_at=None)
    target = follow.InProcessTarget(loaded)
    before = _served(loaded, probe)
    with pytest.raises(deltas.DeltaError, match="has no update key"):
        follow.Follower(export, [target], say=lambda m: None).step()
    np.testing.assert_array_equal(_served(loaded, probe), before)
    follow.Follower(export, [target], say=lambda m: None,
                    allow_keyless=True).step()
    np.testing.assert_allclose(_served(loaded, probe),
                               _trained(model, probe), atol=TOL)
    # Migration: the next base (here a compaction) has a key.
    _fit(model, rng, 2, hi=300)
    new = tn.serving.publish_delta(model, export, compact_at=0.01)
    assert new == str(tmp_path / "ranker" / "2")
    assert update_key.matches(deltas.read_info(new)["update_key"],
                              _the_key(new))


def test_trainer_restart_from_older_checkpoint(setup, tmp_path):
    """The trainer publishes past its newest checkpoint, dies, restores it
    and trains other rows: the first delta after the restore makes the
    served model equal the restored trainer again (rows the lost steps
    created read zero)."""
    model, rng, export = setup
    ckpts = str(tmp_path / "ckpt")
    loaded = tf.saved_model.load(export)
    follower = follow.Follower(export, [follow.InProcessTarget(loaded)],
                               say=lambda m: None)
    _fit(model, rng, 2)
    tn.serving.publish_delta(model, export, compact_at=None)
    tn.saving.save(model, ckpts, incremental=True)
    _fit(model, rng, 2, lo=1000, hi=1100)  # lost with the trainer
    tn.serving.publish_delta(model, export, compact_at=None)
    follower.step()
    probe = _probe()
    probe["user_id"][:20] = np.arange(1000, 1100, 5)

    restarted = Ranker()
    restarted.compile(tn.optimizer.Adagrad(0.1))
    tn.saving.restore(restarted, ckpts, track_changes=True)
    before = _trained(restarted, probe)
    assert np.max(np.abs(_served(loaded, probe) - before)) > 1e-4
    publish.publisher(restarted, export)  # before training resumes
    _fit(restarted, rng, 2, lo=0, hi=100)
    tn.serving.publish_delta(restarted, export, compact_at=None)
    follower.step()
    np.testing.assert_allclose(_served(loaded, probe),
                               _trained(restarted, probe), atol=TOL)
    # Checkpoints' own marks still hold: an incremental save is a delta.
    path = tn.saving.save(restarted, ckpts, incremental=True)
    assert tn.saving.read_manifest(path)["kind"] == "delta"


def _live_keys(table):
    return set(table.export()[0].numpy().tolist())


def _overlay_state(loaded, name, keys, dim=8):
    found = tf.raw_ops.LookupTableFindV2(
        table_handle=loaded.tables[name].overlay.resource_handle,
        keys=tf.constant(np.asarray(sorted(keys), np.int64)),
        default_value=tf.fill([dim + 1], -1.0)).numpy()
    return found[:, 0], found[:, 1:]


@pytest.mark.parametrize("incremental", [True, False])
def test_trainer_restart_from_newer_checkpoint_publishes_freed_keys(
        setup, tmp_path, incremental):
    """Keys freed after the last publish and before the checkpoint the
    trainer restarts from (here: evicted by TTL, some before a first save
    and some before a second) are gone from the restored trainer; the first
    delta after the restart must free them in serving too (before the fix
    they lived only in the dead publisher's memory and served their old
    row until the next base)."""
    model, rng, export = setup
    ckpts = str(tmp_path / "ckpt")
    loaded = tf.saved_model.load(export)
    follower = follow.Follower(export, [follow.InProcessTarget(loaded)],
                               say=lambda m: None)
    table = model.tables()["user_id"]
    _fit(model, rng, 2, lo=0, hi=300)
    tn.serving.publish_delta(model, export, compact_at=None)
    follower.step()
    served = _live_keys(table)
    for lo in (0, 100):  # evict, save; evict again, save again
        _fit(model, rng, 1, lo=lo, hi=lo + 30)
        step = int(model.optimizer.iterations.numpy())
        assert int(table.evict(ttl_steps=1, current_step=step)) > 0
        saved = tn.saving.save(model, ckpts, incremental=incremental)
    # Both readers of the table's change log are on the table, by name:
    # the publisher (its reader kept what it read across the saves'
    # re-marks) and, when the saves track changes, the checkpoint.
    readers = table.change_log.readers
    publisher = readers[f"publisher:{os.path.abspath(export)}"]
    assert publisher.owner is publish.publisher(model, export)
    assert ("checkpoint" in readers) == incremental
    if incremental:
        assert readers["checkpoint"].marks[0] == \
            tn.saving.read_manifest(saved)["id"]
    gone = served - _live_keys(table)  # serving holds a row for each
    assert set(gone) <= set(publisher.freed().tolist())
    assert len(gone) > 100

    # The trainer dies; a new one restores the newest checkpoint (newer
    # than the last publish) and publishes before training resumes.
    restarted = Ranker()
    restarted.compile(tn.optimizer.Adagrad(0.1))
    tn.saving.restore(restarted, ckpts, track_changes=True)
    assert not gone & _live_keys(restarted.tables()["user_id"])
    probe = _probe()
    n = min(len(gone), len(probe["user_id"]) - 1)
    probe["user_id"][:n] = sorted(gone)[:n]
    stale = _served(loaded, probe)
    assert np.max(np.abs(stale - _trained(restarted, probe))) > 1e-4
    path = tn.serving.publish_delta(restarted, export, compact_at=None)
    manifest = json.load(open(os.path.join(path, deltas.MANIFEST)))
    assert manifest["tables"]["user_id"]["deleted"] >= len(gone)
    follower.step()
    state, rows = _overlay_state(loaded, "user_id", gone)
    assert np.all(state == 2) and np.all(rows == 0)
    np.testing.assert_allclose(_served(loaded, probe),
                               _trained(restarted, probe), atol=TOL)
    # Training goes on: the next delta carries them no more.
    _fit(restarted, rng, 2, lo=0, hi=60)
    path = tn.serving.publish_delta(restarted, export, compact_at=None)
    follower.step()
    np.testing.assert_allclose(_served(loaded, probe),
                               _trained(restarted, probe), atol=TOL)


@pytest.mark.long
def test_publish_under_parameter_server_strategy(tmp_path):
    from tests.support.cluster import assert_all_stopped, cluster
    program = os.path.join(os.path.dirname(__file__), "programs",
                           "fresh_pss.py")
    c = cluster(2, 1, [sys.executable, program, str(tmp_path / "m" / "1")])
    code = c.wait(900)
    assert_all_stopped(c)
    assert code == 0, c.output[-3000:]
    lines = [line for line in c.lines if "FRESH_PSS epoch=" in line]
    assert len(lines) == 3, c.output[-3000:]
    for i, line in enumerate(lines):
        assert f"version={i + 1}" in line, line
        assert float(line.rsplit("diff=", 1)[1]) <= TOL, line
    assert any("FRESH_PSS_DONE" in line for line in c.lines)


class _Dies:
    """A target whose follower dies after `calls` requests."""

    def __init__(self, inner, calls):
        self.inner, self.calls, self.name = inner, calls, inner.name

    def call(self, signature, inputs):
        if signature != deltas.SERVING_VERSION:
            if self.calls == 0:
                raise KeyboardInterrupt("follower killed")
            self.calls -= 1
        return self.inner.call(signature, inputs)


def test_follower_killed_mid_apply_converges(setup):
    """A delta sent in several apply_rows chunks; the follower dies after
    the first chunk. The version has not moved, so the restarted follower
    sends the whole delta again and ends where an uninterrupted one does."""
    model, rng, export = setup
    _fit(model, rng, 3, hi=400)
    tn.serving.publish_delta(model, export, compact_at=None)
    loaded = tf.saved_model.load(export)
    target = follow.InProcessTarget(loaded)
    probe = _probe()
    with pytest.raises(KeyboardInterrupt):
        follow.Follower(export, [_Dies(target, 1)], chunk_bytes=1024,
                        say=lambda m: None).step()
    assert follow.serving_version(target)[0] == 0  # half applied
    follow.Follower(export, [target], chunk_bytes=1024,
                    say=lambda m: None).step()
    assert follow.serving_version(target)[0] == 1
    np.testing.assert_allclose(_served(loaded, probe),
                               _trained(model, probe), atol=TOL)


def test_compaction_writes_a_new_base_version(setup):
    """Once the published rows reach compact_at of the base's, the next
    publish writes the next version directory (a new updatable base);
    publishing continues there and the follower serves each replica the
    deltas of the base it loaded."""
    model, rng, export = setup
    old = follow.InProcessTarget(tf.saved_model.load(export), name="old")
    follower = follow.Follower(export, [old], say=lambda m: None)
    _fit(model, rng, 2, hi=300)
    first = tn.serving.publish_delta(model, export, compact_at=0.05)
    assert first.endswith(os.path.join("deltas", "delta-000001"))
    follower.step()
    _fit(model, rng, 2, hi=300)
    old_key = _the_key(export)
    second = tn.serving.publish_delta(model, export, compact_at=0.05,
                                     rotate_update_key=True)
    base = os.path.dirname(export)
    assert second == os.path.join(base, "2")
    # Rotated: the new base has a new key, the key file keeps the old one
    # second, so a follower given the file drives replicas on either base.
    new_key, kept = update_key.read_key_file(
        update_key.default_key_file(export))
    assert kept == old_key != new_key
    assert update_key.matches(deltas.read_info(second)["update_key"],
                              new_key)
    assert deltas.newest_export(export) == second
    probe = _probe()
    new = follow.InProcessTarget(tf.saved_model.load(second), name="new")
    np.testing.assert_allclose(_served(new.loaded, probe),
                               _trained(model, probe), atol=TOL)
    _fit(model, rng, 2, hi=300)
    third = tn.serving.publish_delta(model, export, compact_at=None)
    assert third.startswith(second + os.sep)
    follower.targets.append(new)
    assert follower.step() == {"old": 1, "new": 1}
    # A follower that has only the old key cannot update the new base.
    _fit(model, rng, 1, hi=300)
    tn.serving.publish_delta(model, export, compact_at=None)
    stale = follow.Follower(export, [new], say=lambda m: None,
                            update_keys=[old_key])
    with pytest.raises(deltas.DeltaError, match="no update key"):
        stale.step()
    assert follow.serving_version(new)[0] == 1
    assert follower.step() == {"old": 1, "new": 2}
    np.testing.assert_allclose(_served(new.loaded, probe),
                               _trained(model, probe), atol=TOL)


def test_publish_deltas_callback_in_fit(setup, tmp_path):
    model, rng, export = setup
    cb = tn.callbacks.PublishDeltas(export, every_n_steps=2, compact_at=None)
    feats, labels = _batch(rng, 32 * 5, 0, 300)
    model.fit(tf.data.Dataset.from_tensor_slices((feats, labels)).batch(32),
              epochs=1, verbose=0, callbacks=[
                  tn.callbacks.Checkpoint(str(tmp_path / "ckpt"),
                                          every_n_steps=2, incremental=True),
                  cb])
    # Steps 3..8: publishes at 4, 6, 8 (crossings of 2) and none at the end.
    assert [os.path.basename(p) for p in cb.published] == [
        "delta-000001", "delta-000002", "delta-000003"]
    loaded = tf.saved_model.load(export)
    follow.Follower(export, [follow.InProcessTarget(loaded)],
                    say=lambda m: None).step()
    probe = _probe()
    np.testing.assert_allclose(_served(loaded, probe),
                               _trained(model, probe), atol=TOL)


# The one-process run is long: its batch-hook publishing is
# test_publish_deltas_callback_in_fit's, the CLI path the cluster run's.
@pytest.mark.parametrize("where", [
    pytest.param("one_process", marks=pytest.mark.long), "cluster"])
def test_cli_publishes_deltas_that_bring_the_base_to_the_trained_model(
        tmp_path, where):
    """`python -m tnet.train --publish_every_n_steps=3` on a user's feature
    spec, in one process and as the chief of a 1 ps x 1 worker cluster: an
    updatable base is exported before training (under a cluster, with the
    model built in the strategy's scope), deltas follow every 3 steps and
    at the end (under a cluster Keras calls no batch hooks: at each epoch
    end) (no compaction: with it, a base exported before training holds no
    rows and the first publish is a new base); the base loaded in this
    process (stock ops only) with every delta applied by the follower
    predicts what the trained model predicts (the final export check's
    sample and expectations)."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from support import byod_data as bd  # noqa: PLC0415
    bd.write_spec(tmp_path / "spec.json")
    train = bd.write_tfrecord(tmp_path / "train.tfrecord", bd.rows(300, 1))
    evals = bd.write_tfrecord(tmp_path / "eval.tfrecord", bd.rows(100, 2))
    export_dir, run = tmp_path / "export", tmp_path / "run"
    cmd = [sys.executable, "-m", "tnet.train",
           f"--feature_spec={tmp_path / 'spec.json'}", "--format=tfrecord",
           f"--train_files={train}", f"--eval_files={evals}",
           f"--model_dir={run}", f"--export_dir={export_dir}",
           "--hidden_units=8", "--batch_size=64", "--epochs=2",
           "--publish_every_n_steps=3", "--publish_compact_at=0",
           f"--update_key_file={tmp_path / 'keys' / 'ranker.key'}",
           "--rotate_update_key"]
    if where == "cluster":
        from tests.support.cluster import assert_all_stopped, cluster  # noqa: PLC0415
        c = cluster(1, 1, cmd, timeout=400)
        code = c.wait(420)
        assert_all_stopped(c)
        assert code == 0, c.output[-3000:]
        stdout = c.output
    else:
        env = dict(os.environ, PYTHONPATH=ROOT, CI="true",
                   TF_CPP_MIN_LOG_LEVEL="2")
        res = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=400)
        assert res.returncode == 0, res.stderr[-3000:]
        stdout = res.stdout
    summary = json.load(open(run / "summary.json"))
    versions = deltas.versions_of(str(export_dir))
    assert len(versions) == 2, versions  # the base, then the final export
    base = os.path.join(export_dir, str(versions[0]))
    # The key file where asked (owner-only), rotated by the final export:
    # its key first, the base's second; the follower below finds it
    # through the path the export recorded.
    keys = update_key.read_key_file(str(tmp_path / "keys" / "ranker.key"))
    assert stat.S_IMODE(os.stat(tmp_path / "keys" / "ranker.key").st_mode) \
        == 0o600
    assert not os.path.exists(update_key.default_key_file(base))
    final = os.path.join(export_dir, str(versions[1]))
    assert update_key.matches(deltas.read_info(final)["update_key"], keys[0])
    assert update_key.matches(deltas.read_info(base)["update_key"], keys[1])
    assert f"publishing deltas to {base}" in stdout
    assert summary["export"]["updatable"] and summary["published"]
    # 2 epochs of ceil(300 / 64) = 5 steps: steps 3, 6, 9, and the end
    # (10; a batch of 44 rows ends each epoch); under a cluster the two
    # epoch ends.
    assert len(deltas.list_deltas(base)) == len(summary["published"]) == (
        2 if where == "cluster" else 4)
    loaded = tf.saved_model.load(base)
    target = follow.InProcessTarget(loaded)
    follower = follow.Follower(base, [target], say=lambda m: None)
    follower.export_dir, follower.info = base, deltas.read_info(base)
    follower.step()
    sample = dict(np.load(run / "export_sample.npz"))
    expected = sample.pop("__expected__").reshape(-1)
    out = loaded.signatures["serving_default"](
        **{k: tf.constant(v) for k, v in sample.items()})
    got = out["prediction"].numpy().reshape(-1)
    np.testing.assert_allclose(got, expected, atol=TOL)
    fresh_model = tf.saved_model.load(base)  # the base alone is behind
    stale = fresh_model.signatures["serving_default"](
        **{k: tf.constant(v) for k, v in sample.items()})["prediction"].numpy()
    assert np.max(np.abs(stale.reshape(-1) - expected)) > 1e-3


# make test-long: test_cli_publishes_deltas_that_bring_the_base_to_the_trained_model stays.
@pytest.mark.long
def test_daily_loop_publishes_every_day_into_the_day_before(tmp_path):
    """`python -m tnet.train --days=A..B --day_pattern=... --publish_every_
    n_steps=4`: before the first day an updatable base of the untrained
    model is exported as the version of the day before (so day 1's rows
    are served too), each day publishes into the day before's export, and
    that export with every delta applied serves what the day's own export
    (the trained model at the end of the day) serves."""
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from support import byod_data as bd  # noqa: PLC0415
    bd.write_spec(tmp_path / "spec.json")
    days = ["2026-11-01", "2026-11-02"]
    for i, day in enumerate(days):  # day 2 brings users day 1 never saw
        bd.write_tfrecord(tmp_path / "data" / day / "part-0.tfrecord",
                          bd.rows(500, i, users=50 + 40 * i))
    export_dir, run = tmp_path / "export", tmp_path / "run"
    cmd = [sys.executable, "-m", "tnet.train",
           f"--feature_spec={tmp_path / 'spec.json'}", "--format=tfrecord",
           f"--days={days[0]}..{days[-1]}",
           f"--day_pattern={tmp_path}/data/{{day}}/*",
           f"--checkpoint_dir={tmp_path / 'ckpt'}",
           f"--export_dir={export_dir}", f"--model_dir={run}",
           "--hidden_units=8", "--batch_size=64", "--shuffle_buffer=0",
           "--publish_every_n_steps=4"]
    env = dict(os.environ, PYTHONPATH=ROOT, CI="true",
               TF_CPP_MIN_LOG_LEVEL="2")
    res = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=400)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert deltas.versions_of(str(export_dir)) == [20261031, 20261101,
                                                  20261102]
    state = json.load(open(tmp_path / "ckpt" / "days.json"))
    assert state["publish_base"]["day"] == "2026-10-31"
    for day in days:  # every 4 steps and at the end, into the day before
        before = "20261031" if day == days[0] else "20261101"
        published = state["days"][day]["published"]
        assert len(published) >= 2 and {os.path.dirname(p) for p in
                                         published} == {
            str(export_dir / before / "deltas")}, published
    # The final export's check sample: what the model trained through day
    # 2 predicts (day 2's export serves it, checked without tnet).
    sample = dict(np.load(run / "export_sample.npz"))
    trained = sample.pop("__expected__").reshape(-1)
    inputs = {k: tf.constant(v) for k, v in sample.items()}

    def predict(loaded):
        out = loaded.signatures["serving_default"](**inputs)
        return out["prediction"].numpy().reshape(-1)

    def follow_all(export, loaded):
        follow.Follower(export, [follow.InProcessTarget(loaded)],
                        say=lambda m: None).step()

    # Day 1: the untrained base + day 1's deltas serves day 1's export.
    base = str(export_dir / "20261031")
    served = tf.saved_model.load(base)
    stale = predict(served)
    follow_all(base, served)
    day1 = tf.saved_model.load(str(export_dir / "20261101"))
    want = predict(day1)
    assert np.max(np.abs(stale - want)) > 1e-3  # the deltas mattered
    np.testing.assert_allclose(predict(served), want, atol=TOL)
    # Day 2: day 1's export + day 2's deltas serves the trained model.
    assert np.max(np.abs(want - trained)) > 1e-3
    follow_all(str(export_dir / "20261101"), day1)
    np.testing.assert_allclose(predict(day1), trained, atol=TOL)


def test_follow_bad_flags_exit_2(tmp_path):
    """A flag typo exits 2 with argparse's usage line (nothing is applied;
    a missing export: test_follow_error_is_its_only_output_line)."""
    for args, says in ((["--export_dirr", str(tmp_path)], "--export_dir"),):
        res = forkrun.run(
            [sys.executable, "-m", "tnet.serving.follow", *args,
             *([] if "--target" in args else ["--target", "grpc://a:1/m"])],
            capture_output=True, text=True, timeout=120,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
        assert res.returncode == 2, res.stderr[-2000:]
        assert says in res.stderr and "Traceback" not in res.stderr


def test_follow_error_is_its_only_output_line(tmp_path):
    """A CLI hides TensorFlow's start-up lines unless TF_CPP_MIN_LOG_LEVEL
    is set: the follower's one-line error is then all it writes."""
    cmd = [sys.executable, "-m", "tnet.serving.follow", "--export_dir",
           str(tmp_path / "none"), "--target", "grpc://127.0.0.1:1/m",
           "--once"]
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                         env=env)
    assert res.returncode == 2
    assert res.stdout == ""
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tnet.serving.follow: ")
    # The user's own setting wins: TensorFlow's lines are theirs to see.
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                         env=dict(env, TF_CPP_MIN_LOG_LEVEL="0"))
    assert res.returncode == 2 and len(res.stderr.splitlines()) > 1
