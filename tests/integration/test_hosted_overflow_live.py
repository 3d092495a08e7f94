"""A hosted per-token pool for overflow, live (issue 25 item 3), over real HTTP with the
official ``openai`` client.

An in-process gateway (``inproc.py``) in front of one self-hosted emulated vLLM replica
(a 70B FP8 model on one H100: a KV cache of a few thousand tokens, so a handful of
requests is its SLO capacity) and a hosted pool (``engine: openai``, ``price_per_mtok``,
``max_concurrency``) whose endpoint is another emulated engine standing in for the hosted
API. A burst of twice the self-hosted replica's SLO capacity (read from the router's own
estimate) is served in full: the replica takes its capacity, the hosted API the rest, and
the ledger charges the hosted API its tokens at its prices. Without the hosted pool the
same burst is shed (429 ``overloaded``) beyond that capacity. No wall-clock timing is
asserted: the answers' TTFT and TPOT are printed (``-s``) against the SLO.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from inproc import inproc_gateway, tick

MODEL = "llama-3.1-70b"
SLO = {"ttft_ms": 500, "tpot_ms": 200}
PRICE = {"input": 0.15, "output": 0.60}
OWN: dict[str, Any] = {
    "name": "own", "accelerator": "h100", "engine": "vllm", "price_per_gpu_hour": 2.0,
    "endpoints": ["emulated://vllm/h100?profile=llama-3.1-70b-fp8&speed=20"],
    "models": {MODEL: "org/llama-3.1-70b-fp8"}, "max_model_len": 2048}
HOSTED: dict[str, Any] = {
    "name": "hosted", "engine": "openai", "price_per_mtok": PRICE, "max_concurrency": 32,
    "expected_latency": {"ttft_ms": 200, "tpot_ms": 10},
    "endpoints": ["emulated://vllm/h200?profile=llama-3.1-70b-fp8&speed=20"],
    "models": {MODEL: "provider/llama-3.1-70b"}}
PROMPT = [{"role": "user", "content": "word " * 400}]  # ~500 tokens: a few fill the KV cache
MAX_TOKENS = 200


def _config(*pools: dict[str, Any]) -> dict[str, Any]:
    return {"pools": list(pools), "default_policy": "cheapest",
            "policies": {"cheapest": {"strategy": "cost", "slo": SLO}}}


async def _ask(client: openai.AsyncOpenAI, stream: bool) -> dict[str, Any]:
    """One chat request: its pool, tokens and client-side TTFT/TPOT, or its error code."""
    t0 = time.monotonic()
    try:
        raw = await client.chat.completions.with_raw_response.create(  # type: ignore[call-overload]
            model=MODEL, messages=PROMPT, max_tokens=MAX_TOKENS, stream=stream,
            stream_options={"include_usage": True} if stream else None)
    except openai.RateLimitError as exc:
        return {"error": exc.code}
    out: dict[str, Any] = {"pool": raw.headers["x-fleetgate-pool"], "ttft_s": None}
    if not stream:
        answer = raw.parse()
        assert answer.usage is not None
        out.update(tokens=answer.usage.completion_tokens, prompt=answer.usage.prompt_tokens)
        return out
    async for chunk in raw.parse():
        if out["ttft_s"] is None and chunk.choices and chunk.choices[0].delta.content:
            out["ttft_s"] = time.monotonic() - t0
        if chunk.usage is not None:
            out.update(tokens=chunk.usage.completion_tokens, prompt=chunk.usage.prompt_tokens)
    if out["ttft_s"] is not None and out["tokens"] > 1:
        out["tpot_s"] = (time.monotonic() - t0 - out["ttft_s"]) / (out["tokens"] - 1)
    return out


async def _capacity(url: str, state: Any) -> int:
    """The self-hosted replica's SLO capacity for this request, from the router's estimate
    (after one request, so the engine has reported its KV cache)."""
    await tick(state)
    await _ask(openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0), False)
    await tick(state)
    async with httpx.AsyncClient(timeout=10) as http:
        found = (await http.get(url + "/admin/decisions?limit=1&candidates=1")).json()
    rows = found["decisions"][0]["candidates"]
    own = next(r for r in rows if r["pool"] == "own")
    return int(own["estimates"]["slo_capacity"])


async def _burst(url: str, n: int, stream: bool) -> list[dict[str, Any]]:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
    return list(await asyncio.gather(*(_ask(client, stream) for _ in range(n))))


@pytest.mark.parametrize("stream", [True, False])
async def test_a_burst_overflows_to_the_hosted_pool(tmp_path: Path, stream: bool) -> None:
    async with inproc_gateway(_config(OWN, HOSTED), tmp_path) as (url, state):
        capacity = await _capacity(url, state)
        assert 1 <= capacity <= 8, capacity  # the 70B's small KV cache on one H100
        answers = await _burst(url, 2 * capacity, stream)
        assert not [a for a in answers if "error" in a], answers  # nothing shed
        pools = [a["pool"] for a in answers]
        assert pools.count("own") >= 1 and pools.count("hosted") >= 1, pools
        async with httpx.AsyncClient(timeout=10) as http:
            costs = (await http.get(url + "/admin/costs")).json()
        row = next(p for p in costs["pools"] if p["pool"] == "hosted")
        assert row["price_per_mtok"] == PRICE and row["gpu_hours"] == 0.0
        hosted = [a for a in answers if a["pool"] == "hosted"]
        assert row["requests"] == len(hosted)
        assert row["usd"] == pytest.approx(sum(
            a["prompt"] * PRICE["input"] + a["tokens"] * PRICE["output"] for a in hosted) / 1e6)
        met = [a for a in answers if a.get("ttft_s") is not None
               and a["ttft_s"] <= SLO["ttft_ms"] / 1000
               and a.get("tpot_s", 0.0) <= SLO["tpot_ms"] / 1000]
        print(f"\nburst of {len(answers)} (capacity {capacity}): {pools.count('hosted')} "
              f"to the hosted pool (${row['usd']:.6f}), "
              + (f"{len(met)}/{len(answers)} within the SLO (client-side)" if stream else ""))


async def test_without_the_hosted_pool_the_burst_is_shed(tmp_path: Path) -> None:
    async with inproc_gateway(_config(OWN), tmp_path) as (url, state):
        capacity = await _capacity(url, state)
        answers = await _burst(url, 2 * capacity, True)
        shed = [a for a in answers if "error" in a]
        assert shed and all(a["error"] == "overloaded" for a in shed), answers
        assert all(a["pool"] == "own" for a in answers if "error" not in a)
        assert state.proxy.flow.shed["normal"] == len(shed)
        print(f"\nburst of {len(answers)} (capacity {capacity}) without the hosted pool: "
              f"{len(shed)} shed")
