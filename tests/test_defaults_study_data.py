"""The generated data of the defaults study's tfrecord_mv and two_tower
cases (tests/programs/, tools/measure_defaults.py): the same bytes from
every run, and a structure a model can learn (else the study's AUC and
recall say nothing). No training: a few seconds."""
import numpy as np

from tests.programs import tfrecord_mv, two_tower


def test_tfrecord_mv_files_are_deterministic_and_learnable(tmp_path):
    a = tfrecord_mv.write_data(tmp_path / "a")
    b = tfrecord_mv.write_data(tmp_path / "b")
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    assert len([n for n in names if n.endswith(".tfrecord")]) == (
        tfrecord_mv.TRAIN_FILES + 1)
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    # The true logits rank the hold-out well above chance (0.788 at
    # DATA_VERSION 1), so the models' AUCs have room to differ.
    assert tfrecord_mv.oracle_auc(a) > 0.75
    # floormod into BINS rows: a few percent of the occurrences share a row.
    assert 0.0 < tfrecord_mv.collisions() < 0.1


def test_two_tower_interactions_are_deterministic_and_learnable():
    first, second = two_tower.generate(), two_tower.generate()
    for part in ("train", "test"):
        for key, value in first[part].items():
            np.testing.assert_array_equal(value, second[part][key])
    test = first["test"]
    assert test["item_id"].size == two_tower.NUM_USERS   # one per user
    assert (test["history"][:, -1] >= 0).all()         # each has a history
    ref = two_tower.reference_recall(first)
    # The generator's own scores beat popularity by a wide margin
    # (0.709 vs 0.384 at k=50), so recall measures learned structure.
    assert ref["oracle_recall_at_50"] > ref["popularity_recall_at_50"] + 0.2


def test_stock_deepfm_computes_deepfm():
    """The study's stock DeepFM (user_models.stock_deepfm, the baseline of
    tn.models.DeepFM) against numpy: first order + FM pairwise term +
    MLP, ids reduced with floormod (int) or to_hash_bucket_fast (str)."""
    import tensorflow as tf
    import tf_keras

    from tests.programs import user_models
    rng = np.random.default_rng(0)
    for string_ids in (False, True):
        model = user_models.stock_deepfm(["a", "b", "c"], ["d"],
                                         string_ids=string_ids, dim=4,
                                         hidden=(5,))
        for w in model.weights:   # the first-order rows start at zero
            w.assign(rng.normal(0.0, 0.5, w.shape).astype(np.float32))
        raw = rng.integers(-(2**40), 2**40, (3, 6))
        ids = raw.astype(str).astype(object) if string_ids else raw
        feats = {c: tf.constant(ids[i]) for i, c in enumerate("abc")}
        feats["d"] = tf.constant(rng.normal(size=6).astype(np.float32))
        got = model(feats).numpy().reshape(-1)

        def rows(name, col):
            table = model.get_layer(name).embeddings.numpy()
            row = (tf.strings.to_hash_bucket_fast(ids[col],
                                                  user_models.NUM_BINS)
                   if string_ids else np.mod(ids[col], user_models.NUM_BINS))
            return table[np.asarray(row)]
        v = np.stack([rows(f"emb_{c}", i) for i, c in enumerate("abc")], 1)
        first = sum(rows(f"first_order_{c}", i)[:, 0]
                    for i, c in enumerate("abc"))
        fm = 0.5 * ((v.sum(1) ** 2) - (v ** 2).sum(1)).sum(1)
        dense = [layer for layer in model.layers
                 if isinstance(layer, tf_keras.layers.Dense)]
        x = np.concatenate([v.reshape(6, -1),
                            feats["d"].numpy()[:, None]], axis=1)
        h = np.maximum(x @ dense[0].kernel.numpy() + dense[0].bias.numpy(), 0)
        deep = (h @ dense[1].kernel.numpy() + dense[1].bias.numpy())[:, 0]
        np.testing.assert_allclose(got, first + fm + deep, rtol=1e-4,
                                   atol=1e-4)
