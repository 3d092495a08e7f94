"""An instant-answer vLLM-shaped OpenAI mock for relay benchmarks (bench/relay_overhead.py).

A raw asyncio protocol (uvloop when installed), HTTP/1.1 keep-alive, no framework: it must
cost far less CPU per request than the gateway in front of it, so the benchmark measures
the gateway and not the engine. Every answer is instant and precomputed per served model.

Endpoints:

* ``POST /v1/chat/completions`` non-stream: a vLLM 0.x ``chat.completion`` body with usage
  (16 completion tokens), ``content-length`` framed, like uvicorn under vLLM.
* ``POST /v1/chat/completions`` with ``"stream": true``: ``transfer-encoding: chunked`` SSE
  in vLLM's chunk shapes: a role chunk, 16 content chunks (the last with
  ``finish_reason``), the usage chunk (``choices: []``) only when
  ``stream_options.include_usage`` is true, then ``data: [DONE]``. Each frame is its own
  socket write (TCP_NODELAY), as an engine writes one chunk per token; back to back by
  default, or ``--frame-gap-ms`` apart (then a relay reads and forwards each one alone,
  as it does with a real engine's token rhythm).
* ``GET /health`` 200 (empty body, as vLLM), ``GET /v1/models``, and ``GET /metrics``: a tiny
  valid exposition with ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
  ``vllm:kv_cache_usage_perc`` and ``vllm:generation_tokens_total`` (or, with
  ``--metrics-file``, that file: a captured vLLM exposition for the collector benchmark).

Run: ``python bench/mock_engine.py --port N [--frame-gap-ms G]`` (0 = any free port); it prints
``MOCK_ENGINE_READY http://127.0.0.1:<port>`` on stdout once it listens.

Standing in for a whole fleet (``bench/collector_overhead.py``, ``bench/scale.py``: one engine
behind thousands of loopback addresses, ``--host 0.0.0.0``) it holds a socket per gateway
connection: it lifts its soft open-files limit to the hard one at start, ``--backlog``
sizes the listen queue for a gateway's first tick connecting to every endpoint at once,
``--idle-timeout-s T`` closes a connection no request came on for T seconds, as uvicorn
under vLLM does after 5 s (``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``; off by default: instant
answers only, a stream with ``--frame-gap-ms`` is not a request in progress to it), and
``--stats`` counts the requests by kind (``GET /_mock/stats``: how many scrapes the
gateways made, without asking them). Both off, the request path is the plain one.

May touch: sockets on the given host. Must not touch: fleetgate (it is the engine's stand-in).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import sys
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

try:
    import orjson
except ImportError:  # the mock also runs on a bare interpreter, a little slower
    orjson = None  # type: ignore[assignment]


def _loads(raw: bytes) -> Any:
    return orjson.loads(raw) if orjson is not None else json.loads(raw)


def _dumps(obj: object) -> bytes:
    if orjson is not None:
        return orjson.dumps(obj)
    return json.dumps(obj, separators=(",", ":")).encode()


READY_PREFIX = "MOCK_ENGINE_READY "
TOKENS = 16
PROMPT_TOKENS = 12
WORD = "tok "
REQUEST_ID = "chatcmpl-0123456789abcdef"
CREATED = int(time.time())


def _response(status: str, ctype: bytes, body: bytes, close: bool = False) -> bytes:
    conn = b"connection: close\r\n" if close else b""
    return (
        b"HTTP/1.1 "
        + status.encode()
        + b"\r\nserver: uvicorn\r\ncontent-type: "
        + ctype
        + b"\r\ncontent-length: "
        + str(len(body)).encode()
        + b"\r\n"
        + conn
        + b"\r\n"
        + body
    )


STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\nserver: uvicorn\r\n"
    b"content-type: text/event-stream; charset=utf-8\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)


def _usage() -> dict[str, object]:
    return {
        "prompt_tokens": PROMPT_TOKENS,
        "total_tokens": PROMPT_TOKENS + TOKENS,
        "completion_tokens": TOKENS,
        "prompt_tokens_details": None,
    }


def completion_body(model: str) -> bytes:
    return _dumps(
        {
            "id": REQUEST_ID,
            "object": "chat.completion",
            "created": CREATED,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": WORD * TOKENS,
                        "refusal": None,
                        "annotations": None,
                        "audio": None,
                        "function_call": None,
                        "tool_calls": [],
                        "reasoning_content": None,
                    },
                    "logprobs": None,
                    "finish_reason": "length",
                    "stop_reason": None,
                }
            ],
            "service_tier": None,
            "system_fingerprint": None,
            "usage": _usage(),
            "prompt_logprobs": None,
            "kv_transfer_params": None,
        }
    )


def stream_frames(model: str, include_usage: bool) -> list[bytes]:
    """The SSE frames of one stream, each already wrapped as one HTTP chunk."""

    def chunk(choices: list[object], **extra: object) -> dict[str, object]:
        return {
            "id": REQUEST_ID,
            "object": "chat.completion.chunk",
            "created": CREATED,
            "model": model,
            "choices": choices,
            **extra,
        }

    objs: list[dict[str, object]] = [
        chunk(
            [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
            prompt_token_ids=None,
        )
    ]
    for i in range(TOKENS):
        last = i == TOKENS - 1
        choice = {
            "index": 0,
            "delta": {"content": WORD},
            "logprobs": None,
            "finish_reason": "length" if last else None,
            "token_ids": None,
        }
        if last:
            choice["stop_reason"] = None
        objs.append(chunk([choice]))
    if include_usage:
        objs.append(chunk([], usage=_usage()))
    payloads = [b"data: " + _dumps(o) + b"\n\n" for o in objs] + [b"data: [DONE]\n\n"]
    return [b"%x\r\n%s\r\n" % (len(p), p) for p in payloads] + [b"0\r\n\r\n"]


class Engine:
    """Shared state: precomputed answers per served model, and counters for /metrics."""

    def __init__(self, frame_gap_s: float = 0.0, metrics_text: bytes | None = None) -> None:
        self.frame_gap_s = frame_gap_s
        self.metrics_text = metrics_text
        self._captured: bytes | None = None  # the answer carrying metrics_text
        self.running = 0
        self.generated = 0
        self._plain: dict[str, bytes] = {}
        self._stream: dict[tuple[str, bool], list[bytes]] = {}

    def plain(self, model: str) -> bytes:
        out = self._plain.get(model)
        if out is None:
            out = self._plain[model] = _response(
                "200 OK", b"application/json", completion_body(model)
            )
        return out

    def stream(self, model: str, include_usage: bool) -> list[bytes]:
        key = (model, include_usage)
        out = self._stream.get(key)
        if out is None:
            out = self._stream[key] = stream_frames(model, include_usage)
        return out

    def metrics(self) -> bytes:
        if self.metrics_text is not None:  # whole, whatever the query: as vLLM answers
            if self._captured is None:
                self._captured = _response("200 OK", b"text/plain; version=0.0.4; charset=utf-8",
                                           self.metrics_text)
            return self._captured
        text = (
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{engine="0",model_name="bench"}} {self.running}.0\n'
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            'vllm:num_requests_waiting{engine="0",model_name="bench"} 0.0\n'
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            'vllm:kv_cache_usage_perc{engine="0",model_name="bench"} 0.0\n'
            "# HELP vllm:generation_tokens_total Number of generation tokens processed.\n"
            "# TYPE vllm:generation_tokens_total counter\n"
            f'vllm:generation_tokens_total{{engine="0",model_name="bench"}} {self.generated}.0\n'
        )
        return _response("200 OK", b"text/plain; version=0.0.4; charset=utf-8", text.encode())


NOT_FOUND = _response("404 Not Found", b"application/json", b'{"detail":"Not Found"}')
BAD_REQUEST = _response(
    "400 Bad Request",
    b"application/json",
    b'{"error":{"message":"bad request","type":"BadRequestError","param":null,"code":400}}',
    close=True,
)
HEALTH = _response("200 OK", b"application/json", b"")


class HttpConnection(asyncio.Protocol):
    """One keep-alive connection: parse requests from the buffer, answer each in order."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.buf = self.buf + data if self.buf else data
        while self.transport is not None:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end]
            length = _content_length(head)
            total = end + 4 + length
            if len(self.buf) < total:
                return
            body = self.buf[end + 4 : total]
            self.buf = self.buf[total:]
            self.handle(head, body)

    def handle(self, head: bytes, body: bytes) -> None:
        transport = self.transport
        assert transport is not None
        line = head[: head.find(b"\r\n")] if b"\r\n" in head else head
        parts = line.split(b" ")
        method, path = (parts[0], parts[1]) if len(parts) >= 2 else (b"", b"")
        if method == b"POST" and path in (b"/v1/chat/completions", b"/v1/completions"):
            self.completion(body)
        elif path == b"/health":
            transport.write(HEALTH)
        elif path.startswith(b"/metrics"):
            transport.write(self.engine.metrics())
        elif path == b"/v1/models":
            transport.write(
                _response(
                    "200 OK",
                    b"application/json",
                    _dumps(
                        {
                            "object": "list",
                            "data": [{"id": "bench-served", "object": "model", "owned_by": "vllm"}],
                        }
                    ),
                )
            )
        else:
            transport.write(NOT_FOUND)
        if b"\r\nconnection: close" in head.lower():
            transport.close()
            self.transport = None

    def completion(self, body: bytes) -> None:
        transport = self.transport
        assert transport is not None
        try:
            req = _loads(body)
            model = str(req.get("model") or "bench-served")
        except (ValueError, AttributeError):
            transport.write(BAD_REQUEST)
            transport.close()
            self.transport = None
            return
        self.engine.generated += TOKENS
        if not req.get("stream"):
            transport.write(self.engine.plain(model))
            return
        opts = req.get("stream_options") or {}
        frames = self.engine.stream(model, bool(opts.get("include_usage")))
        transport.write(STREAM_HEAD + frames[0])
        gap = self.engine.frame_gap_s
        if not gap:
            for frame in frames[1:]:
                transport.write(frame)
            return
        self.engine.running += 1
        loop = asyncio.get_running_loop()
        for k, frame in enumerate(frames[1:], start=1):
            loop.call_later(gap * k, self._write_later, transport, frame, k == len(frames) - 1)

    def _write_later(self, transport: asyncio.Transport, frame: bytes, last: bool) -> None:
        if not transport.is_closing():
            transport.write(frame)
        if last:
            self.engine.running -= 1

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None


