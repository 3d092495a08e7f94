"""Server-sent-event framing for engine streams (vLLM and SGLang OpenAI servers).

Both engines write frames as ``data: <json>\\n\\n`` and end with ``data: [DONE]\\n\\n``; vLLM
may interleave ``: keep-alive`` comment frames. The relay must forward frames untouched, so
this module splits a byte stream into whole frames and reads a frame's payload without
building more than it must. Fast paths are byte checks; JSON is decoded only for the rare
frames that carry an error or usage.

A hostile or broken engine (issue 24) is held to the format:

- **Frame size**: a frame still unterminated past ``MAX_FRAME_BYTES`` (8 MiB: a Responses
  ``response.completed`` event repeats the whole answer, so frames can be large, but
  not that large) raises ``FrameTooLarge``, an ``UpstreamError`` of kind ``protocol``: the
  relay treats it as a broken stream. A long partial frame is kept as a list of pieces
  and joined once, when its end arrives (no quadratic re-copying).
- **Not SSE**: ``checked`` keeps a frame's ``data:``, ``event:``, ``id:``, ``retry:`` and
  comment lines and drops any other line (garbage bytes, an HTML page); a ``data`` payload
  that is not JSON by its first and last byte (``{...}`` / ``[...]``, or ``[DONE]``) is
  dropped too (``data: {broken json``). It is a byte check, not a parse: a payload broken
  inside its braces still passes (a full parse per frame would cost the fast path).

May touch: bytes and orjson, the relay's error type. Must not touch: HTTP, routing, config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from fleetgate.backends.relay import UpstreamError

DONE = b"[DONE]"
DONE_FRAME = b"data: [DONE]\n\n"
MAX_FRAME_BYTES = 8 * 1024 * 1024
_LONG = 64 * 1024  # a partial frame this long is kept in pieces, joined once at its end


class FrameTooLarge(UpstreamError):
    def __init__(self, size: int) -> None:
        super().__init__("protocol", f"the engine sent an SSE frame over "
                                     f"{MAX_FRAME_BYTES // (1024 * 1024)} MiB ({size} bytes "
                                     "without its end)")


class SSEFramer:
    """Incrementally splits a byte stream into complete SSE frames (blank-line terminated)."""

    __slots__ = ("_buf", "_parts", "_size")

    def __init__(self) -> None:
        self._buf = b""
        self._parts: list[bytes] = []  # a long partial frame, in pieces
        self._size = 0

    def feed(self, chunk: bytes) -> list[bytes]:
        """Return the complete frames now available, each with its terminating blank line."""
        if self._parts:
            edge = self._parts[-1][-3:] + chunk[:3]
            self._parts.append(chunk)
            self._size += len(chunk)
            if b"\n\n" not in chunk and b"\n\n" not in edge and b"\n\r\n" not in edge \
                    and b"\n\r\n" not in chunk:
                if self._size > MAX_FRAME_BYTES:
                    raise FrameTooLarge(self._size)
                return []
            buf, self._parts, self._size = b"".join(self._parts), [], 0
        else:
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
        rest = buf[start:]
        if len(rest) > _LONG:
            if len(rest) > MAX_FRAME_BYTES:
                raise FrameTooLarge(len(rest))
            self._buf, self._parts, self._size = b"", [rest], len(rest)
        else:
            self._buf = rest
        return frames

    def tail(self) -> bytes:
        """Bytes of an unterminated last frame (non-empty only if the stream was cut)."""
        return b"".join(self._parts) if self._parts else self._buf


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


_FIELDS = (b"data:", b"event:", b"id:", b"retry:", b":")


def _json_like(data: bytes) -> bool:
    return (data[:1] == b"{" and data[-1:] == b"}") or data == DONE or \
        (data[:1] == b"[" and data[-1:] == b"]")


def checked(frame: bytes) -> tuple[bytes, bytes | None] | None:
    """The frame as it may be relayed and its data payload (None: a comment or event-only
    frame), or None when nothing in it is SSE (module doc: lines that are not SSE and data
    that is not JSON are dropped)."""
    if frame.startswith(b"data: ") and frame.count(b"\n") == 2:  # the common frame
        line = frame[6:-2]
        return (frame, line) if _json_like(line) else None
    kept: list[bytes] = []
    parts: list[bytes] = []
    dropped = False
    for line in frame.split(b"\n"):
        if not line:
            continue
        if not line.startswith(_FIELDS):
            dropped = True
            continue
        if line.startswith(b"data:"):
            value = line[5:]
            parts.append(value[1:] if value.startswith(b" ") else value)
        kept.append(line)
    data: bytes | None = b"\n".join(parts) if parts else None
    if data is not None and not _json_like(data):
        kept = [line for line in kept if not line.startswith(b"data:")]
        data, dropped = None, True
    if not kept:
        return None
    return (b"\n".join(kept) + b"\n\n" if dropped else frame), data


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
