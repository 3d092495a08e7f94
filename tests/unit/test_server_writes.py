"""``gateway/server._HeadWithBody``: an answer's head waits for a body of known length and
goes out with it in one write; anything else is written as it comes (one layer, with a
stand-in for uvicorn's request cycle and the connection's transport)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fleetgate.gateway.server import _HeadWithBody


@dataclass
class _Transport:
    writes: list[bytes] = field(default_factory=list)
    closed: bool = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


@dataclass
class _Cycle:
    method: str = "POST"
    response_started: bool = False
    chunked_encoding: bool | None = None
    expected_content_length: int = 0
    scope: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.scope["method"] = self.method

    def head(self, wrapped: _HeadWithBody, length: int | None) -> None:
        """What uvicorn's send does for ``http.response.start``: state, then one write."""
        self.response_started = True
        self.chunked_encoding = length is None
        self.expected_content_length = length or 0
        wrapped.write(b"HTTP/1.1 200 OK\r\n\r\n")


def _wrapped(method: str = "POST") -> tuple[_Cycle, _Transport, _HeadWithBody]:
    cycle, transport = _Cycle(method), _Transport()
    return cycle, transport, _HeadWithBody(cycle, transport)


def test_a_head_with_a_known_body_goes_out_with_it() -> None:
    cycle, transport, wrapped = _wrapped()
    cycle.head(wrapped, 5)
    assert transport.writes == []
    wrapped.write(b"hello")
    wrapped.write(b"")  # anything after goes as it comes
    assert transport.writes == [b"HTTP/1.1 200 OK\r\n\r\nhello", b""]


def test_a_stream_head_and_a_head_without_body_go_out_at_once() -> None:
    cycle, transport, wrapped = _wrapped()
    cycle.head(wrapped, None)  # chunked: a stream's frames follow when they come
    assert transport.writes == [b"HTTP/1.1 200 OK\r\n\r\n"]
    for method, length in (("HEAD", 5), ("GET", 0)):  # no body write will follow
        cycle, transport, wrapped = _wrapped(method)
        cycle.head(wrapped, length)
        assert transport.writes == [b"HTTP/1.1 200 OK\r\n\r\n"]


def test_writes_before_the_answer_pass_and_a_close_sends_a_held_head() -> None:
    cycle, transport, wrapped = _wrapped()
    wrapped.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # receive(), before any answer
    assert transport.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
    cycle.head(wrapped, 5)
    wrapped.close()  # the app failed after its head: it goes, then the connection closes
    assert transport.writes[-1] == b"HTTP/1.1 200 OK\r\n\r\n" and transport.closed
    assert wrapped.is_closing()  # the rest is the transport's