class FleetConnection(HttpConnection):
    """``HttpConnection`` for an engine standing in for a fleet (``--stats``,
    ``--idle-timeout-s``): counts the requests by kind, answers ``GET /_mock/stats`` with
    the counts and the open connections, and is closed by ``sweep_idle`` when no request
    came for a while."""

    def __init__(self, engine: Engine, live: set[FleetConnection], counts: Counter[str]) -> None:
        super().__init__(engine)
        self.live = live
        self.counts = counts
        self.last = time.monotonic()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.live.add(self)
        self.counts["connections"] += 1

    def data_received(self, data: bytes) -> None:
        self.last = time.monotonic()
        super().data_received(data)

    def handle(self, head: bytes, body: bytes) -> None:
        line = head[: head.find(b"\r\n")] if b"\r\n" in head else head
        path = line.split(b" ")[1] if line.count(b" ") >= 1 else b""
        if path == b"/_mock/stats":
            assert self.transport is not None
            self.transport.write(_response("200 OK", b"application/json", _dumps(
                {**self.counts, "open": len(self.live)})))
            return
        if path.startswith(b"/metrics"):
            self.counts["metrics"] += 1
        else:
            self.counts[path.partition(b"?")[0].decode("latin-1")] += 1
        super().handle(head, body)

    def connection_lost(self, exc: Exception | None) -> None:
        self.live.discard(self)
        super().connection_lost(exc)


