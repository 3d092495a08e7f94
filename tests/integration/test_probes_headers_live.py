"""Issue 25 item 1: the probes and headers clients expect, over real HTTP with the official
``openai`` client: ``/health`` and ``/version``; OpenAI's ``x-ratelimit-*`` headers on every
answer to a key with limits (whole answers, a stream's start, the 429 with ``retry-after``);
``x-fleetgate-cost-usd`` on a whole answer, equal to the ledger's charge.

An in-process gateway on a real uvicorn server (``inproc.py``) in front of an emulated vLLM.
No wall-clock timing is asserted.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import openai
import pytest

from fleetgate import __version__
from inproc import inproc_gateway, tick

MODEL, SERVED = "llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct"
ADMIN = "admin-key-0123456789"
LIMITED, OPEN_KEY = "sk-limited-0123456789", "sk-nolimits-0123456789"
RPM, TPM = 3, 5000
MESSAGES = [{"role": "user", "content": "hello there"}]
DURATION = re.compile(r"^(?:\d+h)?(?:\d+m)?\d+(?:\.\d+)?s$|^\d+ms$")  # OpenAI's: 6m0s, 20ms
CONFIG = {
    "pools": [{"name": "emu", "accelerator": "h100", "engine": "vllm",
               "price_per_gpu_hour": 2.0, "endpoints": ["emulated://vllm/h100?speed=50"],
               "models": {MODEL: SERVED}}],
    "auth": {"admin_keys": [ADMIN], "keys": [
        {"name": "limited", "key": LIMITED, "tenant": "team-limited",
         "limits": {"rpm": RPM, "tpm": TPM}},
        {"name": "open", "key": OPEN_KEY, "tenant": "team-open"}]},
}
RATE = ("x-ratelimit-limit-requests", "x-ratelimit-remaining-requests",
        "x-ratelimit-reset-requests", "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens")


def _client(url: str, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=30)


def _rate(headers: httpx.Headers) -> dict[str, str]:
    found = {name: headers[name] for name in RATE if name in headers}
    assert set(found) == set(RATE), headers
    assert found["x-ratelimit-limit-requests"] == str(RPM)
    assert found["x-ratelimit-limit-tokens"] == str(TPM)
    for kind in ("requests", "tokens"):
        assert DURATION.match(found[f"x-ratelimit-reset-{kind}"]), found
        assert found[f"x-ratelimit-remaining-{kind}"].isdigit(), found
    return found


async def test_health_and_version_need_no_key_and_are_documented(tmp_path: Path) -> None:
    async with inproc_gateway(CONFIG, tmp_path) as (url, _), \
            httpx.AsyncClient(timeout=10) as client:
        health = await client.get(url + "/health")
        assert (health.status_code, health.content) == (200, b"")
        version = await client.get(url + "/version")
        assert version.status_code == 200 and version.json() == {"version": __version__}
        doc = (await client.get(url + "/openapi.json",
                                headers={"authorization": f"Bearer {ADMIN}"})).json()
        assert "get" in doc["paths"]["/health"] and "get" in doc["paths"]["/version"]


async def test_rate_limit_headers_count_down_to_a_429(tmp_path: Path) -> None:
    async with inproc_gateway(CONFIG, tmp_path) as (url, state):
        await tick(state)
        client = _client(url, LIMITED)
        chat = client.chat.completions

        first = await chat.with_raw_response.create(model=MODEL, messages=MESSAGES,
                                                    max_tokens=8)
        used = first.parse().usage
        assert used is not None
        r1 = _rate(first.headers)
        assert r1["x-ratelimit-remaining-requests"] == str(RPM - 1)
        # a whole answer: its usage counts, in place of what it reserved
        assert r1["x-ratelimit-remaining-tokens"] == str(TPM - used.total_tokens)

        async with chat.with_streaming_response.create(
                model=MODEL, messages=MESSAGES, max_tokens=8, stream=True) as streamed:
            r2 = _rate(streamed.headers)  # sent with the response start
            assert "x-fleetgate-cost-usd" not in streamed.headers
            async for _ in streamed.iter_lines():
                pass
        assert r2["x-ratelimit-remaining-requests"] == str(RPM - 2)
        assert int(r2["x-ratelimit-remaining-tokens"]) < int(r1["x-ratelimit-remaining-tokens"])

        third = await chat.with_raw_response.create(model=MODEL, messages=MESSAGES,
                                                    max_tokens=8)
        r3 = _rate(third.headers)
        assert r3["x-ratelimit-remaining-requests"] == "0"
        assert int(r3["x-ratelimit-remaining-tokens"]) < int(r1["x-ratelimit-remaining-tokens"])

        with pytest.raises(openai.RateLimitError) as refused:
            await chat.create(model=MODEL, messages=MESSAGES, max_tokens=8)
        headers = refused.value.response.headers
        assert refused.value.status_code == 429
        retry_after = int(headers["retry-after"])
        assert 1 <= retry_after <= 60
        r4 = _rate(headers)
        assert r4["x-ratelimit-remaining-requests"] == "0"
        assert client._parse_retry_after_header(headers) == retry_after  # the SDK's reading


async def test_cost_header_is_the_ledgers_charge(tmp_path: Path) -> None:
    async with inproc_gateway(CONFIG, tmp_path) as (url, state), \
            httpx.AsyncClient(timeout=10) as admin:
        await tick(state)
        answer = await _client(url, OPEN_KEY).completions.with_raw_response.create(
            model=MODEL, prompt="once upon a time", max_tokens=8)
        assert not any(name.startswith("x-ratelimit-") for name in answer.headers)  # no limits
        usd = float(answer.headers["x-fleetgate-cost-usd"])
        assert usd > 0
        costs = (await admin.get(url + "/admin/costs",
                                 headers={"authorization": f"Bearer {ADMIN}"})).json()
        (tenant,) = [t for t in costs["tenants"] if t["tenant"] == "team-open"]
        assert tenant["requests"] == 1
        assert usd == pytest.approx(tenant["usd"], rel=1e-12)
