"""The AVX-512 op library gives the baseline library's bits.

setup.py builds libtnet_ops_avx512.so (the hot kernels compiled for
AVX-512) beside libtnet_ops.so; tnet/_ops.py loads it on a CPU that has
those instructions. Both are compiled with -ffp-contract=off, so no
multiply-add is fused in one and not the other: a table trained on a ps of
one CPU type and restored on another, or a job whose workers differ, moves
no value. The check runs one fixed workload (tests/programs/isa_workload.py:
tables of every rule and width, dedup, keys, combines and gradients) under
each library and compares every output bit for bit. (With contraction left
on, 120 of its 249 outputs differ.)
"""
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from tnet import _ops

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKLOAD = ROOT / "tests" / "programs" / "isa_workload.py"


def _run(tmp_path, isa, *args, script=None):
    env = dict(os.environ, TNET_OPS_ISA=isa, TF_CPP_MIN_LOG_LEVEL="2")
    cmd = [sys.executable, *(["-c", script] if script else
                             [str(WORKLOAD), str(tmp_path / f"{isa}.npz")]),
           *args]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)


def _avx512_runs_here() -> bool:
    built = _ops._build_info().get("variants") or {}
    return ("avx512" in built
            and _ops._VARIANT_CPU["avx512"] <= _ops._cpu_features())


@pytest.mark.skipif(not _avx512_runs_here(),
                    reason="no AVX-512 library, or this CPU cannot run it")
def test_avx512_library_gives_the_baseline_bits(tmp_path):
    outs = {}
    for isa in ("baseline", "avx512"):
        res = _run(tmp_path, isa)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
        outs[isa] = np.load(tmp_path / f"{isa}.npz")
        assert str(outs[isa]["isa"]) == isa  # the library it asked for
    base, fast = outs["baseline"], outs["avx512"]
    assert sorted(base.files) == sorted(fast.files)
    assert len(base.files) > 200
    differ = [k for k in base.files if k != "isa" and not (
        base[k].shape == fast[k].shape and base[k].dtype == fast[k].dtype
        and base[k].tobytes() == fast[k].tobytes())]
    assert not differ, f"{len(differ)} outputs differ, e.g. {differ[:10]}"


def test_the_library_choice_is_reported_and_checked(tmp_path):
    show = "import tnet; from tnet import _ops; print(_ops.isa, _ops.library_path)"
    res = _run(tmp_path, "baseline", script=show)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split()[-2:] == [
        "baseline", str(ROOT / "tnet" / "_lib" / "libtnet_ops.so")]
    res = _run(tmp_path, "", script=show)  # unset: the best this CPU runs
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.split()[-2] == ("avx512" if _avx512_runs_here()
                                      else "baseline")
    # A wrong value, or a library this machine cannot run: one line.
    res = _run(tmp_path, "sse9", script=show)
    assert res.returncode != 0 and "Traceback" not in res.stderr
    line, = [x for x in res.stderr.splitlines() if x.startswith("ImportError")]
    assert "TNET_OPS_ISA='sse9' is not one of auto, baseline, avx512" in line
    if not _avx512_runs_here():
        res = _run(tmp_path, "avx512", script=show)
        assert res.returncode != 0 and "Traceback" not in res.stderr
        line, = [x for x in res.stderr.splitlines()
                 if x.startswith("ImportError")]
        assert "TNET_OPS_ISA=avx512" in line and "unset TNET_OPS_ISA" in line


def test_a_cpu_or_build_without_avx512_gets_the_baseline(monkeypatch):
    monkeypatch.setattr(_ops, "_cpu_features", lambda: {"sse2", "avx2"})
    monkeypatch.setenv("TNET_OPS_ISA", "auto")
    assert _ops._choose_library() == ("baseline", _ops._BASELINE_PATH)
    monkeypatch.setenv("TNET_OPS_ISA", "avx512")
    with pytest.raises(_ops.OpLibraryError,
                       match="this CPU lacks avx512bw, avx512dq, avx512f"):
        _ops._choose_library()
    # A CPU that has it, and a build that does not list the variant (a
    # sanitizer build): the variant file is never loaded.
    monkeypatch.setattr(_ops, "_cpu_features",
                        lambda: set(_ops._VARIANT_CPU["avx512"]))
    monkeypatch.setattr(_ops, "_build_info", lambda: {"variants": {}})
    with pytest.raises(_ops.OpLibraryError, match="has no such library"):
        _ops._choose_library()
    monkeypatch.setenv("TNET_OPS_ISA", "")
    assert _ops._choose_library()[0] == "baseline"
