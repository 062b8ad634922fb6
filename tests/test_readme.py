"""The README's quickstart runs as written (with a tiny `dataset`)."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np

from tests.conftest import ROOT

SETUP = '''
import numpy as np
import tensorflow as tf
dataset = tf.data.Dataset.from_tensor_slices(
    ({"user_id": np.arange(64), "city": np.array(["a", "b"] * 32)},
     np.ones(64, np.float32))).batch(16)
'''


def test_readme_quickstart_runs(tmp_path):
    text = (ROOT / "README.md").read_text()
    code = re.findall(r"```python\n(.*?)```", text, re.S)[0]
    assert "model.fit(dataset)" in code
    code = code.replace("model = Ranker()", SETUP + "model = Ranker()")
    code = code.replace('"/tmp/export/1"', repr(str(tmp_path / "export" / "1")))
    code += "\nprint('QUICKSTART_OK', int(model.embed.tables['user_id'].size()))\n"
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "QUICKSTART_OK 64" in res.stdout
    assert (tmp_path / "export" / "1" / "saved_model.pb").exists()


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start)
    return text[start:end if end >= 0 else len(text)]


def test_readme_fresh_walkthrough_runs(tmp_path):
    """README "Fresh models in serving" / "Try it locally": the Python
    file (train, export updatable, serve, publish, follow) and the gRPC
    commands (the stand-in server, the follower's CLI) run as written,
    under tmp_path instead of /tmp/fresh."""
    section = _section((ROOT / "README.md").read_text(), "### Try it locally")
    code = re.findall(r"```python\n(.*?)```", section, re.S)[0]
    shell = re.findall(r"```sh\n(.*?)```", section, re.S)[0]
    work = str(tmp_path / "fresh")
    code = code.replace("/tmp/fresh", work)
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=str(ROOT),
                                  TF_CPP_MIN_LOG_LEVEL="2"))
    assert res.returncode == 0, res.stderr[-3000:]
    out = {line.split(":", 1)[0]: line.split(":", 1)[1]
           for line in res.stdout.splitlines() if ":" in line}
    before, after, trainer = (np.array(out[k].strip(" []").split(), float)
                              for k in ("served before", "served after",
                                        "trainer"))
    assert np.max(np.abs(after - before)) > 1e-3  # the delta changed it
    np.testing.assert_allclose(after, trainer, atol=1e-5)
    assert "delta-000001" in out["published"]
    # The shell block: `python` is this interpreter, paths under tmp_path.
    shell = shell.replace("/tmp/fresh", work).replace(
        "python ", f"{sys.executable} ")
    res = subprocess.run(["bash", "-c", shell], cwd=ROOT, capture_output=True,
                         text=True, timeout=300,
                         env=dict(os.environ, PYTHONPATH=str(ROOT),
                                  TF_CPP_MIN_LOG_LEVEL="3"))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert re.search(r"\[tnet\.follow\] grpc://127\.0\.0\.1:\d+/ranker: "
                     r"applied delta-000001", res.stdout), res.stdout
