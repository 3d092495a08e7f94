"""The stores when Redis fails: typed errors, no hangs, failover to memory and back.

Each Redis test starts its own ``redis-server`` (``store_redis.RedisServer``) so it can kill,
freeze (SIGSTOP) and restart it without disturbing anyone. The failover wrappers run on a
fake clock, so "try Redis again after 1 s" is a clock step, not a sleep. The first tests
drive the failover logic with a primary that fails on demand, no Redis at all.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator

import pytest
import redis.asyncio as aioredis

from fleetgate.state.store import (
    EndpointShare,
    FailoverLimitStore,
    FailoverSharedState,
    MemoryLimits,
    MemorySharedState,
    StoreUnavailable,
    create_stores,
)
from fleetgate.state.store.redis import RedisLimits, RedisSharedState
from store_redis import RedisServer, unique_prefix

T0 = 1_790_000_000.0
SHARE = EndpointShare(2, 0.1, 0.01, 900.0, 1.0, 1.0, 0.0, "ready")


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class FlakyLimits(MemoryLimits):
    """A primary that raises ``StoreUnavailable`` while ``down``; counts the calls it gets."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.calls = 0

    def _check(self) -> None:
        self.calls += 1
        if self.down:
            raise StoreUnavailable("down on purpose")

    async def take(self, *args, **kw):
        self._check()
        return await super().take(*args, **kw)

    async def acquire(self, key: str, limit: int, ttl_s: float, now: float) -> str | None:
        self._check()
        return await super().acquire(key, limit, ttl_s, now)

    async def release(self, key: str, hold_id: str) -> None:
        self._check()
        await super().release(key, hold_id)

    async def add_spend(self, key: str, usd: float, period_key: str, ttl_s: float) -> float:
        self._check()
        return await super().add_spend(key, usd, period_key, ttl_s)

    async def spent(self, key: str, period_key: str) -> float:
        self._check()
        return await super().spent(key, period_key)


# -- failover logic, no Redis ----------------------------------------------------------
async def test_degraded_mode_probes_the_primary_once_per_interval() -> None:
    primary, clock = FlakyLimits(), FakeClock()
    store = FailoverLimitStore(primary, MemoryLimits(), retry_every_s=1.0, clock=clock)
    assert (await store.take("k", 1, 2, 60, T0)).allowed and primary.calls == 1
    primary.down = True
    assert (await store.take("k", 1, 2, 60, T0)).used == 1  # memory: per-replica count
    assert store.degraded and primary.calls == 2
    for _ in range(5):
        await store.take("k", 1, 100, 60, T0)
    assert primary.calls == 2  # no Redis call until the interval has passed
    clock.t += 1.0
    await store.take("k", 1, 100, 60, T0)
    assert primary.calls == 3 and store.degraded  # one probe, still down
    primary.down = False
    clock.t += 1.0
    v = await store.take("k", 1, 100, 60, T0)
    assert not store.degraded and v.used == 2  # back on the primary's own counts


async def test_holds_are_released_where_they_were_taken() -> None:
    primary, fallback, clock = FlakyLimits(), MemoryLimits(), FakeClock()
    store = FailoverLimitStore(primary, fallback, clock=clock)
    on_primary = await store.acquire("c", 1, 30, T0)
    assert on_primary is not None and on_primary.startswith("p:")
    primary.down = True
    on_fallback = await store.acquire("c", 1, 30, T0)
    assert on_fallback is not None and on_fallback.startswith("f:")
    await store.release("c", on_fallback)
    await store.release("c", on_primary)  # queued: Redis is down
    primary.down, clock.t = False, clock.t + 1.0
    assert await primary.acquire("c", 1, 30, T0) is None  # still held there
    await store.take("k", 1, 10, 60, T0)  # first success replays the queued release
    assert await primary.acquire("c", 1, 30, T0) is not None


async def test_spend_during_an_outage_is_kept_and_replayed() -> None:
    primary, clock = FlakyLimits(), FakeClock()
    store = FailoverLimitStore(primary, MemoryLimits(), clock=clock)
    assert await store.add_spend("team", 2.0, "2026-11", 3600) == 2.0
    primary.down = True
    assert await store.add_spend("team", 0.5, "2026-11", 3600) == 2.5  # known + delta
    assert await store.add_spend("team", 0.25, "2026-11", 3600) == 2.75
    assert await store.spent("team", "2026-11") == 2.75
    assert await store.spent("other", "2026-11") == 0.0
    primary.down, clock.t = False, clock.t + 1.0
    assert await store.spent("team", "2026-11") == 2.75  # replayed into the primary
    assert await primary.spent("team", "2026-11") == 2.75
    assert await store.add_spend("team", 1.0, "2026-11", 3600) == 3.75


