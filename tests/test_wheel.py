"""tnet installs like a library: `make wheel`'s wheel carries the op
library (built for one TensorFlow, recorded beside it) and installs into a
fresh virtualenv; importing tnet under another TensorFlow, or without the
library, fails at import with one line saying what it was built for and
how to rebuild (tnet/_ops.py), not an undefined-symbol error."""
from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
import tensorflow as tf

from tests.conftest import ROOT


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "TF_CONFIG", "LD_PRELOAD")}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", CI="true", **extra)
    return env


def _copy_package(target: pathlib.Path) -> pathlib.Path:
    """A copy of the tnet package as built here (with _lib/*.so)."""
    import tnet  # noqa: PLC0415
    src = pathlib.Path(tnet.__file__).resolve().parent
    shutil.copytree(src, target / "tnet",
                    ignore=shutil.ignore_patterns("__pycache__", "*.tmp"))
    info = target / "tnet" / "_lib" / "build_info.json"
    if not info.exists():  # a build from before the record existed
        info.write_text(json.dumps({"tensorflow": tf.__version__}))
    return target / "tnet"


def _one_line_failure(res, prefix: str) -> str:
    """The run failed with exactly one line of its own on stderr (TF's C++
    start-up log lines aside), and no traceback; returns that line."""
    assert res.returncode != 0, res.stdout[-2000:]
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    assert "undefined symbol" not in res.stderr, res.stderr[-3000:]
    ours = [line for line in res.stderr.splitlines() if line.startswith(prefix)]
    assert len(ours) == 1, res.stderr[-3000:]
    return ours[0]


