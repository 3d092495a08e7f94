"""The load generator of bench/relay_overhead.py: a raw-asyncio HTTP/1.1 client.

Closed loop on keep-alive connections (one per concurrent user); parses content-length and
chunked bodies; records each request's latency (request write to last response byte) while
the window is recording. Cheap enough to drive the gateway from one core (its own ceiling
is the *direct* rows of the relay table).
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from dataclasses import dataclass, field


def request_bytes(host: str, port: int, model: str, stream: bool) -> bytes:
    body: dict[str, object] = {"model": model, "max_tokens": 16,
                               "messages": [{"role": "user", "content": "Say hello."}]}
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    raw = json.dumps(body, separators=(",", ":")).encode()
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n\r\n"
            ).encode() + raw


@dataclass
class Window:
    """Shared by all connections of one scenario."""

    request: bytes
    recording: bool = False
    stopping: bool = False
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    first_body: bytes | None = None
    in_flight: int = 0
    drained: asyncio.Event = field(default_factory=asyncio.Event)


class LoadConnection(asyncio.Protocol):
    """Closed loop on one keep-alive connection; parses content-length and chunked bodies."""

    def __init__(self, window: Window) -> None:
        self.w = window
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.t0 = 0.0
        self.status = 0
        self.need = -1  # bytes of body left (content-length); -2: chunked; -1: head
        self.keep: list[bytes] | None = None
        self.lost = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(self) -> None:
        assert self.transport is not None
        self.w.in_flight += 1
        if self.w.first_body is None and self.keep is None:
            self.keep = []
        self.t0 = time.perf_counter()
        self.transport.write(self.w.request)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while self._parse():
            self._complete()

    def _parse(self) -> bool:
        """Consume what is buffered; True when a whole response has been read."""
        buf = self.buf
        if self.need == -1:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return False
            head = bytes(buf[:end]).lower()
            self.status = int(head[9:12])
            del buf[:end + 4]
            i = head.find(b"\r\ncontent-length:")
            if i >= 0:
                j = head.find(b"\r\n", i + 2)
                self.need = int(head[i + 17:j if j >= 0 else None])
            elif b"transfer-encoding: chunked" in head:
                self.need = -2
            else:
                raise RuntimeError(f"response without a length: {head!r}")
        if self.need >= 0:
            if len(buf) < self.need:
                return False
            if self.keep is not None:
                self.keep.append(bytes(buf[:self.need]))
            del buf[:self.need]
            return True
        while True:  # chunked: <hex>\r\n<data>\r\n ... 0\r\n\r\n
            eol = buf.find(b"\r\n")
            if eol < 0:
                return False
            size = int(buf[:eol].split(b";")[0], 16)
            if len(buf) < eol + 2 + size + 2:
                return False
            if self.keep is not None:
                self.keep.append(bytes(buf[eol + 2:eol + 2 + size]))
            del buf[:eol + 2 + size + 2]
            if size == 0:
                return True

    def _complete(self) -> None:
        w = self.w
        if w.recording:
            w.latencies.append(time.perf_counter() - self.t0)
        if self.status != 200:
            w.errors += 1
        if self.keep is not None:
            if w.first_body is None:
                w.first_body = b"".join(self.keep)
            self.keep = None
        self.need = -1
        w.in_flight -= 1
        if w.stopping:
            if w.in_flight == 0:
                w.drained.set()
        else:
            self.send()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if not self.lost.done():
            self.lost.set_result(exc)
        if self.need != -1 or self.w.in_flight:
            self.w.errors += 1
