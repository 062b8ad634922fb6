# tnet: the README's two commands are `make demo` and `make test`.
# Both create .venv if missing, install the pinned requirements, build the
# op library against that TensorFlow, then run.
VENV    ?= .venv
PYTHON  ?= python3
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.tnet-requirements
PYTEST_ARGS ?=

# The docs site (mkdocs.yml): its own venv, .venv-docs, from
# requirements-docs.txt (no TensorFlow needed: the API reference is read
# from the sources). `make docs` builds site/ with --strict (a broken link,
# anchor or reference fails); `make docs-serve` previews it on :8000.
DOCS_VENV ?= .venv-docs
DOCS_STAMP := $(DOCS_VENV)/.tnet-docs-requirements

$(DOCS_STAMP): requirements-docs.txt
	$(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/python -m pip install --quiet -r requirements-docs.txt
	touch $@

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs build --strict

docs-serve: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs serve

.PHONY: docs docs-serve wheel-check demo test flaky test-long test-all test-hosts test-hosts-long build wheel bench-ops bench-stages bench-train bench-pss bench-saving bench-retrieval bench-lifecycle bench clean soak bench-scale bench-tfra bench-fresh bench-online bench-online-cluster bench-tier bench-pss-bytes

$(PY):
	$(PYTHON) -m venv $(VENV)

# The pinned requirements go in with uv (from the package registry, pinned
# here) when it installs: a clean clone's venv in ~15 s from uv's cache
# (~/.cache/uv) against ~57 s with pip, the same pins. --compile-bytecode
# as pip does: where PYTHONDONTWRITEBYTECODE=1 (as on the project's
# machines) no .pyc is ever written later, and every Python start compiled
# TensorFlow from source (import 9 s of CPU instead of 3.4; make test
# 20 min instead of 13). Where uv cannot be installed, or TNET_PIP=1, pip
# does it as before.
UV_VERSION ?= 0.13.9
$(STAMP): requirements.txt | $(PY)
	@if [ "$${TNET_PIP:-0}" != 1 ] && \
	    $(PY) -m pip install --quiet "uv==$(UV_VERSION)" >/dev/null 2>&1; then \
	  echo "installing requirements.txt with uv"; \
	  $(VENV)/bin/uv pip install --quiet --compile-bytecode --python $(PY) \
	      -r requirements.txt; \
	else \
	  echo "installing requirements.txt with pip"; \
	  $(PY) -m pip install --quiet --upgrade pip && \
	  $(PY) -m pip install --quiet -r requirements.txt; \
	fi
	touch $@

# Compiles tnet_ops/ into tnet/_lib/libtnet_ops.so (incremental).
build: $(STAMP)
	$(PY) -m pip install --quiet --no-build-isolation --no-deps -e .

# A wheel with the op library and the bind shim inside, for this platform,
# Python and TensorFlow (version 0.2.0+tf<X.Y.Z>, requires tensorflow==X.Y.Z;
# tnet/_lib/build_info.json records it): dist/tnet-*.whl. Install it with
# pip into any environment that has that TensorFlow. DIST: where it goes.
DIST ?= dist
wheel: $(STAMP)
	rm -rf build/lib* build/bdist*
	$(PY) -m pip wheel --quiet --no-build-isolation --no-deps -w $(DIST) .
	@ls -1 $(DIST)/tnet-*.whl

# The wheel installed into a fresh venv (build/wheel-check/venv) with the
# lowest version of every range it declares, then a model through fit,
# save, restore in a fresh process, export and a load without tnet
# (tools/wheel_check.py). Downloads those versions on first use.
wheel-check: $(STAMP)
	$(PY) tools/wheel_check.py

# The main job on its embedded default: a local cluster (2 ps, 2 workers) on
# 127.0.0.1 trains Wide&Deep on synthetic data, evaluates, exports a
# SavedModel and reloads it in a process without tnet.
demo: build
	$(PY) tools/launch_local.py --ps 2 --workers 2 -- \
	    $(PY) -m tnet.train --flagfile=configs/demo.cfg

# make test: the suite in TEST_JOBS processes (pytest-xdist, a test file
# to one worker, so a module's trained model or export is built once),
# then the tests marked serial alone (collected from the files that have
# them: collecting the whole suite again cost ~5 s). (--dist loadgroup
# does not group under pytest 9.2 with xdist 3.8.0: xdist sets item._nodeid, which
# pytest 9 no longer reads; the xdist_group marks of tests/conftest.py
# take effect only with an xdist that groups again.) It ends with the
# slowest 15 tests and its wall time (from the start of make, so a clean
# clone's venv and op build count): the budget is 12 minutes.
# Three workers on two cores: the suite's tests wait ~15% of their time
# (subprocess start-up, a cluster's ports, a stream's polling), which a
# third worker fills; four thrash (a third of the CPU in the kernel).
TEST_JOBS ?= 3
TEST_BUDGET_S ?= 720
MAKE_START := $(shell date +%s)
test: build
	@rc=0; \
	$(PY) -m pytest -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder \
	    -m "not serial" \
	    --durations=15 $(PYTEST_ARGS) tests || rc=$$?; \
	files=$$(grep -l "pytest.mark.serial" tests/test_*.py); \
	[ -z "$$files" ] || $(PY) -m pytest -m serial $(PYTEST_ARGS) $$files || { \
	    s=$$?; [ $$s -eq 5 ] || rc=$$s; }; \
	t=$$(( $$(date +%s) - $(MAKE_START) )); \
	echo "make test: $$(( t / 60 )) min $$(( t % 60 )) s wall from the start of make (budget $(TEST_BUDGET_S) s from a clean clone)"; \
	exit $$rc

# The long tests `make test` leaves out (marked @pytest.mark.long: full-size
# quality comparisons, slow fault scenarios); test-all runs everything.
test-long: build
	TNET_LONG_TESTS=1 $(PY) -m pytest $(PYTEST_ARGS) tests

test-all: build
	TNET_LONG_TESTS=all $(PY) -m pytest $(PYTEST_ARGS) tests

# A cluster across hosts (tests/test_hosts.py): chief, ps and worker tasks
# each in its own network namespace (needs root and iproute2), with links
# cut and tasks killed; each fault scenario HOSTS_REPEAT times. CI runs it
# at 2 (its share of CI's 30 minutes: about 6 minutes at 1, 9 at 2, 11 at
# 3 on 2 cores); test-hosts-long repeats each 10 times.
HOSTS_REPEAT ?= 2
test-hosts: build
	TNET_HOSTS_SCENARIOS=1 TNET_HOSTS_REPEAT=$(HOSTS_REPEAT) \
	    $(PY) -m pytest $(PYTEST_ARGS) tests/test_hosts.py

test-hosts-long: build
	$(MAKE) test-hosts HOSTS_REPEAT=10

# The tests that flaked before (tools/flaky.py lists them and why), each
# FLAKY_RUNS times in its own process, with pass counts at the end. The
# scenarios across hosts need root, as test-hosts.
FLAKY_RUNS ?= 10
flaky: build
	$(PY) tools/flaky.py --runs $(FLAKY_RUNS)

# Benchmarks are not tests: run them on a quiet machine.
bench-ops: build
	$(PY) tools/bench_ops.py

# Per-id cost of each stage of the sparse step (SPARSE-HEAVY batch) beside
# the memory-bound figure of this machine (tools/membound.cc).
bench-stages: build
	$(PY) tools/bench_stages.py

bench-train: build
	$(PY) tools/bench_train.py

bench-pss: build
	$(PY) tools/bench_pss.py

# Issue 29: what one SPARSE-HEAVY step moves through each ps (1 worker,
# 2 ps) against the minimum U x (8 + 4 x dim), and its gRPC calls, counted
# from gRPC's own trace. Not part of `make bench` (the trace is slow).
bench-pss-bytes: build
	$(PY) tools/bench_pss_bytes.py

# tnet vs TensorFlow Recommenders-Addons 0.8.1 (WD-400, same synthetic
# data). TFRA needs TF 2.16.2: the script creates .venv-tfra once (~2.3 GB).
# tnet against TFRA 0.8.1 (its own venv, .venv-tfra, created on first use):
# WD-400 (with TFRA under PSS), then SPARSE-HEAVY (one process).
bench-tfra: build
	$(PY) tools/bench_tfra.py
	$(PY) tools/bench_tfra.py --config sparse_heavy

bench-saving: build
	$(PY) tools/bench_saving.py

bench-retrieval: build
	$(PY) tools/bench_retrieval.py

# Soak: a 2 ps x 2 worker cluster trains for SOAK_MINUTES on a bounded key
# space; RSS of every process and table size are sampled (tools/soak.py).
SOAK_MINUTES ?= 10
soak: build
	$(PY) tools/soak.py --minutes $(SOAK_MINUTES)

# One table's whole life at ROWS rows (train, save, restore, export, serve
# without tnet; each stage its own process), the same at PSS_ROWS on a
# 2-ps local cluster, and the serving structures compared at
# STRUCTURE_ROWS. Needs ~75 B x ROWS of RAM and ~110 B x ROWS of disk.
ROWS ?= 200000000
PSS_ROWS ?= 50000000
STRUCTURE_ROWS ?= 20000000
bench-scale: build
	$(PY) tools/bench_scale.py --rows $(ROWS) --pss_rows $(PSS_ROWS) \
	    --structure_rows $(STRUCTURE_ROWS)

# Fresh models in serving: a 1% delta vs a full export + load, overlay latency.
FRESH_ROWS ?= 10000000
bench-fresh: build
	$(PY) tools/bench_fresh.py --rows $(FRESH_ROWS)

# Online training, click to served, measured end to end (issue 55): a
# writer lands a file every 2 s at 10k events/s, the trainer streams and
# publishes, the follower applies to a server without tnet, a prober waits
# for new ids' predictions to move; then throughput publishing vs not.
bench-online: build
	$(PY) tools/bench_online.py

# The same with the trainer as the chief of a 2 ps x 2 worker local cluster.
bench-online-cluster: build
	$(PY) tools/bench_online.py --cluster

# Tables larger than memory: a disk tier (TIER_ROWS rows, TIER_BUDGET_GB of
# rows in memory) against the in-memory table at TIER_MEM_ROWS, Zipf ids.
TIER_ROWS ?= 200000000
TIER_MEM_ROWS ?= 50000000
TIER_BUDGET_GB ?= 4
bench-tier: build
	$(PY) tools/bench_tier.py --rows $(TIER_ROWS) --mem_rows $(TIER_MEM_ROWS) \
	    --budget_gb $(TIER_BUDGET_GB)

# Admission / cap vs AUC on >= 10M distinct synthetic keys, plus a PNG.
bench-lifecycle: build
	$(PY) tools/bench_lifecycle.py

bench: bench-ops bench-train bench-pss bench-saving bench-retrieval bench-lifecycle

clean:
	rm -rf build tnet/_lib/*.so *.egg-info site

# Robustness (issue 7): longer runs than `make test`'s bounded ones.
# fuzz: FUZZ_CASES random op calls (tests/test_fuzz_ops.py), new seeds each
#   run unless FUZZ_SEED is set; outcome counts -> bench/results/fuzz_ops.json.
# stress: STRESS_SECONDS of threads on one table, through the TF ops
#   (tests/test_stress.py) and through the C++ table alone (table_stress.cc).
# sanitize: the op library under AddressSanitizer and ThreadSanitizer
#   (tools/sanitizers/sanitize.sh; builds into build/sanitize/, leaves
#   tnet/_lib alone).
.PHONY: fuzz stress sanitize sanitize-asan sanitize-tsan
FUZZ_CASES ?= 100000
STRESS_SECONDS ?= 300

fuzz: build
	mkdir -p bench/results
	FUZZ_CASES=$(FUZZ_CASES) FUZZ_BATCHES=$$(( $(FUZZ_CASES) / 2000 + 1 )) \
	FUZZ_SEED=$${FUZZ_SEED:-$$(date +%s)} \
	FUZZ_RESULTS=bench/results/fuzz_ops.json \
	    $(PY) -m pytest -q -p no:cacheprovider tests/test_fuzz_ops.py

stress: build
	STRESS_SECONDS=$(STRESS_SECONDS) $(PY) -m pytest -q tests/test_stress.py
	mkdir -p build/stress
	$${CXX:-g++} -std=c++17 -O2 -I. tools/sanitizers/table_stress.cc \
	    tnet_ops/table/table_shard.cc tnet_ops/table/table_shard_rows.cc tnet_ops/table/row_tier.cc -pthread -o build/stress/table_stress
	build/stress/table_stress $(STRESS_SECONDS) 4 4
	build/stress/table_stress $(STRESS_SECONDS) 4 4 16384

sanitize-asan: build
	PY=$(abspath $(PY)) tools/sanitizers/sanitize.sh asan

sanitize-tsan: build
	PY=$(abspath $(PY)) tools/sanitizers/sanitize.sh tsan

sanitize: sanitize-asan sanitize-tsan
