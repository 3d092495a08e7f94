"""The OpenAI-surface APIs the gateway relays, as data: one row per API.

All five go through the same route -> attempt -> relay path; what differs is data:

| api | path | stream ends with | first output frame | usage in, out |
|---|---|---|---|---|
| chat | /v1/chat/completions | ``[DONE]`` | any data | prompt_tokens, completion_tokens |
| completions | /v1/completions | ``[DONE]`` | any data | prompt_tokens, completion_tokens |
| responses | /v1/responses | ``response.completed`` | a ``.delta`` | input_tokens, output_tokens |
| messages | /v1/messages | ``message_stop`` | ``content_block_delta`` | input, output_tokens |
| embeddings | /v1/embeddings | (no streams) | - | prompt_tokens |

Usage is normalised to ``{"prompt_tokens", "completion_tokens", "total_tokens"}`` for the
ledger, limits and telemetry, whatever the API calls it. A Responses stream carries its
usage inside the final ``response`` object; a Messages stream reports input tokens in
``message_start`` and the running output count in ``message_delta``. Chat and completions
streams get ``stream_options.include_usage`` added upstream (the engines send usage only
when asked); the other streams always carry it.

A chat or completions stream that breaks after its first byte continues on another endpoint
(``resumes``: stream.py, mid-stream resume); where that cannot be done, and for the other APIs,
errors written into a stream that broke after its first byte take the API's own shape: an
OpenAI error object and ``[DONE]`` for chat/completions, an ``error`` event for Responses
(``{"type": "error", "code", "message"}``) and for Messages (``{"type": "error", "error":
{"type", "message"}}``).

May touch: orjson, the SSE helpers. Must not touch: HTTP, routing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from fleetgate.backends.sse import DONE_FRAME


@dataclass(frozen=True, slots=True)
class Api:
    name: str
    path: str
    streams: bool
    end_markers: tuple[bytes, ...]  # a frame holding one of these ends the stream well
    output_marker: bytes | None  # the first frame holding it is the first token (None: any)
    usage_in: str
    usage_out: str | None
    asks_usage: bool  # add stream_options.include_usage upstream
    prompt_param: str = "messages"  # the prompt's field: what a context_length_exceeded names
    output_caps: tuple[str, ...] = ("max_tokens",)  # the fields that cap the output, first wins
    resumes: bool = False  # a stream broken mid-way continues elsewhere (stream.py)

    def usage(self, raw: dict[str, Any] | None) -> dict[str, int] | None:
        """The engine's usage object in chat terms (prompt/completion/total tokens)."""
        if not isinstance(raw, dict):
            return None
        prompt = _int(raw.get(self.usage_in))
        completion = _int(raw.get(self.usage_out)) if self.usage_out else 0
        return {"prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": _int(raw.get("total_tokens")) or prompt + completion}

    def stream_usage(self, data: bytes, seen: dict[str, int] | None) -> dict[str, int] | None:
        """Usage carried by one stream frame's data, merged with what earlier frames said."""
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return seen
        if not isinstance(obj, dict):
            return seen
        found = obj.get("usage")
        if found is None and isinstance(obj.get("response"), dict):  # Responses events
            found = obj["response"].get("usage")
        if found is None and isinstance(obj.get("message"), dict):  # Messages: message_start
            found = obj["message"].get("usage")
        usage = self.usage(found)
        if usage is None:
            return seen
        if seen is not None and self.name == "messages":  # message_delta: output so far
            usage["prompt_tokens"] = usage["prompt_tokens"] or seen["prompt_tokens"]
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return usage

    def error_frame(self, status: int, message: str) -> bytes:
        body: dict[str, Any]
        if self.name == "responses":
            body = {"type": "error", "code": str(status), "message": message, "param": None}
            return b"event: error\ndata: " + orjson.dumps(body) + b"\n\n"
        if self.name == "messages":
            body = {"type": "error", "error": {"type": "api_error", "message": message}}
            return b"event: error\ndata: " + orjson.dumps(body) + b"\n\n"
        body = {"error": {"message": message, "type": "upstream_error", "param": None,
                          "code": status}}
        return b"data: " + orjson.dumps(body) + b"\n\n" + DONE_FRAME


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


_DONE = (b"data: [DONE]",)
APIS: dict[str, Api] = {a.name: a for a in (
    Api("chat", "/v1/chat/completions", True, _DONE, None, "prompt_tokens",
        "completion_tokens", True, output_caps=("max_completion_tokens", "max_tokens"),
        resumes=True),
    Api("completions", "/v1/completions", True, _DONE, None, "prompt_tokens",
        "completion_tokens", True, "prompt", resumes=True),
    Api("responses", "/v1/responses", True,
        (b'"type":"response.completed"', b'"type":"response.incomplete"',
         b'"type":"response.failed"'), b'.delta"', "input_tokens", "output_tokens", False,
        "input", ("max_output_tokens",)),
    Api("messages", "/v1/messages", True, (b'"type":"message_stop"',),
        b'"type":"content_block_delta"', "input_tokens", "output_tokens", False),
    Api("embeddings", "/v1/embeddings", False, (), None, "prompt_tokens", None, False,
        "input", ()),
)}
