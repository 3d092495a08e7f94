"""A hostile engine: a scripted OpenAI-compatible upstream on a real local TCP port.

Used by ``tests/integration/test_hostile_engine.py`` (issue 24): a real ``fleetgate serve``
is put in front of it and every way an engine can answer badly is tried with the official
``openai`` client and raw httpx. The server runs an asyncio loop in a background thread of
the test process, so a test needs no second process for the engine.

The behaviour is picked by the endpoint's path: a pool's endpoint
``{url}/m/<mode>`` makes the gateway post to ``{url}/m/<mode>/v1/chat/completions``, so one
server gives each mode its own endpoint (its own breaker) and its own public model name.
``GET .../health``, ``/metrics`` and ``/v1/models`` answer well, so every endpoint is ready.

| mode | the answer (stream / non-stream) |
|---|---|
| ok | a well-formed chat answer |
| html | 200 ``text/html`` page |
| empty_json | 200 ``{}`` |
| gzip | the well-formed answer, ``content-encoding: gzip`` |
| garbage | frames with non-SSE bytes between them / a body of garbage bytes |
| broken_json | ``data: {broken json`` between good frames / a truncated JSON body |
| slow_headers | no status line for 60 s |
| trickle | headers, then the good answer one byte a second |
| endless | headers, then frames (or JSON bytes) forever, never finished |
| stall | headers and a first piece, then silence |
| huge_frame | one good frame, then one 64 MiB ``data:`` line / (stream only) |
| wrong_ct | the good answer under a wrong ``content-type`` |

May touch: asyncio, sockets, gzip. Must not touch: fleetgate itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import threading
import time
from collections.abc import Iterator

import orjson

MODES = ("ok", "html", "empty_json", "gzip", "garbage", "broken_json", "slow_headers",
         "trickle", "endless", "stall", "huge_frame", "wrong_ct")
HUGE = 64 * 1024 * 1024


def chat_answer(model: str) -> bytes:
    return orjson.dumps({
        "id": "chatcmpl-h", "object": "chat.completion", "created": 1, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi there"},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}})


def chunk(model: str, delta: dict, finish: str | None = None, usage: bool = False) -> bytes:
    obj: dict = {"id": "chatcmpl-h", "object": "chat.completion.chunk", "created": 1,
                 "model": model, "choices": [] if usage else
                 [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage:
        obj["usage"] = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def chat_frames(model: str) -> list[bytes]:
    return [chunk(model, {"role": "assistant", "content": ""}),
            chunk(model, {"content": "hi"}), chunk(model, {"content": " there"}),
            chunk(model, {}, "stop"), chunk(model, {}, usage=True), b"data: [DONE]\n\n"]


def head(content_type: str, extra: str = "", length: int | None = None) -> bytes:
    framing = f"content-length: {length}" if length is not None else \
        "transfer-encoding: chunked"
    return (f"HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\n{framing}\r\n{extra}"
            "\r\n").encode()


def piece(data: bytes) -> bytes:
    """One chunk of a chunked body."""
    return f"{len(data):x}\r\n".encode() + data + b"\r\n" if data else b""


class HostileEngine:
    """The server (module doc); ``with HostileEngine() as engine: engine.url``."""

    def __init__(self) -> None:
        self.url = ""
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self.requests: list[tuple[str, dict[str, str]]] = []  # (path, headers) of each POST

    def __enter__(self) -> HostileEngine:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0), self.loop).result(10)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            assert self._server is not None
            self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    def endpoint(self, mode: str) -> str:
        return f"{self.url}/m/{mode}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                raw = await reader.readuntil(b"\r\n\r\n")
                lines = raw.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, _, v in
                           (ln.partition(":") for ln in lines[1:] if ln)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                if method == "GET":
                    await self._get(path, writer)
                    continue
                self.requests.append((path, headers))
                mode = path.split("/")[2] if path.startswith("/m/") else "ok"
                request = orjson.loads(body) if body else {}
                keep = await self._answer(mode, bool(request.get("stream")),
                                          str(request.get("model", "m")), reader, writer)
                if not keep:
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def _get(self, path: str, writer: asyncio.StreamWriter) -> None:
        if path.endswith("/v1/models"):
            body = b'{"object":"list","data":[]}'
        elif path.endswith(("/health", "/metrics")):
            body = b""
        else:
            writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
            return
        writer.write(head("application/json", length=len(body)) + body)
        await writer.drain()

    async def _answer(self, mode: str, stream: bool, model: str, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> bool:
        """Write the mode's answer; False when the connection must not be reused."""
        good = b"".join(chat_frames(model)) if stream else chat_answer(model)
        kind = "text/event-stream" if stream else "application/json"
        if mode == "ok":
            writer.write(head(kind, length=len(good)) + good)
        elif mode == "html":
            page = b"<!DOCTYPE html>\n<html><body>\n\n<h1>502 Bad Gateway</h1>\n\n</body></html>"
            writer.write(head("text/html", length=len(page)) + page)
        elif mode == "empty_json":
            writer.write(head("application/json", length=2) + b"{}")
        elif mode == "gzip":
            packed = gzip.compress(good)
            writer.write(head(kind, "content-encoding: gzip\r\n", len(packed)) + packed)
        elif mode == "wrong_ct":
            writer.write(head("text/html" if stream else "text/plain", length=len(good)) + good)
        elif mode in ("garbage", "broken_json"):
            writer.write(self._mixed(mode, stream, model, good))
        else:
            return await self._slow(mode, stream, model, good, kind, reader, writer)
        await writer.drain()
        return True

    @staticmethod
    def _mixed(mode: str, stream: bool, model: str, good: bytes) -> bytes:
        if not stream:
            bad = b"\x00\xff\xfe garbage, not json" if mode == "garbage" else good[:40]
            return head("application/json", length=len(bad)) + bad
        frames = chat_frames(model)
        noise = (b"\x00\xff\xfe binary garbage\n\n", b"<html>not sse</html>\n\n",
                 b"garbage line\ndata: {\"also\":\"glued to garbage\"}\n\n") \
            if mode == "garbage" else (b"data: {broken json\n\n", b'data: {"id": "x", \n\n')
        mixed = [frames[0], noise[0], frames[1], *noise[1:], *frames[2:]]
        return head("text/event-stream") + b"".join(map(piece, mixed)) + b"0\r\n\r\n"

    async def _slow(self, mode: str, stream: bool, model: str, good: bytes, kind: str,
                    reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        gone = asyncio.ensure_future(reader.read(1))  # the gateway hung up (or sent more)
        try:
            if mode == "slow_headers":
                await asyncio.wait([gone], timeout=60)
                return False
            writer.write(head(kind))
            if mode == "trickle":
                for i in range(len(good)):
                    writer.write(piece(good[i:i + 1]))
                    await writer.drain()
                    if (await asyncio.wait([gone], timeout=1.0))[0]:
                        return False
            elif mode == "stall":
                writer.write(piece(chat_frames(model)[0] if stream else good[:20]))
                await writer.drain()
                await asyncio.wait([gone], timeout=60)
            elif mode == "endless":
                await self._endless(stream, model, writer, gone)
            elif mode == "huge_frame":
                await self._huge(model, writer, gone)
            return False
        finally:
            gone.cancel()

    @staticmethod
    async def _endless(stream: bool, model: str, writer: asyncio.StreamWriter,
                       gone: asyncio.Future[bytes]) -> None:
        if stream:
            writer.write(piece(chat_frames(model)[0]))
            item = chunk(model, {"content": "x"})
        else:
            writer.write(piece(b'{"id":"chatcmpl-h","object":"chat.completion","choices":['))
            item = b'{"index":0,"message":{"role":"assistant","content":"x"}},'
        end = time.monotonic() + 60
        while not gone.done() and time.monotonic() < end:
            writer.write(piece(item * 50))
            await writer.drain()
            await asyncio.sleep(0.01)

    @staticmethod
    async def _huge(model: str, writer: asyncio.StreamWriter,
                    gone: asyncio.Future[bytes]) -> None:
        writer.write(piece(chat_frames(model)[0]) + piece(b'data: {"x":"'))
        block = b"a" * (1024 * 1024)
        for _ in range(HUGE // len(block)):
            if gone.done():
                return
            writer.write(piece(block))
            await writer.drain()
        writer.write(piece(b'"}\n\n' + b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()


@contextlib.contextmanager
def hostile_engine() -> Iterator[HostileEngine]:
    with HostileEngine() as engine:
        yield engine
