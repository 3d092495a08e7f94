"""The official openai client, sync and async, against a real `fleetgate serve` over real HTTP.

The shared gateway fronts one emulated vLLM (H100) and one emulated SGLang (MI300X) engine;
round-robin alternates between them, so every check runs against both flavours.
"""

from __future__ import annotations

import httpx
import openai
import pytest

from procs import PUBLIC_8B, SERVED_8B, Proc

POOLS = {"h100-vllm", "mi300x-sglang"}
MESSAGES = [{"role": "user", "content": "Say something about GPUs."}]


def _client(gateway: Proc) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)


def _aclient(gateway: Proc) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)


def test_models_lists_public_names(gateway: Proc) -> None:
    models = _client(gateway).models.list()
    assert [m.id for m in models.data] == [PUBLIC_8B]


def test_chat_non_stream_both_engines(gateway: Proc) -> None:
    client = _client(gateway)
    seen = set()
    for _ in range(2):
        raw = client.chat.completions.with_raw_response.create(
            model=PUBLIC_8B, messages=MESSAGES, max_tokens=7)
        resp = raw.parse()
        seen.add(raw.headers["x-fleetgate-pool"])
        assert raw.headers["x-fleetgate-endpoint"].startswith(raw.headers["x-fleetgate-pool"])
        assert raw.headers["x-fleetgate-policy"] == "round_robin"
        assert raw.headers["x-request-id"]
        assert resp.model == PUBLIC_8B
        assert resp.choices[0].message.content
        assert resp.usage is not None
        assert resp.usage.completion_tokens == 7
        assert resp.usage.prompt_tokens > 0
        assert resp.usage.total_tokens == resp.usage.prompt_tokens + 7
    assert seen == POOLS


@pytest.mark.parametrize("include_usage", [True, False])
def test_chat_stream_usage_honoured(gateway: Proc, include_usage: bool) -> None:
    client = _client(gateway)
    seen = set()
    for _ in range(2):
        raw = client.chat.completions.with_raw_response.create(
            model=PUBLIC_8B, messages=MESSAGES, max_tokens=5, stream=True,
            stream_options={"include_usage": True} if include_usage else None)
        seen.add(raw.headers["x-fleetgate-pool"])
        assert raw.headers["content-type"].startswith("text/event-stream")
        chunks = list(raw.parse())
        assert all(c.model == PUBLIC_8B for c in chunks)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text
        usages = [c.usage for c in chunks if c.usage is not None]
        if include_usage:
            assert len(usages) == 1 and chunks[-1].choices == []
            assert usages[0].completion_tokens == 5
            assert usages[0].total_tokens == usages[0].prompt_tokens + 5
        else:
            assert usages == []
    assert seen == POOLS


async def test_completions_async_stream_and_plain(gateway: Proc) -> None:
    client = _aclient(gateway)
    seen = set()
    for _ in range(2):
        raw = await client.completions.with_raw_response.create(
            model=PUBLIC_8B, prompt="The MI300X has", max_tokens=4)
        seen.add(raw.headers["x-fleetgate-pool"])
        resp = raw.parse()
        assert resp.model == PUBLIC_8B and resp.choices[0].text
        assert resp.usage is not None and resp.usage.completion_tokens == 4
    assert seen == POOLS
    for _ in range(2):
        stream = await client.completions.create(
            model=PUBLIC_8B, prompt="The H100 has", max_tokens=4, stream=True,
            stream_options={"include_usage": True})
        chunks = [c async for c in stream]
        assert all(c.model == PUBLIC_8B for c in chunks)
        assert "".join(c.choices[0].text for c in chunks if c.choices)
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
    await client.close()


async def test_async_chat_stream(gateway: Proc) -> None:
    client = _aclient(gateway)
    stream = await client.chat.completions.create(
        model=PUBLIC_8B, messages=MESSAGES, max_tokens=3, stream=True)
    chunks = [c async for c in stream]
    assert chunks and chunks[-1].choices[0].finish_reason == "length"
    await client.close()


