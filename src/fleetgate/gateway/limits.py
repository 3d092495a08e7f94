"""Per-key limits and per-tenant budgets, enforced across replicas through the limit store.

Before routing, ``admit`` checks, for the caller's key: requests per minute (a sliding
60 s window, check-and-add in one atomic store step), tokens per minute (a check that the
last 60 s used fewer tokens than the limit; the tokens are recorded when the response's
usage is known, streams included), concurrent requests (a semaphore whose holds expire
after ``HOLD_TTL_S`` if a replica dies), and the tenant's $ budget for the day / month
(spend recorded from the cost of every finished attempt). Over any limit: 429 in the
OpenAI envelope with ``Retry-After``.

The store is Redis when ``FLEETGATE_REDIS_URL`` is set (limits hold across replicas) and
in-memory otherwise; while Redis is down the failover store answers from memory (limits
become per-replica) and ``degraded`` says so.

``LimitsObserver`` settles each admitted request through the observer seam: tokens and
spend on every finished attempt, the concurrency hold released when the request ends.

May touch: the limit store, the auth principal, the observer seam. Must not touch: HTTP.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from fleetgate.catalog.pricing import charge_usd
from fleetgate.config.schema import KeyLimits
from fleetgate.gateway.auth import Principal
from fleetgate.gateway.errors import RateLimited
from fleetgate.gateway.proxy.observer import (
    NOOP_REQUEST,
    AttemptObserver,
    AttemptResult,
    RequestObserver,
)
from fleetgate.gateway.proxy.request import ProxyRequest
from fleetgate.routing import Decision, Endpoint
from fleetgate.state.store import LimitStore

log = logging.getLogger("fleetgate.limits")

MINUTE = 60.0
HOLD_TTL_S = 900.0
NO_LIMITS = KeyLimits()


def attempt_cost_usd(endpoint: Endpoint, result: AttemptResult) -> float:
    """The attempt's share of its replica's GPU time (docs/observability.md): replica $/s
    times the seconds it ran, divided by the requests sharing the replica meanwhile."""
    return charge_usd(endpoint.usd_per_s, result.e2e_s, result.mean_concurrency)


@dataclass(slots=True)
class Admission:
    principal: Principal
    hold: str | None = None
    settled_usd: float = 0.0
    tokens: float = 0.0


@dataclass(slots=True)
class LimitEnforcer:
    store: LimitStore
    clock: Callable[[], float] = time.time
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run a store update without holding up the response (errors are logged)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("limit bookkeeping failed: %s", task.exception())

    async def admit(self, principal: Principal) -> Admission | None:
        """Check every limit of the caller; None when it has none (nothing to settle)."""
        lim, key, now = principal.limits, principal.name, self.clock()
        if lim == NO_LIMITS:
            return None
        if lim.rpm is not None:
            verdict = await self.store.take(f"rpm:{key}", 1, lim.rpm, MINUTE, now)
            if not verdict.allowed:
                raise _limited(f"key {key!r} is over its {lim.rpm} requests/min",
                               verdict.retry_after_s)
        if lim.tpm is not None:
            verdict = await self.store.take(f"tpm:{key}", 0, lim.tpm, MINUTE, now)
            if not verdict.allowed:
                raise _limited(f"key {key!r} is over its {lim.tpm} tokens/min",
                               verdict.retry_after_s)
        await self._check_budget(principal, now)
        admission = Admission(principal)
        if lim.concurrency is not None:
            admission.hold = await self.store.acquire(f"conc:{key}", lim.concurrency,
                                                      HOLD_TTL_S, now)
            if admission.hold is None:
                raise _limited(f"key {key!r} already has {lim.concurrency} requests running", 1)
        return admission

    async def _check_budget(self, principal: Principal, now: float) -> None:
        lim = principal.limits
        for cap, period in ((lim.usd_per_day, _day(now)), (lim.usd_per_month, _month(now))):
            if cap is None:
                continue
            spent = await self.store.spent(f"usd:{principal.tenant}", period)
            if spent >= cap:
                raise _limited(f"tenant {principal.tenant!r} spent ${spent:.4f} of its "
                               f"${cap:g} budget for {period}", _seconds_to_next(period, now))

    async def record(self, admission: Admission, tokens: float, usd: float) -> None:
        p, now = admission.principal, self.clock()
        if p.limits.tpm is not None and tokens:
            await self.store.record(f"tpm:{p.name}", tokens, MINUTE, now)
        budgeted = p.limits.usd_per_day is not None or p.limits.usd_per_month is not None
        if usd > 0 and budgeted:
            for period, ttl in ((_day(now), 2 * 86400.0), (_month(now), 62 * 86400.0)):
                await self.store.add_spend(f"usd:{p.tenant}", usd, period, ttl)

    async def release(self, admission: Admission) -> None:
        if admission.hold is not None:
            await self.store.release(f"conc:{admission.principal.name}", admission.hold)


def _limited(message: str, retry_after_s: float) -> RateLimited:
    seconds = max(1, math.ceil(retry_after_s))
    return RateLimited(message, headers={"retry-after": str(seconds)})


def _day(now: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(now))


def _month(now: float) -> str:
    return time.strftime("%Y-%m", time.gmtime(now))


def _seconds_to_next(period: str, now: float) -> float:
    if len(period) == 10:  # a day
        return 86400 - now % 86400
    return 86400.0  # a month: come back tomorrow at the latest to see


class LimitsObserver:
    """Settles admitted requests: tokens and spend per finished attempt, holds on end."""

    def __init__(self, enforcer: LimitEnforcer) -> None:
        self._enforcer = enforcer

    def request(self, req: ProxyRequest) -> RequestObserver:
        if req.admission is None:  # a caller without limits: nothing to settle
            return NOOP_REQUEST
        return _Settle(self._enforcer, req.admission)


@dataclass(slots=True)
class _Settle:
    enforcer: LimitEnforcer
    admission: Admission

    def routed(self, decision: Decision) -> None:
        pass

    def attempt(self, endpoint: Endpoint, served_model: str, number: int) -> AttemptObserver:
        return _SettleAttempt(self, endpoint)

    def end(self, status: int, error: str | None = None) -> None:
        self.enforcer.spawn(self.enforcer.release(self.admission))


@dataclass(slots=True)
class _SettleAttempt:
    parent: _Settle
    endpoint: Endpoint

    def headers(self) -> dict[str, str]:
        return {}

    def first_token(self, ttft_s: float) -> None:
        pass

    def finished(self, result: AttemptResult) -> None:
        usage = result.usage or {}
        tokens = float(usage.get("total_tokens") or 0)
        enforcer = self.parent.enforcer
        enforcer.spawn(enforcer.record(self.parent.admission, tokens,
                                       attempt_cost_usd(self.endpoint, result)))

    def failed(self, status: int, error: str) -> None:
        pass

    def cancelled(self) -> None:
        pass
