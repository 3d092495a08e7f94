"""Issue 15 (hardening) over real HTTP: an in-process gateway on a real uvicorn server
(``inproc.py``), in front of emulated engines where a test needs one. Waits are bounded
polls, never sleeps for state."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
import pytest
import yaml

from fleetgate.state.store import (
    FailoverLimitStore,
    MemoryLimits,
    StoreUnavailable,
    create_stores,
)
from inproc import SERVERS, inproc_gateway, tick
from store_redis import RedisServer, unique_prefix

T0 = 1_790_000_000.0


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t

MODEL, SERVED = "llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct"
ADMIN, API = "admin-key-0123456789", "api-key-0123456789"
MESSAGES = [{"role": "user", "content": "hi"}]


def _pool(name: str, src: str, **extra: object) -> dict:
    return {"name": name, "accelerator": "h100", "engine": "vllm", "price_per_gpu_hour": 2.0,
            "endpoints": [src], "models": {MODEL: SERVED}, **extra}


NO_ENGINE = {"pools": [_pool("p", "http://127.0.0.1:9")]}  # nothing listens: no process
AUTH = {"auth": {"admin_keys": [ADMIN], "keys": [
    {"name": "t", "key": API, "tenant": "team-a", "limits": {"concurrency": 2}}]}}


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def _raw(url: str, request: bytes) -> bytes:
    """One raw HTTP exchange; returns what the server sent until it closed or went idle."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    writer.write(request)
    await writer.drain()
    data = b""
    try:
        while chunk := await asyncio.wait_for(reader.read(65536), 10):
            data += chunk
    except TimeoutError:
        pass
    writer.close()
    return data


# -- 4: bounded JSON decode, content parts ----------------------------------------------
@pytest.mark.parametrize("bad", ["deep-255", "deep-1000", "text-number", "text-null",
                                 "text-true"])
async def test_defect_4_bad_input_is_a_400_envelope_on_a_kept_connection(
        tmp_path: Path, bad: str) -> None:
    if bad.startswith("deep"):
        depth = int(bad.split("-")[1])
        body = (f'{{"model":"{MODEL}","max_tokens":4,"messages":[{{"role":"user",'
                f'"content":"hi"}}],"x":{"[" * depth}{"]" * depth}}}')
    else:
        value = bad.split("-")[1].replace("number", "1")
        body = (f'{{"model":"{MODEL}","max_tokens":4,"messages":[{{"role":"user",'
                f'"content":[{{"type":"text","text":{value}}}]}}]}}')
    async with inproc_gateway(NO_ENGINE, tmp_path) as (url, _), \
            httpx.AsyncClient(timeout=30) as client:
        resp = await client.post(url + "/v1/chat/completions", content=body,
                                 headers={"content-type": "application/json"})
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["type"] == "invalid_request_error"
        assert resp.headers.get("connection") != "close"  # keep-alive survives a 400


# -- 7: the x-request-id policy ------------------------------------------------------------
async def test_defect_7_request_id_is_bounded_and_ascii(tmp_path: Path) -> None:
    async with inproc_gateway(NO_ENGINE, tmp_path) as (url, _), \
            httpx.AsyncClient(timeout=30) as client:
        body = {"model": "nope", "messages": MESSAGES}
        ok = await client.post(url + "/v1/chat/completions", json=body,
                               headers={"x-request-id": "abc-123"})
        assert ok.status_code == 404 and ok.headers["x-request-id"] == "abc-123"
        huge = await client.post(url + "/v1/chat/completions", json=body,
                                 headers={"x-request-id": "a" * 60_000})
        assert 0 < len(huge.headers["x-request-id"]) <= 128
        odd = await client.post(url + "/v1/chat/completions", json=body,
                                headers=[(b"x-request-id", "r\u00e9sum\u00e9".encode())])
        assert odd.headers["x-request-id"].isascii() and "sum" not in odd.headers["x-request-id"]


