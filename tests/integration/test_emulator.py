"""Integration tests of the emulated engines' wire formats over real HTTP.

Real emulator apps under real uvicorn servers on 127.0.0.1 (emulator_harness.py), talked to
with the official ``openai`` SDK (sync and async) and raw httpx: SSE framing and chunk shapes,
usage rules, completions, error shapes and the queue cap, per flavour (vLLM 0.33, SGLang
0.5.23). No timing is asserted.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import openai
import pytest
from emulator_harness import (
    ALIAS,
    CHAT,
    MODEL,
    ServerThread,
    config,
    post_stream,
    sse_events,
)


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
        tool_choice="none",  # tools offered but not to be called: plain text
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
