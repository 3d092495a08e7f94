"""The fleet scaler in ``serve`` (issue 23 item 3): the embedded default fleet's autoscaled
emulated pools, started and stopped by the gateway itself, over real HTTP.

A burst of long-prompt streams grows the pool cheapest per unit of SLO capacity; quiet
shrinks the dear H200 pool to nothing and the grown one back to its floor; not one request
fails, including those in flight on a replica chosen to drain. The burst outruns the fleet
before the new replicas are up, so admission answers part of it 429 with ``Retry-After``,
which the ``openai`` SDK retries, as clients do: every request ends in an answer.
``/admin/scaling`` and the gauges say so. Cold start and the scale-down delay are shortened
(the default fleet's are 15 s and 60 s); the scaler is ticked by the test, as the collector
is, so nothing waits on the scaler's own timer. No timing is asserted.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import openai
import yaml

from inproc import inproc_gateway, tick

MODEL = "llama-3.1-8b"
LONG_PROMPT = "Summarise the accelerator market. " * 235  # ~2,000 tokens
SERIAL = iter(range(1_000_000))  # each prompt its own (no prefix cache hit makes it cheap)
WORKERS = 96  # closed loop: more than the floors serve within the SLO


def _default_fleet() -> dict[str, Any]:
    text = resources.files("fleetgate.config").joinpath("default.yaml").read_text()
    config = yaml.safe_load(text)
    for pool in config["pools"]:
        if "autoscale" in pool:
            pool["autoscale"].update(cold_start_s=1, scale_down_delay_s=3)
    return config


async def _stream(client: openai.AsyncOpenAI, statuses: Counter[str]) -> None:
    try:
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": f"{next(SERIAL)} {LONG_PROMPT}"}],
            max_tokens=100,
            stream=True)
        async for chunk in raw.parse():
            if chunk.choices and chunk.choices[0].finish_reason:
                statuses["finished"] += 1
        statuses[f"pool {raw.headers['x-fleetgate-pool']}"] += 1
    except openai.APIError as exc:  # every failure is counted, none is allowed
        statuses[f"error {type(exc).__name__}"] += 1


async def _burst(client: openai.AsyncOpenAI, statuses: Counter[str], until: float) -> None:
    async def worker() -> None:
        while time.monotonic() < until:
            await _stream(client, statuses)
    await asyncio.gather(*(worker() for _ in range(WORKERS)))


async def _scaling(http: httpx.AsyncClient, url: str) -> dict[str, Any]:
    return (await http.get(url + "/admin/scaling")).json()["pools"]


async def test_a_burst_grows_the_cheapest_pool_and_quiet_shrinks_the_dear_one(
        tmp_path: Path) -> None:
    async with inproc_gateway(_default_fleet(), tmp_path, scale_interval_s=3600) as (
            url, state):
        assert state.scaler is not None
        await tick(state)
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=10,
                                    timeout=300)
        statuses: Counter[str] = Counter()
        http = httpx.AsyncClient(timeout=30)
        state.scaler.tick()
        start = await _scaling(http, url)
        assert start["h200-sglang"]["ready"] == 1 and start["mi300x-sglang"]["ready"] == 1

        burst = asyncio.create_task(_burst(client, statuses, time.monotonic() + 40))
        grown: str | None = None
        for _ in range(240):  # at most ~60 s
            await tick(state)
            state.scaler.tick()
            pools = await _scaling(http, url)
            grown = next((name for name, p in pools.items() if p["ready"] > 1), None)
            if grown:
                break
            await asyncio.sleep(0.25)
        print("while the burst ran:", {n: (p["desired"], p["ready"], p["starting"], p["load_per_s"],
                                            p["replica_capacity_per_s"], p["reason"])
                                        for n, p in pools.items()}, dict(statuses))
        assert grown is not None, pools
        costs = {n: p["usd_per_hour_at_desired"] / max(p["desired"], 1) for n, p in pools.items()}
        assert grown != "h200-sglang", (grown, costs)  # the dearest pool is bought last
        await burst

        shrunk: dict[str, Any] = {}
        for _ in range(240):
            await tick(state)
            state.scaler.tick()
            shrunk = await _scaling(http, url)
            settled = shrunk["h200-sglang"]["desired"] == 0 and shrunk[grown]["desired"] == 1
            if settled and shrunk["h200-sglang"]["ready"] == 0 and \
                    shrunk[grown]["ready"] == 1 and not any(p["draining"] for p in shrunk.values()):
                break  # the scaler wants what is there: the burst's demand has decayed
            await asyncio.sleep(0.25)
        print("after the quiet:", {n: (p["desired"], p["ready"], p["draining"], p["reason"])
                                   for n, p in shrunk.items()})
        assert shrunk["h200-sglang"]["ready"] == 0 and shrunk["h200-sglang"]["desired"] == 0
        assert shrunk[grown]["ready"] == 1

        metrics = (await http.get(url + "/metrics")).text
        assert f'fleetgate_pool_desired_replicas{{pool="{grown}"}} 1.0' in metrics
        assert 'fleetgate_pool_replicas{pool="h200-sglang",state="ready"} 0.0' in metrics
        # a light request is still served after the shrink, by a pool that is up
        await _stream(client, statuses)
        await http.aclose()
        errors = {k: v for k, v in statuses.items() if k.startswith("error")}
        print("requests:", dict(statuses))
        assert not errors, statuses
        served = sum(v for k, v in statuses.items() if k.startswith("pool"))
        assert served == statuses["finished"] > 40
