"""glibc malloc tuning of a cluster process: the mmap threshold pinned and
the top pad set (`pin_mmap_threshold`, `set_top_pad`), so a long-lived
ps, worker or chief does not grow with each save."""
from __future__ import annotations

import ctypes
import ctypes.util
import os

_M_TOP_PAD = -2                # mallopt parameters (glibc malloc.h)
_M_MMAP_THRESHOLD = -3
DEFAULT_MMAP_THRESHOLD = 128 * 1024
DEFAULT_TOP_PAD = 64 * 1024 * 1024


def _glibc_setting(environ, env_name: str, tunable: str) -> bool:
    """Whether the process's environment set this malloc option itself."""
    return (env_name in environ
            or f"glibc.malloc.{tunable}=" in environ.get("GLIBC_TUNABLES", ""))


class MallocSettingError(ValueError):
    """TNET_TOP_PAD or TNET_MMAP_THRESHOLD is not a byte count (the
    message names the variable, its value and the fix)."""


def pin_mmap_threshold(environ=None) -> dict:
    """Sets two glibc malloc options in a cluster process (ps and worker
    tasks in `python -m tnet.server`, the chief in
    `ParameterServerStrategy()`); returns {option: value set, or None}.

    - M_MMAP_THRESHOLD to TNET_MMAP_THRESHOLD or 128 KiB: fixes the
      threshold (which also turns off glibc's dynamic raising of it), so
      every large transient buffer (checkpoint export chunks, gradients) is
      mmapped and returned to the OS when freed. With the dynamic threshold
      the heap fragments and a cluster process grows with every checkpoint
      (BENCHMARKS "Checkpoint memory").
    - M_TOP_PAD to TNET_TOP_PAD or 64 MiB: a heap that trims keeps that
      much free memory, and a thread's arena keeps an emptied heap rather
      than unmapping it (glibc's heap_trim weighs both against the pad).
      With glibc's 128 KiB, each step's freed tensors and RPC buffers went
      back to the kernel and the next step faulted them in again, zeroed
      page by page: under PSS (SPARSE-HEAVY, 2w/2ps) that was ~30% of a
      worker's CPU per step and ~15% of a ps's (BENCHMARKS "The
      allocator").

    0 in either variable leaves that option alone; so does the
    environment's own setting of it (MALLOC_MMAP_THRESHOLD_ /
    MALLOC_TOP_PAD_, or glibc.malloc tunables in GLIBC_TUNABLES).
    Nothing is set where the C library is not glibc."""
    return _mallopt(("mmap_threshold", "top_pad"), environ)


def set_top_pad(environ=None) -> dict:
    """Sets only M_TOP_PAD (as `pin_mmap_threshold` does, same variables
    and opt-outs); `tn.Model` calls it when it builds its train function,
    so a one-process job keeps its freed step memory too (SPARSE-HEAVY:
    ~3,300 page faults per step without it, ~110 with it; BENCHMARKS
    "One combine per table"). The mmap threshold stays glibc's dynamic
    one. Returns {"top_pad": value set, or None}."""
    return _mallopt(("top_pad",), environ)


def _mallopt(names, environ=None) -> dict:
    environ = os.environ if environ is None else environ
    wanted = {
        "mmap_threshold": (_M_MMAP_THRESHOLD, "TNET_MMAP_THRESHOLD",
                           DEFAULT_MMAP_THRESHOLD, "MALLOC_MMAP_THRESHOLD_"),
        "top_pad": (_M_TOP_PAD, "TNET_TOP_PAD", DEFAULT_TOP_PAD,
                    "MALLOC_TOP_PAD_"),
    }
    wanted = {name: wanted[name] for name in names}
    done = {name: None for name in wanted}
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return done
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    for name, (param, ours, default, theirs) in wanted.items():
        raw = environ.get(ours, default)
        try:
            value = int(raw)
        except ValueError:
            value = -1
        if not 0 <= value < 2**31:
            raise MallocSettingError(
                f"{ours}={raw!r}: expected a whole number of bytes below "
                "2 GiB (0 leaves glibc's default)")
        if value == 0 or _glibc_setting(environ, theirs, name):
            continue
        if mallopt(param, value) == 1:
            done[name] = value
    return done
