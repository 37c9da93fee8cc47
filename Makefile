SHELL := /bin/bash
# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
FRAMEWORKS := $(VENV)/.installed-frameworks
TORCH := torch==2.13.0

.PHONY: demo test test-extended test-multihost test-slow test-gpu test-all lint imports view bench-detect bench-overhead bench-plan bench-recover bench-simulate bench-chaos bench-scale up clean

# torch is named in both installs: with the project's extras alone, pip 26's resolver swaps the
# CPU wheel for a CUDA build of several GB.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH)
	$(BIN)/python -m pip install -q -e '.[dev]' $(TORCH)
	touch $(STAMP)

# The frameworks of examples/lightning and examples/hf_trainer (the `frameworks` extra), for the
# slow suite only: `make test` does not pay for them. torch named again, to keep the CPU wheel.
$(FRAMEWORKS): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,frameworks]' $(TORCH)
	touch $(FRAMEWORKS)

demo: $(STAMP)
	$(BIN)/unicron demo

up: $(STAMP)
	$(BIN)/unicron up

test: imports
	$(BIN)/pytest

# What `make test` leaves out to stay under its 15 minutes, and CI runs after it (.ci/run).
test-extended: $(STAMP)
	$(BIN)/pytest -m extended

test-slow: $(FRAMEWORKS)
	$(BIN)/pytest -m slow

# On a machine with CUDA (bench/gpu_check.sh runs it there); elsewhere each test says why not.
test-gpu: $(STAMP)
	$(BIN)/pytest -m gpu -rs -p no:randomly tests/gpu

test-all: $(FRAMEWORKS)
	$(BIN)/pytest -m ''

# The folders are mapped into `unicron` by the build (pyproject.toml, package-dir), which tools
# that read source cannot follow: mypy and lint-imports read the package as built, in build/view,
# and mypy's paths are mapped back to the folders.
VIEW := build/view
view: $(STAMP)
	rm -rf $(VIEW)
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation --no-compile --target $(VIEW) .

imports: view
	cd $(VIEW) && PYTHONPATH=. $(CURDIR)/$(BIN)/lint-imports --config $(CURDIR)/pyproject.toml

lint: imports
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	set -o pipefail; $(BIN)/mypy $(VIEW)/unicron bench \
	  | sed -E "s#^$(VIEW)/unicron/(cli|planning|services|shared|simulator|trainer)/#\1/#; s#^$(VIEW)/##"

# `make bench-NAME` runs bench/NAME.py.
BENCHES := detect overhead plan recover simulate chaos scale natsleader
$(addprefix bench-,$(BENCHES)): bench-%: $(STAMP)
	$(BIN)/python bench/$*.py

# Hosts in network namespaces (needs root and iproute2; skipped with the reason otherwise).
test-multihost: $(STAMP)
	rm -f .unicron/multihost.json
	$(BIN)/pytest -m multihost -rs -p no:randomly tests/multihost
	@cat .unicron/multihost.json 2>/dev/null || echo '{"skipped": "see the reason above"}'

clean:
	rm -rf .unicron .pytest_cache .mypy_cache .ruff_cache
