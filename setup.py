"""Builds tnet and its op library.

`pip install -e . --no-build-isolation` (what the Makefile runs) compiles
every tnet_ops/**/*.cc against the TensorFlow installed in the current
environment into tnet/_lib/libtnet_ops.so. Build isolation must stay off:
the library has to link against the very TensorFlow that will load it.
Objects are cached in build/obj and recompiled only when a source or any
header under tnet_ops/ changed, and shared between checkouts through
~/.cache/tnet/obj (TNET_BUILD_CACHE; see _ObjectCache); files compile in
parallel (TNET_BUILD_JOBS, default: number of CPUs). TNET_EXTRA_CFLAGS
adds flags (e.g. sanitizers).
tnet_ops/bind/bind_shim.c becomes tnet/_lib/libtnet_bind.so, a separate
LD_PRELOAD library (see tnet/bind.py).

`make wheel` (pip wheel --no-build-isolation) packs both libraries into a
wheel for this platform and Python, tagged for the TensorFlow it was built
against: the version carries it as a local label (0.2.0+tf2.21.0), the
metadata pins that TensorFlow (and the tf-keras of its minor version), and
tnet/_lib/build_info.json beside the library records it; tnet/_ops.py
checks it before loading the library. Everything else is a range (a
library must install beside its users' other tools); requirements.txt
stays the pinned development environment, and `make wheel-check` installs
the wheel with the lowest version of each range and uses it.
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import time

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).resolve().parent
OPS = ROOT / "tnet_ops"
# The one version: tnet/__init__.py's __version__.
BASE_VERSION = re.search(r'^__version__ = "([^"]+)"',
                         (ROOT / "tnet" / "__init__.py").read_text(),
                         re.M)[1]


def _tf_flags() -> tuple[list[str], list[str]]:
    try:
        import tensorflow as tf  # noqa: PLC0415
    except ImportError as e:  # pragma: no cover - build-time guidance
        sys.exit(
            "tnet's ops build against the installed TensorFlow, which is "
            f"missing ({e}). Install requirements.txt first, then run "
            "`pip install -e . --no-build-isolation` (or just `make test`)."
        )
    return tf.sysconfig.get_compile_flags(), tf.sysconfig.get_link_flags()


class _ObjectCache:
    """Objects shared by every checkout on this machine, so a fresh clone
    (CI, a second worktree, after `make clean`) compiles only what changed:
    ${TNET_BUILD_CACHE:-~/.cache/tnet/obj}/<key>.o, the key a hash of the
    compiler's version, the flags (the checkout's path taken out), the
    TensorFlow version, the source and every header under tnet_ops/.
    TNET_BUILD_CACHE=0 turns it off; entries unused for 30 days go."""

    MAX_AGE_S = 30 * 86400

    def __init__(self, cxx: str, cflags: list[str],
                 headers: list[pathlib.Path]) -> None:
        where = os.environ.get("TNET_BUILD_CACHE", "")
        self.dir = None
        if where == "0":
            return
        self.dir = pathlib.Path(where or os.path.join(
            os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")),
            "tnet", "obj"))
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            version = subprocess.run([cxx, "--version"], capture_output=True,
                                     text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            self.dir = None
            return
        import importlib.metadata  # noqa: PLC0415
        base = hashlib.sha256()
        for part in [version, importlib.metadata.version("tensorflow"),
                     *(f.replace(str(ROOT), "<checkout>") for f in cflags)]:
            base.update(part.encode() + b"\0")
        for h in headers:
            base.update(str(h.relative_to(ROOT)).encode() + b"\0")
            base.update(h.read_bytes())
        self.base = base
        now = time.time()
        for old in self.dir.glob("*.o"):
            try:
                if now - old.stat().st_mtime > self.MAX_AGE_S:
                    old.unlink()
            except OSError:
                pass

    def _path(self, src: pathlib.Path) -> pathlib.Path:
        key = self.base.copy()
        key.update(str(src.relative_to(ROOT)).encode() + b"\0")
        key.update(src.read_bytes())
        return self.dir / (key.hexdigest()[:32] + ".o")

    def fetch(self, src: pathlib.Path, obj: pathlib.Path) -> bool:
        if self.dir is None:
            return False
        cached = self._path(src)
        try:
            shutil.copyfile(cached, obj)
            os.utime(cached)  # in use: not pruned
        except OSError:
            return False
        return True

    def store(self, src: pathlib.Path, obj: pathlib.Path) -> None:
        if self.dir is None:
            return
        cached = self._path(src)
        tmp = cached.with_name(f".{cached.name}.{os.getpid()}.tmp")
        try:
            shutil.copyfile(obj, tmp)
            os.replace(tmp, cached)
        except OSError:
            pass


class BuildOps(build_ext):
    """Compiles tnet_ops/ with g++ -std=c++17 -O2 and TF's own flags."""

    def get_ext_filename(self, fullname: str) -> str:
        return os.path.join(*fullname.split(".")) + ".so"

    def build_extension(self, ext: Extension) -> None:
        if ext.name == "tnet._lib.libtnet_bind":
            self._build_bind_shim(ext)
            return
        compile_flags, link_flags = _tf_flags()
        extra = shlex.split(os.environ.get("TNET_EXTRA_CFLAGS", ""))
        cxx = os.environ.get("CXX", "g++")
        # -fno-math-errno: sqrt need not set errno (nothing reads it), so
        # the optimizers' row loops vectorize (sqrtps, same results).
        # -ffile-prefix-map: an object names its sources relative to the
        # checkout, so another clone can reuse it (_ObjectCache).
        cflags = ["-std=c++17", "-fPIC", "-O2", "-fno-math-errno", "-Wall",
                  "-Wno-sign-compare", "-Wno-deprecated-declarations",
                  f"-ffile-prefix-map={ROOT}/=", f"-I{ROOT}"
                  ] + compile_flags + extra
        # TF's flags carry --std=c++17 already; keep ours for clarity.
        # Objects are cached per set of flags: a flag change recompiles.
        flags_id = hashlib.sha1(" ".join([cxx, *cflags]).encode()).hexdigest()[:10]
        objdir = (ROOT / "build" / "obj"
                  / f"{'san' if extra else 'opt'}-{flags_id}")
        objdir.mkdir(parents=True, exist_ok=True)
        sources = sorted(OPS.rglob("*.cc"))
        headers = sorted(OPS.rglob("*.h"))
        newest_header = max((h.stat().st_mtime for h in headers), default=0)

        cache = _ObjectCache(cxx, cflags, headers)

        def compile_one(src: pathlib.Path) -> pathlib.Path:
            obj = objdir / (str(src.relative_to(OPS)).replace("/", "_") + ".o")
            if (obj.exists() and obj.stat().st_mtime >= src.stat().st_mtime
                    and obj.stat().st_mtime >= newest_header):
                return obj
            if cache.fetch(src, obj):
                print("[tnet build]", src.relative_to(ROOT), "(cached)",
                      flush=True)
                return obj
            cmd = [cxx, *cflags, "-c", str(src), "-o", str(obj)]
            print("[tnet build]", src.relative_to(ROOT), flush=True)
            subprocess.run(cmd, check=True)
            cache.store(src, obj)
            return obj

        jobs = int(os.environ.get("TNET_BUILD_JOBS", os.cpu_count() or 1))
        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            objs = list(pool.map(compile_one, sources))
        out = pathlib.Path(self.get_ext_fullpath(ext.name))
        out.parent.mkdir(parents=True, exist_ok=True)
        # Linked aside, then renamed: a process that has the old library
        # loaded (a running test or job) keeps its mapping intact.
        tmp = out.with_name(out.name + ".tmp")
        cmd = [cxx, "-shared", "-o", str(tmp), *map(str, objs), *link_flags,
               *extra]
        print("[tnet build] link", out, flush=True)
        subprocess.run(cmd, check=True)
        os.replace(tmp, out)
        _write_build_info(out.parent)

    def run(self) -> None:
        # In-place builds (`make build`'s editable install, build_ext
        # --inplace) link into build/lib, and setuptools copies the
        # libraries into the source tree: the build record goes with them.
        super().run()
        if self.inplace:
            _write_build_info(ROOT / "tnet" / "_lib")

    def _build_bind_shim(self, ext: Extension) -> None:
        """The LD_PRELOAD bind library (plain C, no TensorFlow; tnet/bind.py)."""
        src = OPS / "bind" / "bind_shim.c"
        out = pathlib.Path(self.get_ext_fullpath(ext.name))
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.exists() and out.stat().st_mtime >= src.stat().st_mtime:
            return
        cc = os.environ.get("CC", "gcc")
        print("[tnet build]", src.relative_to(ROOT), flush=True)
        subprocess.run([cc, "-O2", "-fPIC", "-shared", "-Wall", "-o", str(out),
                        str(src), "-ldl"], check=True)



