"""The cost router under real load, through a real gateway over HTTP (issue 12's scenarios).

- Bursts on the embedded default fleet do not poison what the router learned: light
  requests afterwards still go to the pool that is cheapest per token.
- Past capacity, low-priority requests get 429 with ``Retry-After`` while high-priority
  ones are served.

Emulated engines run at ``speed`` X; no timing is asserted, only where requests went and
what the gateway answered.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from importlib import resources
from pathlib import Path

import httpx
import openai
import yaml

from inproc import inproc_gateway, tick

MODEL = "llama-3.1-8b"


def _default_fleet(speed: int) -> dict:
    text = resources.files("fleetgate.config").joinpath("default.yaml").read_text()
    config = yaml.safe_load(text)
    for pool in config["pools"]:
        pool["endpoints"] = [f"{src}?speed={speed}" for src in pool["endpoints"]]
    return config


async def _stream(client: openai.AsyncOpenAI, max_tokens: int,
                  headers: dict[str, str] | None = None) -> str:
    raw = await client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Tell me about accelerators."}],
        max_tokens=max_tokens, stream=True, extra_headers=headers or {})
    async for _ in raw.parse():
        pass
    return raw.headers["x-fleetgate-pool"]


async def test_bursts_do_not_push_light_traffic_off_the_cheapest_pool(tmp_path: Path) -> None:
    """Two bursts of 48 concurrent streams of 300 tokens, then 30 light requests: >= 90% of
    those go where the router sent light traffic before the bursts (the pool cheapest per
    token at the SLO), and the learned corrections stay bounded."""
    # speed 1, as `make run`: faster emulation would make the relay, not the engines, the
    # bottleneck of 48 streams on this 2-core machine, and the router would rightly learn it
    config = _default_fleet(speed=1)
    # at its list price MI300X is within 10% of H200 per token on this workload (the 8B's
    # calibration, docs/gpus.md), and a near tie may rightly go either way: a clear margin
    next(p for p in config["pools"] if p["name"] == "mi300x-sglang")["price_per_gpu_hour"] = 1.5
    async with inproc_gateway(config, tmp_path) as (url, state):
        await tick(state)
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0,
                                    timeout=120)
        # the pool cheapest per token hangs on the answers' typical length (routing/
        # estimate.py): learn it from answers like the bursts' first, one at a time (no load)
        for _ in range(3):
            await _stream(client, 300)
            await tick(state)
        cheapest = await _stream(client, 8)
        for _ in range(2):
            await asyncio.gather(*(_stream(client, 300) for _ in range(48)))
            await tick(state)
        light = Counter()
        for _ in range(30):
            light[await _stream(client, 8)] += 1
            await tick(state)
        print(f"light requests after the bursts: {dict(light)} (cheapest idle: {cheapest})")
        assert light[cheapest] >= 27, (cheapest, light)
        async with httpx.AsyncClient() as http:
            endpoints = (await http.get(url + "/admin/endpoints")).json()["endpoints"]
        for ep in endpoints:  # the old rule drove these to their cap of 50
            assert ep["k_tpot"] < 5 and ep["k_ttft"] < 10, ep


async def test_past_capacity_low_priority_is_shed_with_retry_after(tmp_path: Path) -> None:
    """One slow endpoint (speed 1) and a flood of 90 requests at once: the overflow waits
    (normal ahead of low) and what cannot be served within the TTFT SLO is answered 429
    with a Retry-After, never a 5xx or a dropped connection; high-priority requests are
    all served; low is shed first."""
    config = {
        "pools": [{"name": "h100", "accelerator": "h100", "engine": "vllm",
                   "price_per_gpu_hour": 2.0, "endpoints": ["emulated://vllm/h100?speed=1"],
                   "models": {MODEL: "meta-llama/Llama-3.1-8B-Instruct"}}],
        "policies": {"cheapest": {"strategy": "cost",
                                  "slo": {"ttft_ms": 2000, "tpot_ms": 10}}},
        "default_policy": "cheapest",
    }

    def body(k: int) -> dict:  # distinct prompts: no prefix cache hits between them
        return {"model": MODEL, "max_tokens": 64, "stream": False,
                "messages": [{"role": "user", "content": f"{k} " + "x " * 600}]}

    async with inproc_gateway(config, tmp_path) as (url, state):
        await tick(state)
        async with httpx.AsyncClient(base_url=url, timeout=120) as http:
            async def one(k: int, priority: str) -> tuple[str, httpx.Response]:
                return priority, await http.post("/v1/chat/completions", json=body(k),
                                                 headers={"x-priority": priority})

            kinds = ["normal"] * 30 + ["low"] * 60 + ["high"] * 5
            results = await asyncio.gather(*(one(k, p) for k, p in enumerate(kinds)))
    statuses = Counter((p, r.status_code) for p, r in results)
    print(f"overload answers: {dict(statuses)}")
    assert {s for _, s in statuses} <= {200, 429}, statuses
    assert statuses[("high", 200)] == 5, statuses
    assert statuses[("low", 429)] > 0, statuses
    for _, r in results:
        if r.status_code == 429:
            assert int(r.headers["retry-after"]) >= 1
            assert r.json()["error"]["code"] == "overloaded"
    served = {p: statuses[(p, 200)] / kinds.count(p) for p in ("normal", "low")}
    assert served["normal"] > served["low"], statuses  # low is shed first
    assert state.proxy.flow.shed["low"] == statuses[("low", 429)]
