"""Prefix-cache-aware routing over real HTTP: a real gateway (in-process uvicorn), three
emulated vLLM engines on local ports (prefix caching on, ``cached_tokens`` reported as with
``--enable-prompt-tokens-details``) and the official ``openai`` client.

Repeated prompts of one conversation must land on the endpoint that cached their prefix and
come back with ``usage.prompt_tokens_details.cached_tokens``; the engines' own counters
(``vllm:prefix_cache_hits_total``) show the hits.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from pathlib import Path

import httpx
import openai
from emulator_harness import ServerThread, config

from inproc import inproc_gateway, tick

MODEL = "llama-3.1-8b"


def _fleet(urls: list[str]) -> dict:
    return {
        "pools": [{"name": "h100", "accelerator": "h100", "engine": "vllm",
                   "price_per_gpu_hour": 2.0, "endpoints": urls,
                   "models": {MODEL: "meta-llama/Llama-3.1-8B-Instruct"}}],
        "policies": {"prefix": {"strategy": "weighted", "scorers": [
            {"name": "queue", "weight": 1}, {"name": "prefix_cache", "weight": 2}]}},
        "default_policy": "prefix",
    }


async def test_repeated_prefixes_hit_the_cache_on_the_same_endpoint(tmp_path: Path) -> None:
    with contextlib.ExitStack() as stack:
        engines = [stack.enter_context(ServerThread(config("vllm", prompt_tokens_details=True)))
                   for _ in range(3)]
        async with inproc_gateway(_fleet([e.url for e in engines]), tmp_path) as (url, state):
            await tick(state)
            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
            where: dict[int, set[str]] = defaultdict(set)
            cached: dict[int, list[int]] = defaultdict(list)
            for turn in range(3):
                for conv in range(4):
                    system = f"conversation {conv}: " + "context words " * 400  # ~1.4k tokens
                    raw = await client.chat.completions.with_raw_response.create(
                        model=MODEL, max_tokens=4, messages=[
                            {"role": "system", "content": system},
                            {"role": "user", "content": f"turn {turn}"}])
                    where[conv].add(raw.headers["x-fleetgate-endpoint"])
                    usage = raw.parse().usage
                    assert usage is not None and usage.prompt_tokens_details is not None
                    cached[conv].append(usage.prompt_tokens_details.cached_tokens or 0)
            assert all(len(endpoints) == 1 for endpoints in where.values()), where
            for conv, tokens in cached.items():
                assert tokens[0] == 0 and min(tokens[1:]) >= 1300, (conv, tokens)
            hits = 0.0
            for engine in engines:
                text = httpx.get(engine.url + "/metrics").text
                hits += sum(float(line.split()[-1]) for line in text.splitlines()
                            if line.startswith("vllm:prefix_cache_hits_total{"))
            assert hits == sum(sum(t) for t in cached.values())