def _tf_version() -> str:
    try:
        from importlib.metadata import version  # noqa: PLC0415
        return version("tensorflow")
    except Exception:  # noqa: BLE001 - no TensorFlow: the build says so
        return ""


def _write_build_info(lib_dir: pathlib.Path) -> None:
    """Records, beside the library, the TensorFlow it links against (and
    the compiler), for tnet/_ops.py to check before loading it."""
    import tensorflow as tf  # noqa: PLC0415
    info = {"tensorflow": tf.__version__, "tnet": BASE_VERSION,
            "cxx11_abi": int(tf.sysconfig.CXX11_ABI_FLAG),
            "compiler": os.environ.get("CXX", "g++"),
            "python": f"{sys.version_info[0]}.{sys.version_info[1]}"}
    tmp = lib_dir / "build_info.json.tmp"
    tmp.write_text(json.dumps(info, indent=1) + "\n")
    os.replace(tmp, lib_dir / "build_info.json")


def _version() -> str:
    """0.2.0+tf<version>: a wheel says which TensorFlow it was built for."""
    tf_version = _tf_version()
    return f"{BASE_VERSION}+tf{tf_version}" if tf_version else BASE_VERSION


# What tnet itself imports, as ranges: the lowest versions are what
# `make wheel-check` installs and runs (numpy and h5py: TensorFlow 2.21's own
# lower bounds).
RANGES = [
    "tensorflow-recommenders>=0.7.3",
    "numpy>=1.26",
    "h5py>=3.11",
    "absl-py>=1.0",
]
EXTRAS = {
    "parquet": ["pyarrow>=14"],   # tnet.data: format="parquet"
}


