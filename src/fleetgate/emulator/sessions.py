"""How one API turns one request's tokens into bytes: the per-request stream session.

``EngineResponse`` (responses.py) drives a ``StreamSession``: ``opening()`` goes out with the
first token (both engines emit their first frames on the first engine output, so the first
byte marks TTFT), ``token(out)`` for every token, ``closing(out)`` after the last one (its
terminator included), and ``body(text, out)`` for a non-streaming request. Sessions may keep
state (sequence numbers, a tool call's progress); one is built per request.

``ChatSession`` serves ``/v1/chat/completions`` and ``/v1/completions`` over a ``WireFormat``
(data-only SSE frames, ``data: [DONE]``); a planned tool call streams through the wire's
tool-call chunks. The Responses and Messages sessions live in api_responses.py and
api_messages.py.

May touch: the wire formats, plan.py's ToolProgress. Must not touch: I/O, the engine.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from fleetgate.emulator.formats import DONE_FRAME, Json, WireFormat, sse
from fleetgate.emulator.parsing import ParsedRequest
from fleetgate.emulator.plan import ToolProgress
from fleetgate.emulator.runtime import Output, RequestHandle


class StreamSession(Protocol):
    def opening(self) -> bytes: ...

    def token(self, out: Output) -> bytes: ...

    def closing(self, out: Output) -> bytes: ...

    def body(self, text: str, out: Output) -> Json: ...


def frames(chunks: Iterable[Json]) -> bytes:
    return b"".join(sse(c) for c in chunks)


class ChatSession:
    """Chat and text completions: ``data: <json>`` frames, then ``data: [DONE]``."""

    def __init__(self, wire: WireFormat, req: ParsedRequest,
                 cache_report: RequestHandle | None = None) -> None:
        self.wire, self.req = wire, req
        self.cache_report = cache_report  # set: usage reports the handle's cached tokens
        call = req.plan.call if req.plan is not None and req.kind == "chat" else None
        self.tools = ToolProgress(call) if call is not None else None
        self.call_id = wire.tool_call_id() if call is not None else ""

    def opening(self) -> bytes:
        return frames(self.wire.stream_start(self.req))

    def token(self, out: Output) -> bytes:
        req = self.req
        if self.tools is not None:
            step = self.tools.step(out.text, last=out.finish_reason is not None)
            return frames(self.wire.tool_stream_token(
                req, step, self.call_id, out.completion_tokens, out.finish_reason))
        return frames(
            self.wire.stream_token(req, out.text, out.completion_tokens, out.finish_reason))

    def closing(self, out: Output) -> bytes:
        chunks = self.wire.stream_end(self.req, out.completion_tokens)
        return frames(self._details(chunks)) + DONE_FRAME

    def body(self, text: str, out: Output) -> Json:
        body = self.wire.response(self.req, text, out.completion_tokens, out.finish_reason or "")
        return self._details([body])[0]

    def _details(self, chunks: list[Json]) -> list[Json]:
        """``usage.prompt_tokens_details.cached_tokens`` when the engine reports it."""
        if self.cache_report is not None:
            for chunk in chunks:
                if isinstance(chunk.get("usage"), dict):
                    chunk["usage"]["prompt_tokens_details"] = {
                        "cached_tokens": self.cache_report.cached}
        return chunks
