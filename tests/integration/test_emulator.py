"""Integration tests of the emulated vLLM / SGLang servers over real HTTP.

Each server is the real app under a real uvicorn on 127.0.0.1 (port 0): most run in a thread
of this process (fast to start, each with its own event loop), one test starts child
processes through ``start_emulator``. Clients are the official ``openai`` SDK (sync and async)
and raw httpx. Waiting for state uses short bounded polling loops; no timing is asserted.
"""

from __future__ import annotations

import asyncio
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from fleetgate.backends.emulator import EmulatorConfig, create_emulator_app, start_emulator

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
ALIAS = "llama-3.1-8b"
ENGINES = ("vllm", "sglang")
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Say something."}]}


class ServerThread:
    """An emulator app under uvicorn in a background thread, on a free port."""

    def __init__(self, config: EmulatorConfig) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        uv = uvicorn.Config(
            create_emulator_app(config),
            http="httptools",
            lifespan="on",
            log_level="warning",
            access_log=False,
        )
        self.server = uvicorn.Server(uv)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def __enter__(self) -> ServerThread:
        self.thread.start()
        poll(lambda: self.server.started, timeout=10)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


def poll(check: Callable[[], Any], timeout: float = 2.0, interval: float = 0.01) -> Any:
    """Return the first truthy ``check()`` within ``timeout`` seconds, else fail."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


def config(engine: str, **kw: Any) -> EmulatorConfig:
    gpu = "h100" if engine == "vllm" else "mi300x"
    return EmulatorConfig(
        engine=engine, gpu=gpu, served_models=[MODEL, ALIAS], **{"speed": 50.0} | kw
    )


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, str]]:
    with ServerThread(config("vllm")) as v, ServerThread(config("sglang")) as s:
        yield {"vllm": v.url, "sglang": s.url}


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def url(servers: dict[str, str], engine: str) -> str:
    return servers[engine]


def sse_events(body: str) -> list[Any]:
    """Decoded ``data:`` payloads of an SSE body; [DONE] kept as the string."""
    assert body.endswith("data: [DONE]\n\n")
    frames = [f for f in body.split("\n\n") if f]
    assert all(f.startswith("data: ") for f in frames)
    return [f[6:] if f[6:] == "[DONE]" else orjson.loads(f[6:]) for f in frames]


def post_stream(
    url: str, body: dict[str, Any], path: str = "/v1/chat/completions", **kw: Any
) -> tuple[httpx.Response, list[Any]]:
    resp = httpx.post(url + path, json=body | {"stream": True}, timeout=10, **kw)
    return resp, sse_events(resp.text)


# -- streaming shapes ------------------------------------------------------------------------
@pytest.mark.parametrize("include_usage", [False, True])
def test_chat_stream_framing(url: str, engine: str, include_usage: bool) -> None:
    body = CHAT | {
        "model": ALIAS,
        "max_tokens": 5,
        "stream_options": {"include_usage": include_usage},
    }
    resp, events = post_stream(url, body)
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    ids = {c["id"] for c in chunks}
    assert len(ids) == 1
    pattern = r"chatcmpl-[0-9a-f]{16}" if engine == "vllm" else r"[0-9a-f]{32}"
    assert re.fullmatch(pattern, ids.pop())
    # vLLM reports its first served name, SGLang echoes what the client sent
    assert {c["model"] for c in chunks} == {MODEL if engine == "vllm" else ALIAS}
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    usage = [c for c in chunks if "usage" in c]
    assert len(usage) == int(include_usage)
    if include_usage:
        assert usage[0]["choices"] == [] and usage[0]["usage"]["completion_tokens"] == 5
        assert chunks[-1] is usage[0]
    finishes = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finishes) == 1 and finishes[0]["choices"][0]["finish_reason"] == "length"
    texts = [c["choices"][0]["delta"].get("content") for c in chunks[1:] if c["choices"]]
    if engine == "vllm":  # finish rides on the last token's chunk
        assert finishes[0]["choices"][0]["delta"]["content"] == texts[-1] != ""
        assert len(texts) == 5
    else:  # a separate finish chunk with matched_stop
        assert finishes[0]["choices"][0]["delta"] == {"reasoning_content": None}
        assert "matched_stop" in finishes[0]["choices"][0]
        assert len(texts) == 6 and texts[-1] is None


def test_natural_stop_counts_the_eos_token(url: str, engine: str) -> None:
    _, events = post_stream(url, CHAT | {"stream_options": {"include_usage": True}})
    usage = events[-2]["usage"]
    finish = next(c for c in events[:-1] if c["choices"] and c["choices"][0]["finish_reason"])
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in events[:-2])
    assert finish["choices"][0]["finish_reason"] == "stop"
    assert usage["completion_tokens"] == 16 and len(text.split()) == 15  # EOS has no text
    if engine == "sglang":
        assert finish["choices"][0]["matched_stop"] == 128009


@pytest.mark.parametrize("include_usage", [False, True])
def test_continuous_usage_rules(url: str, engine: str, include_usage: bool) -> None:
    options = {"include_usage": include_usage, "continuous_usage_stats": True}
    _, events = post_stream(url, CHAT | {"max_tokens": 3, "stream_options": options})
    with_usage = [c for c in events[:-1] if "usage" in c]
    # vLLM honours continuous usage only together with include_usage; SGLang always
    expect_all = include_usage or engine == "sglang"
    assert len(with_usage) == (len(events) - 1 if expect_all else 0)


def test_completions_stream_and_non_stream(url: str, engine: str) -> None:
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 4}
    _, events = post_stream(
        url, body | {"stream_options": {"include_usage": True}}, path="/v1/completions"
    )
    chunks = [c for c in events[:-1] if c["choices"]]
    assert {c["object"] for c in events[:-1]} == {"text_completion"}
    assert len(chunks) == 4 and chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert events[-2]["usage"]["completion_tokens"] == 4
    plain = httpx.post(url + "/v1/completions", json=body, timeout=10).json()
    assert plain["object"] == "text_completion"
    assert plain["choices"][0]["text"] == "".join(c["choices"][0]["text"] for c in chunks)
    assert plain["usage"] == plain["usage"] | {
        "prompt_tokens": 5,
        "completion_tokens": 4,
        "total_tokens": 9,
    }
    if engine == "vllm":
        assert re.fullmatch(r"cmpl-[0-9a-f]{16}", plain["id"])


# -- the official SDK ------------------------------------------------------------------------
def test_openai_sync_client(url: str) -> None:
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    chat = client.chat.completions.create(model=MODEL, messages=CHAT["messages"], max_tokens=7)
    assert chat.usage is not None and chat.usage.completion_tokens == 7
    assert chat.choices[0].finish_reason == "length" and chat.choices[0].message.content
    comp = client.completions.create(model=MODEL, prompt="Hello", max_tokens=3)
    assert comp.usage is not None and comp.usage.completion_tokens == 3
    stream = client.chat.completions.create(
        model=MODEL,
        messages=CHAT["messages"],
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens > 4
    assert [m.id for m in client.models.list().data] == [MODEL, ALIAS]


async def test_openai_async_client_with_extra_fields(url: str) -> None:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    stream = await client.chat.completions.create(
        model=MODEL,
        messages=CHAT["messages"],
        max_tokens=6,
        stream=True,
        tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
        response_format={"type": "json_object"},
        extra_body={"top_k": 5, "min_p": 0.1},
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert len(text.split()) == 6
    await client.close()


# -- errors ----------------------------------------------------------------------------------
def test_unknown_model(url: str, engine: str) -> None:
    resp = httpx.post(url + "/v1/chat/completions", json=CHAT | {"model": "gpt-4"}, timeout=10)
    if engine == "vllm":
        assert resp.status_code == 404
        assert resp.json()["error"] | {"message": ""} == {
            "message": "",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    else:  # SGLang accepts any model name and echoes it
        assert resp.status_code == 200 and resp.json()["model"] == "gpt-4"


def test_sdk_sees_vllm_404_as_not_found(servers: dict[str, str]) -> None:
    client = openai.OpenAI(base_url=servers["vllm"] + "/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4", messages=CHAT["messages"])


LONG_PROMPT = "x" * 4 * 9000  # ~9,000 tokens > max_model_len 8192


@pytest.mark.parametrize(
    ("engine_name", "body", "status", "param"),
    [
        (
            "vllm",
            CHAT | {"messages": [{"role": "user", "content": LONG_PROMPT}]},
            400,
            "input_tokens",
        ),
        ("vllm", CHAT | {"max_tokens": 9000}, 400, "max_tokens"),
        ("vllm", CHAT | {"stream": False, "stream_options": {"include_usage": True}}, 400, None),
        ("vllm", CHAT | {"messages": []}, 400, None),
        ("sglang", CHAT | {"messages": [{"role": "user", "content": LONG_PROMPT}]}, 400, None),
        ("sglang", CHAT | {"max_tokens": 8190}, 400, None),
    ],
)
def test_request_errors(
    servers: dict[str, str], engine_name: str, body: dict[str, Any], status: int, param: str | None
) -> None:
    resp = httpx.post(servers[engine_name] + "/v1/chat/completions", json=body, timeout=10)
    assert resp.status_code == status
    err = resp.json()
    if engine_name == "vllm":
        assert set(err) == {"error"} and err["error"]["code"] == status
        assert err["error"]["param"] == param
    else:
        assert err["object"] == "error" and err["code"] == status
        assert err["type"] == "BadRequestError" and set(err) >= {"message", "param"}
    if body.get("stream_options") and not body.get("stream"):
        assert err["error"]["message"] == "Stream options can only be defined when `stream=True`."


def test_vllm_clamps_an_overlong_output(servers: dict[str, str]) -> None:
    body = CHAT | {"messages": [{"role": "user", "content": "x" * 4 * 8000}], "max_tokens": 500}
    resp = httpx.post(servers["vllm"] + "/v1/chat/completions", json=body, timeout=30).json()
    assert resp["usage"]["prompt_tokens"] + resp["usage"]["completion_tokens"] == 8192


def test_malformed_json(url: str, engine: str) -> None:
    resp = httpx.post(url + "/v1/chat/completions", content=b"{not json", timeout=10)
    assert resp.status_code == 400
    err = resp.json()
    assert (err["error"]["code"] if engine == "vllm" else err["code"]) == 400


@pytest.mark.parametrize("stream", [False, True])
def test_queue_full(engine: str, stream: bool) -> None:
    with ServerThread(config(engine, max_queued_requests=0)) as srv:
        resp = httpx.post(
            srv.url + "/v1/chat/completions", json=CHAT | {"stream": stream}, timeout=10
        )
        metrics = httpx.get(srv.url + "/metrics").text
    if engine == "vllm":  # a real 503 before any streaming
        assert resp.status_code == 503 and resp.json()["error"]["code"] == 503
        assert f'vllm:admission_rejections_total{{model_name="{MODEL}"' in metrics
    elif stream:  # HTTP 200, one in-band error frame, then [DONE]
        assert resp.status_code == 200
        assert sse_events(resp.text) == [
            {
                "error": {
                    "object": "error",
                    "message": "The request queue is full.",
                    "type": "SERVICE_UNAVAILABLE",
                    "param": None,
                    "code": 503,
                }
            },
            "[DONE]",
        ]
    else:
        assert resp.status_code == 503
        assert resp.json() | {"message": ""} == {
            "object": "error",
            "message": "",
            "type": "503",
            "param": None,
            "code": 503,
        }


# -- faults ----------------------------------------------------------------------------------
@pytest.fixture
def fresh(engine: str) -> Iterator[str]:
    with ServerThread(config(engine)) as srv:
        yield srv.url


def set_faults(url: str, **faults: Any) -> dict[str, Any]:
    resp = httpx.post(url + "/emulator/faults", json=faults)
    assert resp.status_code == 200
    return dict(resp.json())


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
def state(url: str) -> dict[str, Any]:
    return dict(httpx.get(url + "/emulator/state").json())


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
        poll(lambda: running() == 0, timeout=1.0, interval=0.001)
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
        after = poll(lambda: (s := state(srv.url))["running"] == 0 and s, timeout=1.0)
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
    body = CHAT | {"max_tokens": 2, "tools": [], "top_k": 3, "guided_json": {}}
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
