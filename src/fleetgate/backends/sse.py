"""Server-sent-event framing for engine streams (vLLM and SGLang OpenAI servers).

Both engines write frames as ``data: <json>\\n\\n`` and end with ``data: [DONE]\\n\\n``; vLLM
may interleave ``: keep-alive`` comment frames. The relay must forward frames untouched, so
this module splits a byte stream into whole frames and reads a frame's payload without
building more than it must. Fast paths are byte checks; JSON is decoded only for the rare
frames that carry an error or usage.

May touch: bytes and orjson. Must not touch: HTTP, routing, config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

DONE = b"[DONE]"
DONE_FRAME = b"data: [DONE]\n\n"


class SSEFramer:
    """Incrementally splits a byte stream into complete SSE frames (blank-line terminated)."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        """Return the complete frames now available, each with its terminating blank line."""
        buf = self._buf + chunk if self._buf else chunk
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        frames: list[bytes] = []
        start = 0
        while True:
            end = buf.find(b"\n\n", start)
            if end < 0:
                break
            frames.append(buf[start : end + 2])
            start = end + 2
        self._buf = buf[start:]
        return frames

    def tail(self) -> bytes:
        """Bytes of an unterminated last frame (non-empty only if the stream was cut)."""
        return self._buf


def frame_data(frame: bytes) -> bytes | None:
    """The frame's data payload (``data:`` lines joined by newlines); None if it has none."""
    if frame.startswith(b"data: ") and frame.count(b"\n") == 2:
        return frame[6:-2]  # the common single-line frame
    parts = []
    for line in frame.split(b"\n"):
        if line.startswith(b"data:"):
            value = line[5:]
            parts.append(value[1:] if value.startswith(b" ") else value)
    return b"\n".join(parts) if parts else None


@dataclass(frozen=True, slots=True)
class StreamError:
    """An in-band error frame: ``{"error": {...}}`` (vLLM and SGLang both nest it in streams)."""

    status: int
    message: str
    type: str
    body: dict[str, Any]


def stream_error(data: bytes) -> StreamError | None:
    """Parse ``data`` as an in-band error frame, or return None if it is an ordinary chunk."""
    if not data.startswith(b'{"error"') and b'"error":' not in data[:16]:
        return None
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    err = obj.get("error") if isinstance(obj, dict) else None
    if not isinstance(err, dict):
        return None
    code = err.get("code")
    status = code if isinstance(code, int) and 400 <= code <= 599 else 500
    return StreamError(status, str(err.get("message", "")), str(err.get("type", "")), err)


def chunk_usage(data: bytes) -> dict[str, Any] | None:
    """The ``usage`` object of a chunk when it carries one (usage chunk or continuous usage)."""
    if b'"usage"' not in data or b'"usage":null' in data:
        return None
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    usage = obj.get("usage") if isinstance(obj, dict) else None
    return usage if isinstance(usage, dict) else None


def is_usage_only_chunk(data: bytes) -> bool:
    """True for the separate final usage chunk (``"choices":[]`` plus a non-null usage)."""
    return b'"choices":[]' in data and chunk_usage(data) is not None
