"""Cost-aware routing on live fleets of emulated engines, through a real gateway over HTTP.

The gateway runs in-process on a real uvicorn server so the tests can drive the collector
tick by tick (no waiting on timers). Emulated engines run at ``speed`` X (X times faster
than the GPU they model); the gateway knows X from the ``emulated://`` URL, so the SLOs
below are wall-clock times (the modelled GPU time divided by X). Tests assert on what the
router decided (where requests went, what it predicted: ``x-fleetgate-pool``,
``/admin/decisions``), never on the latency the client measured: the machine's other work
is in that.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import httpx
import openai
import pytest

from inproc import inproc_gateway, tick

MESSAGES = [{"role": "user", "content": "Tell me about accelerators."}]
M8B = {"llama-3.1-8b": "meta-llama/Llama-3.1-8B-Instruct"}
M70B = {"llama-3.1-70b": "meta-llama/Llama-3.1-70B-Instruct-FP8"}


def _pool(name: str, gpu: str, engine: str, price: float, src: str, models: dict,
          **extra: object) -> dict:
    return {"name": name, "accelerator": gpu, "engine": engine, "price_per_gpu_hour": price,
            "endpoints": [src], "models": models, **extra}


async def _get(target: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=30) as c:  # the gateway runs on this event loop
        return await c.get(target)


async def _post(target: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=60) as c:
        return await c.post(target)


def _client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=60)


async def _stream(client: openai.AsyncOpenAI, model: str, max_tokens: int,
                  content: str = "hello", headers: dict | None = None) -> dict:
    """One streamed chat: pool, TTFT and mean TPOT as the client sees them (wall seconds)."""
    t0 = time.perf_counter()
    raw = await client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": content}], max_tokens=max_tokens,
        stream=True, stream_options={"include_usage": True}, extra_headers=headers or {})
    first = None
    tokens = 0
    async for chunk in raw.parse():
        if chunk.choices and chunk.choices[0].delta.content and first is None:
            first = time.perf_counter()
        if chunk.usage:
            tokens = chunk.usage.completion_tokens
    end = time.perf_counter()
    assert first is not None and tokens == max_tokens
    return {"pool": raw.headers["x-fleetgate-pool"], "ttft": first - t0,
            "tpot": (end - first) / max(1, tokens - 1)}


def _cheapest_meeting_slo_fleet() -> dict:
    """Same H100s at different prices, plus a cheaper pool that cannot meet the SLO."""
    fast = "?speed=5"
    return {
        "pools": [
            _pool("h100-slow-cheap", "h100", "vllm", 1.00, "emulated://vllm/h100?speed=1", M8B),
            _pool("h100-cheap", "h100", "vllm", 2.00, "emulated://vllm/h100" + fast, M8B),
            _pool("h100-mid", "h100", "vllm", 2.50, "emulated://vllm/h100" + fast, M8B),
            _pool("h200-dear", "h200", "sglang", 3.60, "emulated://sglang/h200" + fast, M8B),
        ],
        "policies": {"cheapest": {"strategy": "cost", "slo": {"ttft_ms": 300, "tpot_ms": 4}},
                     "fastest": {"strategy": "latency"}},
        "default_policy": "cheapest",
    }


async def test_light_load_goes_to_the_cheapest_endpoint_meeting_the_slo(tmp_path: Path) -> None:
    async with inproc_gateway(_cheapest_meeting_slo_fleet(), tmp_path) as (url, state):
        client = _client(url)
        pools = Counter()
        for _ in range(40):
            pools[(await _stream(client, "llama-3.1-8b", 8))["pool"]] += 1
            await tick(state)
        assert pools["h100-cheap"] >= 38, pools  # >= 95%
        decisions = (await _get(url + "/admin/decisions?limit=1")).json()["decisions"]
        slow = next(c for c in decisions[0]["candidates"] if c["endpoint"] == "h100-slow-cheap-0")
        assert slow["estimates"]["meets_slo"] == 0.0  # cheaper per hour, but too slow


async def test_load_beyond_capacity_spills_and_still_meets_the_slo(tmp_path: Path) -> None:
    """70B FP8 on one H100 leaves KV room for ~2.4k tokens: a handful of requests at once.

    Judged on the router's decisions (``/admin/decisions``: where each request went and
    what the router predicted there), never on wall-clock latency: on a busy machine the
    emulator and the client share the cores, and a wall-clock SLO check failed 9 of 120
    in a fresh clone (issue 24). The measured SLO attainment is printed, not asserted."""
    src = "emulated://vllm/h100?speed=2"
    config = {
        "pools": [_pool("h100-cheap", "h100", "vllm", 2.00, src, M70B, max_model_len=2048),
                  _pool("h100-dear", "h100", "vllm", 3.00, src, M70B, max_model_len=2048)],
        "policies": {"cheapest": {"strategy": "cost", "slo": {"ttft_ms": 375, "tpot_ms": 40}}},
        "default_policy": "cheapest",
    }
    content = "x" * 800  # ~210 prompt tokens + 32 out: 10 fit in one replica's KV cache
    async with inproc_gateway(config, tmp_path) as (url, _state):
        client = _client(url)
        results: list[dict] = []

        async def worker(k: int, n: int) -> None:
            await asyncio.sleep(0.02 * k)  # a 240 ms ramp, not one 12-request burst
            for i in range(n):
                results.append(await _stream(client, "llama-3.1-70b", 32, content,
                                             headers={"x-request-id": f"spill-{k}-{i}"}))

        await asyncio.gather(*(worker(k, 10) for k in range(12)))
        pools = Counter(r["pool"] for r in results)
        assert pools["h100-cheap"] > pools["h100-dear"] > 0, pools  # filled first, then spilled
        log = (await _get(url + "/admin/decisions?limit=1000")).json()["decisions"]
        ours = {d["request_id"]: d for d in log if d["request_id"].startswith("spill-")}
        assert len(ours) == len(results) == 120
        predicted_miss, dear_while_cheap_fit = [], []
        for d in ours.values():
            by_pool = {c["pool"]: c["estimates"] for c in d["candidates"]}
            chosen = by_pool[d["chosen_pool"]]
            if chosen["meets_slo"] != 1.0:  # sent where the SLO was not predicted to hold
                predicted_miss.append((d["request_id"], d["chosen_pool"], chosen))
            if d["chosen_pool"] == "h100-dear" and by_pool["h100-cheap"]["meets_slo"] == 1.0:
                dear_while_cheap_fit.append(d["request_id"])  # paid more than it had to
            assert d["attempts"][-1]["status"] == 200
        slow = [r for r in results if r["ttft"] > 0.375 or r["tpot"] > 0.040]
        print(f"pools {dict(pools)}; predicted misses {len(predicted_miss)}; measured "
              f"(wall clock, not asserted) SLO misses {len(slow)}/{len(results)}")
        assert len(predicted_miss) <= len(results) // 100, predicted_miss  # >= 99% predicted
        assert not dear_while_cheap_fit, dear_while_cheap_fit


async def test_slowed_endpoint_loses_traffic_under_latency_and_cost(tmp_path: Path) -> None:
    config = _cheapest_meeting_slo_fleet()
    async with inproc_gateway(config, tmp_path) as (url, state):
        client = _client(url)
        fleet = state.generation.fleet
        for policy, victim in (("cheapest", "h100-cheap"), ("fastest", None)):
            headers = {"x-fleetgate-policy": policy}
            first = (await _stream(client, "llama-3.1-8b", 8, headers=headers))["pool"]
            victim = victim or first
            url_of = fleet.endpoints[fleet.index(f"{victim}-0")].url
            httpx.post(url_of + "/emulator/faults", json={"slow_factor": 5}).raise_for_status()
            seen = []
            for _ in range(12):
                seen.append((await _stream(client, "llama-3.1-8b", 8, headers=headers))["pool"])
                await tick(state)
                # a correction moves at most 2x a second (state/learning.py): requests 15 ms
                # apart would teach it nothing however slow the endpoint got
                await asyncio.sleep(0.15)
            assert seen[-6:].count(victim) <= 1, (policy, seen)  # moved off it
            httpx.post(url_of + "/emulator/faults", json={"slow_factor": 1}).raise_for_status()


async def test_every_decision_is_explainable(tmp_path: Path) -> None:
    async with inproc_gateway(_cheapest_meeting_slo_fleet(), tmp_path) as (url, _state):
        client = _client(url)
        rid = "explain-me-1"
        await _stream(client, "llama-3.1-8b", 4, headers={"x-request-id": rid})
        body = (await _get(url + "/admin/decisions?limit=5")).json()["decisions"]
        d = next(x for x in body if x["request_id"] == rid)
        # which endpoint a cold fleet picks hangs on the workload's answer length, unknown
        # before the first answer (routing/estimate.py); that it is explained is the point
        assert d["policy"] == "cheapest" and d["chosen"] == d["candidates"][0]["endpoint"]
        assert d["reason"] and d["estimated_usd_per_mtok"] > 0
        assert len(d["candidates"]) == 4
        for c in d["candidates"]:
            assert set(c["scores"]) == {"cost"}
            assert {"ttft_s", "tpot_s", "usd_per_mtok", "meets_slo"} <= set(c["estimates"])
        assert d["attempts"] == [{"endpoint": d["chosen"], "status": 200}]
        assert (await _get(url + "/admin/decisions?limit=0")).status_code == 400
        assert (await _get(url + "/admin/decisions?candidates=x")).status_code == 400
        top = (await _get(url + "/admin/decisions?limit=1&candidates=2")).json()["decisions"]
        assert [c["rank"] for c in top[0]["candidates"]] == [0, 1]
        eps = (await _get(url + "/admin/endpoints")).json()
        assert {e["id"] for e in eps["endpoints"]} >= {"h100-cheap-0", "h200-dear-0"}
        assert {p["pool"] for p in eps["pools"]} == {"h100-slow-cheap", "h100-cheap",
                                                     "h100-mid", "h200-dear"}


async def test_endpoints_page_and_filter_by_pool(tmp_path: Path) -> None:
    """At thousands of endpoints the whole list holds the event loop for seconds: pages and
    one pool's rows cost what their rows do, and the pool rows always cover the match."""
    async with inproc_gateway(_cheapest_meeting_slo_fleet(), tmp_path) as (url, state):
        await tick(state)
        whole = (await _get(url + "/admin/endpoints")).json()
        ids = [e["id"] for e in whole["endpoints"]]
        assert whole["total"] == 4 and whole["next_offset"] is None and len(ids) == 4
        seen, offset = [], 0
        while offset is not None:
            page = (await _get(url + f"/admin/endpoints?offset={offset}&limit=3")).json()
            assert page["total"] == 4 and page["pools"] == whole["pools"]
            seen += [e["id"] for e in page["endpoints"]]
            offset = page["next_offset"]
        assert seen == ids  # fleet order, each endpoint once
        one = (await _get(url + "/admin/endpoints?pool=h100-mid")).json()
        assert [e["id"] for e in one["endpoints"]] == ["h100-mid-0"] and one["total"] == 1
        assert [p["pool"] for p in one["pools"]] == ["h100-mid"]
        past = (await _get(url + "/admin/endpoints?offset=9")).json()
        assert past["endpoints"] == [] and past["next_offset"] is None
        none = (await _get(url + "/admin/endpoints?pool=nope")).json()
        assert none["total"] == 0 and none["pools"] == []
        # what the dashboard reads: a few rows per pool, the pools' figures over all of them
        cards = (await _get(url + "/admin/endpoints?per_pool=0")).json()
        assert cards["endpoints"] == [] and cards["pools"] == whole["pools"]
        first = (await _get(url + "/admin/endpoints?per_pool=1")).json()
        assert [e["id"] for e in first["endpoints"]] == ids and first["total"] == 4
        for p in whole["pools"]:
            rows = [e for e in whole["endpoints"] if e["pool"] == p["pool"]]
            assert p["routed"] == sum(e["health"] == "ready" and not e["parked"] for e in rows)
            assert p["parked"] == sum(e["parked"] for e in rows)
            assert p["queued"] == sum(e["queued"] or 0 for e in rows)
            assert p["breakers"] == sorted({e["breaker"] for e in rows})
            assert p["price_per_gpu_hour"] == rows[0]["price_per_gpu_hour"]
        for bad in ("limit=0", "offset=-1", "limit=x", "per_pool=-1"):
            resp = await _get(url + "/admin/endpoints?" + bad)
            assert resp.status_code == 400 and "error" in resp.json(), bad


