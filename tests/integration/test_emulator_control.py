"""Integration tests of the emulators' control surface, faults, disconnects and launcher.

Faults (fail_next, down, slow, hang), aborts on client disconnect (checked with a bounded
poll of ``/emulator/state``), SGLang's ``/abort_request``, discovery and health routes,
``/metrics`` parsed with prometheus_client, the request log, and ``start_emulator`` child
processes (including dying with the parent).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest
from emulator_harness import (
    ALIAS,
    CHAT,
    MODEL,
    ServerThread,
    config,
    set_faults,
    sse_events,
    state,
)
from prometheus_client.parser import text_string_to_metric_families

from fleetgate.emulator import start_emulator
from procs import wait_for


# -- faults ----------------------------------------------------------------------------------
@pytest.fixture
def fresh(engine: str) -> Iterator[str]:
    with ServerThread(config(engine)) as srv:
        yield srv.url


def test_fail_next(fresh: str, engine: str) -> None:
    set_faults(fresh, fail_next=2, fail_status=500)
    codes = [
        httpx.post(fresh + "/v1/chat/completions", json=CHAT, timeout=10).status_code
        for _ in range(3)
    ]
    assert codes == [500, 500, 200]
    assert httpx.get(fresh + "/emulator/faults").json()["fail_next"] == 0
    assert httpx.post(fresh + "/emulator/faults", json={"bogus": 1}).status_code == 422


def test_down_answers_503_everywhere_but_the_control_surface(fresh: str) -> None:
    set_faults(fresh, down=True)
    for method, path in [
        ("GET", "/health"),
        ("GET", "/v1/models"),
        ("GET", "/metrics"),
        ("POST", "/v1/chat/completions"),
    ]:
        assert httpx.request(method, fresh + path, json=CHAT).status_code == 503
    assert httpx.get(fresh + "/emulator/state").status_code == 200
    set_faults(fresh, down=False)
    assert httpx.get(fresh + "/health", timeout=10).status_code == 200


def test_slow_factor_stretches_steps(fresh: str) -> None:
    assert set_faults(fresh, slow_factor=1e6)["slow_factor"] == 1e6
    with pytest.raises(httpx.ReadTimeout):  # one step now takes hours of wall time
        httpx.post(fresh + "/v1/chat/completions", json=CHAT, timeout=0.3)
    set_faults(fresh, slow_factor=1.0)
    assert httpx.post(fresh + "/v1/chat/completions", json=CHAT, timeout=10).status_code == 200


async def test_hang_holds_requests_until_cleared(fresh: str) -> None:
    set_faults(fresh, hang=True)
    async with httpx.AsyncClient(timeout=10) as client:
        pending = asyncio.create_task(client.post(fresh + "/v1/chat/completions", json=CHAT))
        done, _ = await asyncio.wait({pending}, timeout=0.3)
        assert not done  # accepted, unanswered
        await client.post(fresh + "/emulator/faults", json={"hang": False})
        resp = await pending
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 16


# -- disconnects -----------------------------------------------------------------------------
async def test_disconnect_mid_stream_aborts_at_once(engine: str) -> None:
    with ServerThread(config(engine, speed=1.0)) as srv, httpx.Client(base_url=srv.url) as http:

        def running() -> int:
            return int(http.get("/emulator/state").json()["running"])

        async with httpx.AsyncClient(timeout=10) as client:
            body = CHAT | {"stream": True, "max_tokens": 4000}
            async with client.stream("POST", srv.url + "/v1/chat/completions", json=body) as r:
                lines = r.aiter_lines()
                while "content" not in await anext(lines):
                    pass  # read until the first token arrives, then hang up
                assert running() == 1
        closed = time.monotonic()
        wait_for(lambda: running() == 0, timeout=1.0, interval=0.001)
        print(
            f"{engine}: running fell to 0 within {1e3 * (time.monotonic() - closed):.1f} ms "
            "of the client closing (bounded poll)"
        )
        after = http.get("/emulator/state").json()
        assert after["aborted"] == 1 and after["kv_used_tokens"] == 0


def test_disconnect_while_waiting_for_a_non_stream_answer(engine: str) -> None:
    with ServerThread(config(engine, speed=1.0)) as srv:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(
                srv.url + "/v1/chat/completions", json=CHAT | {"max_tokens": 4000}, timeout=0.3
            )
        after = wait_for(lambda: (s := state(srv.url))["running"] == 0 and s, timeout=1.0)
        assert after["aborted"] == 1


def test_sglang_abort_request_ends_the_stream_with_abort(servers: dict[str, str]) -> None:
    url = servers["sglang"]
    with httpx.stream(
        "POST",
        url + "/v1/chat/completions",
        timeout=10,
        json=CHAT | {"stream": True, "max_tokens": 8000, "rid": "my-rid"},
    ) as r:
        lines = r.iter_lines()
        next(line for line in lines if "content" in line)
        assert httpx.post(url + "/abort_request", json={"rid": "my-rid"}).status_code == 200
        body = "\n\n".join(line for line in lines if line) + "\n\n"
    finishes = [c["choices"][0]["finish_reason"] for c in sse_events(body)[:-1] if c["choices"]]
    assert finishes[-1] == "abort"


# -- discovery, health, metrics, the request log ---------------------------------------------
def test_models_and_health_routes(url: str, engine: str) -> None:
    cards = httpx.get(url + "/v1/models").json()["data"]
    assert [c["id"] for c in cards] == [MODEL, ALIAS]
    assert {c["owned_by"] for c in cards} == {engine}
    assert all(("permission" in c) == (engine == "vllm") for c in cards)
    assert all(c["max_model_len"] == 8192 for c in cards)
    health = httpx.get(url + "/health", timeout=10)
    assert health.status_code == 200 and health.content == b""
    if engine == "vllm":
        assert httpx.get(url + "/version").json() == {"version": "0.33.0"}
        assert httpx.get(url + "/load").json() == {"server_load": 0}
        assert httpx.post(url + "/ping").status_code == 200
    else:
        for path in ("/health_generate", "/ready", "/ping"):
            assert httpx.get(url + path, timeout=10).status_code == 200
        info = httpx.get(url + "/model_info").json()
        assert info["served_model_name"] == MODEL and info["is_generation"] is True
        load = httpx.get(url + "/v1/loads").json()
        assert load["version"] == "0.5.23" and load["accelerator"] == "rocm"
        assert set(load["loads"][0]) >= {
            "num_running_reqs",
            "num_waiting_reqs",
            "token_usage",
            "gen_throughput",
            "max_total_num_tokens",
        }


VLLM_FAMILIES = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
    "vllm:num_preemptions": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
}
SGLANG_FAMILIES = {
    "sglang:num_running_reqs": "gauge",
    "sglang:num_queue_reqs": "gauge",
    "sglang:token_usage": "gauge",
    "sglang:gen_throughput": "gauge",
    "sglang:cache_hit_rate": "gauge",
    "sglang:utilization": "gauge",
    "sglang:fwd_occupancy": "gauge",
    "sglang:prompt_tokens": "counter",
    "sglang:generation_tokens": "counter",
    "sglang:num_requests": "counter",
    "sglang:time_to_first_token_seconds": "histogram",
    "sglang:inter_token_latency_seconds": "histogram",
    "sglang:e2e_request_latency_seconds": "histogram",
}


def test_metrics_exposition(url: str, engine: str) -> None:
    httpx.post(url + "/v1/chat/completions", json=CHAT | {"max_tokens": 3}, timeout=10)
    resp = httpx.get(url + "/metrics")
    assert resp.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
    families = {f.name: f for f in text_string_to_metric_families(resp.text)}
    expected = VLLM_FAMILIES if engine == "vllm" else SGLANG_FAMILIES
    assert {n: families[n].type for n in expected if n in families} == expected
    samples = {s.name: s for f in families.values() for s in f.samples}
    if engine == "vllm":
        labels = samples["vllm:num_requests_running"].labels
        assert labels == {"engine": "0", "model_name": MODEL}
        assert samples["vllm:generation_tokens_total"].value >= 3
        assert "vllm:time_to_first_token_seconds_bucket" in samples
        assert any(name.endswith("_created") for name in samples)
    else:
        assert samples["sglang:num_running_reqs"].labels == {
            "model_name": MODEL,
            "engine_type": "unified",
            "tp_rank": "0",
            "pp_rank": "0",
            "moe_ep_rank": "0",
        }
        assert samples["sglang:fwd_occupancy"].value != samples["sglang:fwd_occupancy"].value
        assert samples["sglang:utilization"].value == 0.0
        assert not any(name.endswith("_created") for name in samples)


def test_request_log_shows_what_was_forwarded(url: str, engine: str) -> None:
    httpx.delete(url + "/emulator/requests")
    headers = {
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        "x-request-id": "req-42",
    }
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    body = CHAT | {"max_tokens": 2, "tools": tools, "tool_choice": "none", "top_k": 3,
                   "guided_json": {}}
    resp = httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=10)
    assert resp.status_code == 200
    if engine == "vllm":
        assert resp.json()["id"] == "chatcmpl-req-42"
    (seen,) = httpx.get(url + "/emulator/requests").json()["requests"]
    assert seen["method"] == "POST" and seen["path"] == "/v1/chat/completions"
    assert seen["headers"]["traceparent"] == headers["traceparent"]
    assert seen["headers"]["x-request-id"] == "req-42"
    assert seen["body"] == body


# -- the launcher ----------------------------------------------------------------------------
async def test_start_emulator_child_process_and_parent_death() -> None:
    handles = await asyncio.gather(
        start_emulator("vllm", "h200", [MODEL], speed=20),
        start_emulator("sglang", "mi355x", ["meta-llama/Llama-3.1-70B-Instruct"], speed=20),
    )
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            for handle in handles:
                assert handle.url.startswith("http://127.0.0.1:") and handle.pid > 0
                resp = await client.post(
                    handle.url + "/v1/completions",
                    json={"model": "m", "prompt": "hi", "max_tokens": 2},
                )
                assert resp.status_code in (200, 404)
            st = (await client.get(handles[1].url + "/emulator/state")).json()
            assert (st["profile"], st["tp"]) == ("llama-3.1-70b-fp8", 1)
        await handles[0].stop()
        assert handles[0].returncode is not None
        handles[1].process.stdin.close()  # what the child sees when its parent dies
        await asyncio.wait_for(handles[1].process.wait(), timeout=10)
    finally:
        for handle in handles:
            handle.kill()


async def test_start_emulator_rejects_a_bad_config() -> None:
    with pytest.raises(ValueError, match="tp >= 2"):
        await start_emulator("vllm", "h100", ["llama-3.1-70b"], tp=1)
