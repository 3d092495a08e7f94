"""The official SDKs against the emulators: Responses (stream and not, with usage), embeddings
(float and base64, dimensions, determinism), chat tools for every ``tool_choice`` (arguments
that validate against the tool's schema), ``response_format`` JSON, and the engine loop's
books (every new API is counted like chat). The Anthropic SDK test runs when ``anthropic`` is
installed."""

from __future__ import annotations

import json
import math
from typing import Any

import httpx
import openai
import pytest
from wire_helpers import ALIAS, check_schema

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "unit", "days"]}
ORDER = {"type": "object", "properties": {
    "sku": {"type": "string", "minLength": 3},
    "lines": {"type": "array", "minItems": 2, "items": {
        "type": "object", "properties": {"qty": {"type": "integer", "minimum": 1},
                                         "gift": {"type": "boolean"}},
        "required": ["qty", "gift"]}},
    "address": {"type": "object", "properties": {"zip": {"type": "string"}},
                "required": ["zip"]}},
    "required": ["sku", "lines", "address"]}
TOOLS: Any = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "place_order", "parameters": ORDER}},
]
ASK: Any = [{"role": "user", "content": "Weather in Paris for three days?"}]


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)


def state(url: str) -> dict[str, Any]:
    return dict(httpx.get(url + "/emulator/state").json())


# -- Responses -------------------------------------------------------------------------------
def test_responses_create(url: str) -> None:
    resp = client(url).responses.create(model=ALIAS, input="Say something.",
                                        instructions="Be brief.")
    assert resp.status == "completed" and resp.object == "response"
    assert resp.output_text.startswith("The quick brown fox")
    assert resp.usage is not None
    assert resp.usage.output_tokens == 16  # natural length, EOS included
    assert resp.usage.total_tokens == resp.usage.input_tokens + 16


