"""The relay's HTTP/1.1 client (``backends/http1.py``) against a scripted local TCP server.

The server is a raw asyncio server on 127.0.0.1 that answers each request with bytes the
test chooses, so keep-alive reuse, chunked and ``content-length`` bodies, an engine that
closes an idle connection, a client that leaves mid-stream, timeouts and bad HTTP are all
checked on real sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from fleetgate.backends import http1
from fleetgate.backends.http1 import Http1Backend
from fleetgate.backends.http1_conn import DECODED_PIECE, HIGH_WATER
from fleetgate.backends.http1_wire import parse
from fleetgate.backends.relay import Timeouts, UpstreamError

FAST = Timeouts(connect=2.0, read=2.0, total=10.0)
JSON = b'{"ok":true}'


def plain(body: bytes = JSON, extra: bytes = b"") -> bytes:
    return (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
            + str(len(body)).encode() + b"\r\n" + extra + b"\r\n" + body)


def chunked(*pieces: bytes) -> bytes:
    out = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
           b"transfer-encoding: chunked\r\n\r\n")
    for p in pieces:
        out += f"{len(p):x}\r\n".encode() + p + b"\r\n"
    return out + b"0\r\n\r\n"


@dataclass
class Server:
    """Answers request k with ``script(k, request_bytes)``; records connections."""

    script: Callable[[int, bytes], bytes | None]
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    writers: list[asyncio.StreamWriter] = field(default_factory=list)
    url: str = ""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(next((ln.split(b":")[1] for ln in head.split(b"\r\n")
                                   if ln.lower().startswith(b"content-length")), b"0"))
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                answer = self.script(len(self.requests) - 1, request)
                if answer is None:
                    continue  # never answers
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed.set()
        finally:
            writer.close()


Script = Callable[[int, bytes], bytes | None]
Serve = Callable[[Script], Awaitable[Server]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    servers: list[asyncio.AbstractServer] = []

    async def start(script: Script) -> Server:
        srv = Server(script)
        server = await asyncio.start_server(srv.handle, "127.0.0.1", 0)
        servers.append(server)
        srv.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/chat/completions"
        return srv

    yield start
    for server in servers:
        server.close()


async def test_plain_answers_reuse_one_connection(serve: Serve) -> None:
    srv = await serve(lambda k, _: plain(b'{"n":%d}' % k))
    client = Http1Backend()
    for k in range(3):
        resp = await client.post(srv.url, b'{"a":1}', {"content-type": "application/json",
                                                        "x-request-id": "r"}, FAST)
        assert (resp.status, resp.content_type) == (200, "application/json")
        assert await resp.read() == b'{"n":%d}' % k
    assert srv.connections == 1
    first = srv.requests[0]
    assert first.startswith(b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:")
    assert b"x-request-id: r\r\n" in first and first.endswith(b'content-length: 7\r\n\r\n{"a":1}')
    await client.close()


async def test_a_chunked_stream_arrives_piece_by_piece(serve: Serve) -> None:
    srv = await serve(lambda k, _: chunked(b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"))
    client = Http1Backend()
    resp = await client.post(srv.url, b"{}", {}, FAST)
    assert resp.content_type == "text/event-stream"
    got = [piece async for piece in resp.chunks()]
    assert b"".join(got) == b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n"
    resp.close()
    again = await client.post(srv.url, b"{}", {}, FAST)  # read to its end: reused
    await again.read()
    assert srv.connections == 1
    await client.close()


async def test_closing_a_stream_early_drops_the_connection(serve: Serve) -> None:
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n"
    srv = await serve(lambda k, _: head)  # the stream never ends
    client = Http1Backend()
    resp = await client.post(srv.url, b"{}", {}, FAST)
    assert await anext(aiter(resp.chunks())) == b"hello"
    resp.close()
    await asyncio.wait_for(srv.closed.wait(), 5)  # the engine sees the client leave
    resp.close()  # twice is harmless
    await client.close()


async def test_an_idle_connection_the_engine_closed_is_replaced(serve: Serve) -> None:
    srv = await serve(lambda k, _: plain())
    client = Http1Backend()
    await (await client.post(srv.url, b"{}", {}, FAST)).read()
    for w in srv.writers:  # the engine closes the idle keep-alive connection
        w.close()
    await asyncio.sleep(0.05)
    resp = await client.post(srv.url, b"{}", {}, FAST)
    assert await resp.read() == JSON and srv.connections == 2
    await client.close()


async def test_connection_close_is_honoured(serve: Serve) -> None:
    srv = await serve(lambda k, _: plain(extra=b"connection: close\r\n"))
    client = Http1Backend()
    for _ in range(2):
        await (await client.post(srv.url, b"{}", {}, FAST)).read()
    assert srv.connections == 2
    await client.close()


async def test_failures_have_their_kinds(serve: Serve) -> None:
    client = Http1Backend()
    silent = await serve(lambda k, _: None)
    with pytest.raises(UpstreamError) as caught:
        await client.post(silent.url, b"{}", {}, Timeouts(2.0, 0.2, 10.0))
    assert caught.value.kind == "timeout"

    stalls = await serve(lambda k, _: b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
    resp = await client.post(stalls.url, b"{}", {}, Timeouts(2.0, 0.2, 10.0))
    with pytest.raises(UpstreamError) as caught:
        await resp.read()
    assert caught.value.kind == "timeout"

    garbage = await serve(lambda k, _: b"NOT HTTP AT ALL\r\n\r\n")
    with pytest.raises(UpstreamError) as caught:
        await client.post(garbage.url, b"{}", {}, FAST)
    assert caught.value.kind == "protocol"

    cut = await serve(lambda k, _: b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial")
    resp = await client.post(cut.url, b"{}", {}, FAST)
    for w in cut.writers:
        w.close()
    with pytest.raises(UpstreamError) as caught:
        await resp.read()
    assert caught.value.kind == "protocol"

    with pytest.raises(UpstreamError) as caught:
        await client.post("http://127.0.0.1:9/v1/chat/completions", b"{}", {}, FAST)
    assert caught.value.kind == "connect"
    await client.close()


async def test_a_slow_reader_pauses_the_engine_socket(serve: Serve) -> None:
    big = b"x" * (4 * HIGH_WATER)
    srv = await serve(lambda k, _: chunked(*[big[i:i + 65536]
                                             for i in range(0, len(big), 65536)]))
    client = Http1Backend()
    resp = await client.post(srv.url, b"{}", {}, FAST)
    await asyncio.sleep(0.2)  # the engine writes everything; the client reads nothing
    assert await resp.read() == big  # all of it, in order, after pausing and resuming
    await client.close()


# -- issue 24: encodings, sizes and what a timeout says ----------------------------------
async def test_a_gzip_answer_is_decoded_and_identity_is_asked_for(serve: Serve) -> None:
    whole = gzip.compress(JSON)
    stream = zlib.compressobj(wbits=31)
    pieces = [stream.compress(b"data: 1\n\n") + stream.flush(zlib.Z_SYNC_FLUSH),
              stream.compress(b"data: [DONE]\n\n") + stream.flush()]
    srv = await serve(lambda k, _: plain(whole, b"content-encoding: gzip\r\n") if k == 0 else
                      chunked(*pieces).replace(b"chunked\r\n", b"chunked\r\n"
                                               b"content-encoding: gzip\r\n", 1))
    client = Http1Backend()
    resp = await client.post(srv.url, b"{}", {}, FAST)
    assert await resp.read() == JSON and resp.received == len(whole)
    assert b"accept-encoding: identity\r\n" in srv.requests[0]
    resp = await client.post(srv.url, b"{}", {}, FAST)
    assert b"".join([p async for p in resp.chunks()]) == b"data: 1\n\ndata: [DONE]\n\n"
    resp.close()
    assert srv.connections == 1  # both read to their end: one connection
    await client.close()


async def test_a_compression_bomb_inflates_one_piece_at_a_time(serve: Serve) -> None:
    bomb = gzip.compress(b"a" * (8 * DECODED_PIECE))
    srv = await serve(lambda k, _: plain(bomb, b"content-encoding: gzip\r\n"))
    client = Http1Backend()
    resp = await client.post(srv.url, b"{}", {}, FAST)
    sizes = [len(p) async for p in resp.chunks()]
    assert sum(sizes) == 8 * DECODED_PIECE and max(sizes) <= DECODED_PIECE
    resp.close()
    await client.close()


@pytest.mark.parametrize("encoding", [b"br", b"gzip, gzip"])
async def test_an_encoding_the_relay_cannot_read_is_a_protocol_failure(
        serve: Serve, encoding: bytes) -> None:
    srv = await serve(lambda k, _: plain(JSON, b"content-encoding: " + encoding + b"\r\n"))
    client = Http1Backend()
    with pytest.raises(UpstreamError) as caught:
        await client.post(srv.url, b"{}", {}, FAST)
    assert caught.value.kind == "protocol" and "content-encoding" in str(caught.value)
    await client.close()


async def test_a_whole_answer_over_the_cap_is_a_protocol_failure(
        serve: Serve, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http1, "MAX_ANSWER_BYTES", 1000)
    srv = await serve(lambda k, _: plain(b"[" + b"1," * 1000 + b"1]"))
    client = Http1Backend()
    resp = await client.post(srv.url, b"{}", {}, FAST)
    with pytest.raises(UpstreamError, match="over"):
        await resp.read()
    await client.close()


async def test_timeouts_say_what_arrived(serve: Serve) -> None:
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n"
    srv = await serve(lambda k, _: None if k == 0 else head)
    client = Http1Backend()
    quick = Timeouts(connect=2.0, read=0.05, total=10.0)
    with pytest.raises(UpstreamError, match=r"no answer headers within 0\.05 s"):
        await client.post(srv.url, b"{}", {}, quick)
    resp = await client.post(srv.url, b"{}", {}, quick)
    with pytest.raises(UpstreamError, match=r"nothing for 0\.05 s after 5 bytes"):
        await resp.read()
    await client.close()


async def test_a_trickle_ends_at_the_total_deadline(serve: Serve) -> None:
    """Bytes every 20 ms keep the read timeout (0.1 s) from firing; the one timer that also
    holds the total deadline (0.3 s) ends the answer there, saying how much came."""
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n"
    srv = await serve(lambda k, _: head)
    client = Http1Backend()
    resp = await client.post(srv.url, b"{}", {}, Timeouts(connect=2.0, read=0.1, total=0.3))

    async def trickle() -> None:
        with contextlib.suppress(ConnectionError, RuntimeError):
            for _ in range(100):
                await asyncio.sleep(0.02)
                srv.writers[0].write(b"1\r\nx\r\n")

    feeder = asyncio.create_task(trickle())
    try:
        with pytest.raises(UpstreamError, match=r"not complete within 0\.3 s \((\d+) bytes"):
            await resp.read()
    finally:
        feeder.cancel()
        await client.close()


async def test_engines_that_went_away_leave_nothing_in_the_pool(serve: Serve) -> None:
    """Pods come and go: the pool forgets a host whose connections the engine closed (or
    that idled past keepalive) at its next sweep, which runs every SWEEP_EVERY connections
    given back; a host still in use keeps its connection."""
    gone = [await serve(lambda k, _: plain()) for _ in range(3)]
    stays = await serve(lambda k, _: plain())
    client = Http1Backend(keepalive_s=30.0)
    for srv in (*gone, stays):
        await (await client.post(srv.url, b"{}", {}, FAST)).read()
    assert len(client._idle) == 4
    for srv in gone:  # the engines go away: their ends of the connections close
        for writer in srv.writers:
            writer.close()
    for _ in range(100):
        await asyncio.sleep(0.01)
        if all(c.closed for srv in gone for c in client._idle[parse(srv.url)[0]]):
            break
    for _ in range(http1.SWEEP_EVERY - 4):  # connections given back to the host that stays
        await (await client.post(stays.url, b"{}", {}, FAST)).read()
    assert list(client._idle) == [parse(stays.url)[0]]
    assert stays.connections == 1
    await client.close()


# -- issue 26: a probe and a scrape pipelined on one connection ------------------------------
HEALTHY = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
METRICS = b"vllm:num_requests_running 3\n"


def _pair_urls(srv: Server) -> tuple[str, str]:
    base = srv.url.rsplit("/v1/", 1)[0]
    return base + "/health", base + "/metrics"


async def test_a_pipelined_pair_is_one_write_and_two_answers_in_order(serve: Serve) -> None:
    srv = await serve(lambda k, req: HEALTHY if req.startswith(b"GET /health") else
                      plain(METRICS, b"x-n: %d\r\n" % k))
    client = Http1Backend()
    health, metrics = _pair_urls(srv)
    for _ in range(2):
        status, second = await client.get_pair(health, {"authorization": "Bearer k"},
                                               metrics, {"accept": "text/plain"}, FAST)
        assert status == 200 and not isinstance(second, UpstreamError) and second is not None
        assert second.status == 200 and await second.read() == METRICS
    resp = await client.get(metrics, None, FAST)  # the connection went back to the pool
    assert await resp.read() == METRICS and srv.connections == 1
    assert [r.split(b" ", 2)[1] for r in srv.requests] == [b"/health", b"/metrics"] * 2 + \
        [b"/metrics"]
    assert b"authorization: Bearer k\r\n" in srv.requests[0]
    assert b"accept: text/plain\r\n" in srv.requests[1]
    await client.close()


async def test_both_requests_go_out_before_any_answer(serve: Serve) -> None:
    srv = await serve(lambda k, _: None)  # reads every request, answers none
    client = Http1Backend()
    health, metrics = _pair_urls(srv)
    with pytest.raises(UpstreamError) as caught:  # no answer to the probe: it failed
        await client.get_pair(health, None, metrics, None, Timeouts(2.0, 0.3, 2.0))
    assert caught.value.kind == "timeout"
    assert [r.split(b" ", 2)[1] for r in srv.requests] == [b"/health", b"/metrics"]
    await client.close()


async def test_a_failing_probe_drops_the_second_answer(serve: Serve) -> None:
    srv = await serve(lambda k, req: b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 4"
                      b"\r\n\r\ndown" if req.startswith(b"GET /health") else plain(METRICS))
    client = Http1Backend()
    health, metrics = _pair_urls(srv)
    assert await client.get_pair(health, None, metrics, None, FAST) == (503, None)
    assert not client._idle  # the second answer was not read: its connection is closed
    assert await (await client.get(metrics, None, FAST)).read() == METRICS
    assert srv.connections == 2
    await client.close()


@pytest.mark.parametrize("announced", [True, False])
async def test_a_connection_closed_after_the_first_answer_asks_again(
        serve: Serve, announced: bool) -> None:
    """``connection: close`` on the probe's answer (or a close without it): the engine
    never answered the scrape on that connection, so it is asked on a new one."""
    srv: Server

    def script(k: int, req: bytes) -> bytes | None:
        if req.startswith(b"GET /health"):
            if k == 0:  # answered, then the connection closed: the scrape is not answered
                srv.writers[0].write(HEALTHY[:-2] + (b"connection: close\r\n\r\n"
                                                     if announced else b"\r\n"))
                srv.writers[0].close()
                return None
            return HEALTHY
        return plain(METRICS)

    srv = await serve(script)
    client = Http1Backend()
    health, metrics = _pair_urls(srv)
    status, second = await client.get_pair(health, None, metrics, None, FAST)
    assert status == 200 and not isinstance(second, UpstreamError) and second is not None
    assert await second.read() == METRICS
    assert srv.connections == 2
    await client.close()


async def test_a_slow_second_answer_times_out_alone(serve: Serve) -> None:
    srv = await serve(lambda k, req: HEALTHY if req.startswith(b"GET /health") else None)
    client = Http1Backend()
    health, metrics = _pair_urls(srv)
    status, second = await client.get_pair(health, None, metrics, None, Timeouts(2.0, 0.3, 2.0))
    assert status == 200 and isinstance(second, UpstreamError) and second.kind == "timeout"
    assert "no answer headers within 0.3 s" in str(second)
    assert not client._idle
    await client.close()


async def test_the_first_answer_fails_as_a_lone_one_would(serve: Serve) -> None:
    """What a probe alone would get: a bad encoding, a bad gzip body, bad HTTP, a refused
    connect; and a gzip body that decodes passes."""
    client = Http1Backend()
    for answer, kind in [
        (HEALTHY[:-2] + b"content-encoding: br\r\n\r\n", "protocol"),
        (b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: 4\r\n\r\nnope",
         "protocol"),
        (b"NOT HTTP AT ALL\r\n\r\n", "protocol"),
    ]:
        def script(k: int, req: bytes, a: bytes = answer) -> bytes:
            return a if req.startswith(b"GET /health") else plain(METRICS)

        srv = await serve(script)
        with pytest.raises(UpstreamError) as caught:
            await client.get_pair(*_pair_urls(srv)[:1], None, _pair_urls(srv)[1], None, FAST)
        assert caught.value.kind == kind
    packed = gzip.compress(b"ok")
    srv = await serve(lambda k, req: plain(packed, b"content-encoding: gzip\r\n")
                      if req.startswith(b"GET /health") else plain(METRICS))
    status, second = await client.get_pair(_pair_urls(srv)[0], None, _pair_urls(srv)[1], None,
                                           FAST)
    assert status == 200 and not isinstance(second, UpstreamError) and second is not None
    assert await second.read() == METRICS
    with pytest.raises(UpstreamError) as caught:
        await client.get_pair("http://127.0.0.1:9/health", None, "http://127.0.0.1:9/metrics",
                              None, FAST)
    assert caught.value.kind == "connect"
    await client.close()


async def test_a_pair_on_an_idle_connection_the_engine_closed_is_sent_again(
        serve: Serve) -> None:
    srv = await serve(lambda k, req: HEALTHY if req.startswith(b"GET /health") else plain(METRICS))
    client = Http1Backend()
    health, metrics = _pair_urls(srv)
    await (await client.get(metrics, None, FAST)).read()
    for w in srv.writers:
        w.close()
    await asyncio.sleep(0.05)
    status, second = await client.get_pair(health, None, metrics, None, FAST)
    assert status == 200 and not isinstance(second, UpstreamError) and second is not None
    assert await second.read() == METRICS and srv.connections == 2
    await client.close()


async def test_a_reused_connection_times_each_request_by_its_own_timeouts(
        serve: Serve) -> None:
    """A connection given back keeps its timer armed for the next request on it: a timer
    set for a shorter wait fires, finds the answer still within this request's timeouts
    and looks again; one set for a longer wait is replaced by this request's."""
    srv: Server

    def script(k: int, _: bytes) -> bytes | None:
        if k == 1:  # answered late
            asyncio.get_running_loop().call_later(0.4, srv.writers[-1].write, plain())
            return None
        return plain() if k < 3 else None  # then never (nor on the new connection after)

    srv = await serve(script)
    client = Http1Backend()
    short, longer = Timeouts(2.0, 0.15, 0.15), Timeouts(2.0, 1.0, 2.0)
    await (await client.post(srv.url, b"{}", {}, short)).read()
    t0 = asyncio.get_running_loop().time()
    assert await (await client.post(srv.url, b"{}", {}, longer)).read() == JSON
    assert asyncio.get_running_loop().time() - t0 >= 0.35  # not cut at the first one's 0.15
    await (await client.post(srv.url, b"{}", {}, Timeouts(2.0, 30.0, 60.0))).read()
    t0 = asyncio.get_running_loop().time()
    with pytest.raises(UpstreamError, match=r"no answer headers within 0\.2 s"):
        await client.post(srv.url, b"{}", {}, Timeouts(2.0, 0.2, 60.0))
    assert asyncio.get_running_loop().time() - t0 < 5.0  # not the last one's 30 s
    await client.close()