# -- 9: /metrics behind the admin key -----------------------------------------------------
async def test_defect_9_metrics_need_the_admin_key_when_auth_is_on(tmp_path: Path) -> None:
    async with inproc_gateway({**NO_ENGINE, **AUTH}, tmp_path) as (url, _), \
            httpx.AsyncClient(timeout=30) as client:
        assert (await client.get(url + "/metrics")).status_code == 401
        denied = await client.get(url + "/metrics", headers={"authorization": f"Bearer {API}"})
        assert denied.status_code == 403 and "error" in denied.json()
        ok = await client.get(url + "/metrics", headers={"authorization": f"Bearer {ADMIN}"})
        assert ok.status_code == 200 and "fleetgate_" in ok.text
    async with inproc_gateway(NO_ENGINE, tmp_path) as (url, _), \
            httpx.AsyncClient(timeout=30) as client:
        assert (await client.get(url + "/metrics")).status_code == 200  # open gateway: open


# -- 10: admin writes: JSON only, same origin, capped ------------------------------------
async def test_defect_10_admin_posts_need_json_same_origin_and_a_small_body(
        tmp_path: Path) -> None:
    registration = ('{"pool":"w","url":"http://127.0.0.1:9","engine":"vllm",'
                    '"accelerator":"h100","models":{"m":"m"},"price_per_gpu_hour":1}')
    async with inproc_gateway(NO_ENGINE, tmp_path) as (url, state), \
            httpx.AsyncClient(timeout=30) as client:
        host = urlsplit(url).netloc
        plain = await client.post(url + "/admin/endpoints", content=registration,
                                  headers={"content-type": "text/plain",
                                           "origin": "http://evil.example"})
        assert plain.status_code in (403, 415) and "error" in plain.json()
        plain = await client.post(url + "/admin/endpoints", content=registration,
                                  headers={"content-type": "text/plain"})
        assert plain.status_code == 415 and "error" in plain.json()
        cross = await client.post(url + "/admin/reload", headers={"origin": "http://evil.example"})
        assert cross.status_code == 403
        big = await client.post(url + "/admin/endpoints", content=b"{" + b" " * (1 << 20),
                                headers={"content-type": "application/json"})
        assert big.status_code == 413 and "error" in big.json()
        assert "w-0" not in {ep.id for ep in state.generation.fleet.endpoints}
        same = await client.post(url + "/admin/reload", headers={"origin": f"http://{host}"})
        assert same.status_code == 200


# -- 13: every error in the envelope --------------------------------------------------------
async def test_defect_13_a_trailing_slash_is_an_enveloped_404(tmp_path: Path) -> None:
    async with inproc_gateway(NO_ENGINE, tmp_path) as (url, _), \
            httpx.AsyncClient(timeout=30) as client:
        for path in ("/v1/chat/completions/", "/v1/models/", "/admin/endpoints/"):
            resp = await client.post(url + path, json={}) if "chat" in path else \
                await client.get(url + path)
            assert resp.status_code == 404, path
            assert resp.json()["error"]["type"] == "not_found_error"


# -- 3: a non-streamed request is cancelled when its client leaves ----------------------
async def test_defect_3_a_client_leaving_a_non_stream_request_cancels_it(
        tmp_path: Path) -> None:
    config = {"pools": [_pool("slow", "emulated://vllm/h100?speed=1")], **AUTH}
    async with inproc_gateway(config, tmp_path) as (url, state):
        engine = state.generation.fleet.endpoints[0].url
        body = orjson.dumps({"model": MODEL, "max_tokens": 2000, "messages": MESSAGES})
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: "
                f"application/json\r\nauthorization: Bearer {API}\r\n"
                f"content-length: {len(body)}\r\n\r\n").encode()
        parts = urlsplit(url)
        conns = []
        for _ in range(2):  # the key's whole concurrency
            _, writer = await asyncio.open_connection(parts.hostname, parts.port)
            writer.write(head + body)
            await writer.drain()
            conns.append(writer)

        async def running(n: int) -> bool:
            async with httpx.AsyncClient(timeout=10) as c:
                return bool((await c.get(engine + "/emulator/state")).json()["running"] == n)

        await until(lambda: running(2), "both requests to run on the engine")
        for writer in conns:
            writer.transport.abort()  # the clients leave
        await until(lambda: running(0), "the engine to drop the abandoned requests")
        live = state.generation.fleet.live
        assert live.value(0, "in_flight") == 0
        async with httpx.AsyncClient(timeout=60) as client:  # the concurrency slots are free
            resp = await client.post(url + "/v1/chat/completions", headers={
                "authorization": f"Bearer {API}"}, json={"model": MODEL, "messages": MESSAGES,
                                                          "max_tokens": 2})
            assert resp.status_code == 200, resp.text
            metrics = (await client.get(url + "/metrics", headers={
                "authorization": f"Bearer {ADMIN}"})).text
        served = [line for line in metrics.splitlines()
                  if line.startswith("fleetgate_requests_total{") and 'status="200"' in line]
        assert sum(float(line.rsplit(" ", 1)[1]) for line in served) == 1  # only the last



