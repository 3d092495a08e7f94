"""Sharded scraping (``state/shard.py``): who visits what, the backup's takeover, and rows
travelling between replicas through a store. In-process, no sockets."""

from __future__ import annotations

import math

import numpy as np
import orjson
from routing_fixtures import make_fleet

from fleetgate.backends.capacity import EngineCapacity
from fleetgate.backends.metrics import EngineLoad
from fleetgate.state.shard import KIND, TAKEOVER, ScrapeShard, rendezvous
from fleetgate.state.store.memory import MemorySharedState

IDS = [f"pool-{k // 100}-{k % 100}" for k in range(10_000)]


def _owners(members: list[str]) -> np.ndarray:
    order = rendezvous(IDS, members)
    return np.array(members)[order[0]]


def test_rendezvous_spreads_the_endpoints_evenly_and_never_backs_up_its_own() -> None:
    members = ["gw-a", "gw-b", "gw-c", "gw-d"]
    order = rendezvous(IDS, members)
    counts = np.bincount(order[0], minlength=4)
    assert counts.sum() == len(IDS)
    assert np.all(np.abs(counts - len(IDS) / 4) < 0.05 * len(IDS) / 4), counts
    assert np.all(order[0] != order[1])  # an owner is never its own backup
    assert np.array_equal(order, rendezvous(IDS, members))  # the same on every replica


def test_a_join_moves_only_what_the_newcomer_wins_and_a_death_only_what_it_owned() -> None:
    four = _owners(["gw-a", "gw-b", "gw-c", "gw-d"])
    five = _owners(["gw-a", "gw-b", "gw-c", "gw-d", "gw-e"])
    moved = four != five
    assert set(five[moved]) == {"gw-e"}  # every move is to the newcomer
    assert 0.15 < moved.mean() < 0.25  # about a fifth
    order = rendezvous(IDS, ["gw-a", "gw-b", "gw-c", "gw-d"])
    backups = np.array(["gw-a", "gw-b", "gw-c", "gw-d"])[order[1]]
    three = _owners(["gw-a", "gw-c", "gw-d"])  # gw-b died
    moved = four != three
    assert np.all(four[moved] == "gw-b")  # only its endpoints moved ...
    assert np.array_equal(three[moved], backups[moved])  # ... each to its backup


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _shard(me: str, store: MemorySharedState, clock: Clock, interval: float = 1.0,
           n: int = 3, reported: dict[int, EngineCapacity] | None = None) -> ScrapeShard:
    live = make_fleet(ready=False)
    told = reported if reported is not None else {}  # what the collector would be told
    return ScrapeShard(live.endpoints[:n], live, me, store, interval, clock, told.__setitem__,
                       wall=lambda: 1e9 + clock.t)


def test_owned_on_full_ticks_backed_up_only_after_the_rows_stop() -> None:
    store, clock = MemorySharedState(), Clock()
    shard = _shard("gw-a", store, clock, n=3)
    assert not shard.due(clock.t, full=False).any()
    assert shard.due(clock.t, full=True).all()  # alone: every endpoint, on full ticks
    shard.assign(["gw-b"])
    assert shard.assign(["gw-b"]) is False  # unchanged membership: nothing recomputed
    assert np.all(shard.mine != shard.backup)  # with two replicas each is one or the other
    shard.heard[:] = clock.t  # the peer's rows are coming
    assert np.array_equal(shard.due(clock.t, full=True), shard.mine)
    clock.t += TAKEOVER * shard.interval_s * 0.9
    assert not shard.due(clock.t, full=False).any()
    clock.t += TAKEOVER * shard.interval_s * 0.2
    assert np.array_equal(shard.due(clock.t, full=False), shard.backup)  # took over
    assert shard.takeovers == int(shard.backup.sum())
    assert np.array_equal(shard.due(clock.t, full=True), shard.mine | shard.backup)