async def test_shared_state_failover_never_raises() -> None:
    class Down(MemorySharedState):
        async def publish(self, *a, **kw):
            raise StoreUnavailable("down")

        async def peers(self, *a, **kw):
            raise StoreUnavailable("down")

        async def put_registration(self, *a, **kw):
            raise StoreUnavailable("down")

        async def drop_registration(self, *a, **kw):
            raise StoreUnavailable("down")

        async def registrations(self, *a, **kw):
            raise StoreUnavailable("down")

        async def publish_blob(self, *a, **kw):
            raise StoreUnavailable("down")

        async def blobs(self, *a, **kw):
            raise StoreUnavailable("down")

    clock = FakeClock()
    shared = FailoverSharedState(Down(), clock=clock)
    await shared.publish("a", {"ep": SHARE}, 5)
    assert await shared.peers("a") == {}
    assert shared.degraded
    for write in (shared.put_registration("http://w:1", b"r", 5, T0),
                  shared.drop_registration("http://w:1"),
                  shared.publish_blob("costs", "a", b"{}", 5)):
        clock.t += 1.0  # each one may probe the primary again
        await write
    clock.t += 1.0
    assert await shared.registrations() == []
    clock.t += 1.0
    assert await shared.blobs("costs") == {}
    assert shared.degraded


# -- a real Redis that dies, freezes and comes back ------------------------------------
@pytest.fixture()
def server() -> Iterator[RedisServer]:
    srv = RedisServer().start()
    yield srv
    if srv.popen is not None and srv.popen.poll() is None:
        os.kill(srv.popen.pid, signal.SIGCONT)
    srv.kill()


async def timed(coro):
    """A store call must answer (or fail) rather than hang; 5 s is a hang guard, not a timing
    claim (the store's own socket timeouts are far shorter)."""
    return await asyncio.wait_for(coro, timeout=5.0)


async def test_a_dead_redis_raises_store_unavailable_at_once(server: RedisServer) -> None:
    limits = RedisLimits.from_url(server.url, unique_prefix())
    shared = RedisSharedState.from_url(server.url, unique_prefix())
    assert (await limits.take("k", 1, 5, 60, T0)).allowed
    server.kill()
    for call in (limits.take("k", 1, 5, 60, T0), limits.acquire("c", 1, 30, T0),
                 limits.spent("t", "p"), shared.publish("a", {"ep": SHARE}, 5),
                 shared.peers("a"), shared.put_registration("http://w:1", b"r", 5, T0),
                 shared.registrations(), shared.publish_blob("costs", "a", b"{}", 5),
                 shared.blobs("costs")):
        with pytest.raises(StoreUnavailable):
            await timed(call)
    await limits.close()
    await shared.close()


async def test_a_frozen_redis_times_out(server: RedisServer) -> None:
    limits = RedisLimits.from_url(server.url, unique_prefix(), timeout_s=0.2)
    assert (await limits.take("k", 1, 5, 60, T0)).allowed
    assert server.popen is not None
    os.kill(server.popen.pid, signal.SIGSTOP)  # accepts connections, never answers
    with pytest.raises(StoreUnavailable):
        await timed(limits.take("k", 1, 5, 60, T0))
    os.kill(server.popen.pid, signal.SIGCONT)
    # a timed-out call's outcome is unknown: Redis may run it once it wakes
    assert (await limits.take("k", 1, 5, 60, T0)).used in (2, 3)
    await limits.close()


async def test_failover_to_memory_and_back_to_redis(server: RedisServer) -> None:
    clock, prefix = FakeClock(), unique_prefix()
    store = FailoverLimitStore(RedisLimits.from_url(server.url, prefix), MemoryLimits(),
                               clock=clock)
    for i in range(3):
        assert (await timed(store.take("rpm", 1, 5, 60, T0 + i))).used == i + 1
    hold = await store.acquire("conc", 2, 30, T0)
    assert hold is not None
    server.kill()
    v = await timed(store.take("rpm", 1, 5, 60, T0 + 3))
    assert store.degraded and (v.allowed, v.used) == (True, 1)  # per-replica from now on
    for i in range(20):
        await timed(store.take("rpm", 1, 100, 60, T0 + 4 + i))
    await timed(store.release("conc", hold))
    assert await timed(store.add_spend("team", 0.5, "2026-11", 3600)) == 0.5
    server.start()  # same port, empty (no persistence)
    assert (await store.take("rpm", 1, 100, 60, T0 + 30)).used == 22  # still on memory
    clock.t += 1.0
    v = await timed(store.take("rpm", 1, 5, 60, T0 + 31))
    assert not store.degraded and v.used == 1  # Redis again
    raw = aioredis.Redis.from_url(server.url)
    assert float(await raw.get(f"{prefix}usd:team:2026-11")) == 0.5  # spend replayed
    assert await raw.exists(f"{prefix}rl:rpm") == 1
    await raw.aclose()
    await store.close()


async def test_create_stores(server: RedisServer) -> None:
    memory = create_stores(None)
    assert isinstance(memory.shared, MemorySharedState) and not memory.degraded
    await memory.close()
    clock, prefix = FakeClock(), unique_prefix()
    a = create_stores(server.url, prefix=prefix, clock=clock)
    b = create_stores(server.url, prefix=prefix, clock=clock)
    await a.shared.publish("a", {"ep": SHARE}, 5)
    assert await b.shared.peers("b") == {"a": {"ep": SHARE}}
    assert (await a.limits.take("k", 1, 1, 60, T0)).allowed
    assert not (await b.limits.take("k", 1, 1, 60, T0)).allowed
    server.kill()
    assert await b.shared.peers("b") == {}
    assert (await b.limits.take("k", 1, 1, 60, T0)).allowed  # from memory
    assert b.degraded
    await a.close()
    await b.close()