# -- 8: slowloris ------------------------------------------------------------------------------
async def test_defect_8_slow_headers_and_unfinished_bodies_get_a_408(tmp_path: Path) -> None:
    async with inproc_gateway(NO_ENGINE, tmp_path, header_timeout_s=0.5,
                              body_timeout_s=0.5) as (url, _):
        head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"  # never finished
        answer = await _raw(url, head)
        status, _, body = answer.partition(b"\r\n\r\n")
        assert status.startswith(b"HTTP/1.1 408"), answer[:200]
        assert orjson.loads(body)["error"]["code"] == "request_timeout"
        unfinished = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: "
                      b"application/json\r\ncontent-length: 1000\r\n\r\n{\"model\":")
        answer = await _raw(url, unfinished)
        status, _, body = answer.partition(b"\r\n\r\n")
        assert status.startswith(b"HTTP/1.1 408"), answer[:200]
        assert orjson.loads(body)["error"]["type"] == "invalid_request_error"


async def test_a_body_that_arrived_with_its_head_is_still_capped(tmp_path: Path) -> None:
    """A body uvicorn read whole before the handler ran is taken without a wait: its size
    cap holds there too, also without a content-length (chunked, in one write)."""
    async with inproc_gateway(NO_ENGINE, tmp_path, max_body_bytes=2048) as (url, _):
        for size, status in ((4000, b"413"), (1000, b"404")):
            body = orjson.dumps({"model": "nobody-serves-this", "messages": [
                {"role": "user", "content": "x" * size}]})
            head = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\n"
                    b"content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n")
            chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
            answer = await _raw(url, head + chunked)
            assert answer.startswith(b"HTTP/1.1 " + status), answer[:200]


# -- 14: a shutdown deadline for streams ----------------------------------------------------
async def test_defect_14_shutdown_ends_long_streams_with_an_error_and_done(
        tmp_path: Path) -> None:
    config = {"pools": [_pool("slow", "emulated://vllm/h100?speed=1")]}
    async with inproc_gateway(config, tmp_path, shutdown_timeout_s=0.5) as (url, _):
        body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 4000, "stream": True}
        async with httpx.AsyncClient(timeout=30) as client, \
                client.stream("POST", url + "/v1/chat/completions", json=body) as resp:
            lines = resp.aiter_lines()
            data = [line async for line in _first(lines, 3)]
            SERVERS[url].should_exit = True  # a shutdown (SIGTERM) while the stream runs
            data += [line async for line in lines if line]
        frames = [line for line in data if line.startswith("data: ")]
        assert frames[-1] == "data: [DONE]"
        assert "shutting down" in frames[-2]  # the error event before it
        assert len(frames) < 4000  # cut short, not the whole answer


async def _first(lines: AsyncIterator[str], n: int) -> AsyncIterator[str]:
    got = 0
    async for line in lines:
        if line:
            yield line
            got += 1
            if got == n:
                return