@pytest.mark.parametrize("damage", ["other_tensorflow", "library_missing"])
def test_import_refuses_a_library_for_another_tensorflow(tmp_path, damage):
    package = _copy_package(tmp_path / "site")
    info = package / "_lib" / "build_info.json"
    recorded = json.loads(info.read_text())
    assert recorded["tensorflow"] == tf.__version__
    if damage == "other_tensorflow":  # as if built against TF 2.99.0
        info.write_text(json.dumps(dict(recorded, tensorflow="2.99.0")))
    else:
        (package / "_lib" / "libtnet_ops.so").unlink()
    env = _env(PYTHONPATH=str(tmp_path / "site"))
    res = subprocess.run([sys.executable, "-c", "import tnet"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=300)
    last = _one_line_failure(res, "ImportError: tnet's op library")
    if damage == "other_tensorflow":
        assert f"built for TensorFlow 2.99.0, but TensorFlow {tf.__version__}" in last
        assert "make build" in last and "tensorflow==2.99.0" in last
    else:
        assert "is missing" in last and "make build" in last
    # The CLI says the same in one line, without a traceback.
    res = subprocess.run([sys.executable, "-m", "tnet.train"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=300)
    assert _one_line_failure(res, "ImportError: tnet's op library") == last


# ------------------------------------------------------- the wheel, installed


def _make_wheel(dist: pathlib.Path) -> subprocess.CompletedProcess:
    """`make wheel` with its wheel in `dist`, built by this interpreter's
    environment (the one that already has the pinned requirements): its
    requirements stamp is not remade (-o), so make runs the wheel recipe
    itself and installs nothing."""
    venv = pathlib.Path(sys.executable).parents[1]
    return subprocess.run(
        ["make", "-C", str(ROOT), "wheel", f"VENV={venv}",
         f"PY={sys.executable}", f"DIST={dist}",
         "-o", str(venv / ".tnet-requirements")],
        env=_env(), capture_output=True, text=True, timeout=1800)


def _fresh_venv(tmp_path: pathlib.Path) -> pathlib.Path:
    """A new virtualenv (no system site-packages, nothing linked from this
    environment) with the pinned requirements installed by pip from
    requirements.txt, as a user would (pip's cache makes repeats cheap)."""
    venv = tmp_path / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    res = subprocess.run(
        [str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "-r", str(ROOT / "requirements.txt")], cwd=tmp_path, env=_env(),
        capture_output=True, text=True, timeout=3600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return py


@pytest.mark.long
def test_wheel_installs_and_trains_in_a_fresh_venv(tmp_path):
    dist = tmp_path / "dist"
    build = _make_wheel(dist)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    wheels = list(dist.glob("tnet-*.whl"))
    assert len(wheels) == 1, wheels
    wheel = wheels[0]
    assert str(wheel) in build.stdout  # the recipe lists what it built
    # Tagged for this TensorFlow: the version's local label and the pin.
    assert f"+tf{tf.__version__}-cp3" in wheel.name, wheel.name
    import zipfile  # noqa: PLC0415
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        assert "tnet/_lib/libtnet_ops.so" in names
        assert "tnet/_lib/libtnet_bind.so" in names
        info = json.loads(z.read("tnet/_lib/build_info.json"))
        meta = z.read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert info["tensorflow"] == tf.__version__
    assert f"Requires-Dist: tensorflow=={tf.__version__}" in meta
    # Only TensorFlow (and its tf-keras) pinned; ranges for the rest, and
    # the extras; typed.
    minor = ".".join(tf.__version__.split(".")[:2])
    assert f"Requires-Dist: tf-keras=={minor}.*" in meta, meta
    assert "Requires-Dist: numpy>=" in meta and "numpy==" not in meta, meta
    assert "pandas" not in meta, meta
    assert "Provides-Extra: parquet" in meta and "Provides-Extra: serving" in meta
    assert "tnet/py.typed" in names

    py = _fresh_venv(tmp_path)
    work = tmp_path / "work"  # no checkout on the path: cwd is elsewhere
    work.mkdir()
    env = _env()
    nothing = subprocess.run([str(py), "-c", "import tnet"], cwd=work,
                             env=env, capture_output=True, text=True)
    assert "No module named 'tnet'" in nothing.stderr, nothing.stderr[-2000:]
    inst = subprocess.run([str(py), "-m", "pip", "install",
                           "--disable-pip-version-check", str(wheel)],
                          cwd=work, env=env, capture_output=True, text=True,
                          timeout=600)
    assert inst.returncode == 0, inst.stdout[-3000:] + inst.stderr[-3000:]
    # The pins were met by requirements.txt: the wheel brought only tnet.
    assert "Successfully installed tnet-" in inst.stdout, inst.stdout[-3000:]
    assert inst.stdout.split("Successfully installed ")[1].split() == [
        wheel.name.split("-cp")[0]], inst.stdout
    where = subprocess.run([str(py), "-c", "import tnet; print(tnet.__file__)"],
                           cwd=work, env=env, capture_output=True, text=True,
                           timeout=300)
    assert where.returncode == 0, where.stderr[-3000:]
    assert where.stdout.strip().startswith(str(tmp_path / "venv")), where.stdout

    # The README quick start, as written (it makes its own data).
    text = (ROOT / "README.md").read_text()
    code = re.findall(r"```python\n(.*?)```", text[text.index("## Quick start"):],
                      re.S)[0]
    code = code.replace('/tmp/tnet_quickstart', str(work / "quick"))
    res = subprocess.run([str(py), "-c", code], cwd=work, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "rows in the user table: 1000" in res.stdout, res.stdout

    # The CLI on a config (a user's flag file), with an export.
    config = work / "my.cfg"
    config.write_text((ROOT / "configs" / "wide_deep_synthetic.cfg").read_text()
                      + f"--model_dir={work / 'run'}\n--export_dir={work / 'export'}\n"
                      "--synthetic_train_examples=4096\n--synthetic_eval_examples=1024\n"
                      "--hidden_units=16\n--batch_size=256\n")
    res = subprocess.run([str(py), "-m", "tnet.train", f"--flagfile={config}"],
                         cwd=work, env=env, capture_output=True, text=True,
                         timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    summary = json.loads((work / "run" / "summary.json").read_text())
    assert summary["export"]["checked_without_tnet"] is True
    assert 0.5 < summary["eval"]["auc"] <= 1.0
    export = summary["export"]["path"]
    # Loaded and called by a process that has no tnet at all.
    check = ("import sys, numpy as np, tensorflow as tf\n"
             f"m = tf.saved_model.load({export!r})\n"
             "f = m.signatures['serving_default']\n"
             "def arg(v):\n"
             "    shape = [4] + [1 if d is None else d for d in v.shape.as_list()[1:]]\n"
             "    return (tf.fill(shape, '') if v.dtype == tf.string\n"
             "            else tf.zeros(shape, v.dtype))\n"
             "args = {k: arg(v) for k, v in f.structured_input_signature[1].items()}\n"
             "out = f(**args)\n"
             "assert 'tnet' not in sys.modules\n"
             "print('LOADED', sorted(out))\n")
    res = subprocess.run([str(py), "-c", check], cwd=work, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "LOADED" in res.stdout

    # The installed wheel under "another TensorFlow": one line at import.
    lib = pathlib.Path(where.stdout.strip()).parent / "_lib"
    recorded = json.loads((lib / "build_info.json").read_text())
    (lib / "build_info.json").write_text(json.dumps(dict(recorded, tensorflow="2.99.0")))
    res = subprocess.run([str(py), "-m", "tnet.train", f"--flagfile={config}"],
                         cwd=work, env=env, capture_output=True, text=True,
                         timeout=300)
    line = _one_line_failure(res, "ImportError: tnet's op library")
    assert "built for TensorFlow 2.99.0" in line and "make build" in line
