"""``fleetgate serve`` in front of a real vLLM that ``fleetgate worker`` registered.

The official ``openai`` client (sync and async) through the gateway: chat and completions,
stream and non-stream, usage, ``include_usage`` both ways, the engine's own errors relayed
with their status; the collector reading the real ``/metrics`` while load moves it; a client
that leaves mid-stream making vLLM abort; the mixed fleet (real CPU pool + emulated H100
pool, same public model) routing to both. ``tiny-real`` is only on the real engine.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from engines_harness import (
    EMU_POOL,
    MAX_MODEL_LEN,
    PUBLIC,
    PUBLIC_REAL,
    REAL_POOL,
    SERVED,
    RealEngine,
    endpoint_row,
    public_models,
    vllm_metrics,
    wait_for,
)

from engine_contract import assert_metrics_parse
from procs import Proc

MESSAGES = [{"role": "user", "content": "Say something about GPUs."}]
LOAD_TOKENS = MAX_MODEL_LEN - 40  # per request: the load must outlast a few scrapes


def _client(fleet: Proc) -> openai.OpenAI:
    return openai.OpenAI(base_url=fleet.url + "/v1", api_key="unused", max_retries=0)


def test_the_worker_is_registered_and_ready(fleet: Proc, real: RealEngine) -> None:
    row = wait_for(lambda: (r := endpoint_row(fleet.url, real.url)) and
                   r["health"] == "ready" and r, 30, "the real endpoint to be ready")
    assert row["pool"] == REAL_POOL and row["engine"] == "vllm" and row["accelerator"] == "cpu"
    assert row["models"] == {PUBLIC: SERVED, PUBLIC_REAL: SERVED}
    assert row["price_per_gpu_hour"] == 0.05 and row["gpus_per_replica"] == 1
    assert {PUBLIC, PUBLIC_REAL} <= set(public_models(fleet.url))
    command = next(ln for ln in real.worker_lines() if "command:" in ln)
    assert "VLLM_CPU_KVCACHE_SPACE=1" in command and "HF_HUB_OFFLINE=1" in command
    assert "-m vllm.entrypoints.openai.api_server --model" in command


def test_chat_non_stream(fleet: Proc, real: RealEngine) -> None:
    raw = _client(fleet).chat.completions.with_raw_response.create(
        model=PUBLIC_REAL, messages=MESSAGES, max_tokens=7)
    resp = raw.parse()
    assert raw.headers["x-fleetgate-pool"] == REAL_POOL and raw.headers["x-request-id"]
    assert resp.model == PUBLIC_REAL and resp.choices[0].message.content
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage is not None and resp.usage.completion_tokens == 7
    assert resp.usage.prompt_tokens > 0
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + 7


@pytest.mark.parametrize("include_usage", [True, False])
def test_chat_stream_include_usage_honoured(fleet: Proc, real: RealEngine,
                                            include_usage: bool) -> None:
    raw = _client(fleet).chat.completions.with_raw_response.create(
        model=PUBLIC_REAL, messages=MESSAGES, max_tokens=5, stream=True,
        stream_options={"include_usage": True} if include_usage else None)
    assert raw.headers["x-fleetgate-pool"] == REAL_POOL
    assert raw.headers["content-type"].startswith("text/event-stream")
    chunks = list(raw.parse())
    assert all(c.model == PUBLIC_REAL for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usages = [c.usage for c in chunks if c.usage is not None]
    if include_usage:
        assert len(usages) == 1 and chunks[-1].choices == []
        assert usages[0].completion_tokens == 5
        assert usages[0].total_tokens == usages[0].prompt_tokens + 5
    else:
        assert usages == []


async def test_completions_async(fleet: Proc, real: RealEngine) -> None:
    client = openai.AsyncOpenAI(base_url=fleet.url + "/v1", api_key="unused", max_retries=0)
    plain = await client.completions.create(model=PUBLIC_REAL, prompt="The MI300X has",
                                            max_tokens=4)
    assert plain.model == PUBLIC_REAL and plain.choices[0].text
    assert plain.usage is not None and plain.usage.completion_tokens == 4
    for include_usage in (True, False):
        stream = await client.completions.create(
            model=PUBLIC_REAL, prompt="The MI300X has", max_tokens=4, stream=True,
            stream_options={"include_usage": True} if include_usage else None)
        chunks = [c async for c in stream]
        assert "".join(c.choices[0].text for c in chunks if c.choices) == plain.choices[0].text
        usages = [c.usage for c in chunks if c.usage is not None]
        assert [u.completion_tokens for u in usages] == ([4] if include_usage else [])
    await client.close()


@pytest.mark.parametrize("stream", [False, True])
def test_context_errors_name_the_field_vllm_names(fleet: Proc, real: RealEngine,
                                                  stream: bool) -> None:
    """Over the context by the gateway's own count: the gateway answers OpenAI's 400 itself
    (no engine is asked), naming the field vLLM would name. Over it only by the engine's
    tokenizer (the gateway's ~4 characters a token undercounts one token a digit): vLLM's own
    400 is relayed with its status and param."""
    client = _client(fleet)
    with pytest.raises(openai.BadRequestError) as too_many:
        client.chat.completions.create(model=PUBLIC_REAL, messages=MESSAGES,
                                       max_tokens=MAX_MODEL_LEN + 44, stream=stream)
    err = too_many.value.body
    assert too_many.value.status_code == 400 and isinstance(err, dict)
    assert err["param"] == "max_tokens" and err["code"] == "context_length_exceeded"
    assert f"maximum context length is {MAX_MODEL_LEN} tokens" in err["message"]
    with pytest.raises(openai.BadRequestError) as too_long:
        client.chat.completions.create(
            model=PUBLIC_REAL, stream=stream, max_tokens=8,
            messages=[{"role": "user", "content": "7" * (2 * MAX_MODEL_LEN)}])
    err = too_long.value.body
    assert isinstance(err, dict) and err["param"] == "input_tokens"  # vLLM's, relayed
    assert f"maximum context length is {MAX_MODEL_LEN} tokens" in err["message"]


@pytest.fixture
def ghost(fleet: Proc, real: RealEngine) -> Iterator[str]:
    """A second registration of the same engine (as ``localhost``) under a public name whose
    served name vLLM does not serve: the way to make the engine itself answer 404."""
    body = {"pool": "cpu-ghost", "url": real.url.replace("127.0.0.1", "localhost"),
            "engine": "vllm", "accelerator": "cpu", "models": {"ghost": "not-served"},
            "price_per_gpu_hour": 0.01, "ttl_s": 120}
    resp = httpx.post(fleet.url + "/admin/endpoints", json=body, timeout=10)
    assert resp.is_success, resp.text
    ident = resp.json()["id"]
    wait_for(lambda: (r := endpoint_row(fleet.url, body["url"])) and r["health"] == "ready",
             30, "the ghost endpoint to be ready")
    yield "ghost"
    httpx.delete(f"{fleet.url}/admin/endpoints/{ident}", timeout=10)


def test_engine_unknown_model_is_relayed_as_404(fleet: Proc, ghost: str) -> None:
    raw = httpx.post(fleet.url + "/v1/chat/completions", timeout=30,
                     json={"model": ghost, "messages": MESSAGES, "max_tokens": 2})
    assert raw.status_code == 404, raw.text
    err = raw.json()["error"]
    assert set(err) >= {"message", "type", "param", "code"}
    assert "does not exist" in err["message"]
    with pytest.raises(openai.NotFoundError):
        _client(fleet).chat.completions.create(model=ghost, messages=MESSAGES, max_tokens=2,
                                               stream=True)


def test_mixed_fleet_routes_to_both_pools(fleet: Proc, real: RealEngine) -> None:
    client = _client(fleet)
    seen = set()
    for _ in range(6):
        raw = client.chat.completions.with_raw_response.create(
            model=PUBLIC, messages=MESSAGES, max_tokens=3)
        seen.add(raw.headers["x-fleetgate-pool"])
        assert raw.parse().model == PUBLIC
    assert seen == {REAL_POOL, EMU_POOL}


def _load(fleet: Proc, n: int, max_tokens: int) -> tuple[list[threading.Thread], list[int]]:
    """``n`` concurrent streaming completions on the real engine; their statuses land in
    the returned list."""
    statuses: list[int] = []

    def one() -> None:
        with httpx.stream("POST", fleet.url + "/v1/completions", timeout=120, json={
                "model": PUBLIC_REAL, "prompt": "Once", "max_tokens": max_tokens,
                "stream": True}) as resp:
            body = b"".join(resp.iter_bytes())
            statuses.append(resp.status_code)
            if resp.status_code != 200:
                print(f"load request: HTTP {resp.status_code} {body[:300]!r}")

    threads = [threading.Thread(target=one, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    return threads, statuses


def test_collector_reads_the_real_metrics_under_load(fleet: Proc, real: RealEngine) -> None:
    """The gateway's view of the real engine moves under load: scraped running and KV usage
    rise while it lasts and fall after. (On 2 busy cores a scrape can take seconds, so the
    learned tokens/s, which needs two scrapes around the load, is not asserted.)"""
    assert_metrics_parse(httpx.get(real.url + "/metrics", timeout=10).text, "vllm")
    before = vllm_metrics(real.url)["vllm:generation_tokens_total"]
    for _ in range(6):  # a load that ends between two scrapes (1 s apart) is not seen: again
        # (the tiny model's two answers can be over within two of the row's polls)
        seen: list[dict[str, Any]] = []
        threads, statuses = _load(fleet, 2, LOAD_TOKENS)
        while any(t.is_alive() for t in threads):
            row = endpoint_row(fleet.url, real.url) or {}
            seen.append({k: row.get(k) for k in ("running", "kv_usage", "in_flight",
                                                 "scrape_age_s")})
            time.sleep(0.05)
        for t in threads:
            t.join(timeout=120)
        assert statuses == [200] * 2
        peak_running = max((r["running"] or 0) for r in seen)
        peak_kv = max((r["kv_usage"] or 0) for r in seen)
        if peak_running >= 1 and peak_kv > 0:
            break
    assert peak_running >= 1 and peak_kv > 0, f"rows during the last load: {seen}"
    wait_for(lambda: (r := endpoint_row(fleet.url, real.url)) and r["running"] == 0, 30,
             "the collector to see the engine idle")
    assert vllm_metrics(real.url)["vllm:generation_tokens_total"] >= before + 2 * LOAD_TOKENS


def test_client_disconnect_through_the_gateway_aborts_in_vllm(fleet: Proc,
                                                             real: RealEngine) -> None:
    before = vllm_metrics(real.url)
    body: dict[str, Any] = {"model": PUBLIC_REAL, "messages": MESSAGES, "stream": True,
                            "max_tokens": MAX_MODEL_LEN - 40}
    with httpx.stream("POST", fleet.url + "/v1/chat/completions", json=body,
                      timeout=30) as resp:
        assert resp.headers["x-fleetgate-pool"] == REAL_POOL
        lines = resp.iter_lines()
        for _ in range(6):
            next(lines)
    wait_for(lambda: vllm_metrics(real.url)["vllm:num_requests_running"] == 0, 30,
             "vLLM to abort the request")
    generated = (vllm_metrics(real.url)["vllm:generation_tokens_total"]
                 - before["vllm:generation_tokens_total"])
    assert 0 < generated < MAX_MODEL_LEN - 40
    ok = httpx.post(fleet.url + "/v1/chat/completions", timeout=30,
                    json=body | {"stream": False, "max_tokens": 2})
    assert ok.status_code == 200  # the gateway and the engine both keep serving