# -- 11: a dead emulated engine is restarted ------------------------------------------------
async def test_defect_11_a_killed_emulated_engine_is_restarted(tmp_path: Path) -> None:
    config = {"pools": [_pool("emu", "emulated://vllm/h100?speed=20")]}
    async with inproc_gateway(config, tmp_path) as (url, state), \
            httpx.AsyncClient(timeout=30) as client:
        body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 2}
        for how in ("tick", "reload"):
            fleet = state.generation.fleet
            (handle,) = fleet.emulators.values()
            handle.kill()
            await until(lambda h=handle: _true(h.returncode is not None), "the engine to die")
            if how == "tick":
                await tick(state)  # the collector's tick restarts it, at its URL
                (fresh,) = fleet.emulators.values()
                assert fresh.url == handle.url and fresh.pid != handle.pid
            else:
                assert (await client.post(url + "/admin/reload")).status_code == 200
                (fresh,) = state.generation.fleet.emulators.values()
                assert fresh.returncode is None and fresh.pid != handle.pid
            await tick(state)
            resp = await client.post(url + "/v1/chat/completions", json=body)
            assert resp.status_code == 200, (how, resp.text)


async def _true(value: bool) -> bool:
    return value


# -- 12: a reload that removes a pool lets its requests finish ------------------------------
async def test_defect_12_a_removed_pools_requests_finish_after_a_reload(
        tmp_path: Path) -> None:
    keep = {"name": "keep", "accelerator": "h100", "engine": "vllm", "price_per_gpu_hour": 2.0,
            "endpoints": ["emulated://vllm/h100?speed=20"], "models": {"other": SERVED}}
    before = {"pools": [_pool("gone", "emulated://vllm/h100?speed=1"), keep]}
    async with inproc_gateway(before, tmp_path) as (url, state), \
            httpx.AsyncClient(timeout=60) as client:
        old = state.generation.fleet
        (gone,) = [h for k, h in old.emulators.items() if k.startswith("gone-0|")]
        body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 600, "stream": True}

        async def running() -> bool:
            return bool((await client.get(gone.url + "/emulator/state")).json()["running"])

        async def request() -> list[str]:
            async with client.stream("POST", url + "/v1/chat/completions", json=body) as resp:
                assert resp.status_code == 200
                return [line async for line in resp.aiter_lines() if line]

        task = asyncio.create_task(request())
        await until(running, "the request to run on the pool about to go")
        (tmp_path / "fleet.yaml").write_text(yaml.safe_dump({"pools": [keep]}))
        assert (await client.post(url + "/admin/reload")).status_code == 200
        lines = await asyncio.wait_for(task, 60)
        assert lines[-1] == "data: [DONE]"
        assert not any('"error"' in line for line in lines), lines[-3:]
        await until(lambda: _true(gone.returncode is not None),
                    "the removed pool's engine to stop once its request ended")


