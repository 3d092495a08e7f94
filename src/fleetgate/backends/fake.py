"""An in-process ``Backend`` that answers from a script: for unit tests of the proxy path.

Each endpoint URL gets a list of scripted answers, used in turn (the last one repeats):

- ``Answer(status, body)``: a whole response;
- ``Answer(200, chunks=[...])``: a stream delivered chunk by chunk, optionally cut
  (``cut="protocol"`` or ``"timeout"``: the read raises ``UpstreamError`` after the chunks);
- ``Answer(200, chunks=[...], hang=True)``: a stream that stops after its chunks and never
  ends (a hung engine: only a deadline of the gateway's ends the wait);
- ``Refuse("connect" | "timeout" | "protocol")``: the POST itself fails.

Every call is recorded in ``calls`` (url, decoded body, headers), so tests check what the
gateway sent upstream. No sockets, no sleeps: failover, in-band error frames and cut
streams are tested in microseconds.

May touch: the relay protocol types. Must not touch: the network.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from fleetgate.backends.relay import Timeouts, UpstreamError, UpstreamResponse


@dataclass(frozen=True, slots=True)
class Answer:
    status: int = 200
    body: bytes = b""
    chunks: tuple[bytes, ...] = ()
    cut: str | None = None  # an UpstreamError kind raised after the chunks
    content_type: str = "application/json"
    hang: bool = False  # after the chunks, wait forever


@dataclass(frozen=True, slots=True)
class Refuse:
    kind: str = "connect"


class _Scripted:
    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.status = answer.status
        self.content_type = answer.content_type
        self.closed = False

    @property
    def received(self) -> int:
        return sum(map(len, self.answer.chunks)) if self.answer.hang else 0

    async def read(self) -> bytes:
        if self.answer.cut:
            raise UpstreamError(self.answer.cut, f"scripted {self.answer.cut}")
        return self.answer.body or b"".join(self.answer.chunks)

    async def chunks(self) -> AsyncIterator[bytes]:
        for chunk in self.answer.chunks:
            yield chunk
        if self.answer.hang:
            await asyncio.Event().wait()
        if self.answer.cut:
            raise UpstreamError(self.answer.cut, f"scripted {self.answer.cut}")

    def close(self) -> None:
        self.closed = True


@dataclass
class FakeBackend:
    script: dict[str, list[Answer | Refuse]] = field(default_factory=dict)  # base URL -> answers
    calls: list[tuple[str, dict[str, Any], dict[str, str]]] = field(default_factory=list)
    responses: list[_Scripted] = field(default_factory=list)

    async def post(self, url: str, body: bytes, headers: Mapping[str, str],
                   timeouts: Timeouts) -> UpstreamResponse:
        self.calls.append((url, orjson.loads(body), dict(headers)))
        base = next((b for b in self.script if url.startswith(b)), None)
        if base is None:
            raise UpstreamError("connect", f"nothing scripted for {url}")
        answers = self.script[base]
        step = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(step, Refuse):
            raise UpstreamError(step.kind, f"scripted {step.kind}")
        response = _Scripted(step)
        self.responses.append(response)
        return response

    async def close(self) -> None:
        pass
