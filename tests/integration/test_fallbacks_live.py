"""Issue 25 item 4: model fallbacks over real HTTP with the official ``openai`` client.

An in-process gateway on a real uvicorn server (``inproc.py``) in front of two emulated vLLM
engines, one per model: ``small`` (pool ``pa``, a 256-token context) falls back to ``long``
(pool ``pb``). Each trigger, streamed and not: every endpoint refusing before the first
byte, no capacity within the SLO (admission sheds), a context too small for the request.
The answer names the model that served (``x-fleetgate-model``), the decision log and the
ledger say the same, a key limited to ``small`` never reaches ``long``, and a tenant's own
rate limit (429) never falls back. No wall-clock timing is asserted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from inproc import inproc_gateway, tick

SMALL, LONG = "small", "long"
SERVED = {SMALL: "org/small-8b-instruct", LONG: "org/long-8b-instruct"}
ADMIN, OPEN_KEY = "admin-key-0123456789", "sk-open-key-0123456789"
SMALL_ONLY, LIMITED = "sk-small-only-0123456789", "sk-limited-0123456789"
ADMIN_H = {"authorization": f"Bearer {ADMIN}"}
MESSAGES = [{"role": "user", "content": "hello there"}]
LONG_PROMPT = [{"role": "user", "content": "word " * 400}]  # ~500 tokens: over 256
CONFIG: dict[str, Any] = {
    "pools": [
        {"name": "pa", "accelerator": "h100", "engine": "vllm", "price_per_gpu_hour": 2.0,
         "endpoints": ["emulated://vllm/h100?speed=50"], "models": {SMALL: SERVED[SMALL]},
         "max_model_len": 256},
        {"name": "pb", "accelerator": "h200", "engine": "vllm", "price_per_gpu_hour": 3.0,
         "endpoints": ["emulated://vllm/h200?speed=50"], "models": {LONG: SERVED[LONG]}}],
    "policies": {"cheapest": {"strategy": "cost", "slo": {"ttft_ms": 300, "tpot_ms": 200}}},
    "default_policy": "cheapest",
    "routes": [{"match": {"model": SMALL}, "policy": "cheapest", "fallbacks": [LONG]}],
    "auth": {"admin_keys": [ADMIN], "keys": [
        {"name": "open", "key": OPEN_KEY, "tenant": "team-open"},
        {"name": "small-only", "key": SMALL_ONLY, "tenant": "team-small", "models": [SMALL]},
        {"name": "limited", "key": LIMITED, "tenant": "team-limited", "limits": {"rpm": 1}}]},
}


def _client(url: str, key: str = OPEN_KEY) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=60)


async def _ask(client: openai.AsyncOpenAI, stream: bool,
               messages: list[dict[str, str]] = MESSAGES) -> tuple[httpx.Headers, str, str]:
    """(headers, the answer's model field, its text) for one chat request."""
    raw = await client.chat.completions.with_raw_response.create(
        model=SMALL, messages=messages, max_tokens=8, stream=stream)  # type: ignore[call-overload]
    if not stream:
        answer = raw.parse()
        return raw.headers, answer.model, answer.choices[0].message.content or ""
    model, text = "", ""
    async for chunk in raw.parse():
        model = chunk.model or model
        text += "".join(c.delta.content or "" for c in chunk.choices)
    return raw.headers, model, text


def _pool_url(state: Any, pool: str) -> str:
    return next(ep.url for ep in state.generation.fleet.endpoints if ep.pool == pool)


async def _decisions(url: str, limit: int) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(timeout=10) as http:
        found = await http.get(url + f"/admin/decisions?limit={limit}&candidates=1",
                               headers=ADMIN_H)
    return list(found.json()["decisions"])


def _assert_fell_back(headers: httpx.Headers, model: str, text: str) -> None:
    assert headers["x-fleetgate-model"] == LONG, dict(headers)
    assert headers["x-fleetgate-pool"] == "pb"
    assert model == LONG and text  # the served name rewritten to the fallback's public name


@pytest.mark.parametrize("stream", [False, True])
async def test_every_endpoint_refusing_falls_back(tmp_path: Path, stream: bool) -> None:
    async with inproc_gateway(CONFIG, tmp_path) as (url, state):
        await tick(state)
        async with httpx.AsyncClient(timeout=10) as http:
            faults = await http.post(_pool_url(state, "pa") + "/emulator/faults",
                                     json={"fail_next": 1, "fail_status": 503})
            assert faults.status_code == 200
        _assert_fell_back(*await _ask(_client(url), stream))
        fell_back, asked = await _decisions(url, 2)
        assert (asked["model"], asked["fell_back_to"]) == (SMALL, LONG)
        assert [a["status"] for a in asked["attempts"]] == [503]
        assert fell_back["model"] == LONG and fell_back["chosen_pool"] == "pb"
        assert fell_back["fallback"]["reason"] == "refused"
        assert fell_back["fallback"]["asked"] == SMALL

        headers, model, _ = await _ask(_client(url), stream)  # served again: no fallback
        assert "x-fleetgate-model" not in headers and model == SMALL


@pytest.mark.parametrize("stream", [False, True])
async def test_a_context_too_small_falls_back(tmp_path: Path, stream: bool) -> None:
    async with inproc_gateway(CONFIG, tmp_path) as (url, state):
        await tick(state)
        _assert_fell_back(*await _ask(_client(url), stream, LONG_PROMPT))
        fell_back, asked = await _decisions(url, 2)
        assert asked["model"] == SMALL and asked["attempts"] == []
        assert fell_back["fallback"]["reason"] == "context_window"
        assert "maximum context length is 256 tokens" in fell_back["fallback"]["error"]
        async with httpx.AsyncClient(timeout=10) as http:
            costs = (await http.get(url + "/admin/costs", headers=ADMIN_H)).json()
        charged = {row["model"]: row for row in costs["models"]}
        assert set(charged) == {LONG}, charged  # the model that served, and only it
        assert charged[LONG]["requests"] == 1 and charged[LONG]["usd"] > 0


@pytest.mark.parametrize("stream", [False, True])
async def test_no_capacity_within_the_slo_falls_back(tmp_path: Path, stream: bool) -> None:
    """``small``'s only endpoint is made to look full (requests in flight past its SLO
    capacity, none ending): admission waits out the TTFT budget, sheds, and ``long``
    serves."""
    async with inproc_gateway(CONFIG, tmp_path) as (url, state):
        await tick(state)
        fleet = state.generation.fleet
        i = next(k for k, ep in enumerate(fleet.endpoints) if ep.pool == "pa")
        for _ in range(400):
            fleet.live.on_dispatch(i, fleet.clock())
        _assert_fell_back(*await _ask(_client(url), stream))
        fell_back, asked = await _decisions(url, 2)
        assert asked["model"] == SMALL and asked["fell_back_to"] == LONG
        assert fell_back["fallback"]["reason"] == "capacity"
        assert state.proxy.flow.shed["normal"] == 1


async def test_a_key_limited_to_the_model_never_reaches_a_fallback(tmp_path: Path) -> None:
    async with inproc_gateway(CONFIG, tmp_path) as (url, state):
        await tick(state)
        with pytest.raises(openai.BadRequestError) as caught:
            await _ask(_client(url, SMALL_ONLY), False, LONG_PROMPT)
        assert caught.value.code == "context_length_exceeded"  # small's own answer
        with pytest.raises(openai.BadRequestError):
            await _ask(_client(url, SMALL_ONLY), True, LONG_PROMPT)
        assert all(d["model"] == SMALL and d["fell_back_to"] is None
                   for d in await _decisions(url, 10))


async def test_a_tenants_own_rate_limit_never_falls_back(tmp_path: Path) -> None:
    async with inproc_gateway(CONFIG, tmp_path) as (url, state):
        await tick(state)
        headers, model, _ = await _ask(_client(url, LIMITED), False)
        assert model == SMALL and "x-fleetgate-model" not in headers
        for stream in (False, True):
            with pytest.raises(openai.RateLimitError) as caught:
                await _ask(_client(url, LIMITED), stream)
            assert caught.value.code == "rate_limit_exceeded"
        assert [d["model"] for d in await _decisions(url, 10)] == [SMALL]
