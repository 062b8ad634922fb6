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
    """The seed of this run's random cases (the op fuzzer, the exact-resume
    matrix, where the bad-input tests put the damage): FUZZ_SEED, else a
    new one drawn once per pytest process (so every run tries new cases)."""
    if not os.environ.get("FUZZ_SEED"):
        os.environ["FUZZ_SEED"] = str(int.from_bytes(os.urandom(3), "little"))
    return int(os.environ["FUZZ_SEED"])


def pytest_report_header(config):
    return (f"random cases seed: FUZZ_SEED={fuzz_seed()} (set it to replay "
            "this run's cases)")


# Long tests (full-size quality comparisons, long fault scenarios, scale):
# `make test` leaves them out to stay within its time budget;
# `make test-long` (TNET_LONG_TESTS=1) runs only them, `make test-all` both.
LONG_ENV = "TNET_LONG_TESTS"


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "long: a long test, run by `make test-long`, not `make test`")


def pytest_collection_modifyitems(config, items):
    mode = os.environ.get(LONG_ENV, "0")
    if mode == "all":
        return
    only_long = mode == "1"
    for item in items:
        is_long = item.get_closest_marker("long") is not None
        if is_long and not only_long:
            item.add_marker(pytest.mark.skip(
                reason=f"long test: `make test-long` runs it ({LONG_ENV}=1)"))
        elif only_long and not is_long:
            item.add_marker(pytest.mark.skip(reason="not a long test"))
