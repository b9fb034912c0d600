# Each target bootstraps its own virtual environment: nothing relies on what was installed by hand.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed

.PHONY: demo estimators test test-fast bench bench-peers bench-ray bench-spatial bench-trust validate clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[serve,litert,test,bench,ray]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/edgemux demo

# the estimators and the simulator on one example node, side by side (what `make demo` did before serving)
estimators: $(STAMP)
	$(VENV)/bin/edgemux predict examples/edge-node.yaml
	$(VENV)/bin/edgemux simulate examples/edge-node.yaml

# The whole suite, spread over the machine's cores (pytest-xdist) by module and class (--dist loadscope): a
# module's expensive fixture is built once, and the validation grid is split into classes so that it is shared.
# (Not --dist loadgroup: with pytest 9.2 its xdist_group marks are silently ignored, pytest-xdist issue 1386.)
# --no-loadscope-reorder keeps the collection order, in which tests/conftest.py puts the longest scopes first
# (tests/scope_seconds.json): xdist's default reorder (most tests per scope first) started the six one-test
# validation-grid classes last, and one core then ran the last of them alone. One worker more than the cores
# (WORKERS): the serving tests spend about a fifth of their time waiting (process start-ups, heartbeats, timed
# loads), and the extra worker computes meanwhile. It prints its 15 slowest tests (where the time goes: see
# docs/development.md, "Tests") and its wall time.
WORKERS ?= $(shell $(PYTHON) -c 'import os; print(len(os.sched_getaffinity(0)) + 1 if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1) + 1)')

test: $(STAMP)
	@start=$$(date +%s); $(PY) -m pytest -q -n $(WORKERS) --dist loadscope --no-loadscope-reorder --durations=15; rc=$$?; \
	echo "make test: $$(( $$(date +%s) - start )) s wall"; exit $$rc

# The inner loop: everything but the tests marked slow (experiments, the full validation grid, benchmarks).
test-fast: $(STAMP)
	$(PY) -m pytest -q -n $(WORKERS) --dist loadscope --no-loadscope-reorder -m "not slow"

validate: $(STAMP)
	$(VENV)/bin/edgemux validate
	$(VENV)/bin/edgemux validate --measurements ../shared/validation/ibis-edgetpu --measurements ../shared/validation/ibis-trt

bench: $(STAMP)
	$(PY) benchmarks/bench_lindley.py
	$(PY) benchmarks/bench_engine.py
	$(PY) benchmarks/bench_admission.py
	$(PY) benchmarks/bench_predicted_vs_observed.py
	$(PY) benchmarks/bench_serving.py
	$(PY) benchmarks/bench_mvsp_forms.py
	$(PY) benchmarks/bench_move.py

# edgemux beside KServe, Ray Serve, MLServer and PyTriton on the same model and request bytes; the first run
# installs each peer into its own virtual environment under build/peers (about 2 GB)
bench-peers: $(STAMP)
	$(PY) benchmarks/bench_peers.py

bench-ray: $(STAMP)
	$(PY) benchmarks/bench_ray_engine.py

# spatial sharing on this machine's real CPU (ONNX Runtime): knee curves, instances, shared weights, share
# changes, and temporal against spatio-temporal rounds (Dhakal Table III)
bench-spatial: $(STAMP)
	$(PY) benchmarks/bench_spatial.py
	$(PY) benchmarks/bench_spatiotemporal.py
	$(PY) benchmarks/bench_spatial_cuda.py

# trust: co-tenants while one tenant sends 3x its contract; kill -9 under load, nothing lost
bench-trust: $(STAMP)
	$(PY) benchmarks/bench_isolation.py
	$(PY) benchmarks/chaos.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .hypothesis .mypy_cache
