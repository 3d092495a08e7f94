"""Engine conformance checks: one suite, two targets.

The same assertions run over the recorded fixtures in ``tests/data`` (see its README), over
the emulator's live output, and over a real vLLM/SGLang server (``make test-engines``). Each
check takes what a client receives (SSE frames as split by ``SSEFramer``, an error body, a
``/metrics`` text) and asserts the engine's documented shape (``docs/engines.md``
§1.5-1.6, §2.5-2.6); values that differ between targets (ids, text, timings) are returned or
only type-checked, so the caller can compare them.

May touch: fleetgate.backends.sse, fleetgate.backends.metrics, orjson, the files in
tests/data. Must not touch: the network, the gateway, clocks.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from fleetgate.backends.metrics import EngineLoad, parse_engine_metrics
from fleetgate.backends.sse import DONE, SSEFramer, frame_data

DATA_DIR = Path(__file__).parent / "data"

HEX16 = re.compile(r"[0-9a-f]{16}")
HEX32 = re.compile(r"[0-9a-f]{32}")


def load_fixture(name: str) -> bytes:
    """Raw bytes of ``tests/data/<name>``."""
    return (DATA_DIR / name).read_bytes()


def split_frames(raw: bytes, chunk_sizes: Iterable[int] | None = None) -> list[bytes]:
    """Split a raw SSE body into frames with SSEFramer; asserts nothing is left over."""
    framer = SSEFramer()
    frames: list[bytes] = []
    if chunk_sizes is None:
        frames += framer.feed(raw)
    else:
        pos = 0
        for size in chunk_sizes:
            frames += framer.feed(raw[pos : pos + size])
            pos += size
        frames += framer.feed(raw[pos:])
    assert framer.tail() == b"", f"unterminated frame at end of stream: {framer.tail()!r}"
    return frames


@dataclass(frozen=True)
class StreamSummary:
    """What a client gets from one choice-0 stream, for comparisons across targets."""

    id: str
    model: str
    text: str
    finish_reason: str | None
    usage: dict[str, Any] | None
    comments: int


def data_payloads(frames: list[bytes]) -> tuple[list[bytes], int]:
    """The data payloads up to ``[DONE]`` (excluded) and the number of comment frames.

    Asserts the SSE framing both engines share: every frame is ``data:`` or a ``:`` comment,
    the stream ends with exactly one ``data: [DONE]`` and nothing follows it.
    """
    payloads: list[bytes] = []
    comments = 0
    for i, frame in enumerate(frames):
        data = frame_data(frame)
        if data is None:
            assert frame.lstrip(b"\n").startswith(b":"), f"frame {i} is neither data nor comment"
            comments += 1
            continue
        if data == DONE:
            assert i == len(frames) - 1, "frames after data: [DONE]"
            return payloads, comments
        payloads.append(data)
    raise AssertionError("stream does not end with data: [DONE]")


def _chunks(payloads: list[bytes]) -> list[dict[str, Any]]:
    chunks = [orjson.loads(p) for p in payloads]
    for chunk in chunks:
        assert isinstance(chunk, dict) and "error" not in chunk, f"error frame: {chunk}"
    return chunks


def _common_chunk_checks(chunks: list[dict[str, Any]], obj: str) -> None:
    assert chunks, "no chunks before [DONE]"
    assert len({c["id"] for c in chunks}) == 1, "chunk ids differ within one stream"
    assert len({c["model"] for c in chunks}) == 1, "model differs within one stream"
    assert len({c["created"] for c in chunks}) == 1, "created differs within one stream"
    for chunk in chunks:
        assert chunk["object"] == obj
        assert isinstance(chunk["created"], int)


def _usage_chunk(chunks: list[dict[str, Any]], include_usage: bool) -> dict[str, Any] | None:
    if not include_usage:
        assert all(c["choices"] for c in chunks), "usage chunk without include_usage"
        assert all(c.get("usage") is None for c in chunks)
        return None
    last = chunks[-1]
    assert last["choices"] == [], "the last chunk before [DONE] must be the usage chunk"
    usage = last["usage"]
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert isinstance(usage[key], int) and usage[key] >= 0, key
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    return dict(usage)


def assert_vllm_chat_stream_shape(frames: list[bytes], *, include_usage: bool) -> StreamSummary:
    """vLLM 0.33 chat stream (engines.md §1.5): role chunk, token chunks, finish on the last
    token chunk (no separate empty finish chunk), usage chunk only with include_usage,
    ``system_fingerprint`` on the usage chunk or else on the finish chunk."""
    payloads, comments = data_payloads(frames)
    chunks = _chunks(payloads)
    _common_chunk_checks(chunks, "chat.completion.chunk")
    assert chunks[0]["id"].startswith("chatcmpl-"), "vLLM ids are chatcmpl-<request id>"
    first = chunks[0]
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "prompt_token_ids" in first, "vLLM sends prompt_token_ids (null) on the first chunk"
    usage = _usage_chunk(chunks, include_usage)
    body = chunks[1:-1] if include_usage else chunks[1:]
    for chunk in body[:-1]:
        choice = chunk["choices"][0]
        assert choice["finish_reason"] is None and "content" in choice["delta"]
        assert "reasoning_content" not in choice["delta"]
    finish = body[-1]["choices"][0]
    assert finish["finish_reason"] in ("stop", "length", "tool_calls", "abort")
    assert "stop_reason" in finish and "matched_stop" not in finish
    fingerprint_holder = chunks[-1] if include_usage else body[-1]
    assert str(fingerprint_holder.get("system_fingerprint", "")).startswith("vllm-")
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in body)
    return StreamSummary(
        first["id"], first["model"], text, finish["finish_reason"], usage, comments
    )


def assert_sglang_chat_stream_shape(frames: list[bytes], *, include_usage: bool) -> StreamSummary:
    """SGLang 0.5.23 chat stream (engines.md §2.5): ``reasoning_content`` always in delta,
    ``matched_stop`` on every choice, a separate finish chunk with an empty delta, optional
    ``sglext`` chunk, usage chunk (nulls kept) only with include_usage."""
    payloads, comments = data_payloads(frames)
    chunks = [c for c in _chunks(payloads) if "sglext" not in c]
    _common_chunk_checks(chunks, "chat.completion.chunk")
    first = chunks[0]["choices"][0]
    assert first["delta"] == {"reasoning_content": None, "role": "assistant", "content": ""}
    usage = _usage_chunk(chunks, include_usage)
    if usage is not None:
        assert "reasoning_tokens" in usage and "prompt_tokens_details" in usage
    body = chunks[1:-1] if include_usage else chunks[1:]
    for chunk in body:
        choice = chunk["choices"][0]
        assert set(choice) == {"index", "delta", "logprobs", "finish_reason", "matched_stop"}
        assert "reasoning_content" in choice["delta"]
        assert "usage" not in chunk and "system_fingerprint" not in chunk
    finish = body[-1]["choices"][0]
    assert finish["delta"] == {"reasoning_content": None}, "finish chunk carries no text"
    assert finish["finish_reason"] in ("stop", "length", "tool_calls", "abort")
    assert all(c["choices"][0]["finish_reason"] is None for c in body[:-1])
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in body)
    return StreamSummary(
        chunks[0]["id"], chunks[0]["model"], text, finish["finish_reason"], usage, comments
    )


def assert_vllm_completion_stream_shape(
    frames: list[bytes], *, include_usage: bool
) -> StreamSummary:
    """vLLM /v1/completions stream: ``object`` "text_completion", every choice field present."""
    payloads, comments = data_payloads(frames)
    chunks = _chunks(payloads)
    _common_chunk_checks(chunks, "text_completion")
    assert chunks[0]["id"].startswith("cmpl-"), "vLLM completion ids are cmpl-<request id>"
    usage = _usage_chunk(chunks, include_usage)
    body = chunks[:-1] if include_usage else chunks
    fields = {"index", "text", "logprobs", "finish_reason", "stop_reason", "prompt_token_ids"}
    for chunk in body:
        assert fields <= set(chunk["choices"][0])
    finish = body[-1]["choices"][0]["finish_reason"]
    assert finish in ("stop", "length", "abort")
    text = "".join(c["choices"][0]["text"] for c in body)
    return StreamSummary(chunks[0]["id"], chunks[0]["model"], text, finish, usage, comments)


def assert_stream_error_frame(frames: list[bytes], *, code: int, flavour: str) -> dict[str, Any]:
    """One in-band error frame ``{"error": {...}}`` with ``code`` (the HTTP status was 200),
    followed by nothing but an optional usage chunk (SGLang with include_usage) and
    ``data: [DONE]``. Returns the error object.

    ``flavour`` "vllm": keys message/type/param/code; "sglang" adds ``"object": "error"``.
    """
    payloads, _ = data_payloads(frames)
    objs = [orjson.loads(p) for p in payloads]
    where = [i for i, obj in enumerate(objs) if obj.get("error") is not None]
    assert len(where) == 1, f"expected one error frame, got {len(where)}"
    err = objs[where[0]]["error"]
    keys = {"message", "type", "param", "code"} | ({"object"} if flavour == "sglang" else set())
    assert set(err) == keys, f"error keys {sorted(err)}"
    assert err["code"] == code and isinstance(err["message"], str) and err["message"]
    for obj in objs[where[0] + 1 :]:
        assert obj.get("choices") == [] and "usage" in obj, f"content after the error: {obj}"
    return dict(err)


def assert_vllm_error_body(body: bytes, *, status: int) -> dict[str, Any]:
    """vLLM's nested OpenAI envelope (engines.md §1.6); 401 is the bare string form."""
    obj = orjson.loads(body)
    if status == 401:
        assert obj == {"error": "Unauthorized"}
        return {"message": "Unauthorized"}
    assert set(obj) == {"error"} and set(obj["error"]) == {"message", "type", "param", "code"}
    assert obj["error"]["code"] == status and obj["error"]["message"]
    return dict(obj["error"])


def assert_sglang_error_body(body: bytes, *, status: int) -> dict[str, Any]:
    """SGLang's flat error object (engines.md §2.6)."""
    obj = orjson.loads(body)
    assert set(obj) == {"object", "message", "type", "param", "code"}
    assert obj["object"] == "error" and obj["code"] == status and obj["message"]
    return dict(obj)


def assert_metrics_parse(text: str, engine: str, *, expect_stats: bool = True) -> EngineLoad:
    """Parse ``/metrics`` text of ``engine`` and check the load signals a router needs.

    ``expect_stats=False`` is for servers without load metrics (vLLM ``--disable-log-stats``):
    every signal must then be None, not 0.
    """
    load = parse_engine_metrics(text, engine)
    if not expect_stats:
        assert not load.has_signals, f"signals from a server without stats: {load}"
        return load
    required = ["waiting", "running", "kv_usage"]
    if engine == "sglang":
        required.append("gen_throughput")
    for name in required:
        value = getattr(load, name)
        assert value is not None and value >= 0, f"{engine}: {name} is {value}"
    assert load.kv_usage is not None and 0.0 <= load.kv_usage <= 1.0
    return load
