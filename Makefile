# fleetgate: `make run` and `make test` work on a fresh machine with Python 3.11+ only.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
HOST   ?= 127.0.0.1
PORT   ?= 8080

.PHONY: run test lint typecheck unit bench check-default clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	@touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[dev]'
	@touch $@ $(VENV)/.installed

run: $(VENV)/.installed  ## start the gateway with the embedded default fleet on :8080
	$(BIN)/fleetgate serve --host $(HOST) --port $(PORT)

lint: $(VENV)/.installed-dev  ## ruff, the layers contract, the Dockerfile
	$(BIN)/ruff check src tests bench
	$(BIN)/lint-imports
	$(BIN)/hadolint Dockerfile

typecheck: $(VENV)/.installed-dev
	$(BIN)/mypy

test: lint typecheck  ## the whole suite (CI runs this)
	$(BIN)/fleetgate check src/fleetgate/config/default.yaml > /dev/null
	$(BIN)/fleetgate check src/fleetgate/config/example.yaml > /dev/null
	$(BIN)/pytest -q -p no:cacheprovider

unit: $(VENV)/.installed-dev
	$(BIN)/pytest -q tests/unit

bench: $(VENV)/.installed-dev  ## gateway overhead benchmark (see BENCHMARKS.md)
	$(BIN)/python bench/relay_overhead.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache src/*.egg-info
