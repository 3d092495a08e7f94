"""Issue 24, item 3: a burst of 200 concurrent requests against rpm, tpm and $ limits.

A real ``fleetgate serve`` (one process, then ``--workers 2``: the supervisor's store served
to both workers) over real emulated engines (Redis: the store contract's concurrent tests;
here, 200 Lua calls at once on a busy machine outlast the store's 0.25 s timeout and the
gateway turns to per-replica limits, as it should). Each limit gets its own key and tenant, and
200 requests at once. What the gateway let through is read back from ``/admin/costs``
(the tenant's tokens and $, every worker's ledger summed) and must be within one request
of the limit: tpm and $ are reserved at admission and settled when the request ends, so a
burst cannot pass them by more than the last request admitted. One request sent alone
afterwards (another tenant, no limits) measures what one request uses and costs.

Before the fix (tokens and $ checked against what had been used, charged at the end) the
200 requests were all admitted: ~19x the tpm and ~5x the $ budget.

The engine runs at its modelled speed (``speed=1``): a request's $ reservation is its
charge alone on the replica by the prior, and an emulator run many times faster than its
prior makes the gateway's own overhead most of each request's (wall-clock) charge.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from procs import PUBLIC_8B, SERVED_8B, Proc, pool, spawn_gateway, wait_for

ADMIN = "sk-admin-0123456789abcdef0"
KEYS = {name: f"sk-{name}-0123456789abcdef" for name in ("rpm", "tpm", "usd", "solo")}
RPM, TPM, USD_PER_DAY = 30, 300, 0.0002
BURST = 200
BODY = {"model": PUBLIC_8B, "max_tokens": 16, "messages": [{"role": "user", "content": "hello"}]}


def _config() -> dict[str, Any]:
    limits = {"rpm": {"rpm": RPM}, "tpm": {"tpm": TPM}, "usd": {"usd_per_day": USD_PER_DAY},
              "solo": {}}
    return {
        "pools": [pool("h100-vllm", "h100", "vllm", 2.95, ["emulated://vllm/h100?speed=1"],
                       {PUBLIC_8B: SERVED_8B})],
        "auth": {"admin_keys": [ADMIN], "keys": [
            {"name": name, "key": key, "tenant": f"tenant-{name}", "limits": limits[name]}
            for name, key in KEYS.items()]},
    }


@pytest.fixture(params=[1, 2], ids=["one-process", "workers-2"])
def gateway(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Proc]:
    workers = int(request.param)
    proc = spawn_gateway(_config(), tmp_path, workers=workers,
                         env={"FLEETGATE_SYNC_INTERVAL_S": "0.2", "FLEETGATE_REQUEST_LOG": "off"})
    if workers > 1:
        replicas: set[str] = set()

        def all_listen() -> bool:  # a fresh connection each: the kernel picks the worker
            replicas.add(httpx.get(proc.url + "/admin/endpoints", timeout=10,
                                   headers={"authorization": f"Bearer {ADMIN}"}).json()["replica"])
            return len(replicas) == workers

        wait_for(all_listen, 60, "every worker to answer")
    yield proc
    proc.stop()


async def _burst(url: str, key: str, n: int = BURST) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        return list(await asyncio.gather(*(
            client.post(url + "/v1/chat/completions", json=BODY,
                        headers={"authorization": f"Bearer {key}"}) for _ in range(n))))


def _tenant(url: str, name: str) -> dict[str, Any]:
    report = httpx.get(url + "/admin/costs", timeout=10,
                       headers={"authorization": f"Bearer {ADMIN}"}).json()
    rows = {row["tenant"]: row for row in report["tenants"]}
    return dict(rows.get(f"tenant-{name}", {"requests": 0, "tokens": 0, "usd": 0.0}))


def _settled(url: str, name: str, ok: int) -> dict[str, Any]:
    """The tenant's row once every admitted request is in it (workers publish their
    ledgers every sync interval)."""
    row: dict[str, Any] = {}

    def counted() -> bool:
        row.update(_tenant(url, name))
        return bool(row["requests"] >= ok)

    wait_for(counted, 30, f"{ok} requests of tenant-{name} in /admin/costs")
    return row


def _check_refusals(responses: list[httpx.Response]) -> int:
    ok = 0
    for r in responses:
        if r.status_code == 200:
            ok += 1
            continue
        assert r.status_code == 429, r.text
        assert int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["code"] is not None or r.json()["error"]["type"]
    return ok


def test_a_burst_stays_within_one_request_of_each_limit(gateway: Proc) -> None:
    url = gateway.url
    solo = asyncio.run(_burst(url, KEYS["solo"], 1))[0]
    assert solo.status_code == 200, solo.text
    one = _settled(url, "solo", 1)  # what one request uses and costs, alone on the engine

    rpm = asyncio.run(_burst(url, KEYS["rpm"]))
    assert _check_refusals(rpm) == RPM

    tpm = asyncio.run(_burst(url, KEYS["tpm"]))
    ok = _check_refusals(tpm)
    tokens = _settled(url, "tpm", ok)["tokens"]
    print(f"tpm {TPM}: {ok} admitted, {tokens} tokens (one request: {one['tokens']})")
    assert 0 < ok < BURST
    assert tokens <= TPM + one["tokens"]

    usd = asyncio.run(_burst(url, KEYS["usd"]))
    ok = _check_refusals(usd)
    spent = _settled(url, "usd", ok)["usd"]
    print(f"${USD_PER_DAY}/day: {ok} admitted, ${spent:.6f} (one request alone: "
          f"${one['usd']:.6f})")
    assert 0 < ok < BURST
    assert spent <= USD_PER_DAY + one["usd"]