async def sweep_idle(live: set[FleetConnection], timeout_s: float) -> None:
    while True:
        await asyncio.sleep(timeout_s / 4)
        cutoff = time.monotonic() - timeout_s
        for conn in [c for c in live if c.last < cutoff]:
            if conn.transport is not None:
                conn.transport.close()
            live.discard(conn)


def _content_length(head: bytes) -> int:
    i = head.lower().find(b"\r\ncontent-length:")
    if i < 0:
        return 0
    j = head.find(b"\r\n", i + 2)
    return int(head[i + 17 : j if j >= 0 else None].strip())


def lift_open_files_limit() -> int:
    """The soft open-files limit raised to the hard one (a connection per endpoint and
    gateway replica: thousands); returns the limit in force."""
    try:
        import resource
    except ImportError:  # not Unix
        return -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


async def serve(host: str, port: int, frame_gap_s: float = 0.0,
                metrics_text: bytes | None = None, backlog: int = 1024,
                idle_timeout_s: float = 0.0, stats: bool = False) -> None:
    engine = Engine(frame_gap_s, metrics_text)
    loop = asyncio.get_running_loop()
    factory: Callable[[], asyncio.Protocol] = lambda: HttpConnection(engine)  # noqa: E731
    background: list[asyncio.Task[None]] = []  # held: an unreferenced task may be collected
    if stats or idle_timeout_s > 0:
        live: set[FleetConnection] = set()
        counts: Counter[str] = Counter()
        factory = lambda: FleetConnection(engine, live, counts)  # noqa: E731
    if idle_timeout_s > 0:
        background.append(asyncio.create_task(sweep_idle(live, idle_timeout_s)))
    server = await loop.create_server(factory, host, port, reuse_address=True, backlog=backlog)
    bound = server.sockets[0].getsockname()[1]
    print(f"{READY_PREFIX}http://{host}:{bound}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--frame-gap-ms", type=float, default=0.0,
                        help="pause between stream frames (default 0: all at once)")
    parser.add_argument("--metrics-file", default=None,
                        help="serve this file as /metrics (e.g. a captured vLLM exposition)")
    parser.add_argument("--backlog", type=int, default=1024,
                        help="listen queue (the kernel caps it at net.core.somaxconn)")
    parser.add_argument("--idle-timeout-s", type=float, default=0.0,
                        help="close a connection idle this long (default 0: never)")
    parser.add_argument("--stats", action="store_true",
                        help="count requests by kind, served as JSON at GET /_mock/stats")
    args = parser.parse_args(argv)
    metrics = Path(args.metrics_file).read_bytes() if args.metrics_file else None
    lift_open_files_limit()
    runner: Callable[[Coroutine[Any, Any, None]], None] = asyncio.run
    with contextlib.suppress(ImportError):
        import uvloop

        runner = uvloop.run
    with contextlib.suppress(KeyboardInterrupt):
        runner(serve(args.host, args.port, args.frame_gap_ms / 1000, metrics, args.backlog,
                     args.idle_timeout_s, args.stats))
    sys.exit(0)


if __name__ == "__main__":
    main()
