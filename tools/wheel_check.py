"""`make wheel-check`: the wheel, installed with the lowest version of every
range it declares, trains, saves, restores and exports a model.

A wheel pins only what its op library's ABI needs (TensorFlow, and the
tf-keras of that minor version) and declares ranges for the rest; this
checks that the bottom of each range works. It builds the wheel (`make
wheel`), creates a fresh venv under build/wheel-check/, installs the wheel
with its extras, constraining each `>=X` requirement to `==X`, and from a
directory outside the checkout runs: fit, save, restore in a fresh process
(predictions equal), export, and a load of the export in a process that
never imports tnet.

    python tools/wheel_check.py [--keep]
"""
from __future__ import annotations

import argparse
import glob
import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORK = ROOT / "build" / "wheel-check"

TRAIN = textwrap.dedent('''
    import sys
    import numpy as np
    import tnet as tn
    import tensorflow as tf
    from tnet import feature_column as fc

    rng = np.random.default_rng(0)
    users = rng.permutation(np.arange(4096) % 500)
    data = tf.data.Dataset.from_tensor_slices(
        ({"user_id": users}, (users % 3 == 0).astype("float32"))).batch(256)
    inputs = {"user_id": tf.keras.Input(shape=(), dtype=tf.int64, name="user_id")}
    x = tn.layers.EmbeddingFeatures(
        [fc.embedding_column(fc.category_column("user_id"), 8)])(inputs)
    model = tn.Model(inputs, tf.keras.layers.Dense(1, "sigmoid")(x))
    model.compile(tn.optimizer.Adagrad(0.5), loss="binary_crossentropy")
    model.fit(data, epochs=2, verbose=0)
    probe = {"user_id": tf.constant([3, 4, 10**9], tf.int64)}
    np.save("before.npy", model.predict(probe, verbose=0))
    tn.saving.save(model, "ckpt")
    print("trained and saved, tnet", tn.__version__)
''')

RESTORE = textwrap.dedent('''
    import numpy as np
    import tnet as tn
    import tensorflow as tf
    from tnet import feature_column as fc

    inputs = {"user_id": tf.keras.Input(shape=(), dtype=tf.int64, name="user_id")}
    x = tn.layers.EmbeddingFeatures(
        [fc.embedding_column(fc.category_column("user_id"), 8)])(inputs)
    model = tn.Model(inputs, tf.keras.layers.Dense(1, "sigmoid")(x))
    model.compile(tn.optimizer.Adagrad(0.5), loss="binary_crossentropy")
    tn.saving.restore(model, "ckpt")
    probe = {"user_id": tf.constant([3, 4, 10**9], tf.int64)}
    after = model.predict(probe, verbose=0)
    np.testing.assert_allclose(after, np.load("before.npy"), atol=1e-6)
    tn.serving.export_for_serving(model, "export/1")
    print("restored (same predictions) and exported")
''')

SERVE = textwrap.dedent('''
    import sys
    import numpy as np
    import tensorflow as tf
    served = tf.saved_model.load("export/1")
    out = served.signatures["serving_default"](
        user_id=tf.constant([3, 4, 10**9], tf.int64))["prediction"].numpy()
    np.testing.assert_allclose(out, np.load("before.npy"), atol=1e-5)
    assert "tnet" not in sys.modules
    print("served without tnet:", out.ravel())
''')


def run(cmd, label=None, **kw):
    print("+", label or " ".join(map(str, cmd)), flush=True)
    subprocess.run(cmd, check=True, **kw)


def lowest(requirements):
    """`name>=X` -> `name==X` constraints (pins and `==X.*` stay)."""
    out = []
    for req in requirements:
        req = req.split(";")[0].strip()
        m = re.match(r"^([A-Za-z0-9_.\-]+)\s*>=\s*([^,\s]+)", req)
        if m:
            out.append(f"{m[1]}=={m[2]}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keep", action="store_true",
                        help="reuse build/wheel-check/venv if it exists")
    args = parser.parse_args()
    dist = WORK / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    run(["make", "-C", str(ROOT), "wheel", f"DIST={dist}"])
    wheel = pathlib.Path(glob.glob(str(dist / "tnet-*.whl"))[0])
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist()
                           if n.endswith("METADATA"))).decode()
    requires = [line.split(":", 1)[1].strip() for line in meta.splitlines()
                if line.startswith("Requires-Dist:")]
    constraints = lowest(requires)
    (WORK / "constraints.txt").write_text("\n".join(constraints) + "\n")
    print("lowest versions:", ", ".join(constraints), flush=True)
    venv = WORK / "venv"
    if not (args.keep and venv.exists()):
        shutil.rmtree(venv, ignore_errors=True)
        run([sys.executable, "-m", "venv", str(venv)])
    py = venv / "bin" / "python"
    run([str(py), "-m", "pip", "install", "--quiet",
         "--disable-pip-version-check", "-c", str(WORK / "constraints.txt"),
         f"{wheel}[parquet]"])
    run([str(py), "-m", "pip", "list", "--format=freeze"])
    work = WORK / "run"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    for name, code in (("train", TRAIN), ("restore", RESTORE),
                       ("serve", SERVE)):
        run([str(py), "-c", code], label=f"{py} -c <{name}>", cwd=work,
            env=env)
    print("wheel-check: OK with", ", ".join(constraints))
    return 0


if __name__ == "__main__":
    sys.exit(main())
