"""Shared fixtures: a small mixed fleet of real emulated engines and a real gateway in front.

Session-scoped where the tests only read (the shared fleet); tests that break endpoints
start their own engines and gateway so they cannot disturb the others.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from procs import PUBLIC_8B, SERVED_8B, Proc, pool, spawn_emulator, spawn_gateway
from store_redis import find_test_redis


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A real Redis: the shared one on 127.0.0.1:6379, else one started for the session
    (tests keep apart by key prefix)."""
    url, server = find_test_redis()
    yield url
    if server is not None:
        server.kill()


@pytest.fixture(scope="session")
def engines() -> Iterator[dict[str, Proc]]:
    procs = {
        "vllm": spawn_emulator("vllm", "h100", [SERVED_8B]),
        "sglang": spawn_emulator("sglang", "mi300x", [SERVED_8B]),
    }
    yield procs
    for p in procs.values():
        p.stop()


@pytest.fixture(scope="session")
def gateway(engines: dict[str, Proc], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    """A gateway over one vLLM (H100) and one SGLang (MI300X) emulated engine."""
    config = {
        "pools": [
            pool("h100-vllm", "h100", "vllm", 2.95, [engines["vllm"].url], {PUBLIC_8B: SERVED_8B}),
            pool("mi300x-sglang", "mi300x", "sglang", 1.99, [engines["sglang"].url],
                 {PUBLIC_8B: SERVED_8B}),
        ],
    }
    proc = spawn_gateway(config, tmp_path_factory.mktemp("gw"))
    yield proc
    proc.stop()


@pytest.fixture()
def tmp_dir(tmp_path: Path) -> Path:
    return tmp_path