def test_responses_stream(url: str) -> None:
    events: list[Any] = list(client(url).responses.create(model=ALIAS, input="Hi",
                                                          stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert final.output_text == text and final.usage is not None
    assert final.usage.output_tokens == 16
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_responses_json_schema(url: str) -> None:
    fmt: Any = {"format": {"type": "json_schema", "name": "weather", "schema": WEATHER}}
    resp = client(url).responses.create(model=ALIAS, input="Weather?", text=fmt)
    check_schema(json.loads(resp.output_text), WEATHER)


# -- embeddings ------------------------------------------------------------------------------
def test_embeddings(url: str) -> None:
    api = client(url)
    floats = api.embeddings.create(model=ALIAS, input=["hello", "world"],
                                   encoding_format="float")
    b64 = api.embeddings.create(model=ALIAS, input=["hello", "world"])  # SDK asks for base64
    assert len(floats.data) == 2 and floats.usage.prompt_tokens > 0
    for a, b in zip(floats.data, b64.data, strict=True):
        assert len(a.embedding) == 4096
        assert math.isclose(math.fsum(x * x for x in a.embedding), 1.0, rel_tol=1e-4)
        assert all(math.isclose(x, y, abs_tol=1e-7) for x, y in zip(a.embedding, b.embedding,
                                                                     strict=True))
    assert floats.data[0].embedding != floats.data[1].embedding
    again = api.embeddings.create(model=ALIAS, input="hello", encoding_format="float")
    assert again.data[0].embedding == floats.data[0].embedding  # deterministic
    small = api.embeddings.create(model=ALIAS, input="hello", dimensions=8,
                                  encoding_format="float")
    assert len(small.data[0].embedding) == 8


# -- chat tools and response_format ------------------------------------------------------------
def _call(choice: Any) -> tuple[str, dict[str, Any]]:
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1 and calls[0].type == "function"
    return calls[0].function.name, json.loads(calls[0].function.arguments)


@pytest.mark.parametrize("tool_choice", ["auto", "required", "named", "absent"])
def test_chat_tool_call(url: str, engine: str, tool_choice: str) -> None:
    kw: dict[str, Any] = {}
    if tool_choice == "named":
        kw["tool_choice"] = {"type": "function", "function": {"name": "place_order"}}
    elif tool_choice != "absent":
        kw["tool_choice"] = tool_choice
    resp = client(url).chat.completions.create(model=ALIAS, messages=ASK, tools=TOOLS, **kw)
    choice = resp.choices[0]
    name, args = _call(choice)
    want = "place_order" if tool_choice == "named" else "get_weather"
    assert name == want
    check_schema(args, ORDER if want == "place_order" else WEATHER)
    named_vllm = tool_choice == "named" and engine == "vllm"
    assert choice.finish_reason == ("stop" if named_vllm else "tool_calls")


def test_chat_tool_choice_none_and_after_a_tool_result(url: str) -> None:
    api = client(url)
    plain = api.chat.completions.create(model=ALIAS, messages=ASK, tools=TOOLS,
                                        tool_choice="none")
    assert plain.choices[0].message.tool_calls is None
    assert plain.choices[0].finish_reason == "stop"
    first = api.chat.completions.create(model=ALIAS, messages=ASK, tools=TOOLS)
    call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
    loop: Any = [*ASK, {"role": "assistant", "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "18C, sunny"}]
    answer = api.chat.completions.create(model=ALIAS, messages=loop, tools=TOOLS)
    assert answer.choices[0].message.tool_calls is None
    assert answer.choices[0].message.content


def test_chat_tool_call_stream(url: str) -> None:
    stream = client(url).chat.completions.create(
        model=ALIAS, messages=ASK, tools=TOOLS, tool_choice="required", stream=True,
        stream_options={"include_usage": True})
    ids, names, args, finish, usage = set(), [], "", None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for tc in choice.delta.tool_calls or []:
                assert tc.index == 0
                if tc.id:
                    ids.add(tc.id)
                if tc.function and tc.function.name:
                    names.append(tc.function.name)
                args += (tc.function.arguments or "") if tc.function else ""
    assert len(ids) == 1 and names == ["get_weather"] and finish == "tool_calls"
    check_schema(json.loads(args), WEATHER)
    assert usage is not None and usage.completion_tokens == math.ceil(
        len('{"name": "get_weather", "parameters": ' + args + "}") / 4) + 1


def test_tool_call_is_deterministic(url: str) -> None:
    api = client(url)
    first = _call(api.chat.completions.create(model=ALIAS, messages=ASK, tools=TOOLS).choices[0])
    second = _call(api.chat.completions.create(model=ALIAS, messages=ASK, tools=TOOLS).choices[0])
    assert first == second


def test_response_format(url: str) -> None:
    api = client(url)
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "order", "schema": ORDER,
                                                       "strict": True}}
    resp = api.chat.completions.create(model=ALIAS, messages=ASK, response_format=fmt)
    check_schema(json.loads(resp.choices[0].message.content or ""), ORDER)
    obj = api.chat.completions.create(model=ALIAS, messages=ASK,
                                      response_format={"type": "json_object"})
    assert isinstance(json.loads(obj.choices[0].message.content or ""), dict)
    stream = api.chat.completions.create(model=ALIAS, messages=ASK, response_format=fmt,
                                         stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    check_schema(json.loads(text), ORDER)


# -- the engine loop's books ---------------------------------------------------------------
def test_new_apis_run_through_the_engine_loop(url: str) -> None:
    before = state(url)
    api = client(url)
    api.responses.create(model=ALIAS, input="Hi")
    api.embeddings.create(model=ALIAS, input=["a", "b"])
    httpx.post(url + "/v1/messages", json={"model": ALIAS, "max_tokens": 32,
                                           "messages": [{"role": "user", "content": "Hi"}]})
    after = state(url)
    assert after["finished"] - before["finished"] == 4  # 1 + 2 inputs + 1
    assert after["prompt_tokens_total"] > before["prompt_tokens_total"]
    assert after["generation_tokens_total"] - before["generation_tokens_total"] >= 32
    metrics = httpx.get(url + "/metrics").text
    assert "prompt_tokens" in metrics


# -- Anthropic SDK (only when the package is installed) -----------------------------------------
def test_anthropic_sdk(url: str) -> None:
    anthropic = pytest.importorskip("anthropic")
    api = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0)
    msg = api.messages.create(model=ALIAS, max_tokens=64,
                              messages=[{"role": "user", "content": "Hi"}])
    assert msg.stop_reason == "end_turn" and msg.usage.output_tokens == 16
    with api.messages.stream(model=ALIAS, max_tokens=64,
                             messages=[{"role": "user", "content": "Hi"}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == msg.content[0].text and final.usage.output_tokens == 16
    tools = [{"name": "get_weather", "input_schema": WEATHER}]
    used = api.messages.create(model=ALIAS, max_tokens=256, tools=tools,
                               messages=[{"role": "user", "content": "Weather?"}])
    assert used.stop_reason == "tool_use"
    check_schema(used.content[0].input, WEATHER)
