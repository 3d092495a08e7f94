"""The collector's probe and scrape of a ready endpoint, pipelined on one connection
(issue 26): against a real loopback engine, the same endpoint state, load and scrape errors
as the probe and then the scrape one after the other."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import fleetgate.state.collector as collector_module
from fleetgate.backends.http1 import Http1Backend
from fleetgate.backends.metrics import EngineLoad
from fleetgate.backends.probes import ProbeResult
from fleetgate.backends.relay import Timeouts
from fleetgate.routing import Endpoint
from fleetgate.state.collector import PROBE_EVERY, Collector
from fleetgate.state.fleet import prior_of
from fleetgate.state.live import LiveFleet

METRICS = (Path(__file__).parent.parent / "data" / "vllm_metrics.txt").read_bytes()


def _answer(status: str, body: bytes, extra: bytes = b"") -> bytes:
    return (b"HTTP/1.1 " + status.encode() + b"\r\ncontent-length: "
            + str(len(body)).encode() + b"\r\n" + extra + b"\r\n" + body)


@dataclass
class Engine:
    """/health (``health`` status) and /metrics (a captured vLLM exposition); records each
    request as (connection number, path)."""

    health: str = "200 OK"
    close_after_health: bool = False  # answers /health with connection: close, then closes
    metrics_silent: bool = False  # never answers /metrics
    seen: list[tuple[int, bytes]] = field(default_factory=list)
    connections: int = 0
    url: str = ""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        n = self.connections
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ", 2)[1]
                self.seen.append((n, path))
                if path == b"/health":
                    if self.close_after_health:
                        writer.write(_answer(self.health, b"", b"connection: close\r\n"))
                        break
                    writer.write(_answer(self.health, b""))
                elif path == b"/metrics":
                    if self.metrics_silent:
                        continue
                    writer.write(_answer("200 OK", METRICS))
                else:
                    writer.write(_answer("404 Not Found", b"{}"))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def engine() -> AsyncIterator[Engine]:
    eng = Engine()
    server = await asyncio.start_server(eng.handle, "127.0.0.1", 0)
    eng.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    yield eng
    server.close()


async def _sequential(self: Collector, ep: Endpoint, i: int,
                      ) -> tuple[ProbeResult, EngineLoad | None]:
    """What the collector did before pipelining: the probe, then the scrape if it passed."""
    health = await self._probe(ep)
    return health, (await self._scrape(ep, i) if health.ok else None)


async def _run(engine: Engine, change: dict[str, object]) -> tuple[object, ...]:
    """Ticks up to the first probe of the ready endpoint, with ``change`` made to the engine
    just before it; what the collector then holds, and how many pipelined pairs it sent."""
    ep = Endpoint("p-0", "p", engine.url, "vllm", "h100", "nvidia", {"m": "m"})
    live = LiveFleet([ep], [prior_of(ep)])
    now = [0.0]
    http = Http1Backend()
    pairs = []
    get_pair = http.get_pair

    async def counted(*args: Any, **kwargs: Any) -> Any:
        pairs.append(args[0])
        return await get_pair(*args, **kwargs)

    http.get_pair = counted  # type: ignore[method-assign]
    col = Collector([ep], live, http, lambda: now[0])
    try:
        for _ in range(PROBE_EVERY):
            await col.tick()
            now[0] += 1.0
        assert live.stats[0].health.state == "ready" and not pairs
        scraped_at = live.stats[0].last_scrape_at
        for key, value in change.items():
            setattr(engine, key, value)
        await col.tick()  # ticks == PROBE_EVERY: the probe is due with the scrape
        st = live.stats[0]
        return (st.health.state, st.health.detail, st.last_scrape_at > scraped_at,
                sum(col.scrape_errors.values()), len(pairs))
    finally:
        await http.close()
        for key in change:
            setattr(engine, key, getattr(Engine(), key))


@pytest.mark.parametrize("change", [
    {},
    {"health": "503 Service Unavailable"},
    {"close_after_health": True},
    {"metrics_silent": True},
], ids=["both-answered", "health-503", "closed-after-health", "metrics-silent"])
async def test_pipelined_visit_ends_as_the_sequential_one(
        engine: Engine, change: dict[str, object], monkeypatch: pytest.MonkeyPatch) -> None:
    if change.get("metrics_silent"):  # a scrape that never answers: shorter timeouts
        monkeypatch.setattr(collector_module, "SCRAPE_TIMEOUT_S", 0.3)
        monkeypatch.setattr(collector_module, "_TIMEOUTS", Timeouts(0.3, 0.3, 0.3))
    with monkeypatch.context() as patched:
        patched.setattr(Collector, "_probe_and_scrape", _sequential)
        *sequential, no_pairs = await _run(engine, change)
    assert no_pairs == 0
    engine.seen.clear()
    *pipelined, pairs = await _run(engine, change)
    assert pairs == 1 and pipelined == sequential
    if not change:  # scraped, no error; every request on the one connection
        assert pipelined[2] and pipelined[3] == 0
        assert {n for n, _ in engine.seen} == {engine.connections}
        assert [p for _, p in engine.seen][-2:] == [b"/health", b"/metrics"]
    if change.get("health"):
        assert pipelined[1] == "503" and not pipelined[2] and pipelined[3] == 0
    if change.get("metrics_silent"):
        assert pipelined[1] == "200" and not pipelined[2] and pipelined[3] == 1


async def test_a_cancelled_tick_cancels_its_visits() -> None:
    """Visits are awaited one by one, not gathered: cancelling the tick still cancels
    every visit it started (as gather did), none is left running."""
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # never answers

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    eps = [Endpoint(f"p-{k}", "p", url, "vllm", "h100", "nvidia", {"m": "m"}) for k in range(3)]
    live = LiveFleet(eps, [prior_of(ep) for ep in eps])
    http = Http1Backend()
    col = Collector(eps, live, http, lambda: 0.0)

    def visits() -> list[asyncio.Task[Any]]:
        return [t for t in asyncio.all_tasks()
                if getattr(t.get_coro(), "__qualname__", "") == "Collector._one"]

    tick = asyncio.ensure_future(col.tick())
    await asyncio.sleep(0.2)  # every visit waits on its probe
    assert len(visits()) == 3
    tick.cancel()
    with pytest.raises(asyncio.CancelledError):
        await tick
    await asyncio.sleep(0)
    assert not visits()  # none left running
    await http.close()
    server.close()
    await asyncio.sleep(0.05)  # the engine's handlers see the connections close
