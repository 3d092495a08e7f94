"""Mid-stream resume in-process: a stream cut after its first byte continues elsewhere.

The H200 endpoint (tried first) sends part of an answer and breaks; the H100 endpoint gets
the continuation request (``FakeBackend`` records it) and its scripted chunks are stitched
into the client's stream: the original ids, no second role delta, one usage chunk with the
true totals, ``[DONE]`` and no error event (gateway/proxy/stream.py).
"""

from __future__ import annotations

from typing import Any

import orjson
from test_proxy import FAST, MODEL, SERVED, SLOW, body_of, request, service

from fleetgate.backends.fake import Answer, FakeBackend

MESSAGES = [{"role": "user", "content": "hello"}]
ORIGINAL = {"id": "chatcmpl-first", "object": "chat.completion.chunk", "created": 111,
            "model": SERVED}
OTHER = {"id": "chatcmpl-second", "object": "chat.completion.chunk", "created": 222,
         "model": SERVED}
WORDS = [f" w{i}" for i in range(8)]


def frame(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def chat_chunk(ids: dict[str, Any], delta: dict[str, Any], finish: str | None = None,
               usage: dict[str, int] | None = None) -> bytes:
    obj = {**ids, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                               "finish_reason": finish}]}
    if usage is not None:
        obj["usage"] = usage
    return frame(obj)


def usage_chunk(ids: dict[str, Any], prompt: int, completion: int) -> bytes:
    return frame({**ids, "choices": [], "usage": {
        "prompt_tokens": prompt, "completion_tokens": completion,
        "total_tokens": prompt + completion}})


DONE = b"data: [DONE]\n\n"
ROLE = {"role": "assistant", "content": ""}


def data_frames(out: bytes) -> list[Any]:
    frames = [f for f in out.split(b"\n\n") if f]
    assert all(f.startswith(b"data: ") for f in frames), frames
    return [f[6:] if f == b"data: [DONE]" else orjson.loads(f[6:]) for f in frames]


def check_stitched(out: bytes, text: str, prompt: int | None, completion: int,
                   obj: str = "chat.completion.chunk") -> None:
    """One continuous stream: the original ids everywhere, one role, the text, one usage
    chunk (``prompt`` None: none expected), then [DONE]; no error event."""
    frames = data_frames(out)
    assert frames[-1] == b"[DONE]" and b"[DONE]" not in frames[:-1]
    chunks = frames[:-1]
    assert all("error" not in c for c in chunks)
    assert {(c["id"], c["created"], c["model"]) for c in chunks} == {
        ("chatcmpl-first" if obj.startswith("chat") else "cmpl-first", 111, MODEL)}
    usages = [c for c in chunks if not c["choices"]]
    if prompt is None:
        assert not usages
    else:
        assert [u["usage"] for u in usages] == [{"prompt_tokens": prompt,
                                                 "completion_tokens": completion,
                                                 "total_tokens": prompt + completion}]
        assert chunks[-1] is usages[0]
    if obj.startswith("chat"):
        deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
        assert sum("role" in d for d in deltas) == 1
        assert "".join(d.get("content") or "" for d in deltas) == text
    else:
        assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == text
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == "length" and not any(finishes[:-1])


async def test_a_chat_stream_cut_mid_way_continues_on_the_next_endpoint() -> None:
    first = [chat_chunk(ORIGINAL, ROLE)] + [chat_chunk(ORIGINAL, {"content": w})
                                            for w in WORDS[:3]]
    rest = [chat_chunk(OTHER, ROLE)] + [
        chat_chunk(OTHER, {"content": w}, "length" if w == WORDS[-1] else None)
        for w in WORDS[3:]] + [usage_chunk(OTHER, 12 + 3, 5), DONE]
    backend = FakeBackend({FAST: [Answer(200, chunks=tuple(first), cut="protocol")],
                           SLOW: [Answer(200, chunks=tuple(rest))]})
    proxy, fleet = service(backend)
    response = await proxy.handle(request(stream=True, wants_usage=True, messages=MESSAGES,
                                          max_tokens=8,
                                          stream_options={"include_usage": True}))
    out = await body_of(response)
    check_stitched(out, "".join(WORDS), 12, 8)
    url, sent, _ = backend.calls[1]
    assert url == SLOW + "/v1/chat/completions"
    assert sent["messages"] == [*MESSAGES, {"role": "assistant", "content": "".join(WORDS[:3])}]
    assert sent["continue_final_message"] is True and sent["add_generation_prompt"] is False
    assert sent["max_tokens"] == 5 and sent["model"] == SERVED and sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True}
    attempts = proxy.decisions.latest(1)[0]["attempts"]
    assert [(a["endpoint"], a["status"], a.get("migrated")) for a in attempts] == [
        ("h200-0", 502, True), ("h100-0", 200, True)]
    assert attempts[1]["after_tokens"] == 3
    assert fleet.live.stats[0].failures == 1  # the broken engine's breaker heard of it
    assert fleet.live.stats[1].output_tokens == 5  # the continuation's own tokens
    assert fleet.live.value(0, "in_flight") == 0 and fleet.live.value(1, "in_flight") == 0


