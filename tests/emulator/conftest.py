"""Fixtures for the emulator API tests: one real emulator per engine flavour under uvicorn in
a background thread (module-scoped), parametrised over the flavours (wire_helpers.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from wire_helpers import ENGINES, EmulatorThread, emulator_config


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, str]]:
    with EmulatorThread(emulator_config("vllm")) as v, EmulatorThread(
            emulator_config("sglang")) as s:
        yield {"vllm": v.url, "sglang": s.url}


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def url(servers: dict[str, str], engine: str) -> str:
    return servers[engine]
