"""Fixtures shared by the emulator test modules: one in-process server per engine flavour
(module-scoped), parametrised over the flavours."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from emulator_harness import ENGINES, flavour_servers


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, str]]:
    with flavour_servers() as urls:
        yield urls


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def url(servers: dict[str, str], engine: str) -> str:
    return servers[engine]