async def test_invalid_reload_keeps_the_old_config_serving(tmp_path: Path) -> None:
    async with inproc_gateway(_cheapest_meeting_slo_fleet(), tmp_path) as (url, state):
        path = state.settings.config_path
        assert path is not None
        good = path.read_text()
        path.write_text(good.replace("price_per_gpu_hour: 2.0", "price_per_gpu_hour: -2.0"))
        resp = await _post(url + "/admin/reload")
        assert resp.status_code == 400
        assert any(e.startswith("pools[1].price_per_gpu_hour") for e in
                   resp.json()["error"]["errors"]), resp.json()
        client = _client(url)
        # the catalog's prior TPOT for an H100 misses the 4 ms SLO (these emulators run 5x
        # faster): the router must first see a few answers and scrapes, as in the light-load
        # test, before the old prices steer it; a judgement on one request was flaky in CI
        pools = Counter()
        for i in range(8):
            pool = (await _stream(client, "llama-3.1-8b", 8))["pool"]
            pools[pool] += i >= 4
            await tick(state)
        assert pools["h100-cheap"] >= 3, pools
        eps = (await _get(url + "/admin/endpoints")).json()["endpoints"]
        assert next(e for e in eps if e["id"] == "h100-cheap-0")["price_per_gpu_hour"] == 2.0
        path.write_text(good.replace("default_policy: cheapest", "default_policy: fastest"))
        resp = await _post(url + "/admin/reload")
        assert resp.status_code == 200, resp.text
        raw = await client.chat.completions.with_raw_response.create(
            model="llama-3.1-8b", messages=MESSAGES, max_tokens=2)
        assert raw.headers["x-fleetgate-policy"] == "fastest"


