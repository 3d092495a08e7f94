"""Two real gateway replicas (two `fleetgate serve` processes) sharing one real Redis.

Each test gets its own Redis key prefix, so tests sharing the server cannot disturb each
other; the Redis-outage test starts a Redis of its own and kills it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from procs import PUBLIC_8B, SERVED_8B, Proc, pool, spawn_emulator, spawn_gateway
from store_redis import RedisServer, unique_prefix

KEY_A = "sk-team-a-0123456789abcdef"
KEY_B = "sk-team-b-0123456789abcdef"
ADMIN = "sk-admin-0123456789abcdef0"
SYNC_S = 0.2
MESSAGES = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def engine() -> Iterator[Proc]:
    proc = spawn_emulator("vllm", "h100", [SERVED_8B], speed=1.0)
    yield proc
    proc.stop()


def _config(engine_url: str, limits_a: dict | None = None, limits_b: dict | None = None) -> dict:
    return {
        "pools": [pool("h100-vllm", "h100", "vllm", 2.95, [engine_url], {PUBLIC_8B: SERVED_8B})],
        "policies": {"cheapest": {"strategy": "cost"}, "fastest": {"strategy": "latency"}},
        "default_policy": "cheapest",
        "auth": {
            "admin_keys": ["${ADMIN_KEY}"],
            "keys": [
                {"name": "team-a", "key": "${KEY_A}", "tenant": "team-a",
                 "limits": limits_a or {}},
                {"name": "team-b", "key": "${KEY_B}", "tenant": "team-b",
                 "models": [PUBLIC_8B], "policies": ["cheapest"], "limits": limits_b or {}},
            ],
        },
    }


def _replicas(config: dict, tmp: Path, redis_url: str) -> tuple[Proc, Proc]:
    env = {"FLEETGATE_REDIS_URL": redis_url, "FLEETGATE_REDIS_PREFIX": unique_prefix(),
           "FLEETGATE_SYNC_INTERVAL_S": str(SYNC_S), "KEY_A": KEY_A, "KEY_B": KEY_B,
           "ADMIN_KEY": ADMIN}
    a = spawn_gateway(config, tmp, env=env)
    try:
        b = spawn_gateway(config, tmp, env=env)
    except BaseException:
        a.stop()
        raise
    return a, b


def _chat(gw: Proc, key: str | None, **extra: object) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    body = {"model": PUBLIC_8B, "messages": MESSAGES, "max_tokens": 2, **extra}
    return httpx.post(gw.url + "/v1/chat/completions", json=body, headers=headers, timeout=30)


def test_keys_tenants_and_the_admin_gate(engine: Proc, tmp_path: Path, redis_url: str) -> None:
    a, b = _replicas(_config(engine.url), tmp_path, redis_url)
    try:
        assert _chat(a, None).status_code == 401
        assert _chat(a, "sk-wrong-key-000000000000").status_code == 401
        assert _chat(a, KEY_A).status_code == 200
        assert _chat(b, KEY_B).status_code == 200
        denied = httpx.get(a.url + "/admin/endpoints",
                           headers={"authorization": f"Bearer {KEY_A}"})
        assert denied.status_code == 403 and denied.json()["error"]["type"]
        assert httpx.get(a.url + "/admin/endpoints").status_code == 401
        ok = httpx.get(a.url + "/admin/endpoints", headers={"authorization": f"Bearer {ADMIN}"})
        assert ok.status_code == 200
        def with_policy(key: str, policy: str) -> httpx.Response:
            return httpx.post(
                b.url + "/v1/chat/completions", timeout=30,
                json={"model": PUBLIC_8B, "messages": MESSAGES, "max_tokens": 1},
                headers={"authorization": f"Bearer {key}", "x-fleetgate-policy": policy})

        assert with_policy(KEY_B, "nope").status_code == 400  # no such policy
        assert with_policy(KEY_B, "fastest").status_code == 403  # not among team-b's policies
        assert with_policy(KEY_A, "fastest").status_code == 200  # team-a may use any
    finally:
        a.stop()
        b.stop()


def test_rpm_limit_holds_across_replicas(engine: Proc, tmp_path: Path, redis_url: str) -> None:
    a, b = _replicas(_config(engine.url, limits_a={"rpm": 5}), tmp_path, redis_url)
    try:
        codes = [_chat(gw, KEY_A).status_code for gw in (a, b, a, b, a)]
        assert codes == [200] * 5
        for gw in (a, b):
            refused = _chat(gw, KEY_A)
            assert refused.status_code == 429
            assert int(refused.headers["retry-after"]) >= 1
            assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert _chat(b, KEY_B).status_code == 200  # another key is not affected
    finally:
        a.stop()
        b.stop()


def test_tenant_budget_stops_requests_once_spent(engine: Proc, tmp_path: Path,
                                                 redis_url: str) -> None:
    a, b = _replicas(_config(engine.url, limits_a={"usd_per_day": 1e-7}), tmp_path, redis_url)
    try:
        assert _chat(a, KEY_A, max_tokens=20).status_code == 200  # spends more than the budget
        deadline = time.monotonic() + 5
        while _chat(b, KEY_A).status_code == 200:  # spend is recorded just after the answer
            assert time.monotonic() < deadline
        refused = _chat(a, KEY_A)
        assert refused.status_code == 429 and "budget" in refused.json()["error"]["message"]
        assert _chat(a, KEY_B).status_code == 200
    finally:
        a.stop()
        b.stop()


def test_in_flight_through_a_is_seen_by_b(engine: Proc, tmp_path: Path, redis_url: str) -> None:
    a, b = _replicas(_config(engine.url), tmp_path, redis_url)
    streams = []
    try:
        client = httpx.Client(timeout=60, headers={"authorization": f"Bearer {KEY_A}"})
        for _ in range(3):  # three long streams held open through replica A
            req = client.build_request("POST", a.url + "/v1/chat/completions", json={
                "model": PUBLIC_8B, "messages": MESSAGES, "max_tokens": 3000, "stream": True})
            resp = client.send(req, stream=True)
            assert resp.status_code == 200, resp.read()
            lines = resp.iter_lines()  # keep the iterator: dropping it closes the stream
            next(lines)
            streams.append((resp, lines))
        seen, deadline = 0.0, time.monotonic() + 10 * SYNC_S
        while seen < 3 and time.monotonic() < deadline:
            eps = httpx.get(b.url + "/admin/endpoints",
                            headers={"authorization": f"Bearer {ADMIN}"}).json()
            seen = eps["endpoints"][0]["peer_in_flight"] or 0.0
        assert seen == 3
        assert eps["endpoints"][0]["peer_requests_per_s"] > 0  # A's rate: B's scaler demand
        decision = httpx.get(b.url + "/admin/decisions?limit=1",
                             headers={"authorization": f"Bearer {ADMIN}"})
        assert decision.status_code == 200
        assert _chat(b, KEY_A).status_code == 200
        last = httpx.get(b.url + "/admin/decisions?limit=1",
                         headers={"authorization": f"Bearer {ADMIN}"}).json()["decisions"][0]
        assert last["candidates"][0]["estimates"]["active"] >= 3  # B routed knowing A's load
    finally:
        for resp, _ in streams:
            resp.close()
        a.stop()
        b.stop()


def test_redis_outage_keeps_serving_and_resyncs(engine: Proc, tmp_path: Path) -> None:
    server = RedisServer().start()
    try:
        a, b = _replicas(_config(engine.url, limits_a={"rpm": 1000}), tmp_path, server.url)
        try:
            assert _chat(a, KEY_A).status_code == 200
            server.kill()
            for gw in (a, b, a, b):
                t0 = time.monotonic()
                assert _chat(gw, KEY_A).status_code == 200  # limits fall back to per-replica
                assert time.monotonic() - t0 < 5
            health = httpx.get(a.url + "/readyz")
            assert health.status_code == 200
            server.start()
            deadline = time.monotonic() + 10
            while True:
                _chat(a, KEY_A)
                eps = httpx.get(a.url + "/admin/endpoints",
                                headers={"authorization": f"Bearer {ADMIN}"}).json()
                if not eps.get("store_degraded", True):
                    break
                assert time.monotonic() < deadline, eps.get("store_degraded")
        finally:
            a.stop()
            b.stop()
    finally:
        server.kill()