def test_extra_fields_pass_through_untouched(gateway: Proc, engines: dict[str, Proc]) -> None:
    client = _client(gateway)
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"q": {"type": "string"}}}}}]
    by_pool = {"h100-vllm": engines["vllm"], "mi300x-sglang": engines["sglang"]}
    for _ in range(2):
        raw = client.chat.completions.with_raw_response.create(
            model=PUBLIC_8B, messages=MESSAGES, max_tokens=2, tools=tools,
            response_format={"type": "json_object"}, extra_body={"top_k": 7, "min_p": 0.05},
            extra_headers={"x-request-id": "test-passthrough-1"})
        engine = by_pool[raw.headers["x-fleetgate-pool"]]
        last = httpx.get(engine.url + "/emulator/requests").json()["requests"][-1]
        body = last["body"]
        assert body["model"] == SERVED_8B
        assert body["tools"] == tools
        assert body["response_format"] == {"type": "json_object"}
        assert body["top_k"] == 7 and body["min_p"] == 0.05
        assert "stream_options" not in body  # never added to a non-streaming request
        assert raw.headers["x-request-id"] == "test-passthrough-1"


BAD_REQUESTS = [
    ("malformed json", b'{"model": "llama-3.1-8b", "messages": [', 400, None),
    ("not an object", b'[1, 2]', 400, None),
    ("empty body", b"", 400, None),
    ("missing messages", b'{"model": "llama-3.1-8b"}', 400, "messages"),
    ("messages wrong type", b'{"model": "llama-3.1-8b", "messages": "hi"}', 400, "messages"),
    ("stream wrong type",
     b'{"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}',
     400, "stream"),
    ("max_tokens wrong type",
     b'{"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "x"}], '
     b'"max_tokens": "10"}', 400, "max_tokens"),
    ("stream_options without stream",
     b'{"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "x"}], '
     b'"stream_options": {"include_usage": true}}', 400, "stream_options"),
    ("missing model", b'{"messages": [{"role": "user", "content": "x"}]}', 400, "model"),
    ("unknown model", b'{"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}',
     404, "model"),
]


@pytest.mark.parametrize(("name", "body", "status", "param"), BAD_REQUESTS,
                         ids=[b[0] for b in BAD_REQUESTS])
def test_bad_input_gets_openai_envelope(gateway: Proc, name: str, body: bytes, status: int,
                                        param: str | None) -> None:
    resp = httpx.post(gateway.url + "/v1/chat/completions", content=body,
                      headers={"content-type": "application/json"})
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"] and "Traceback" not in err["message"]
    if param:
        assert err["param"] == param


def test_oversized_body_is_413_and_gateway_keeps_serving(gateway: Proc) -> None:
    big = b'{"model": "llama-3.1-8b", "messages": [{"role": "user", "content": "' + (
        b"x" * (9 * 1024 * 1024)) + b'"}]}'
    resp = httpx.post(gateway.url + "/v1/chat/completions", content=big,
                      headers={"content-type": "application/json"}, timeout=30)
    assert resp.status_code == 413
    assert resp.json()["error"]["code"] == "request_too_large"
    ok = _client(gateway).chat.completions.create(model=PUBLIC_8B, messages=MESSAGES,
                                                  max_tokens=1)
    assert ok.choices[0].message.content is not None


def test_unknown_route_and_method_are_enveloped(gateway: Proc) -> None:
    resp = httpx.get(gateway.url + "/v1/nothing-here")
    assert resp.status_code == 404 and "error" in resp.json()
    resp = httpx.get(gateway.url + "/v1/chat/completions")
    assert resp.status_code == 405 and "error" in resp.json()


def test_openai_client_sees_typed_errors(gateway: Proc) -> None:
    client = _client(gateway)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=PUBLIC_8B, messages=[])