async def test_reload_keeps_what_the_router_learned(tmp_path: Path) -> None:
    async with inproc_gateway(_cheapest_meeting_slo_fleet(), tmp_path) as (url, state):
        client = _client(url)
        await _stream(client, "llama-3.1-8b", 8)  # a cold fleet's pick hangs on no answer yet
        cheap, mid = "h100-cheap-0", "h100-mid-0"
        warm = (await _get(url + "/admin/endpoints")).json()["endpoints"]
        served = next(e["requests"] for e in warm if e["id"] == cheap)
        for _ in range(5):
            await _stream(client, "llama-3.1-8b", 8)
        before = {e["id"]: e for e in (await _get(url + "/admin/endpoints")).json()["endpoints"]}
        assert before[cheap]["requests"] == served + 5 and before[cheap]["k_tpot"] != 1.0
        path = state.settings.config_path
        assert path is not None
        path.write_text(path.read_text().replace("price_per_gpu_hour: 2.5",
                                                 "price_per_gpu_hour: 2.4"))
        assert (await _post(url + "/admin/reload")).status_code == 200
        after = {e["id"]: e for e in (await _get(url + "/admin/endpoints")).json()["endpoints"]}
        assert after[mid]["usd_per_s"] == pytest.approx(2.4 / 3600, abs=1e-6)  # new price
        for key in ("requests", "k_tpot", "k_ttft", "tpot_s", "health", "breaker"):
            assert after[cheap][key] == before[cheap][key], key  # and nothing was forgotten


