"""Raw HTTP against the emulators, compared with the fixtures generated from the engines' own
classes (tests/data/README.md): event names and order, framing (``event:`` lines, ``[DONE]``
or not), every body's keys in order, ids, and the error shapes."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest
from wire_helpers import (
    ALIAS,
    MODEL,
    EmulatorThread,
    emulator_config,
    fixture_json,
    fixture_text,
    same_keys,
    sse_frames,
)

from procs import wait_for

TOOLS: Any = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
        "required": ["city", "unit"]}}}]
ASK: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
RESPONSES_EVENTS = ["response.created", "response.in_progress", "response.output_item.added",
                    "response.content_part.added"]
RESPONSES_TAIL = ["response.output_text.done", "response.content_part.done",
                  "response.output_item.done"]


def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=30)


def by_type(frames: list[tuple[str | None, Any]]) -> dict[str, Any]:
    return {event: data for event, data in frames if event is not None}


# -- /v1/responses ---------------------------------------------------------------------------
def test_responses_stream_matches_fixture(url: str, engine: str) -> None:
    resp = post(url, "/v1/responses", {"model": ALIAS, "input": "Hello", "stream": True})
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "text/event-stream; charset=utf-8"
    frames = sse_frames(resp.text)
    assert "[DONE]" not in [data for _, data in frames]  # no terminator on this API
    names = [event for event, _ in frames]
    assert all(event == data["type"] for event, data in frames)
    deltas = names[4:-4]
    assert names[:4] == RESPONSES_EVENTS and set(deltas) == {"response.output_text.delta"}
    assert names[-4:] == [*RESPONSES_TAIL, "response.completed"]
    assert [data["sequence_number"] for _, data in frames] == list(range(len(frames)))
    ref = by_type(sse_frames(fixture_text(f"{engine}_responses_stream.txt")))
    for event, data in frames:
        same_keys(data, ref[str(event)], str(event))
    final = frames[-1][1]["response"]
    assert final["usage"]["output_tokens"] == 16 and final["status"] == "completed"
    assert final["output"][0]["content"][0]["text"] == "".join(d["delta"] for _, d in
                                                               frames[4:-4])
    rid = final["id"]
    assert re.fullmatch(r"resp_[0-9a-f]{16}" if engine == "vllm" else r"resp_[0-9a-f]{32}", rid)
    assert final["model"] == (MODEL if engine == "vllm" else ALIAS)


def test_responses_body_matches_fixture(url: str, engine: str) -> None:
    resp = post(url, "/v1/responses", {"model": ALIAS, "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Hello"}]}]})
    assert resp.status_code == 200
    body = resp.json()
    same_keys(body, fixture_json(f"{engine}_responses.json"))
    usage = body["usage"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert body["status"] == "completed" and body["object"] == "response"


def test_responses_cut_short_is_incomplete(url: str, engine: str) -> None:
    body = {"model": ALIAS, "input": "Hello", "max_output_tokens": 3}
    full = post(url, "/v1/responses", body).json()
    assert full["status"] == "incomplete"
    assert full["incomplete_details"] == {"reason": "max_output_tokens"}
    assert full["usage"]["output_tokens"] == 3
    frames = sse_frames(post(url, "/v1/responses", body | {"stream": True}).text)
    assert frames[-1][0] == "response.incomplete"
    item = by_type(frames)["response.output_item.done"]["item"]
    assert item["status"] == ("incomplete" if engine == "vllm" else "completed")


def test_responses_errors(url: str, engine: str) -> None:
    resp = post(url, "/v1/responses", {"model": "gpt-x", "input": "Hello"})
    assert resp.status_code == 404
    err = resp.json()["error"]  # nested on both engines
    assert err["code"] == 404 and err["param"] == "model"
    resp = post(url, "/v1/responses", {"model": ALIAS})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == 400


# -- /v1/messages ----------------------------------------------------------------------------
def test_messages_stream_matches_fixture(url: str, engine: str) -> None:
    resp = post(url, "/v1/messages", {"model": ALIAS, "messages": ASK, "max_tokens": 64,
                                      "stream": True})
    assert resp.status_code == 200
    frames = sse_frames(resp.text)
    names = [event for event, _ in frames]
    assert names[:2] == ["message_start", "content_block_start"]
    assert set(names[2:-3]) == {"content_block_delta"}
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert "ping" not in names and "[DONE]" not in [d for _, d in frames]
    ref = by_type(sse_frames(fixture_text(f"{engine}_messages_stream.txt")))
    for event, data in frames:
        same_keys(data, ref[str(event)], str(event))
    start, delta = frames[0][1]["message"], frames[-2][1]
    assert start["usage"]["output_tokens"] == 0 and start["usage"]["input_tokens"] > 0
    assert delta["delta"]["stop_reason"] == "end_turn"
    assert delta["usage"]["output_tokens"] == 16


def test_messages_body_matches_fixture(url: str, engine: str) -> None:
    resp = post(url, "/v1/messages", {"model": ALIAS, "messages": ASK, "max_tokens": 64,
                                      "system": "Be brief."})
    body = resp.json()
    same_keys(body, fixture_json(f"{engine}_messages.json"))
    assert body["id"].startswith("chatcmpl-" if engine == "vllm" else "msg_")
    cut = post(url, "/v1/messages", {"model": ALIAS, "messages": ASK, "max_tokens": 2}).json()
    assert cut["stop_reason"] == "max_tokens" and cut["usage"]["output_tokens"] == 2


def test_messages_tool_use_stream(url: str, engine: str) -> None:
    tools = [{"name": "get_weather", "input_schema": TOOLS[0]["function"]["parameters"]}]
    body = {"model": ALIAS, "messages": ASK, "max_tokens": 200, "tools": tools, "stream": True}
    frames = sse_frames(post(url, "/v1/messages", body).text)
    names = [event for event, _ in frames]
    assert names[:2] == ["message_start", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    block = frames[1][1]["content_block"]
    assert block["type"] == "tool_use" and block["name"] == "get_weather" and block["input"] == {}
    parts = [d["delta"]["partial_json"] for e, d in frames if e == "content_block_delta"]
    args = json.loads("".join(parts))
    assert set(args) == {"city", "unit"} and args["unit"] in ("c", "f")
    assert frames[-2][1]["delta"]["stop_reason"] == "tool_use"
    if engine == "vllm":
        ref = by_type(sse_frames(fixture_text("vllm_messages_tools_stream.txt")))
        for event, data in frames:
            same_keys(data, ref[str(event)], str(event))


def test_messages_errors(url: str, engine: str) -> None:
    missing = post(url, "/v1/messages", {"model": ALIAS, "messages": ASK})
    assert missing.status_code == 400
    if engine == "vllm":  # pydantic validation: the global handler's OpenAI shape
        assert missing.json()["error"]["type"] == "Bad Request"
        unknown = post(url, "/v1/messages", {"model": "claude-3-5-sonnet", "messages": ASK,
                                             "max_tokens": 8})
        assert unknown.status_code == 404
        same_keys(unknown.json(), fixture_json("vllm_messages_error_404.json"))
        assert unknown.json()["error"]["type"] == "not_found_error"
    else:
        assert missing.json() == {"type": "error", "error": {
            "type": "invalid_request_error", "message": "max_tokens: Field required"}}


# -- chat tools ------------------------------------------------------------------------------
def test_chat_tool_call_body_matches_fixture(url: str, engine: str) -> None:
    resp = post(url, "/v1/chat/completions", {"model": ALIAS, "messages": ASK, "tools": TOOLS})
    body = resp.json()
    same_keys(body, fixture_json(f"{engine}_chat_tools.json"))
    choice = body["choices"][0]
    call = choice["message"]["tool_calls"][0]
    pattern = r"chatcmpl-tool-[0-9a-f]{16}" if engine == "vllm" else r"call_[0-9a-f]{24}"
    assert re.fullmatch(pattern, call["id"])
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == (None if engine == "vllm" else "")
    assert json.loads(call["function"]["arguments"])["unit"] in ("c", "f")


def test_chat_tool_call_stream_matches_fixture(url: str, engine: str) -> None:
    body = {"model": ALIAS, "messages": ASK, "tools": TOOLS, "stream": True,
            "stream_options": {"include_usage": True}}
    frames = [data for _, data in sse_frames(post(url, "/v1/chat/completions", body).text)]
    ref = [data for _, data in sse_frames(fixture_text(f"{engine}_chat_tools_stream.txt"))]
    assert frames[-1] == "[DONE]" and ref[-1] == "[DONE]"
    ours, theirs = frames[:-1], ref[:-1]
    same_keys(ours[0], theirs[0], "role chunk")
    same_keys(ours[1], theirs[1], "name chunk")
    same_keys(ours[2], theirs[2], "arguments chunk")
    same_keys(ours[-2], theirs[-2], "finish chunk")
    same_keys(ours[-1], theirs[-1], "usage chunk")
    calls = [c["choices"][0]["delta"]["tool_calls"][0] for c in ours[1:-1]
             if c["choices"][0]["delta"].get("tool_calls")]
    assert calls[0]["function"]["name"] == "get_weather" and calls[0]["id"]
    args = "".join(c["function"]["arguments"] or "" for c in calls[1:])
    assert set(json.loads(args)) == {"city", "unit"}
    assert ours[-2]["choices"][0]["finish_reason"] == "tool_calls"


def test_chat_tool_validation_errors(url: str, engine: str) -> None:
    named = {"type": "function", "function": {"name": "nope"}}
    resp = post(url, "/v1/chat/completions", {"model": ALIAS, "messages": ASK, "tools": TOOLS,
                                              "tool_choice": named})
    assert resp.status_code == 400
    if engine == "vllm":
        assert resp.json()["error"]["param"] == "tool_choice"
    else:
        assert resp.json()["message"] == "Tool 'nope' not found in tools list."
    resp = post(url, "/v1/chat/completions", {"model": ALIAS, "messages": ASK,
                                              "tool_choice": "required"})
    assert resp.status_code == 400


# -- /v1/embeddings --------------------------------------------------------------------------
def test_embeddings_body_matches_fixture(url: str, engine: str) -> None:
    resp = post(url, "/v1/embeddings", {"model": ALIAS, "input": ["hello", "world"]})
    body = resp.json()
    same_keys(body, fixture_json(f"{engine}_embeddings.json"))
    assert [d["index"] for d in body["data"]] == [0, 1]
    assert len(body["data"][0]["embedding"]) == 4096  # the 8B profile's d_model
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0


@pytest.mark.parametrize("flavour", ["vllm", "sglang"])
def test_embeddings_on_a_generative_model(flavour: str) -> None:
    with EmulatorThread(emulator_config(flavour, embeddings=False)) as server:
        resp = post(server.url, "/v1/embeddings", {"model": ALIAS, "input": "hello"})
    if flavour == "vllm":  # no pooling task: the route is not registered
        assert (resp.status_code, resp.json()) == (404, {"detail": "Not Found"})
    else:
        assert resp.status_code == 400
        assert resp.json() == fixture_json("sglang_embeddings_error_400.json")


# -- the engine loop -----------------------------------------------------------------------
@pytest.mark.parametrize(("path", "body"), [
    ("/v1/responses", {"model": ALIAS, "input": "Hello", "max_output_tokens": 4000}),
    ("/v1/messages", {"model": ALIAS, "max_tokens": 4000, "messages": ASK}),
])
def test_a_client_that_leaves_aborts_its_request(path: str, body: dict[str, Any]) -> None:
    with EmulatorThread(emulator_config("vllm", speed=1.0)) as server:
        if path == "/v1/messages":  # a cap on this API: write to it with a long plan instead
            body = body | {"output_config": {"format": {"type": "json_schema", "schema": {
                "type": "object", "properties": {"s": {"type": "string", "minLength": 8000}},
                "required": ["s"]}}}}
        with httpx.stream("POST", server.url + path, json=body | {"stream": True},
                          timeout=30) as resp:
            first = next(resp.iter_lines())
            assert first.startswith("event: ")
        state_url = server.url + "/emulator/state"
        wait_for(lambda: httpx.get(state_url).json()["in_flight"] == 0, timeout=5,
                 what="the request to leave the engine")
        assert httpx.get(state_url).json()["aborted"] == 1
