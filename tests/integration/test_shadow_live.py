"""Shadow traffic through a real gateway over HTTP, emulated engines behind it: half the
requests are mirrored to a candidate pool; clients only ever see the serving pool;
``/admin/shadow`` compares the two on the same requests; a hung candidate changes nothing
for clients."""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

import httpx
import openai
from typer.testing import CliRunner

from fleetgate.cli import app
from inproc import inproc_gateway, tick

MODEL = "llama-3.1-8b"
SERVED = {MODEL: "meta-llama/Llama-3.1-8B-Instruct"}


def _config(fraction: float) -> dict:
    def pool(name: str, gpu: str, engine: str, price: float) -> dict:
        return {"name": name, "accelerator": gpu, "engine": engine, "price_per_gpu_hour": price,
                "endpoints": [f"emulated://{engine}/{gpu}?speed=20"], "models": SERVED}

    return {
        "pools": [pool("h200", "h200", "sglang", 3.6), pool("mi355x", "mi355x", "vllm", 2.9)],
        "policies": {"prod": {
            "strategy": "cost", "slo": {"ttft_ms": 1500, "tpot_ms": 80},
            "filters": [{"name": "select", "params": {"pools": ["h200"]}}],
            "shadow": {"pool": "mi355x", "fraction": fraction, "max_usd_per_hour": 5}}},
        "default_policy": "prod",
    }


async def _ttfts(client: openai.AsyncOpenAI, n: int) -> tuple[list[float], set[str]]:
    ttfts, pools = [], set()
    for _ in range(n):
        t0 = time.perf_counter()
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=16,
            stream=True)
        first = None
        async for chunk in raw.parse():
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.perf_counter() - t0
        assert first is not None
        ttfts.append(first)
        pools.add(raw.headers["x-fleetgate-pool"])
    return ttfts, pools


async def test_half_the_traffic_mirrored_and_compared(tmp_path: Path) -> None:
    async with inproc_gateway(_config(0.5), tmp_path) as (url, state):
        await tick(state)
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        ttfts, pools = await _ttfts(client, 40)
        assert pools == {"h200"}
        assert state.shadow is not None
        await state.shadow.drain()
        async with httpx.AsyncClient() as http:
            report = (await http.get(url + "/admin/shadow")).json()["candidates"]
            metrics = (await http.get(url + "/metrics")).text
        (row,) = report
        assert row["pool"] == "mi355x" and row["serving_pool"] == "h200"
        assert 8 <= row["mirrored"] <= 32 and row["failed"] == 0
        assert row["requests"] == row["mirrored"] == row["serving"]["requests"]
        assert row["output_tokens"] == row["serving"]["output_tokens"] == 16 * row["mirrored"]
        for side in (row, row["serving"]):
            assert side["ttft_ms"]["p95"] > 0 and side["tpot_ms"]["p50"] > 0
            assert side["usd_per_mtok"] > 0
        # the copies are not charged to anyone: only the served requests are in the ledger
        assert 'fleetgate_requests_total' in metrics
        print(f"client TTFT p50 with half mirrored: {statistics.median(ttfts) * 1000:.1f} ms")
        # the one-page report (the gateway serves on this loop: the CLI runs in a thread)
        result = await asyncio.to_thread(CliRunner().invoke, app,
                                         ["bench", "report", "--shadow", url])
        assert result.exit_code == 0, result.output
        assert "mi355x would have served at TTFT p95" in result.output
        assert "against h200's" in result.output


async def test_client_latency_with_and_without_mirroring(tmp_path: Path) -> None:
    """The same 40 requests with fraction 0.5 and without a shadow: every answer from the
    serving pool; the TTFT p50s are printed (no timing assert: the machine is shared)."""
    p50 = {}
    for label, fraction in (("without", None), ("with half mirrored", 0.5)):
        config = _config(fraction or 0.5)
        if fraction is None:
            del config["policies"]["prod"]["shadow"]
        where = tmp_path / label.replace(" ", "-")
        where.mkdir()
        async with inproc_gateway(config, where) as (url, state):
            await tick(state)
            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
            await _ttfts(client, 5)  # warm-up
            ttfts, pools = await _ttfts(client, 40)
            assert pools == {"h200"}
            p50[label] = statistics.median(ttfts) * 1000
    print("client TTFT p50 ms: " + ", ".join(f"{k} {v:.1f}" for k, v in p50.items()))


async def test_a_hung_candidate_changes_nothing_for_clients(tmp_path: Path) -> None:
    async with inproc_gateway(_config(1.0), tmp_path) as (url, state):
        await tick(state)
        fleet = state.generation.fleet
        candidate = fleet.endpoints[fleet.index("mi355x-0")].url
        async with httpx.AsyncClient() as http:
            (await http.post(candidate + "/emulator/faults", json={"hang": True})
             ).raise_for_status()
            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
            _, pools = await _ttfts(client, 6)
            assert pools == {"h200"}
            assert state.shadow is not None
            await state.shadow.drain()  # each copy ends at the first-byte deadline
            (row,) = (await http.get(url + "/admin/shadow")).json()["candidates"]
            (await http.post(candidate + "/emulator/faults", json={"hang": False})
             ).raise_for_status()
        assert row["serving"]["requests"] == 6 and row["failed"] >= 1
