#!/usr/bin/env bash
# Builds tnet's op library with a sanitizer and runs the op tests under it.
#
#   tools/sanitizers/sanitize.sh asan|tsan [pytest files...]
#
# 1. The library is built with TNET_EXTRA_CFLAGS into build/sanitize/KIND/lib
#    (setup.py caches objects per flag set, in build/obj/san-<flags id>),
#    and a copy of the tnet package
#    that loads it is made in build/sanitize/KIND/pkg: the normal
#    tnet/_lib/libtnet_ops.so is never touched.
# 2. The TensorFlow-free table stress driver (table_stress.cc) is built with
#    the same sanitizer and run: the clean signal for data races, since TF's
#    own uninstrumented threads are not in it.
# 3. pytest runs the op tests with the sanitizer runtime (and libstdc++, or
#    ASan's __cxa_throw interceptor finds no real function) preloaded into
#    Python; `python -P` keeps the checkout's own tnet off sys.path. Reports
#    go to build/sanitize/KIND/report.* ; any ASan report fails the run.
#    Under TSan only the driver gates (see the note before step 3).
set -euo pipefail
kind=${1:?usage: sanitize.sh asan|tsan [tests...]}
shift || true
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
CXX=${CXX:-g++}
out=$ROOT/build/sanitize/$kind
tests=("$@")
[ ${#tests[@]} -gt 0 ] || tests=(tests/test_table.py tests/test_bad_input.py
  tests/test_optimizers.py tests/test_fuzz_ops.py tests/test_stress.py)
case $kind in
  asan)
    flags="-fsanitize=address -fno-omit-frame-pointer -g"
    driver_flags="-fsanitize=address,undefined -fno-omit-frame-pointer"
    runtime=$($CXX -print-file-name=libasan.so)
    # allocator_may_return_null: a fuzzed 2^45-row tensor must fail as a
    # ResourceExhausted, as it does without ASan. Leak checking is off:
    # Python and TF keep their globals at exit.
    export ASAN_OPTIONS="detect_leaks=0:allocator_may_return_null=1:halt_on_error=1"
    export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
    ;;
  tsan)
    flags="-fsanitize=thread -g"
    driver_flags="-fsanitize=thread"
    runtime=$($CXX -print-file-name=libtsan.so)
    export TSAN_OPTIONS="halt_on_error=0:report_signal_unsafe=0"
    ;;
  *) echo "unknown sanitizer $kind (asan or tsan)" >&2; exit 2 ;;
esac
stdcxx=$($CXX -print-file-name=libstdc++.so)
cd "$ROOT"
mkdir -p "$out"
rm -f "$out"/report.*

echo "== [$kind] building the op library"
TNET_EXTRA_CFLAGS="$flags" "$PY" setup.py -q build_ext --build-lib "$out/lib" \
  | grep -v '^\[tnet build\] tnet_ops' || true
rm -rf "$out/pkg" && mkdir -p "$out/pkg"
cp -r tnet "$out/pkg/"
find "$out/pkg" -name __pycache__ -prune -exec rm -rf {} +
cp "$out/lib/tnet/_lib/libtnet_ops.so" "$out/pkg/tnet/_lib/libtnet_ops.so"

echo "== [$kind] table stress driver (no TensorFlow)"
$CXX -std=c++17 -O1 -g $driver_flags -I. tools/sanitizers/table_stress.cc \
  tnet_ops/table/table_shard.cc tnet_ops/table/table_shard_rows.cc tnet_ops/table/row_tier.cc -pthread -o "$out/table_stress"
"$out/table_stress" "${DRIVER_SECONDS:-20}" 4 4
"$out/table_stress" "${DRIVER_SECONDS:-20}" 4 1
# The same with a disk tier whose cache holds 16 KiB of rows: every
# operation also moves rows between the cache and the tier's file.
"$out/table_stress" "${DRIVER_SECONDS:-20}" 4 4 16384

if [ "$kind" = tsan ] && [ "${TSAN_PYTHON:-0}" != 1 ]; then
  # Under Python every kernel runs inside uninstrumented TensorFlow: TSan
  # cannot see the happens-before of Eigen's ParallelFor barrier, of
  # RefCounted::Unref or of TF's tensor buffers, and reports those handoffs
  # as races (178 reports in one run of the op tests, every one with such a
  # handoff between the two stacks; see BENCHMARKS.md). The driver above is
  # the race check; TSAN_PYTHON=1 runs the op tests too, for information.
  echo "== [$kind] done: driver clean (op tests under TSan: TSAN_PYTHON=1)"
  exit 0
fi
echo "== [$kind] op tests under $kind: ${tests[*]}"
# From here reports go to files (pytest would swallow a dying child's
# stderr); TSan's exit code 66 would only repeat what the files say.
export ASAN_OPTIONS="${ASAN_OPTIONS:-}:log_path=$out/report"
export TSAN_OPTIONS="${TSAN_OPTIONS:-}:log_path=$out/report:exitcode=0"
export TF_CPP_MIN_LOG_LEVEL=2
loaded=$(PYTHONPATH="$out/pkg" LD_PRELOAD="$runtime $stdcxx" "$PY" -P -c \
  "import tnet._ops as o; print(o.library_path)" 2>/dev/null | tail -1)
case $loaded in "$out"/*) ;; *) echo "wrong library loaded: $loaded" >&2; exit 1 ;; esac
status=0
PYTHONPATH="$out/pkg" LD_PRELOAD="$runtime $stdcxx" \
  FUZZ_CASES=${FUZZ_CASES:-1000} STRESS_SECONDS=${STRESS_SECONDS:-15} \
  "$PY" -P -m pytest -p no:cacheprovider --capture=sys -q "${tests[@]}" || status=$?
reports=$(ls "$out"/report.* 2>/dev/null || true)
if [ "$kind" = tsan ] && [ -n "$reports" ]; then
  echo "== [tsan] $(cat $reports | grep -c 'WARNING: ThreadSanitizer') reports" \
    "in $out (informational: see above)"
elif [ -n "$reports" ]; then
  echo "== [$kind] sanitizer reports:" >&2
  for r in $reports; do head -60 "$r" >&2; echo >&2; done
  status=1
fi
echo "== [$kind] done: status $status (reports in $out)"
exit $status
