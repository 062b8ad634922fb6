"""tnet.files.publish_dir and write_json_atomic: the one way the
three writers (checkpoints, serving exports, serving deltas) publish."""
from __future__ import annotations

import json
import os

import pytest

from tnet import files


def test_publish_dir_renames_a_complete_directory(tmp_path):
    final = tmp_path / "models" / "3"
    stale = tmp_path / "models" / ".3.tmp-killed"
    other = tmp_path / "models" / ".4.tmp-running"
    os.makedirs(stale)
    os.makedirs(other)
    with files.publish_dir(str(final)) as tmp:
        assert os.path.basename(tmp).startswith(".3.tmp-")
        assert not final.exists() and not stale.exists()  # a leftover of 3
        with open(os.path.join(tmp, "a"), "w") as f:
            f.write("x")
        os.makedirs(os.path.join(tmp, "sub"))
    assert sorted(os.listdir(tmp_path / "models")) == [".4.tmp-running", "3"]
    assert (final / "a").read_text() == "x" and (final / "sub").is_dir()


def test_publish_dir_leaves_nothing_on_error(tmp_path):
    final = tmp_path / "ckpt-7"
    with pytest.raises(RuntimeError, match="boom"):
        with files.publish_dir(str(final)) as tmp:
            open(os.path.join(tmp, "part"), "w").close()
            raise RuntimeError("boom")
    assert os.listdir(tmp_path) == []


def test_publish_dir_replaces_only_an_empty_final(tmp_path):
    final = tmp_path / "1"
    final.mkdir()
    with files.publish_dir(str(final)) as tmp:
        open(os.path.join(tmp, "saved_model.pb"), "w").close()
    assert os.listdir(final) == ["saved_model.pb"]
    with pytest.raises(OSError):
        with files.publish_dir(str(final)) as tmp:
            open(os.path.join(tmp, "other"), "w").close()
    assert os.listdir(final) == ["saved_model.pb"]
    assert sorted(os.listdir(tmp_path)) == ["1"]


def test_write_json_atomic(tmp_path):
    path = str(tmp_path / "state.json")
    files.write_json_atomic(path, {"v": 1})
    files.write_json_atomic(path, {"v": 2}, indent=2)
    assert json.load(open(path)) == {"v": 2}
    assert os.listdir(tmp_path) == ["state.json"]
