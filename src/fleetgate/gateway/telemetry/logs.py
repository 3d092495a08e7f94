"""The request log: one JSON line per finished request, and nothing a client sent or got.

Fields (docs/observability.md): ``ts``, ``event`` ("request"), ``request_id``, ``trace_id``
(the server span's, or the incoming ``traceparent``'s when tracing is off, else null),
``path``, ``model``, ``tenant``, ``policy``, ``pool``, ``endpoint``, ``status``, ``attempts``,
``stream``, ``ttft_ms``, ``e2e_ms``, ``input_tokens``, ``output_tokens``, ``cost_usd``.
Prompts, completions, API keys and upstream error messages (engines may echo input in
them) are never written: the status says what happened, the trace says why.

Where it goes is a process knob, ``FLEETGATE_REQUEST_LOG`` = ``stderr`` (default) |
``stdout`` | ``off``; the lines are also off when ``FLEETGATE_LOG_LEVEL`` is above
``info``. The lines are written straight to the stream as bare JSON (no logging prefix),
so a log shipper can parse them as they are; ``sink`` can be swapped (tests do). Lines go
out together, in one write ``FLUSH_S`` after the first of them (one system call for many
requests at any load; it was one per turn of the event loop, so one per request at low
load), and at once when the app stops (``close``).

May touch: orjson, the given stream. Must not touch: the logging module's global config,
telemetry libraries, anything of the request but the fields above.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from typing import Any, TextIO

import orjson

Sink = Callable[[bytes], None]
FLUSH_S = 0.05  # the longest a line waits for its write


class RequestLog:
    def __init__(self, sink: Sink | None, close: Callable[[], None] = lambda: None) -> None:
        self.sink = sink
        self.close = close  # writes what waits (the app stops)

    @property
    def enabled(self) -> bool:
        return self.sink is not None

    def write(self, record: dict[str, Any]) -> None:
        if self.sink is not None:
            self.sink(orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE))


class StreamSink:
    """Lines to ``stream``, written together (module doc); without an event loop, or once
    closed, at once."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._out = getattr(stream, "buffer", None)  # the bytes under a text stream
        self._pending: list[bytes] = []
        self._closed = False
        self.due: asyncio.TimerHandle | None = None  # the write the waiting lines wait for

    def __call__(self, line: bytes) -> None:
        self._pending.append(line)
        if len(self._pending) > 1:
            return  # a write is already due
        if not self._closed:
            try:
                self.due = asyncio.get_running_loop().call_later(FLUSH_S, self.flush)
                return
            except RuntimeError:  # no event loop here
                pass
        self.flush()

    def flush(self) -> None:
        if self.due is not None:
            self.due.cancel()  # written now: the timer has nothing left to do
            self.due = None
        if not self._pending:
            return
        data = b"".join(self._pending)
        self._pending.clear()
        if self._out is not None:
            self._stream.flush()  # whatever text went before stays in order
            self._out.write(data)
            self._out.flush()
        else:
            self._stream.write(data.decode())
            self._stream.flush()

    def close(self) -> None:
        self._closed = True
        self.flush()


def request_log(where: str, log_level: str) -> RequestLog:
    """The log the settings ask for (``where``: stderr | stdout | off)."""
    level = logging.getLevelName(log_level.upper())
    if where == "off" or (isinstance(level, int) and level > logging.INFO):
        return RequestLog(None)
    sink = StreamSink(sys.stdout if where == "stdout" else sys.stderr)
    return RequestLog(sink, sink.close)
