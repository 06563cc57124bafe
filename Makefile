# cuzk-mp: `make test` and `make bench` create and fill .venv themselves.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
TOOLS_STAMP := tools/node_modules/.installed-stamp
EXTRAS ?= test

.PHONY: venv tools test test-fast test-gpu bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -e '.[$(EXTRAS)]'
	touch $@

# snarkjs + circom2 from the committed lock file: the outside oracle for tests, never the product.
tools: $(TOOLS_STAMP)

$(TOOLS_STAMP): tools/package.json tools/package-lock.json
	cd tools && npm ci --no-audit --no-fund --loglevel=error
	touch $@

test: $(STAMP) $(TOOLS_STAMP)
	$(VPY) -m pytest tests

# Everything but the slow and snarkjs-oracle tests (a quick local loop).
test-fast: $(STAMP)
	$(VPY) -m pytest -m "not slow and not snarkjs" tests

# On the GPU machine (no network there): its system python3 has cupy and numba; the
# other dependencies travel as wheels in .whl/ (see README "GPU machine").
test-gpu:
	PYTHONPATH=$(CURDIR):$$PYTHONPATH python3 -m pytest -m gpu tests

bench: $(STAMP)
	$(VENV)/bin/cuzk-mp bench

clean:
	rm -rf $(VENV) tools/node_modules .pytest_cache