def _runtime_requirements() -> list[str]:
    """Exactly the TensorFlow the op library links against (its C++ API
    has no stable ABI) and the tf-keras of that minor version; ranges for
    the rest."""
    tf_version = _tf_version()
    if not tf_version:
        return ["tensorflow", "tf-keras", *RANGES]
    minor = ".".join(tf_version.split(".")[:2])
    return [f"tensorflow=={tf_version}", f"tf-keras=={minor}.*", *RANGES]


def _extras() -> dict[str, list[str]]:
    """`tnet[parquet]`, `tnet[serving]` (the follower's gRPC client: the
    serving API of the same TensorFlow minor version)."""
    tf_version = _tf_version()
    minor = ".".join(tf_version.split(".")[:2]) if tf_version else ""
    serving = (f"tensorflow-serving-api=={minor}.*" if minor
               else "tensorflow-serving-api")
    return {**EXTRAS, "serving": [serving]}


setup(
    name="tnet",
    version=_version(),
    description="Sparse embedding tables and ParameterServerStrategy "
                "training for Keras recommendation models",
    packages=find_packages(include=["tnet", "tnet.*"]),
    python_requires=">=3.11,<3.12",   # what is pinned and tested
    install_requires=_runtime_requirements(),
    extras_require=_extras(),
    package_data={"tnet": ["py.typed"]},
    ext_modules=[Extension("tnet._lib.libtnet_ops", sources=[]),
                 Extension("tnet._lib.libtnet_bind", sources=[])],
    cmdclass={"build_ext": BuildOps},
    zip_safe=False,
)
