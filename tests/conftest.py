"""Shared pytest setup: tnet is imported before TensorFlow (Keras 2)."""
from __future__ import annotations

import json
import os
import pathlib

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow loads

import tnet  # noqa: E402,F401  (must precede tensorflow: selects tf_keras)

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
    config.addinivalue_line(
        "markers", "serial: needs the machine to itself (a time or memory "
        "bound): `make test` runs it after the parallel pass, alone")
    # Drawn here, in the controller, before pytest-xdist starts its
    # workers: every worker inherits the same seed.
    fuzz_seed()


def _shared_fixture_group(item):
    """The test's module-, class- or session-scoped fixture defined in
    tests/ (a trained model, an export, a matrix of runs), if any: under
    pytest-xdist (`--dist loadgroup`) every test that uses it goes to one
    worker, so it is built once, not once per worker. (Inert with pytest
    9.2 and xdist 3.8.0, whose loadgroup does not group: make test uses
    --dist loadfile; see the Makefile.)"""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    for name in item.fixturenames:
        defs = info.name2fixturedefs.get(name)
        if not defs:
            continue
        fixture = defs[-1]
        if fixture.scope != "function" and fixture.baseid.startswith("tests"):
            return f"{fixture.baseid}::{name}"
    return None


# Seconds each test file took in a recent `make test` (the setup, call and
# teardown of its tests added up): `python tools/durations_by_file.py
# --write-order tests/file_seconds.json LOG` rewrites it from a run's
# `--durations=0` output.
FILE_SECONDS = ROOT / "tests" / "file_seconds.json"


def _heaviest_files_first(items):
    """Orders the test files by their seconds in FILE_SECONDS, largest
    first, each file's tests kept together and in their order. make test
    hands whole files to its workers in this order (`--dist loadfile
    --no-loadscope-reorder`), so the long files start first and the short
    ones fill in at the end, instead of a long file starting last while
    the other workers have nothing left (xdist's own order is by the
    number of tests). Files not listed come after the listed ones, in
    pytest's order (a new test file is small, or it is listed)."""
    try:
        seconds = json.loads(FILE_SECONDS.read_text())
    except (OSError, ValueError):
        return
    default = 0.0
    first_seen: dict[str, int] = {}
    for i, item in enumerate(items):
        first_seen.setdefault(item.nodeid.split("::", 1)[0], i)

    def key(pair):
        i, item = pair
        path = item.nodeid.split("::", 1)[0]
        return (-seconds.get(path, default), first_seen[path], i)

    items[:] = [item for _, item in sorted(enumerate(items), key=key)]


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            group = _shared_fixture_group(item)
            if group is not None:
                item.add_marker(pytest.mark.xdist_group(group))
    _heaviest_files_first(items)
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
