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
so a log shipper can parse them as they are; ``sink`` can be swapped (tests do). The lines
of requests that finish in one turn of the event loop go out in one write at its end (one
system call for many requests under load, none of them held longer than that turn).

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


class RequestLog:
    def __init__(self, sink: Sink | None) -> None:
        self.sink = sink

    @property
    def enabled(self) -> bool:
        return self.sink is not None

    def write(self, record: dict[str, Any]) -> None:
        if self.sink is not None:
            self.sink(orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE))


def stream_sink(stream: TextIO) -> Sink:
    pending: list[bytes] = []
    out = getattr(stream, "buffer", None)  # the bytes under a text stream, when it has one

    def flush() -> None:
        data = b"".join(pending)
        pending.clear()
        if out is not None:
            stream.flush()  # whatever text went before stays in order
            out.write(data)
            out.flush()
        else:
            stream.write(data.decode())
            stream.flush()

    def write(line: bytes) -> None:
        pending.append(line)
        if len(pending) == 1:
            try:
                asyncio.get_running_loop().call_soon(flush)
            except RuntimeError:  # no event loop here: at once
                flush()

    return write


def request_log(where: str, log_level: str) -> RequestLog:
    """The log the settings ask for (``where``: stderr | stdout | off)."""
    level = logging.getLevelName(log_level.upper())
    if where == "off" or (isinstance(level, int) and level > logging.INFO):
        return RequestLog(None)
    return RequestLog(stream_sink(sys.stdout if where == "stdout" else sys.stderr))
