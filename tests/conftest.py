"""Shared pytest setup: tnet is imported before TensorFlow (Keras 2)."""
from __future__ import annotations

import os
import pathlib

import pytest

import tnet  # noqa: F401  (must precede tensorflow: selects tf_keras)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"


def data_file(relative: str) -> pathlib.Path:
    """Path of a file under ../shared/data.

    Under CI=true a missing file fails the test (CI always has ../shared);
    elsewhere it skips, so a checkout without the data still runs the rest.
    """
    path = SHARED_DATA / relative
    if not path.exists():
        message = f"data file missing: {path} (../shared/data must sit beside the repo)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


def fuzz_seed() -> int:
    """The op fuzzer's seed for this run: FUZZ_SEED, else a new one drawn
    once per pytest process (so every run fuzzes new cases)."""
    if not os.environ.get("FUZZ_SEED"):
        os.environ["FUZZ_SEED"] = str(int.from_bytes(os.urandom(3), "little"))
    return int(os.environ["FUZZ_SEED"])


def pytest_report_header(config):
    return (f"op fuzzer seed: FUZZ_SEED={fuzz_seed()} (set it to replay this "
            "run's cases)")
