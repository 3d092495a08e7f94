"""``make test-engines``: the gateway and the conformance checks against a real vLLM (CPU).

Skipped unless ``FLEETGATE_ENGINE_TESTS=1`` (``make test`` runs ``pytest tests`` and must not
need vLLM); ``make test-engines`` sets it with the engine venv's python and the tiny model.

One real vLLM per run (it takes about a minute to start on 2 cores): the session fixture
``real`` starts it through ``fleetgate worker``, registered with the session gateway
``fleet`` whose config has one emulated vLLM pool (``h100-emu``) serving the same public name
(``tiny``); the real pool (``cpu-vllm``) also serves ``tiny-real``. The modules run in name
order and ``test_vllm_lifecycle.py`` comes last: it stops the engine.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from engines_harness import EMU_POOL, MAX_MODEL_LEN, PUBLIC, SERVED, RealEngine, start_real_vllm

from procs import Proc, pool, spawn_emulator, spawn_gateway

HERE = Path(__file__).parent
ENABLED = os.environ.get("FLEETGATE_ENGINE_TESTS") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="real-engine tests: run `make test-engines` "
                                   "(FLEETGATE_ENGINE_TESTS=1)")
    for item in items:
        if HERE in Path(str(item.path)).parents:
            # the first test also waits for vLLM to start
            item.add_marker(pytest.mark.timeout(420) if ENABLED else skip)


def _env_path(name: str) -> Path:
    value = os.environ.get(name)
    if not value or not Path(value).exists():
        pytest.fail(f"{name} must point at an existing path (set by `make test-engines`)")
    return Path(value)


@pytest.fixture(scope="session")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    """The gateway: one emulated vLLM pool; the real engine joins by registering."""
    config = {"pools": [pool(EMU_POOL, "h100", "vllm", 2.95, ["emulated://vllm/h100?speed=20"],
                             {PUBLIC: SERVED})]}
    proc = spawn_gateway(config, tmp_path_factory.mktemp("gateway"),
                         env={"FLEETGATE_HEALTH_INTERVAL_S": "1.0",
                              "FLEETGATE_REQUEST_LOG": "off"})
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def real(fleet: Proc, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealEngine]:
    """vLLM on the tiny model, started and registered by ``fleetgate worker``."""
    model = _env_path("FLEETGATE_TINY_MODEL")
    python = str(_env_path("FLEETGATE_ENGINE_PYTHON"))
    log = tmp_path_factory.mktemp("real-vllm") / "worker.log"
    engine = start_real_vllm(fleet.url, model, python, log)
    print(f"\nreal vLLM at {engine.url}: registered {engine.started_s:.1f}s after the worker "
          f"started; log {log}")
    yield engine
    engine.stop()


@pytest.fixture(scope="session")
def emulated() -> Iterator[Proc]:
    """The emulator's vLLM flavour serving the same name and context length as ``real``."""
    proc = spawn_emulator("vllm", "h100", [SERVED], speed=1.0,
                          extra=["--max-model-len", str(MAX_MODEL_LEN)])
    yield proc
    proc.stop()
