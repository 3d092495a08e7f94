"""Fleet-wide state: two in-process gateway replicas sharing one real Redis.

A worker registered at replica A is routed by replica B (its heartbeat and its removal go
through either one), ``/admin/costs`` at either replica is the sum of both replicas' charges
(tenants included), and each decision-log entry names the replica that routed it. Each test
uses its own Redis key prefix; the worker is a real emulated engine in a child process, the
configured pool an ``emulated://`` engine per replica. Waits are bounded polls.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetgate.gateway.state import AppState
from inproc import inproc_gateway, tick
from procs import Proc, spawn_emulator
from store_redis import unique_prefix

PUBLIC, SERVED = "llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct"
WORKER_MODEL = "llama-3.1-8b-amd"
KEY_A, ADMIN = "sk-team-a-0123456789abcdef", "sk-admin-0123456789abcdef0"
ADMIN_H = {"authorization": f"Bearer {ADMIN}"}
TEAM_H = {"authorization": f"Bearer {KEY_A}"}
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def worker() -> Iterator[Proc]:
    proc = spawn_emulator("sglang", "mi300x", [SERVED], speed=50)
    yield proc
    proc.stop()


def _config() -> dict[str, Any]:
    return {
        "pools": [{"name": "h100-vllm", "accelerator": "h100", "engine": "vllm",
                   "price_per_gpu_hour": 2.95, "endpoints": ["emulated://vllm/h100?speed=50"],
                   "models": {PUBLIC: SERVED}}],
        "auth": {"admin_keys": [ADMIN],
                 "keys": [{"name": "team-a", "key": KEY_A, "tenant": "team-a"}]},
    }


@asynccontextmanager
async def two_replicas(tmp: Path, redis_url: str
                       ) -> AsyncIterator[tuple[tuple[str, AppState], tuple[str, AppState]]]:
    shared = {"redis_url": redis_url, "redis_prefix": unique_prefix(), "sync_interval_s": 0.1}
    (tmp / "a").mkdir()
    (tmp / "b").mkdir()
    async with inproc_gateway(_config(), tmp / "a", **shared) as a, \
            inproc_gateway(_config(), tmp / "b", **shared) as b:
        await tick(a[1])
        await tick(b[1])
        yield a, b


async def until(check: Callable[[], Awaitable[Any]], what: str, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def _models(http: httpx.AsyncClient, url: str) -> list[str]:
    resp = await http.get(url + "/v1/models", headers=TEAM_H)
    return [m["id"] for m in resp.json()["data"]]


async def _chat(http: httpx.AsyncClient, url: str, model: str = PUBLIC) -> httpx.Response:
    return await http.post(url + "/v1/chat/completions", headers=TEAM_H, json={
        "model": model, "messages": MESSAGES, "max_tokens": 4})


async def test_a_worker_registered_at_a_is_served_by_b(tmp_path: Path, redis_url: str,
                                                       worker: Proc) -> None:
    body = {"pool": "mi300x-workers", "url": worker.url, "engine": "sglang",
            "accelerator": "mi300x", "models": {WORKER_MODEL: SERVED},
            "price_per_gpu_hour": 1.5, "ttl_s": 30}
    async with two_replicas(tmp_path, redis_url) as ((a, _), (b, state_b)), \
            httpx.AsyncClient(timeout=30) as http:
        first = await http.post(a + "/admin/endpoints", json=body, headers=ADMIN_H)
        assert first.status_code == 201, first.text
        endpoint = first.json()["id"]
        await until(lambda: _has(http, b, WORKER_MODEL), "B to adopt A's registration")
        chat = await _chat(http, b, WORKER_MODEL)
        assert chat.status_code == 200, chat.text
        assert chat.headers["x-fleetgate-endpoint"] == endpoint  # the same id on both
        eps = (await http.get(b + "/admin/endpoints", headers=ADMIN_H)).json()
        assert eps["registered"] == [worker.url]
        heartbeat = await http.post(b + "/admin/endpoints", json=body, headers=ADMIN_H)
        assert (heartbeat.status_code, heartbeat.json()["new"]) == (200, False)
        gone = await http.delete(b + f"/admin/endpoints/{endpoint}", headers=ADMIN_H)
        assert gone.status_code == 200  # removed at B: A drops it too
        await until(lambda: _lacks(http, a, WORKER_MODEL), "A to drop the removed worker")
        assert WORKER_MODEL not in await _models(http, b)

        lapsing = {**body, "ttl_s": 1}  # registered at B, never refreshed: lapses everywhere
        assert (await http.post(b + "/admin/endpoints", json=lapsing,
                                headers=ADMIN_H)).status_code == 201
        await until(lambda: _has(http, a, WORKER_MODEL), "A to adopt B's registration")
        t0 = time.monotonic()
        await until(lambda: _lacks(http, a, WORKER_MODEL), "the lapsed worker to leave A")
        await until(lambda: _lacks(http, b, WORKER_MODEL), "the lapsed worker to leave B")
        assert time.monotonic() - t0 < 5
        assert state_b.registrations == {}


async def _has(http: httpx.AsyncClient, url: str, model: str) -> bool:
    return model in await _models(http, url)


async def _lacks(http: httpx.AsyncClient, url: str, model: str) -> bool:
    return model not in await _models(http, url)


async def test_costs_at_either_replica_are_the_fleets(tmp_path: Path, redis_url: str) -> None:
    async with two_replicas(tmp_path, redis_url) as ((a, state_a), (b, state_b)), \
            httpx.AsyncClient(timeout=30) as http:
        for url in (a, b, a, a, b):
            assert (await _chat(http, url)).status_code == 200
        ledger_a, ledger_b = state_a.ledger, state_b.ledger
        assert ledger_a is not None and ledger_b is not None
        usd_a, usd_b = ledger_a.total_usd(), ledger_b.total_usd()
        assert usd_a > 0 and usd_b > 0

        async def fleet_report(url: str) -> dict[str, Any] | None:
            report = (await http.get(url + "/admin/costs", headers=ADMIN_H)).json()
            return report if report["total"]["requests"] == 5 else None

        for url, state in ((a, state_a), (b, state_b)):
            report = await until(lambda u=url: fleet_report(u), f"{url}'s fleet costs")
            assert report["total"]["usd"] == pytest.approx(usd_a + usd_b, rel=1e-12)
            (tenant,) = report["tenants"]
            assert tenant["tenant"] == "team-a"
            assert tenant["usd"] == pytest.approx(usd_a + usd_b, rel=1e-12)
            assert tenant["requests"] == 5
            assert state.sync is not None and report["replica"] == state.sync.replica_id
            parts = {r["replica"]: (r["requests"], r["usd"]) for r in report["replicas"]}
            assert state_a.sync is not None and state_b.sync is not None
            assert parts == {state_a.sync.replica_id: (3, pytest.approx(usd_a, rel=1e-12)),
                             state_b.sync.replica_id: (2, pytest.approx(usd_b, rel=1e-12))}
            (pool,) = report["pools"]
            assert pool["pool"] == "h100-vllm" and pool["requests"] == 5


async def test_each_decision_names_its_replica(tmp_path: Path, redis_url: str) -> None:
    async with two_replicas(tmp_path, redis_url) as ((a, state_a), (b, state_b)), \
            httpx.AsyncClient(timeout=30) as http:
        for url, state in ((a, state_a), (b, state_b)):
            assert (await _chat(http, url)).status_code == 200
            replica = (await http.get(url + "/admin/endpoints", headers=ADMIN_H)).json()[
                "replica"]
            assert state.sync is not None and replica == state.sync.replica_id
            (entry,) = (await http.get(url + "/admin/decisions?limit=1",
                                       headers=ADMIN_H)).json()["decisions"]
            assert entry["replica"] == replica
        assert state_a.sync is not None and state_b.sync is not None
        assert state_a.sync.replica_id != state_b.sync.replica_id