# -- 6: Redis failover: the replay races, stale pooled connections ---------------------------
class _SlowReleases(MemoryLimits):
    """A primary whose releases wait for ``go`` and that fails on demand."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.go = asyncio.Event()

    async def take(self, *args: Any, **kw: Any) -> Any:
        if self.down:
            raise StoreUnavailable("down on purpose")
        return await super().take(*args, **kw)

    async def release(self, key: str, hold_id: str) -> None:
        if self.down:
            raise StoreUnavailable("down on purpose")
        await self.go.wait()
        await super().release(key, hold_id)


async def test_defect_6_overlapping_replays_after_redis_returns_do_not_fail() -> None:
    """A replay waits on Redis; the outage flickers and a second success replays too: no
    ``IndexError: pop from empty list`` (a 500), every queued release done once."""
    primary, clock = _SlowReleases(), FakeClock()
    store = FailoverLimitStore(primary, MemoryLimits(), retry_every_s=1.0, clock=clock)
    primary.go.set()
    holds = [await store.acquire("c", 10, 30, T0) for _ in range(2)]
    primary.go.clear()
    primary.down = True
    for hold in holds:
        assert hold is not None
        await store.release("c", hold)  # queued: Redis is down
    primary.down, clock.t = False, clock.t + 1.0
    first = asyncio.create_task(store.take("k", 1, 100, 60, T0))  # replays, waits on Redis
    await asyncio.sleep(0)
    primary.down = True
    clock.t += 1.0
    await store.take("k", 1, 100, 60, T0)  # the outage flickers: degraded again
    primary.down, clock.t = False, clock.t + 1.0
    second = asyncio.create_task(store.take("k", 1, 100, 60, T0))  # another recovery
    await asyncio.sleep(0)
    also = await store.acquire("c", 10, 30, T0)  # released during the replay: queued or done
    assert also is not None
    third = asyncio.create_task(store.release("c", also))
    await asyncio.sleep(0)
    primary.go.set()
    await asyncio.wait_for(asyncio.gather(first, second, third), 10)
    await store.take("k", 1, 100, 60, T0)
    assert (await primary.take("probe", 1, 100, 60, T0)).allowed
    assert await primary.acquire("c", 1, 30, T0) is not None  # every hold released


async def test_defect_6_a_redis_restart_does_not_flip_degraded(tmp_path: Path) -> None:
    """Pooled connections to the Redis that went away are stale, not a new outage."""
    server = RedisServer().start()
    try:
        stores = create_stores(server.url, prefix=unique_prefix())
        try:
            await asyncio.gather(*(stores.limits.take("k", 1, 1000, 60, T0) for _ in range(8)))
            server.kill()
            server.start()  # back on the same port: every pooled connection is stale
            for _ in range(20):
                await stores.limits.take("k", 1, 1000, 60, T0)
                assert not stores.limits.degraded  # type: ignore[attr-defined]
        finally:
            await stores.close()
    finally:
        server.kill()


# -- 15 (fixed elsewhere): a reused x-request-id leaks no concurrency hold ---------------
async def test_defect_15_a_reused_request_id_leaks_no_concurrency_hold(tmp_path: Path) -> None:
    async with inproc_gateway({**NO_ENGINE, **AUTH}, tmp_path) as (url, _), \
            httpx.AsyncClient(timeout=30) as client:
        headers = {"authorization": f"Bearer {API}", "x-request-id": "same-id"}
        body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 2}
        for _ in range(3):  # the key's concurrency is 2: each pair fits if holds are freed
            pair = await asyncio.gather(*(client.post(url + "/v1/chat/completions",
                                                      json=body, headers=headers)
                                          for _ in range(2)))
            assert all(r.status_code in (502, 503) for r in pair)  # no engine; never a 429


# -- issue 24 item 7: the API document behind the admin key --------------------------------
async def test_issue24_7_docs_need_the_admin_key_when_auth_is_on(tmp_path: Path) -> None:
    """Before: /docs, /openapi.json and /docs/oauth2-redirect answered anyone, listing every
    admin path."""
    paths = ("/docs", "/openapi.json", "/docs/oauth2-redirect")
    async with inproc_gateway({**NO_ENGINE, **AUTH}, tmp_path) as (url, _), \
            httpx.AsyncClient(timeout=30) as client:
        for path in paths:
            anonymous = await client.get(url + path)
            assert anonymous.status_code == 401, path
            assert anonymous.json()["error"]["type"] == "authentication_error"
            tenant = await client.get(url + path, headers={"authorization": f"Bearer {API}"})
            assert tenant.status_code == 403, path
        doc = await client.get(url + "/openapi.json",
                               headers={"authorization": f"Bearer {ADMIN}"})
        assert doc.status_code == 200 and "/admin/endpoints" in doc.json()["paths"]
    async with inproc_gateway(NO_ENGINE, tmp_path) as (url, _), \
            httpx.AsyncClient(timeout=30) as client:
        assert (await client.get(url + "/openapi.json")).status_code == 200  # open gateway


# -- issue 24 item 8: a WebSocket upgrade gets the envelope ---------------------------------
async def test_issue24_8_a_websocket_upgrade_gets_the_openai_envelope(tmp_path: Path) -> None:
    """Before: 403 with an empty body."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus

    async with inproc_gateway(NO_ENGINE, tmp_path) as (url, _):
        for path, status in (("/v1/chat/completions", 405), ("/v1/realtime", 404)):
            with pytest.raises(InvalidStatus) as caught:
                async with connect(url.replace("http://", "ws://") + path):
                    pass
            response = caught.value.response
            assert response.status_code == status, path
            error = orjson.loads(response.body)["error"]
            assert set(error) == {"message", "type", "param", "code"} and error["message"]
            assert response.headers["content-type"] == "application/json"