async def test_rows_travel_through_the_store_newest_first() -> None:
    store, clock = MemorySharedState(), Clock()
    reported: dict[int, EngineCapacity] = {}
    a, b = _shard("gw-a", store, clock), _shard("gw-b", store, clock, reported=reported)
    a.assign(["gw-b"])
    b.assign(["gw-a"])
    i = 1
    load = EngineLoad(waiting=3.0, running=7.0, kv_usage=0.25, generation_tokens_total=1000.0)
    cap = EngineCapacity(kv_capacity_tokens=400_000, max_batch=256, max_model_len=8192)
    a.visited(i, clock.t, "ready", "200", load, cap)
    await a.publish()
    clock.t += 0.2
    assert await b.pull() == 1
    live = b._live
    assert live.value(i, "queued") == 3.0 and live.value(i, "running") == 7.0
    assert live.value(i, "kv_usage") == 0.25
    assert live.stats[i].health.state == "ready"
    assert reported[i].kv_capacity_tokens == 400_000  # the collector skips its own read
    assert math.isclose(b.heard[i], clock.t - 0.2)  # the visit's time, on b's clock
    assert b.source[i] == "gw-a"
    assert await b.pull() == 0  # the same blob again: skipped
    # a newer visit that found the engine down: health travels, load stays unknown
    clock.t += 1.0
    a.visited(i, clock.t, "not_ready", "connect refused", None, None)
    await a.publish()
    assert await b.pull() == 1
    assert live.stats[i].health.state == "not_ready"
    assert live.stats[i].health.detail == "connect refused"
    # b's own newer visit wins over a's older row
    clock.t += 0.5
    b.visited(i, clock.t, "ready", "200", load, cap)
    b.heard[i] = clock.t
    a.visited(i, clock.t - 0.4, "not_ready", "timeout", None, None)
    await a.publish()
    assert await b.pull() == 0


async def test_alone_publishes_nothing_and_malformed_rows_are_skipped() -> None:
    store, clock = MemorySharedState(), Clock()
    a = _shard("gw-a", store, clock)
    a.visited(0, clock.t, "ready", "200", EngineLoad(running=1.0), None)
    await a.publish()
    assert await store.blobs(KIND) == {}
    b = _shard("gw-b", store, clock)
    b.assign(["gw-a"])
    await store.publish_blob(KIND, "gw-a", b"not json", 3.0)
    await store.publish_blob(KIND, "gw-c", orjson.dumps({IDS[0]: ["x"]}), 3.0)
    await store.publish_blob(KIND, "gw-d", orjson.dumps({"pool-unknown": [1e9, "ready"]}), 3.0)
    assert await b.pull() == 0  # nothing applied, nothing raised


async def test_the_collector_takes_over_between_its_full_ticks() -> None:
    """While replicas share the scraping: a full tick each interval and takeover steps at
    the quarter-intervals between (``Collector.run``; no more than STEPS - 1 between two
    full ticks, fewer when a tick runs long); alone, full ticks only. Counted, not timed."""
    import asyncio

    from fleetgate.state.collector import STEPS, Collector

    for shared in (True, False):
        live = make_fleet(ready=False)
        collector = Collector(live.endpoints, live, None, lambda: 0.0)  # type: ignore[arg-type]
        collector.shard = object() if shared else None  # type: ignore[assignment]
        ticks: list[bool] = []

        async def tick(full: bool = True, ticks: list[bool] = ticks) -> None:
            ticks.append(full)

        collector.tick = tick  # type: ignore[method-assign]
        task = asyncio.create_task(collector.run(0.1))
        for _ in range(400):  # 4 full ticks take 0.4 s; 20 s at most on a crawling machine
            if ticks.count(True) >= 4:
                break
            await asyncio.sleep(0.05)
        task.cancel()
        assert ticks.count(True) >= 4
        between = [len(run) for run in "".join("F" if f else "s" for f in ticks).split("F")]
        assert max(between) <= STEPS - 1
        assert (sum(between) > 0) == shared