async def test_without_usage_asked_no_usage_chunk_reaches_the_client() -> None:
    first = [chat_chunk(ORIGINAL, ROLE), chat_chunk(ORIGINAL, {"content": WORDS[0]})]
    rest = [chat_chunk(OTHER, {"role": "assistant", "content": WORDS[1]}),
            chat_chunk(OTHER, {"content": WORDS[2]}, "length"), usage_chunk(OTHER, 9, 2), DONE]
    backend = FakeBackend({FAST: [Answer(200, chunks=tuple(first), cut="timeout")],
                           SLOW: [Answer(200, chunks=tuple(rest))]})
    proxy, _ = service(backend)
    out = await body_of(await proxy.handle(request(stream=True, messages=MESSAGES,
                                                   max_completion_tokens=3)))
    check_stitched(out, "".join(WORDS[:3]), None, 3)
    assert backend.calls[1][1]["max_completion_tokens"] == 2


async def test_a_completions_stream_continues_with_the_text_appended_to_the_prompt() -> None:
    ids = {"id": "cmpl-first", "object": "text_completion", "created": 111, "model": SERVED}
    other = {**ids, "id": "cmpl-second", "created": 222}

    def text(ids: dict[str, Any], piece: str, finish: str | None = None) -> bytes:
        return frame({**ids, "choices": [{"index": 0, "text": piece, "logprobs": None,
                                          "finish_reason": finish}]})

    first = [text(ids, w) for w in WORDS[:5]]
    tail = [text(other, w, "length" if i == 15 else None)
            for i, w in enumerate([*WORDS[5:], *WORDS[:8]], start=5)][:11]
    rest = [*tail, usage_chunk(other, 9, 11), DONE]
    backend = FakeBackend({FAST: [Answer(200, chunks=tuple(first), cut="protocol")],
                           SLOW: [Answer(200, chunks=tuple(rest))]})
    proxy, _ = service(backend)
    out = await body_of(await proxy.handle(request(
        "completions", stream=True, wants_usage=True, prompt="Say:",
        stream_options={"include_usage": True})))
    expected = "".join([*WORDS, *WORDS[:8]][:16])
    check_stitched(out, expected, 4, 16, obj="text_completion")
    sent = backend.calls[1][1]
    assert sent["prompt"] == "Say:" + "".join(WORDS[:5])
    assert sent["max_tokens"] == 11  # the completions default (16) less what was sent


async def test_an_answer_cut_after_its_last_token_is_ended_by_the_gateway() -> None:
    """Only the usage chunk and [DONE] were lost: nothing to continue, no second engine."""
    first = [chat_chunk(ORIGINAL, ROLE), chat_chunk(ORIGINAL, {"content": WORDS[0]}),
             chat_chunk(ORIGINAL, {"content": WORDS[1]}, "length")]
    backend = FakeBackend({FAST: [Answer(200, chunks=tuple(first), cut="protocol")]})
    proxy, _ = service(backend)
    out = await body_of(await proxy.handle(request(stream=True, wants_usage=True,
                                                   messages=MESSAGES, max_tokens=2)))
    frames = data_frames(out)
    assert frames[-1] == b"[DONE]" and frames[-2]["usage"]["completion_tokens"] == 2
    assert len(backend.calls) == 1


