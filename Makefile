# cuzk-mp: `make test` and `make bench` create and fill .venv themselves.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
TOOLS_STAMP := tools/node_modules/.installed-stamp
# Extras to install, comma-separated. Empty (the default): `test` and `fleet` (the fleet tests'
# queue library), plus the GPU extra matching this machine's NVIDIA driver (`gpu` for CUDA 12,
# `gpu-cuda13` for CUDA 13; none without a GPU).
# `make print-extras` shows the choice; `make venv EXTRAS=test,plot` overrides it.
EXTRAS ?=
# Test processes (pytest-xdist). Each test file runs whole, in its order, in one of them
# (`--dist loadfile`: module fixtures such as the fleet's three daemons stay in one process).
# Most tests wait on child processes, so two keep a 2-core machine busy: the suite took 517 s
# with 2 against 778 s with 1 on one (perf/results/test-suite-cpu-2026-12-07-workers.json).
TEST_WORKERS ?= 2
PYTEST := $(VPY) -m pytest -n $(TEST_WORKERS) --dist loadfile

.PHONY: venv print-extras tools lint test test-fast test-gpu bench bench-gpu clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	scripts/install-venv.sh "$(PY)" "$(VENV)" "$(EXTRAS)"
	touch $@

# What `make venv` would install here, without installing anything.
print-extras:
	@scripts/install-venv.sh --dry-run "$(PY)" "$(VENV)" "$(EXTRAS)"

# snarkjs + circom2 from the committed lock file: the outside oracle for tests, never the product.
tools: $(TOOLS_STAMP)

$(TOOLS_STAMP): tools/package.json tools/package-lock.json
	cd tools && npm ci --no-audit --no-fund --loglevel=error
	touch $@

# The lint gate: ruff on everything, mypy on the packages listed in pyproject.toml ([tool.mypy]).
lint: $(STAMP)
	$(VENV)/bin/ruff check cuzk_mp tests scripts perf
	$(VENV)/bin/mypy

test: lint $(TOOLS_STAMP)
	$(PYTEST) tests

# Everything but the slow and snarkjs-oracle tests (a quick local loop).
test-fast: $(STAMP)
	$(PYTEST) -m "not slow and not snarkjs" tests

# On the GPU machine (no network there): its system python3 has cupy and numba; the
# other dependencies travel as wheels in .whl/ (see README "GPU machine").
test-gpu:
	PYTHONPATH=$(CURDIR):$$PYTHONPATH python3 -m pytest -m gpu tests

bench: $(STAMP)
	$(VENV)/bin/cuzk-mp bench

# `make bench` on the GPU machine: its system python3 and the carried wheels, no .venv.
bench-gpu:
	PYTHONPATH=$(CURDIR):$$PYTHONPATH python3 -m cuzk_mp bench

clean:
	rm -rf $(VENV) tools/node_modules .pytest_cache .mypy_cache .ruff_cache
