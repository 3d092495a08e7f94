"""Sharded scraping between real gateway replicas (two ``fleetgate serve`` on one real Redis)
in front of four emulated engines (``state/shard.py``).

Each endpoint is visited by one replica per interval and the other reads its row from
Redis: both show the same ``scraped_by`` and fresh load for every endpoint, and together
they visit about once per endpoint and interval (unsharded it would be twice). When one
replica is killed, the other takes its endpoints over and keeps serving. Counts and
membership are asserted; the visit rate only against the unsharded rate it must be far
below (the machine's load moves ticks, not who makes them).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from procs import PUBLIC_8B, SERVED_8B, Proc, pool, spawn_emulator, spawn_gateway, wait_for
from store_redis import unique_prefix

INTERVAL_S = 1.0
ENDPOINTS = 4


@pytest.fixture(scope="module")
def four_engines() -> Iterator[list[Proc]]:
    procs: list[Proc] = []
    try:
        for _ in range(ENDPOINTS):
            procs.append(spawn_emulator("vllm", "h100", [SERVED_8B], speed=20))
        yield procs
    finally:
        for p in procs:
            p.stop()


def _admin(gw: Proc) -> dict:
    return httpx.get(gw.url + "/admin/endpoints", timeout=10).json()


def test_each_endpoint_is_scraped_by_one_replica_and_a_death_is_covered(
        four_engines: list[Proc], tmp_path: Path, redis_url: str) -> None:
    config = {"pools": [pool("h100-vllm", "h100", "vllm", 2.95, [e.url for e in four_engines],
                             {PUBLIC_8B: SERVED_8B})]}
    env = {"FLEETGATE_REDIS_URL": redis_url, "FLEETGATE_REDIS_PREFIX": unique_prefix(),
           "FLEETGATE_SYNC_INTERVAL_S": "0.2", "FLEETGATE_HEALTH_INTERVAL_S": str(INTERVAL_S)}
    a = spawn_gateway(config, tmp_path, env=env)
    b = spawn_gateway(config, tmp_path, env=env)
    try:
        ra, rb = _admin(a)["replica"], _admin(b)["replica"]

        def split() -> bool:  # both see both, and agree on who scraped each endpoint
            ea, eb = _admin(a), _admin(b)
            if ea["collector"]["replicas"] != 2 or eb["collector"]["replicas"] != 2:
                return False
            by_a = {e["id"]: e["scraped_by"] for e in ea["endpoints"]}
            by_b = {e["id"]: e["scraped_by"] for e in eb["endpoints"]}
            return by_a == by_b and set(by_a.values()) <= {ra, rb} and \
                ea["collector"]["owned"] + eb["collector"]["owned"] == ENDPOINTS

        wait_for(split, timeout=15, interval=0.2, what="the two replicas to split the fleet")
        for row in _admin(b)["endpoints"]:  # rows scraped by A are fresh at B too
            assert row["health"] == "ready" and row["scrape_age_s"] is not None
        before = [_admin(gw)["collector"]["visits"] for gw in (a, b)]
        t0 = time.monotonic()
        time.sleep(6 * INTERVAL_S)
        after = [_admin(gw)["collector"]["visits"] for gw in (a, b)]
        intervals = (time.monotonic() - t0) / INTERVAL_S
        per_endpoint = (sum(after) - sum(before)) / (ENDPOINTS * intervals)
        print(f"visits per endpoint and interval, both replicas: {per_endpoint:.2f} "
              f"(a {after[0] - before[0]}, b {after[1] - before[1]} in {intervals:.1f})")
        assert per_endpoint < 1.5  # unsharded: 2.0 (each replica visits every endpoint)

        a.kill()  # no goodbye: its rows and membership just stop

        def covered() -> bool:
            eb = _admin(b)
            return eb["collector"]["replicas"] == 1 and all(
                e["scraped_by"] == rb and e["health"] == "ready" for e in eb["endpoints"])

        wait_for(covered, timeout=15, interval=0.2, what="B to take over A's endpoints")
        assert _admin(b)["collector"]["owned"] == ENDPOINTS
        resp = httpx.post(b.url + "/v1/chat/completions", timeout=30, json={
            "model": PUBLIC_8B, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
        assert resp.status_code == 200
    finally:
        a.stop()
        b.stop()