async def test_an_answer_holding_tool_calls_is_not_resumed() -> None:
    call = {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                            "function": {"name": "f", "arguments": "{"}}]}
    first = [chat_chunk(ORIGINAL, ROLE), chat_chunk(ORIGINAL, call)]
    backend = FakeBackend({FAST: [Answer(200, chunks=tuple(first), cut="protocol")],
                           SLOW: [Answer(200, chunks=(DONE,))]})
    proxy, _ = service(backend)
    out = await body_of(await proxy.handle(request(stream=True, messages=MESSAGES)))
    assert data_frames(out)[-2]["error"]["code"] == 502 and out.endswith(DONE)
    assert len(backend.calls) == 1


async def test_when_no_endpoint_takes_the_continuation_the_stream_ends_with_an_error() -> None:
    first = [chat_chunk(ORIGINAL, ROLE), chat_chunk(ORIGINAL, {"content": WORDS[0]})]
    backend = FakeBackend({FAST: [Answer(200, chunks=tuple(first), cut="protocol")],
                           SLOW: [Answer(503, b'{"error":{"message":"busy","code":503}}')]})
    proxy, fleet = service(backend)
    out = await body_of(await proxy.handle(request(stream=True, messages=MESSAGES,
                                                   max_tokens=4)))
    assert data_frames(out)[-2]["error"]["code"] == 502 and out.endswith(DONE)
    attempts = proxy.decisions.latest(1)[0]["attempts"]
    assert [(a["endpoint"], a["status"]) for a in attempts] == [("h200-0", 502),
                                                                 ("h100-0", 503)]
    assert fleet.live.value(0, "in_flight") == 0 and fleet.live.value(1, "in_flight") == 0


async def test_a_continuation_that_breaks_too_moves_on_again() -> None:
    """Three endpoints' worth: the continuation itself breaks and is continued once more."""
    first = [chat_chunk(ORIGINAL, ROLE), chat_chunk(ORIGINAL, {"content": WORDS[0]})]
    second = [chat_chunk(OTHER, ROLE), chat_chunk(OTHER, {"content": WORDS[1]}),
              chat_chunk(OTHER, {"content": WORDS[2]})]
    third = [chat_chunk(OTHER, ROLE), chat_chunk(OTHER, {"content": WORDS[3]}, "length"),
             usage_chunk(OTHER, 10 + 3, 1), DONE]
    third_url = "http://h100b:8000"
    shared: list[Answer | Any] = [Answer(200, chunks=tuple(second), cut="protocol"),
                                  Answer(200, chunks=tuple(third))]  # whichever is tried first
    backend = FakeBackend({FAST: [Answer(200, chunks=tuple(first), cut="protocol")],
                           SLOW: shared, third_url: shared})
    proxy, _ = _three_endpoint_service(backend, third_url)
    out = await body_of(await proxy.handle(request(stream=True, wants_usage=True,
                                                   messages=MESSAGES, max_tokens=4)))
    check_stitched(out, "".join(WORDS[:4]), 10, 4)
    assert backend.calls[-1][1]["messages"][-1] == {"role": "assistant",
                                                    "content": "".join(WORDS[:3])}
    assert backend.calls[-1][1]["max_tokens"] == 1


def _three_endpoint_service(backend: FakeBackend, third_url: str) -> Any:
    from fleetgate.backends.relay import Timeouts
    from fleetgate.config import FleetConfig
    from fleetgate.gateway.decisions import DecisionLog
    from fleetgate.gateway.proxy.service import Generation, ProxyService
    from fleetgate.routing import build_router
    from fleetgate.state.fleet import Fleet

    rows = (("h200", "h200", 3.6, [FAST]), ("h100", "h100", 2.9, [SLOW, third_url]))
    pools = [{"name": name, "accelerator": gpu, "engine": "vllm", "price_per_gpu_hour": price,
              "endpoints": urls, "models": {MODEL: SERVED}} for name, gpu, price, urls in rows]
    config = FleetConfig.model_validate({"pools": pools, "default_policy": "fast",
                                         "policies": {"fast": {"strategy": "latency"}}})
    fleet = Fleet(config, http=None)  # type: ignore[arg-type]
    for i in range(len(fleet.endpoints)):
        fleet.live.on_probe(i, fleet.clock(), True, "200")
    gen = Generation(fleet, build_router(config), {"fast": 3}, {"fast": None})
    return ProxyService(lambda: gen, backend, Timeouts(), DecisionLog()), fleet
