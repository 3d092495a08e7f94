"""Issue 24, item 3: tpm and $ are reserved at admission and settled exactly once.

``LimitEnforcer`` over the in-memory store (time injected), and the real ``ProxyService``
over ``FakeBackend`` with ``LimitsObserver`` settling (no sockets): whatever way a request
ends (answered, refused upstream, cut, shed, cancelled), its reservations are replaced by
what it used or given back, and its concurrency hold is freed. The failover store keeps
reservations where they were made across a Redis outage.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from fleetgate.backends.fake import Answer, FakeBackend, Refuse
from fleetgate.backends.relay import Timeouts
from fleetgate.config import FleetConfig
from fleetgate.config.auth import KeyLimits
from fleetgate.gateway.auth import Principal
from fleetgate.gateway.decisions import DecisionLog
from fleetgate.gateway.errors import GatewayError, RateLimited
from fleetgate.gateway.limits import (
    UNCAPPED_OUTPUT_TOKENS,
    LimitEnforcer,
    LimitsObserver,
    PromptScale,
    _day,
    attempt_cost_usd,
    worst_case_usd,
)
from fleetgate.gateway.proxy.apis import APIS
from fleetgate.gateway.proxy.observer import AttemptResult
from fleetgate.gateway.proxy.request import ProxyRequest
from fleetgate.gateway.proxy.service import Generation, ProxyService
from fleetgate.routing import RoutingRequest, build_router
from fleetgate.state.fleet import Fleet
from fleetgate.state.store import FailoverLimitStore, MemoryLimits, StoreUnavailable

T0 = 1_790_000_000.0
DAY = _day(T0)
URL = "http://h100:8000"
MODEL, SERVED = "llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct"
OK = (b'{"model":"%s","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],'
      b'"usage":{"prompt_tokens":13,"completion_tokens":7,"total_tokens":20}}' % SERVED.encode())
CHUNK = b'data: {"id":"c","model":"%s","choices":[{"delta":{"content":"hi"}}]}\n\n' % \
    SERVED.encode()
USAGE = (b'data: {"id":"c","model":"m","choices":[],"usage":{"prompt_tokens":13,'
         b'"completion_tokens":7,"total_tokens":20}}\n\n')
DONE = b"data: [DONE]\n\n"


def principal(**limits: Any) -> Principal:
    return Principal("k", "team", limits=KeyLimits(**limits))


def routing(max_tokens: int | None = 16, stream: bool = False) -> RoutingRequest:
    return RoutingRequest(MODEL, stream=stream, max_tokens=max_tokens, prompt_chars=20)


def fleet() -> Fleet:
    config = FleetConfig.model_validate({"pools": [
        {"name": "h100", "accelerator": "h100", "engine": "vllm", "price_per_gpu_hour": 3.6,
         "endpoints": [URL], "models": {MODEL: SERVED}}],
        "policies": {"fast": {"strategy": "latency"}}, "default_policy": "fast"})
    f = Fleet(config, http=None)  # type: ignore[arg-type]  # never started: no I/O
    f.live.on_probe(0, f.clock(), True, "200")
    return f


async def drained(enforcer: LimitEnforcer) -> None:
    while enforcer._tasks:
        await asyncio.gather(*enforcer._tasks, return_exceptions=True)


async def tpm_used(store: MemoryLimits) -> float:
    return (await store.take("tpm:k", 0, math.inf, 60, T0)).used


def reserved_usd(store: MemoryLimits) -> float:
    return sum(r.total for r in store._reserved.values())


# -- admission ---------------------------------------------------------------------------
async def test_a_burst_is_admitted_up_to_the_tpm_by_its_reservations() -> None:
    store = MemoryLimits()
    enforcer = LimitEnforcer(store, clock=lambda: T0)
    admitted, refused = 0, []
    for _ in range(200):  # prompt 20 chars: 5 + 8 tokens, plus max_tokens 16 = 29 each
        try:
            await enforcer.admit(principal(tpm=300), routing())
            admitted += 1
        except RateLimited as exc:
            refused.append(exc)
    assert admitted == 10 and await tpm_used(store) == 290
    assert refused[0].status == 429 and int(refused[0].headers["retry-after"]) == 60


async def test_a_request_never_reserves_more_than_the_whole_limit() -> None:
    store = MemoryLimits()
    enforcer = LimitEnforcer(store, clock=lambda: T0)
    await enforcer.admit(principal(tpm=300), routing(max_tokens=None))  # 13 + 4096
    assert await tpm_used(store) == 300
    with pytest.raises(RateLimited):
        await enforcer.admit(principal(tpm=300), routing(max_tokens=1))


async def test_a_later_refusal_gives_the_earlier_reservations_back() -> None:
    store = MemoryLimits()
    enforcer = LimitEnforcer(store, clock=lambda: T0)
    f = fleet()
    held = await enforcer.admit(principal(tpm=300, usd_per_day=1.0, concurrency=1), routing(),
                                f.snapshot)
    one = reserved_usd(store)
    assert held is not None and one > 0
    with pytest.raises(RateLimited, match="requests running"):
        await enforcer.admit(principal(tpm=300, usd_per_day=1.0, concurrency=1), routing(),
                             f.snapshot)
    await drained(enforcer)
    assert await tpm_used(store) == 29  # the first one's only
    assert reserved_usd(store) == pytest.approx(one)
    await enforcer.settle(held)
    assert await tpm_used(store) == 0 and reserved_usd(store) == 0
    assert await store.acquire("conc:k", 1, 60, T0) is not None  # the hold was freed


async def test_the_budget_admits_while_spend_and_reservations_are_below_it() -> None:
    store = MemoryLimits()
    enforcer = LimitEnforcer(store, clock=lambda: T0)
    f = fleet()
    one = worst_case_usd(f.snapshot(), routing(), 13)
    cap = 3.5 * one
    held = [await enforcer.admit(principal(usd_per_day=cap), routing(), f.snapshot)
            for _ in range(4)]  # 0, 1, 2, 3 reservations below the cap: 4 admitted
    with pytest.raises(RateLimited, match="budget") as exc:
        await enforcer.admit(principal(usd_per_day=cap), routing(), f.snapshot)
    assert int(exc.value.headers["retry-after"]) >= 1
    assert reserved_usd(store) == pytest.approx(4 * one)
    for admission in held:
        assert admission is not None
        admission.settled_usd = one / 10  # what it really cost
        await enforcer.settle(admission)
        await enforcer.settle(admission)  # exactly once
    assert reserved_usd(store) == 0
    assert await store.spent("usd:team", DAY) == pytest.approx(0.4 * one)


# -- the $ estimate ----------------------------------------------------------------------
def test_the_worst_case_bounds_a_charge_at_any_concurrency() -> None:
    f = fleet()
    snap, ep = f.snapshot(), f.endpoints[0]
    worst = worst_case_usd(snap, routing(), 13)
    e2e = worst / ep.usd_per_s  # the prior's time alone
    assert worst > 0
    for batch in (1, 8, 64):  # a request that ran as long, shared: charged less
        assert attempt_cost_usd(ep, AttemptResult(200, None, None, e2e, batch)) <= worst * 1.0001
    assert worst_case_usd(snap, routing(max_tokens=160), 13) > 5 * worst
    assert worst_case_usd(snap, routing(max_tokens=None), 13) > \
        worst_case_usd(snap, routing(max_tokens=UNCAPPED_OUTPUT_TOKENS - 1), 13)
    assert worst_case_usd(snap, RoutingRequest("nobody-serves-it"), 13) == 0


def test_the_prompt_scale_follows_the_engines_count_from_above() -> None:
    scale = PromptScale()
    r = routing()  # estimate 13
    assert scale.tokens(r) == 13
    scale.observe(MODEL, 13, 26)
    assert scale.tokens(r) == 26
    scale.observe(MODEL, 13, 13)  # lower: 2% of the way
    assert 25 <= scale.tokens(r) <= 26
    scale.observe(MODEL, 13, 1000)  # capped at 4x
    assert scale.tokens(r) == 52
    scale.observe("other", 13, 6)  # never below the estimate
    assert scale.tokens(RoutingRequest("other", prompt_chars=20)) == 13


# -- every way a request ends settles it once ---------------------------------------------
def proxied(backend: FakeBackend) -> tuple[ProxyService, LimitEnforcer, MemoryLimits, Fleet]:
    store, f = MemoryLimits(), fleet()
    enforcer = LimitEnforcer(store, clock=lambda: T0)
    config = f.config
    gen = Generation(f, build_router(config), {"fast": 2}, resume={"fast": False})
    return (ProxyService(lambda: gen, backend, Timeouts(), DecisionLog(),
                         observer=LimitsObserver(enforcer)), enforcer, store, f)


async def run(proxy: ProxyService, enforcer: LimitEnforcer, f: Fleet, stream: bool,
              cancel: bool = False) -> None:
    """One request through the proxy; ``cancel``: the client leaves while the engine hangs
    (before the answer, or after a stream's first frame), as the ASGI server cancels it."""
    r = routing(stream=stream)
    admission = await enforcer.admit(principal(tpm=1000, usd_per_day=1.0, concurrency=1), r,
                                     f.snapshot)
    req = ProxyRequest(APIS["chat"], r, {"model": MODEL, "stream": stream}, "rid",
                       admission=admission)
    if cancel and not stream:
        task = asyncio.ensure_future(proxy.handle(req))
        for _ in range(100):  # until it waits on the hung engine (loop turns, no clock)
            await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return
    try:
        response = await proxy.handle(req)
    except GatewayError:
        return
    iterator = getattr(response, "body_iterator", None)
    if iterator is None:
        await asyncio.sleep(0)  # a whole answer's end is told on the loop's next turn
        return
    if cancel:
        await iterator.__anext__()  # the first frame reached the client
        pending = asyncio.ensure_future(iterator.__anext__())
        for _ in range(100):
            await asyncio.sleep(0)
        pending.cancel()
        await asyncio.gather(pending, return_exceptions=True)
        return
    async for _ in iterator:
        pass


@pytest.mark.parametrize(("answers", "stream", "cancel", "tokens"), [
    ([Answer(200, OK)], False, False, 20),                            # answered
    ([Answer(200, chunks=(CHUNK, USAGE, DONE))], True, False, 20),    # streamed
    ([Refuse("connect"), Refuse("connect")], False, False, 0),        # upstream down: 502
    ([Answer(503, b"{}"), Answer(503, b"{}")], False, False, 0),      # shed upstream
    ([Answer(400, b'{"message":"no"}')], False, False, 0),            # the client's error
    ([Answer(200, chunks=(CHUNK,), cut="protocol")], True, False, 0),  # cut mid-stream
    ([Answer(200, chunks=(CHUNK,), hang=True)], True, True, 0),       # the client left
    ([Answer(200, hang=True)], False, True, 0),                       # left before an answer
], ids=["ok", "stream", "refused", "503", "400", "cut", "left-stream", "left"])
async def test_every_end_settles_the_reservations_once(answers: list[Any], stream: bool,
                                                       cancel: bool, tokens: int) -> None:
    proxy, enforcer, store, f = proxied(FakeBackend({URL: list(answers)}))
    await run(proxy, enforcer, f, stream, cancel)
    await drained(enforcer)
    assert await tpm_used(store) == tokens
    assert reserved_usd(store) == 0
    spent = await store.spent("usd:team", DAY)
    assert (spent > 0) == (tokens > 0)
    assert await store.acquire("conc:k", 1, 60, T0) is not None  # the hold was freed


# -- failover: reservations stay where they were made -------------------------------------
class Down(MemoryLimits):
    """A primary (Redis) that fails every call while ``down`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise StoreUnavailable("down")

    async def take(self, *args: Any) -> Any:
        self._check()
        return await super().take(*args)

    async def record(self, *args: Any) -> None:
        self._check()
        await super().record(*args)

    async def add_spend(self, *args: Any) -> float:
        self._check()
        return await super().add_spend(*args)

    async def reserve_spend(self, *args: Any) -> str | None:
        self._check()
        return await super().reserve_spend(*args)

    async def spent(self, *args: Any) -> float:
        self._check()
        return await super().spent(*args)


async def test_reservations_across_an_outage() -> None:
    primary, fallback, t = Down(), MemoryLimits(), [0.0]
    store = FailoverLimitStore(primary, fallback, retry_every_s=1.0, clock=lambda: t[0])
    day = DAY
    on_redis = await store.reserve_spend("t", 0.5, day, 1.0, 60, T0)
    entry = (await store.take("tpm", 30, 100, 60, T0)).entry
    assert on_redis is not None and on_redis.startswith("p:")
    assert entry is not None and entry.startswith("p:")
    await store.add_spend("t", 0.25, day, 86400)  # known total 0.25
    primary.down = True
    assert await store.add_spend("t", 0.25, day, 86400, settles=on_redis) == 0.5  # queued
    assert store.degraded
    local = await store.reserve_spend("t", 0.5, day, 1.0, 60, T0)  # 0.5 spent < 1
    assert local is not None and local.startswith("f:")
    assert await store.reserve_spend("t", 0.1, day, 1.0, 60, T0) is None  # 0.5 + 0.5
    await store.record("tpm", 10, 60, T0 + 1, replaces=entry)  # into the fallback's window
    assert (await fallback.take("tpm", 0, 100, 60, T0 + 1)).used == 10
    await store.add_spend("t", 0.0, day, 86400, settles=local)
    assert reserved_usd(fallback) == 0
    primary.down, t[0] = False, 5.0
    assert await store.spent("t", day) == pytest.approx(0.5)  # replayed: 0.25 + 0.25
    assert reserved_usd(primary) == 0  # the queued settle dropped Redis's reservation
    assert (await primary.take("tpm", 0, 100, 60, T0 + 1)).used == 30  # leaves with its window
