"""tnet.files.publish_dir and write_json_atomic: the one way the
three writers (checkpoints, serving exports, serving deltas) publish; the
messages of a checkpoint or export the file system refuses or cannot fit."""
from __future__ import annotations

import errno
import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

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


# ------------------------------------------------- a write that cannot fit
def test_write_failure_names_the_file_system_and_the_fix(tmp_path):
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path))
    message, code = files.write_failure("checkpoint /x/ckpt-3", str(tmp_path),
                                        full, "save to another directory")
    assert code == errno.ENOSPC and "\n" not in message
    assert message.startswith("could not write checkpoint /x/ckpt-3: OSError:")
    assert f"The file system of {tmp_path} is full (" in message
    assert message.endswith(": free space or save to another directory.")
    # h5py's text for a full disk counts too; other failures get no hint.
    message, code = files.write_failure(
        "the export /m/2", str(tmp_path),
        RuntimeError("file write failed ... errno = 28\nmore"), "fix")
    assert code == errno.ENOSPC and "more" not in message and "is full" in message
    denied = PermissionError(errno.EACCES, "Permission denied", "/m/2")
    message, code = files.write_failure("the export /m/2", "/m", denied, "fix")
    assert code == errno.EACCES and "is full" not in message
    assert message == ("could not write the export /m/2: PermissionError: "
                       "[Errno 13] Permission denied: '/m/2'.")


def test_space_shortfall_compares_with_the_free_bytes(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    assert files.free_bytes(str(tmp_path)) == pytest.approx(free, rel=0.01)
    assert files.free_bytes(str(tmp_path / "missing")) is None
    assert files.space_shortfall("w", 1, str(tmp_path), "fix") is None
    message = files.space_shortfall("the export /m/2", free * 2, str(tmp_path),
                                    "export to another directory")
    assert message.startswith(
        f"could not write the export /m/2: it needs about {free * 2:,} bytes "
        f"and the file system of {tmp_path} is full (")
    assert message.endswith(": free space or export to another directory.")
    # An unknown free space never refuses a write.
    assert files.space_shortfall("w", free * 2, str(tmp_path / "missing"),
                                 "fix") is None


def test_variables_bytes():
    arrays = [np.zeros((3, 4), np.float32), np.zeros(5, np.float16),
              np.zeros((), np.int64)]
    variables = [tf.Variable(a) for a in arrays]
    assert files.variables_bytes(variables) == sum(a.nbytes for a in arrays)
    assert files.variables_bytes([]) == 0