@pytest.mark.parametrize("policy", ["round_robin", "power_of_two"])
async def test_killed_endpoint_fails_over_opens_breaker_and_recovers(
        tmp_path: Path, policy: str) -> None:
    from procs import free_port, spawn_emulator

    port = free_port()
    victim = spawn_emulator("vllm", "h100", [M8B["llama-3.1-8b"]], speed=5, port=port)
    other = spawn_emulator("sglang", "mi300x", [M8B["llama-3.1-8b"]], speed=5)
    config = {"pools": [_pool("victim", "h100", "vllm", 2.0, victim.url, M8B),
                        _pool("other", "mi300x", "sglang", 2.0, other.url, M8B)],
              "policies": {"p": {"strategy": policy}}, "default_policy": "p"}
    try:
        async with inproc_gateway(config, tmp_path) as (url, state):
            fleet = state.generation.fleet
            now = [time.monotonic()]
            fleet.clock = lambda: now[0]  # breaker cooldowns run on this clock
            client = _client(url)
            load = [asyncio.create_task(_stream(client, "llama-3.1-8b", 16)) for _ in range(8)]
            victim_i = fleet.index("victim-0")
            for _ in range(500):  # bounded: until the load has reached the victim
                if fleet.live.value(victim_i, "in_flight") > 0:
                    break
                await asyncio.sleep(0.01)
            victim.kill()
            after = [await _stream(client, "llama-3.1-8b", 4) for _ in range(10)]
            assert {r["pool"] for r in after} == {"other"}  # not one request failed
            done = await asyncio.gather(*load, return_exceptions=True)
            failed = [d for d in done if isinstance(d, BaseException)]
            # a failure may only be a stream that had started: never an HTTP error status
            assert not any(isinstance(e, openai.APIStatusError) for e in failed), failed
            await tick(state, 2)  # two failed probes: not ready, whoever saw it first
            live = fleet.live
            i = live.index["victim-0"]
            assert live.stats[i].health.state == "not_ready"
            victim = spawn_emulator("vllm", "h100", [M8B["llama-3.1-8b"]], speed=5, port=port)
            await tick(state)
            assert live.stats[i].health.state == "ready"
            now[0] += 6.0  # past the breaker's cooldown: a half-open probe request may go
            back = Counter([(await _stream(client, "llama-3.1-8b", 2))["pool"]
                            for _ in range(10)])
            assert back["victim"] > 0, back
    finally:
        victim.stop()
        other.stop()


