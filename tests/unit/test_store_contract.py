"""The store contract: one suite, run against the in-memory stores, the same served to
``serve --workers`` over a Unix socket (``local``), and the Redis stores.

Time is injected: limits take ``now`` from the test, the memory shared state runs on a fake
clock. The only wall-clock wait is Redis's own key expiry for a dead replica (TTL 0.3 s,
bounded poll; likewise for a lapsed registration and a dead replica's cost snapshot).
Redis tests use a real server (``store_redis.find_test_redis``), one unique key
prefix per test. The Redis-only tests at the end check that two clients (two replicas) see
one limit, also under concurrent calls.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import orjson
import pytest
import redis.asyncio as aioredis

from fleetgate.state.store import (
    EndpointShare,
    LimitStore,
    MemoryLimits,
    MemorySharedState,
    SharedState,
)
from fleetgate.state.store.base import decode_shares, encode_shares
from fleetgate.state.store.local import LocalStore, LocalStoreServer
from fleetgate.state.store.redis import RedisLimits, RedisSharedState
from store_redis import unique_prefix, wait_key_gone

T0 = 1_790_000_000.0  # wall-clock epoch seconds, as the gateway passes them
W = 60.0


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@dataclass
class Harness:
    shared: SharedState
    limits: LimitStore
    share_ttl_s: float
    let_expire: Callable[[str], Awaitable[None]]  # a key written with ttl share_ttl_s

    async def let_shares_expire(self, replica_id: str) -> None:
        await self.let_expire(f"replica:{replica_id}")


@pytest.fixture(params=["memory", "local", "redis"])
async def store(request: pytest.FixtureRequest,
                tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Harness]:
    if request.param in ("memory", "local"):
        clock = FakeClock()

        async def advance(_key: str) -> None:
            clock.t += 5.01

        shared, limits = MemorySharedState(clock), MemoryLimits(clock)
        if request.param == "memory":
            yield Harness(shared, limits, 5.0, advance)
            return
        path = str(tmp_path_factory.mktemp("store") / "store.sock")
        server = LocalStoreServer(shared, limits)
        await server.start(path)
        client = LocalStore(path, timeout_s=5.0)
        yield Harness(client, client, 5.0, advance)
        await client.close()
        await server.close()
        return
    url, prefix = request.getfixturevalue("redis_url"), unique_prefix()
    raw = aioredis.Redis.from_url(url)

    async def expire(key: str) -> None:  # Redis expires keys itself: bounded poll
        await wait_key_gone(raw, prefix + key)

    h = Harness(RedisSharedState.from_url(url, prefix), RedisLimits.from_url(url, prefix),
                0.3, expire)
    yield h
    await h.shared.close()
    await h.limits.close()
    await raw.aclose()


def share(in_flight: float, **kw: object) -> EndpointShare:
    base: dict = dict(in_flight=in_flight, ttft_s=0.2, tpot_s=0.02, tokens_per_s=1500.0,
                      k_ttft=1.1, k_tpot=0.9, breaker_open_until=0.0, health="ready")
    return EndpointShare(**{**base, **kw})


# -- SharedState -----------------------------------------------------------------------
async def test_peers_are_the_other_replicas(store: Harness) -> None:
    a = {"ep-1": share(3, requests_per_s=4.5),
         "ep-2": share(0, ttft_s=None, tpot_s=None, tokens_per_s=None)}
    b = {"ep-1": share(5, breaker_open_until=math.inf, health="not_ready")}
    await store.shared.publish("a", a, ttl_s=30)
    await store.shared.publish("b", b, ttl_s=30)
    assert await store.shared.peers("a") == {"b": b}
    assert await store.shared.peers("b") == {"a": a}
    assert await store.shared.peers("c") == {"a": a, "b": b}


def test_shares_of_a_replica_from_before_request_rates_still_decode() -> None:
    old = orjson.dumps({"ep-1": [3, 0.2, 0.02, 1500.0, 1.1, 0.9, 0.0, "ready"]})
    assert decode_shares(old) == {"ep-1": share(3)}  # requests_per_s 0: none said
    new = encode_shares({"ep-1": share(3, requests_per_s=4.5)})
    assert orjson.loads(new)["ep-1"][:8] == orjson.loads(old)["ep-1"]  # appended: old ones read it
    assert decode_shares(new)["ep-1"].requests_per_s == 4.5


async def test_publish_replaces_the_replicas_shares(store: Harness) -> None:
    await store.shared.publish("a", {"ep-1": share(1), "ep-2": share(2)}, ttl_s=30)
    await store.shared.publish("a", {"ep-2": share(7)}, ttl_s=30)
    assert await store.shared.peers("b") == {"a": {"ep-2": share(7)}}


async def test_a_dead_replicas_shares_expire(store: Harness) -> None:
    await store.shared.publish("alive", {"ep-1": share(1)}, ttl_s=30)
    await store.shared.publish("dead", {"ep-1": share(9)}, ttl_s=store.share_ttl_s)
    assert set(await store.shared.peers("me")) == {"alive", "dead"}
    await store.let_shares_expire("dead")
    assert await store.shared.peers("me") == {"alive": {"ep-1": share(1)}}


# -- SharedState: registrations and cost snapshots --------------------------------------
async def test_registrations_keep_the_order_they_first_registered_in(store: Harness) -> None:
    shared = store.shared
    await shared.put_registration("http://b:8000", b"rb", 30, now=T0 + 1)
    await shared.put_registration("http://a:8000", b"ra", 30, now=T0 + 1)
    await shared.put_registration("http://c:8000", b"rc", 30, now=T0)
    await shared.put_registration("http://b:8000", b"rb2", 30, now=T0 + 5)  # a heartbeat
    regs = await shared.registrations()
    assert [(r.key, r.record, r.first_seen) for r in regs] == [
        ("http://c:8000", b"rc", T0), ("http://a:8000", b"ra", T0 + 1),
        ("http://b:8000", b"rb2", T0 + 1)]
    assert all(0 < r.ttl_left_s <= 30 for r in regs)
    await shared.drop_registration("http://a:8000")
    await shared.drop_registration("http://nobody:8000")  # unknown: ignored
    assert [r.key for r in await shared.registrations()] == ["http://c:8000", "http://b:8000"]


async def test_a_lapsed_registration_is_gone_and_comes_back_last(store: Harness) -> None:
    shared = store.shared
    await shared.put_registration("http://x:1", b"x", store.share_ttl_s, now=T0)
    await shared.put_registration("http://y:1", b"y", 30, now=T0 + 1)
    await store.let_expire("reg:http://x:1")
    assert [r.key for r in await shared.registrations()] == ["http://y:1"]
    await shared.put_registration("http://x:1", b"x", 30, now=T0 + 9)  # registers anew
    assert [(r.key, r.first_seen) for r in await shared.registrations()] == [
        ("http://y:1", T0 + 1), ("http://x:1", T0 + 9)]


async def test_cost_snapshots_of_every_replica(store: Harness) -> None:
    shared = store.shared
    assert await shared.blobs("costs") == {}
    await shared.publish_blob("costs", "a", b'{"v":1}', 30)
    await shared.publish_blob("costs", "b", b'{"v":2}', store.share_ttl_s)
    await shared.publish_blob("costs", "a", b'{"v":3}', 30)  # replaces a's
    assert await shared.blobs("costs") == {"a": b'{"v":3}', "b": b'{"v":2}'}
    await store.let_expire("costs:b")
    assert await shared.blobs("costs") == {"a": b'{"v":3}'}
    await shared.publish_blob("rows", "a", b"[]", 30)  # kinds apart
    assert await shared.blobs("rows") == {"a": b"[]"}
    assert await shared.blobs("costs") == {"a": b'{"v":3}'}


# -- RateLimits: sliding window --------------------------------------------------------
async def test_take_allows_up_to_the_limit_then_refuses(store: Harness) -> None:
    for i in range(3):
        v = await store.limits.take("rpm:k", 1, 3, W, T0 + i)
        assert (v.allowed, v.used, v.retry_after_s) == (True, i + 1, 0)
    v = await store.limits.take("rpm:k", 1, 3, W, T0 + 10)
    assert (v.allowed, v.used) == (False, 3)
    assert v.retry_after_s == pytest.approx(W - 10)  # when the entry at T0 leaves
    v = await store.limits.take("rpm:k", 1, 3, W, T0 + 11)
    assert (v.allowed, v.used) == (False, 3)  # a refusal adds nothing
    assert (await store.limits.take("rpm:other", 1, 3, W, T0 + 11)).allowed  # keys are apart


async def test_the_window_slides(store: Harness) -> None:
    for i in range(3):
        assert (await store.limits.take("k", 1, 3, W, T0 + i)).allowed
    assert not (await store.limits.take("k", 1, 3, W, T0 + W - 0.001)).allowed
    v = await store.limits.take("k", 1, 3, W, T0 + W)  # the entry at T0 is out at T0 + W
    assert (v.allowed, v.used) == (True, 3)
    assert not (await store.limits.take("k", 1, 3, W, T0 + W + 0.5)).allowed
    v = await store.limits.take("k", 1, 3, W, T0 + 10 * W)  # long idle: all expired
    assert (v.allowed, v.used) == (True, 1)


@pytest.mark.parametrize(("amount", "allowed", "retry_after_s"), [
    (2, True, 0.0),           # 4 + 4 + 2 = 10 fits
    (5, False, W - 3),        # needs the 4 at T0 gone
    (7, False, W - 1),        # needs both gone: the 4 at T0 + 2 leaves at T0 + 2 + W
    (11, False, W),           # can never fit: a full window
])
async def test_amounts_and_retry_after(store: Harness, amount: float, allowed: bool,
                                       retry_after_s: float) -> None:
    await store.limits.take("k", 4, 10, W, T0)
    await store.limits.take("k", 4, 10, W, T0 + 2)
    v = await store.limits.take("k", amount, 10, W, T0 + 3)
    assert v.allowed is allowed
    assert v.used == (8 + amount if allowed else 8)
    assert v.retry_after_s == pytest.approx(retry_after_s)


async def test_amount_zero_checks_and_record_adds(store: Harness) -> None:
    """Tokens per minute: check before (amount 0), record after the response."""
    assert (await store.limits.take("tpm", 0, 100, W, T0)).allowed
    await store.limits.record("tpm", 60, W, T0)
    v = await store.limits.take("tpm", 0, 100, W, T0 + 1)
    assert (v.allowed, v.used) == (True, 60)
    await store.limits.record("tpm", 50, W, T0 + 2)  # past the limit: recorded anyway
    v = await store.limits.take("tpm", 0, 100, W, T0 + 3)
    assert (v.allowed, v.used) == (False, 110)
    assert v.retry_after_s == pytest.approx(W - 3)  # 50 < 100 once the 60 leaves
    await store.limits.record("tpm", 40, W, T0 + 4)
    v = await store.limits.take("tpm", 0, 100, W, T0 + W + 0.5)
    assert (v.allowed, v.used) == (True, 90)
    v = await store.limits.take("tpm", 0, 90, W, T0 + W + 0.5)  # used == limit: refused
    assert (v.allowed, v.retry_after_s) == (False, pytest.approx(1.5))
    await store.limits.record("tpm", 0, W, T0 + W + 1)  # nothing to add
    assert (await store.limits.take("tpm", 0, 100, W, T0 + W + 1)).used == 90


async def test_fractional_amounts_keep_an_exact_total(store: Harness) -> None:
    for i in range(10):
        await store.limits.record("usd", 0.1, 10, T0 + i)
    v = await store.limits.take("usd", 0, 100, 10, T0 + 10)  # the first 0.1 left
    assert v.used == pytest.approx(0.9)
    v = await store.limits.take("usd", 0, 100, 10, T0 + 100)
    assert v.used == 0


# -- RateLimits: concurrency -----------------------------------------------------------
async def test_acquire_and_release(store: Harness) -> None:
    h1 = await store.limits.acquire("conc", 2, 30, T0)
    h2 = await store.limits.acquire("conc", 2, 30, T0)
    assert h1 is not None and h2 is not None and h1 != h2
    assert await store.limits.acquire("conc", 2, 30, T0) is None
    assert await store.limits.acquire("conc:other", 2, 30, T0) is not None
    await store.limits.release("conc", h1)
    await store.limits.release("conc", h1)  # twice: harmless
    await store.limits.release("conc", "no-such-hold")
    h3 = await store.limits.acquire("conc", 2, 30, T0 + 1)
    assert h3 is not None
    assert await store.limits.acquire("conc", 2, 30, T0 + 1) is None


async def test_holds_of_a_crashed_replica_expire(store: Harness) -> None:
    assert await store.limits.acquire("conc", 2, 30, T0) is not None
    assert await store.limits.acquire("conc", 2, 10, T0) is not None
    assert await store.limits.acquire("conc", 2, 30, T0 + 9) is None
    assert await store.limits.acquire("conc", 2, 30, T0 + 10) is not None  # 10 s hold gone
    assert await store.limits.acquire("conc", 2, 30, T0 + 11) is None
    assert await store.limits.acquire("conc", 2, 30, T0 + 41) is not None  # both gone


# -- Budgets ---------------------------------------------------------------------------
async def test_spend_totals_per_key_and_period(store: Harness) -> None:
    day, month = "2026-11-30", "2026-11"
    assert await store.limits.spent("team-a", day) == 0
    assert await store.limits.add_spend("team-a", 1.5, day, 86400 * 2) == 1.5
    assert await store.limits.add_spend("team-a", 2.25, day, 86400 * 2) == 3.75
    assert await store.limits.add_spend("team-a", 0.125, month, 86400 * 62) == 0.125
    assert await store.limits.add_spend("team-b", 1.0, day, 86400 * 2) == 1.0
    assert await store.limits.spent("team-a", day) == 3.75
    assert await store.limits.spent("team-a", month) == 0.125
    assert await store.limits.spent("team-a", "2026-12-01") == 0


# -- reservations: tokens in the window, $ against a cap (issue 24) ---------------------
async def test_a_taken_amount_is_a_reservation_that_record_replaces(store: Harness) -> None:
    v = await store.limits.take("tpm", 40, 100, W, T0)
    assert v.allowed and v.entry is not None
    w = await store.limits.take("tpm", 50, 100, W, T0 + 1)
    assert w.allowed and w.entry not in (None, v.entry)
    assert not (await store.limits.take("tpm", 20, 100, W, T0 + 2)).allowed  # 90 reserved
    await store.limits.record("tpm", 12, W, T0 + 3, replaces=v.entry)  # used 12 of its 40
    assert (await store.limits.take("tpm", 0, 100, W, T0 + 3)).used == 62
    await store.limits.record("tpm", 5, W, T0 + 4, replaces=v.entry)  # settled twice: adds
    assert (await store.limits.take("tpm", 0, 100, W, T0 + 4)).used == 67
    await store.limits.record("tpm", 0, W, T0 + 5, replaces=w.entry)  # given back
    assert (await store.limits.take("tpm", 0, 100, W, T0 + 5)).used == 17
    await store.limits.record("tpm", 0, W, T0 + 5, replaces="no-such-entry")
    v = await store.limits.take("tpm", 83, 100, W, T0 + 6)  # 17 + 83 fits exactly
    assert (v.allowed, v.used) == (True, 100)
    assert (await store.limits.take("tpm", 0, 100, W, T0 + 3 + W)).used == 88  # 12 left
    assert (await store.limits.take("rpm", 0, 1, W, T0)).entry is None  # a check adds none


async def test_an_unsettled_reservation_leaves_with_its_window(store: Harness) -> None:
    v = await store.limits.take("tpm", 90, 100, W, T0)
    assert not (await store.limits.take("tpm", 20, 100, W, T0 + W - 1)).allowed
    assert (await store.limits.take("tpm", 20, 100, W, T0 + W)).allowed  # its replica died
    await store.limits.record("tpm", 30, W, T0 + W + 1, replaces=v.entry)  # late: adds only
    assert (await store.limits.take("tpm", 0, 100, W, T0 + W + 1)).used == 50


async def test_spend_reservations_count_against_the_cap(store: Harness) -> None:
    day = "2026-11-30"
    a = await store.limits.reserve_spend("t", 0.4, day, 1.0, 30, T0)
    b = await store.limits.reserve_spend("t", 0.5, day, 1.0, 30, T0)
    assert a is not None and b is not None and a != b
    c = await store.limits.reserve_spend("t", 0.5, day, 1.0, 30, T0)  # 0.9 < 1: room left
    assert c is not None
    assert await store.limits.reserve_spend("t", 0.01, day, 1.0, 30, T0) is None  # 1.4
    assert await store.limits.spent("t", day) == 0  # reservations are not spend
    assert await store.limits.add_spend("t", 0.1, day, 86400, settles=a) == pytest.approx(0.1)
    assert await store.limits.add_spend("t", 0.2, day, 86400, settles=b) == pytest.approx(0.3)
    d = await store.limits.reserve_spend("t", 0.6, day, 1.0, 30, T0)  # 0.3 + 0.5 < 1
    assert d is not None
    assert await store.limits.reserve_spend("t", 0.01, day, 1.0, 30, T0) is None  # 1.4
    assert await store.limits.add_spend("t", 0.0, day, 86400, settles=c) == pytest.approx(0.3)
    assert await store.limits.add_spend("t", 0.0, day, 86400, settles=c) == pytest.approx(0.3)
    assert await store.limits.reserve_spend("t", 0.01, day, 1.0, 30, T0) is not None  # 0.9
    assert await store.limits.reserve_spend("t", 0.5, "2026-12-01", 1.0, 30, T0) is not None
    assert await store.limits.reserve_spend("u", 0.5, day, 1.0, 30, T0) is not None


async def test_spend_reservations_of_a_dead_replica_expire(store: Harness) -> None:
    day = "2026-11-30"
    assert await store.limits.reserve_spend("t", 0.7, day, 1.0, 10, T0) is not None
    assert await store.limits.reserve_spend("t", 0.7, day, 1.0, 30, T0) is not None
    assert await store.limits.reserve_spend("t", 0.1, day, 1.0, 30, T0 + 9) is None
    late = await store.limits.reserve_spend("t", 0.3, day, 1.0, 30, T0 + 10)  # 10 s one gone
    assert late is not None
    assert await store.limits.reserve_spend("t", 0.1, day, 1.0, 30, T0 + 11) is None  # 1.0
    assert await store.limits.reserve_spend("t", 0.1, day, 1.0, 30, T0 + 41) is not None


# -- two clients, one limit: two workers (local) or two replicas (Redis) -----------------
@pytest.fixture(params=["local", "redis"])
async def two_replicas(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                       ) -> AsyncIterator[tuple[LimitStore, LimitStore]]:
    if request.param == "local":
        path = str(tmp_path_factory.mktemp("store") / "store.sock")
        server = LocalStoreServer(MemorySharedState(), MemoryLimits())
        await server.start(path)
        local = LocalStore(path, timeout_s=5.0), LocalStore(path, timeout_s=5.0)
        yield local
        for client in local:
            await client.close()
        await server.close()
        return
    url, prefix = request.getfixturevalue("redis_url"), unique_prefix()
    # a generous timeout: these tests are about atomicity, and 60 concurrent scripts opening
    # their first connections on a busy CI machine can take longer than the 0.25 s default
    a, b = (RedisLimits.from_url(url, prefix, timeout_s=5.0),
            RedisLimits.from_url(url, prefix, timeout_s=5.0))
    yield a, b
    await a.close()
    await b.close()


async def test_two_replicas_share_one_limit(
        two_replicas: tuple[LimitStore, LimitStore]) -> None:
    a, b = two_replicas
    for i in range(6):
        assert (await (a, b)[i % 2].take("rpm", 1, 6, W, T0 + i)).allowed
    assert not (await a.take("rpm", 1, 6, W, T0 + 7)).allowed
    assert not (await b.take("rpm", 1, 6, W, T0 + 7)).allowed
    hold = await a.acquire("conc", 1, 30, T0)
    assert hold is not None
    assert await b.acquire("conc", 1, 30, T0) is None
    await b.release("conc", hold)  # any replica may release a hold id it is given
    assert await b.acquire("conc", 1, 30, T0) is not None
    await a.add_spend("team", 1.25, "2026-11", 60)
    assert await b.add_spend("team", 1.0, "2026-11", 60) == 2.25


async def test_concurrent_takes_are_atomic(
        two_replicas: tuple[LimitStore, LimitStore]) -> None:
    a, b = two_replicas
    verdicts = await asyncio.gather(*[(a, b)[i % 2].take("rpm", 1, 25, W, T0 + i * 1e-3)
                                      for i in range(60)])
    assert sum(v.allowed for v in verdicts) == 25
    holds = await asyncio.gather(*[(a, b)[i % 2].acquire("conc", 7, 30, T0)
                                   for i in range(30)])
    assert sum(h is not None for h in holds) == 7


async def test_concurrent_reservations_are_atomic(
        two_replicas: tuple[LimitStore, LimitStore]) -> None:
    a, b = two_replicas
    verdicts = await asyncio.gather(*[(a, b)[i % 2].take("tpm", 30, 300, W, T0 + i * 1e-3)
                                      for i in range(60)])
    assert sum(v.allowed for v in verdicts) == 10
    holds = await asyncio.gather(*[(a, b)[i % 2].reserve_spend("t", 0.25, "d", 2.0, 30, T0)
                                   for i in range(30)])
    assert sum(h is not None for h in holds) == 8  # 7 * 0.25 < 2: the 8th still fits
    settled = [h for h in holds if h is not None]
    await asyncio.gather(*[(b, a)[i % 2].add_spend("t", 0.125, "d", 60, settles=h)
                           for i, h in enumerate(settled)])
    assert await a.spent("t", "d") == 1.0
    more = await asyncio.gather(*[(a, b)[i % 2].reserve_spend("t", 0.25, "d", 2.0, 30, T0)
                                  for i in range(30)])
    assert sum(h is not None for h in more) == 4  # 1.0 + 3 * 0.25 < 2