async def test_breaker_opens_on_failing_endpoint_and_closes_after_cooldown(tmp_path: Path) -> None:
    from procs import spawn_emulator

    served = M8B["llama-3.1-8b"]
    bad = spawn_emulator("vllm", "h100", [served], speed=5)
    good = spawn_emulator("vllm", "h100", [served], speed=5)
    config = {"pools": [_pool("bad", "h100", "vllm", 1.0, bad.url, M8B),
                        _pool("good", "h100", "vllm", 2.0, good.url, M8B)],
              "policies": {"p": {"strategy": "round_robin"}}, "default_policy": "p"}
    try:
        async with inproc_gateway(config, tmp_path) as (url, state):
            fleet = state.generation.fleet
            now = [time.monotonic()]
            fleet.clock = lambda: now[0]  # the breaker's cooldown runs on this clock
            httpx.post(bad.url + "/emulator/faults", json={"fail_next": 1000, "fail_status": 503})
            client = _client(url)
            pools = [(await _stream(client, "llama-3.1-8b", 2))["pool"] for _ in range(14)]
            assert set(pools) == {"good"}  # every 503 was retried on the other endpoint
            breaker = fleet.live.stats[fleet.index("bad-0")].breaker
            assert breaker.state == "open" and breaker.consecutive_failures == 5
            seen = len(httpx.get(bad.url + "/emulator/requests").json()["requests"])
            for _ in range(4):
                await _stream(client, "llama-3.1-8b", 2)
            assert len(httpx.get(bad.url + "/emulator/requests").json()["requests"]) == seen
            httpx.post(bad.url + "/emulator/faults", json={"fail_next": 0})
            now[0] += 6.0  # past the 5 s cooldown: one half-open probe request may go
            await tick(state)
            pools = [(await _stream(client, "llama-3.1-8b", 2))["pool"] for _ in range(6)]
            assert "bad" in pools and breaker.state == "closed"
    finally:
        bad.stop()
        good.stop()
