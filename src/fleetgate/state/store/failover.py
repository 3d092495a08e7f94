"""Keep answering when Redis is down: failover wrappers around the Redis stores.

``FailoverLimitStore(primary, fallback)`` uses the primary (Redis) while it answers. When a
call raises ``StoreUnavailable`` it answers that call and the following ones from the
fallback (in-memory: limits become per-replica), sets ``degraded = True`` and logs one
warning. While degraded it tries the primary again at most once per ``retry_every_s``
(one caller probes, the others go straight to memory), so a dead Redis costs nothing per
request; the first call that succeeds ends the outage (one info log). What it does so that
the outage loses little:

- concurrency holds are tagged with the store that issued them (``"p:"``/``"f:"``), so a
  hold is released where it was taken; releases of Redis holds during an outage are queued
  and replayed on recovery (if the replica dies first, the holds expire after their TTL);
- spend is never dropped: during an outage ``add_spend`` adds to an unsynced delta per
  (key, period), totals read as last known Redis total + delta, and the deltas are added to
  Redis on recovery;
- sliding windows (rpm/tpm) restart from the fallback's own counts: they are short-lived;
  a window entry (a tpm reservation) is tagged like a hold, and settling one of Redis's
  during an outage records the tokens in the fallback (the Redis entry leaves its window);
- spend reservations are tagged too; during an outage they are made in the fallback against
  the cap less what the outage's totals say (last known Redis total + delta), and settling
  one of Redis's queues its release for the recovery (or it expires after its TTL).

``FailoverSharedState(inner)`` never raises ``StoreUnavailable``: ``publish`` becomes a no-op
and ``peers`` returns ``{}`` (route on this replica's own counts) while Redis is down, with
the same once-per-``retry_every_s`` probing and logging. Likewise registration and cost
writes are dropped and ``registrations`` / ``costs`` return empty while it is down: callers
check ``degraded`` after the call and keep what they knew (the gateway keeps its own
registrations and expires them by itself; ``/admin/costs`` reports this replica alone).
The caller's sync task can then be a plain loop: ``await shared.publish(...)``,
``merge(await shared.peers(...))``, sleep.

May touch: ``base``, logging. Must not touch: redis (only through the wrapped stores).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

from fleetgate.state.store.base import (
    EndpointShare,
    LimitStore,
    Registered,
    SharedState,
    StoreUnavailable,
    Verdict,
)

T = TypeVar("T")
log = logging.getLogger("fleetgate.store")
MAX_QUEUED = 10_000  # queued releases / remembered totals kept during an outage


class _Gate:
    """Degraded-mode bookkeeping: when to try the primary, and one log line per outage."""

    def __init__(self, what: str, retry_every_s: float, clock: Callable[[], float]) -> None:
        self.what = what
        self.retry_every_s = retry_every_s
        self.clock = clock
        self.degraded = False
        self._retry_at = 0.0

    def claim(self) -> bool:
        """May this call use the primary? While degraded, one call per interval may."""
        if not self.degraded:
            return True
        now = self.clock()
        if now < self._retry_at:
            return False
        self._retry_at = now + self.retry_every_s
        return True

    def fail(self, exc: StoreUnavailable) -> None:
        self._retry_at = self.clock() + self.retry_every_s
        if not self.degraded:
            self.degraded = True
            log.warning("state store unavailable (%s): %s; retrying every %.1fs",
                        exc, self.what, self.retry_every_s)

    def succeed(self) -> bool:
        """Record a primary success; True when it ends an outage."""
        if not self.degraded:
            return False
        self.degraded = False
        log.info("state store answers again: %s back on Redis", self.what)
        return True


class FailoverLimitStore:
    """``RateLimits`` + ``Budgets``: Redis while it answers, memory while it does not."""

    def __init__(self, primary: LimitStore, fallback: LimitStore, retry_every_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.primary = primary
        self.fallback = fallback
        self._gate = _Gate("limits are per-replica meanwhile", retry_every_s, clock)
        self._pending_releases: list[tuple[str, str]] = []
        self._pending_settles: list[tuple[str, str, str, float]] = []  # key, period, id, ttl
        self._unsynced: dict[tuple[str, str], tuple[float, float]] = {}
        self._known: dict[tuple[str, str], float] = {}
        self._replaying = False

    @property
    def degraded(self) -> bool:
        return self._gate.degraded

    async def take(self, key: str, amount: float, limit: float, window_s: float,
                   now: float) -> Verdict:
        verdict, on_primary = await self._route(
            lambda s: s.take(key, amount, limit, window_s, now))
        if verdict.entry is None:
            return verdict
        return dataclasses.replace(verdict, entry=_tag(on_primary, verdict.entry))

    async def record(self, key: str, amount: float, window_s: float, now: float,
                     replaces: str | None = None) -> None:
        if replaces is None:
            await self._route(lambda s: s.record(key, amount, window_s, now))
            return
        where, _, inner = replaces.partition(":")
        if where == "f":
            await self.fallback.record(key, amount, window_s, now, inner)
            return
        await self._route(lambda s: s.record(key, amount, window_s, now, inner)
                          if s is self.primary else s.record(key, amount, window_s, now))

    async def acquire(self, key: str, limit: int, ttl_s: float, now: float) -> str | None:
        hold, on_primary = await self._route(lambda s: s.acquire(key, limit, ttl_s, now))
        return None if hold is None else _tag(on_primary, hold)

    async def release(self, key: str, hold_id: str) -> None:
        where, _, inner = hold_id.partition(":")
        if where == "f":
            await self.fallback.release(key, inner)
            return
        if self._gate.claim():
            try:
                await self.primary.release(key, inner)
            except StoreUnavailable as exc:
                self._gate.fail(exc)
            else:
                await self._succeeded()
                return
        if len(self._pending_releases) < MAX_QUEUED:
            self._pending_releases.append((key, inner))

    async def add_spend(self, key: str, usd: float, period_key: str, ttl_s: float,
                        settles: str | None = None) -> float:
        pk = (key, period_key)
        where, _, inner = (settles or "").partition(":")
        if where == "f":
            await self.fallback.add_spend(key, 0.0, period_key, ttl_s, inner)
        on_primary = inner if where == "p" else None
        if self._gate.claim():
            try:
                total = await (self.primary.add_spend(key, usd, period_key, ttl_s)
                               if on_primary is None else
                               self.primary.add_spend(key, usd, period_key, ttl_s, on_primary))
            except StoreUnavailable as exc:
                self._gate.fail(exc)
            else:
                self._remember(pk, total)
                await self._succeeded()  # may replay unsynced spend and raise the total
                return self._known.get(pk, total)
        if on_primary is not None and len(self._pending_settles) < MAX_QUEUED:
            self._pending_settles.append((key, period_key, on_primary, ttl_s))
        delta = self._unsynced.get(pk, (0.0, ttl_s))[0] + usd
        self._unsynced[pk] = (delta, ttl_s)
        return self._known.get(pk, 0.0) + delta

    async def reserve_spend(self, key: str, usd: float, period_key: str, cap: float,
                            ttl_s: float, now: float) -> str | None:
        if self._gate.claim():
            try:
                hold = await self.primary.reserve_spend(key, usd, period_key, cap, ttl_s, now)
            except StoreUnavailable as exc:
                self._gate.fail(exc)
            else:
                await self._succeeded()
                return None if hold is None else _tag(True, hold)
        pk = (key, period_key)  # the fallback holds no spend: the outage's totals are here
        spent = self._known.get(pk, 0.0) + self._unsynced.get(pk, (0.0, 0.0))[0]
        hold = await self.fallback.reserve_spend(key, usd, period_key, cap - spent, ttl_s, now)
        return None if hold is None else _tag(False, hold)

    async def spent(self, key: str, period_key: str) -> float:
        pk = (key, period_key)
        if self._gate.claim():
            try:
                total = await self.primary.spent(key, period_key)
            except StoreUnavailable as exc:
                self._gate.fail(exc)
            else:
                self._remember(pk, total)
                await self._succeeded()
                return self._known.get(pk, total)
        return self._known.get(pk, 0.0) + self._unsynced.get(pk, (0.0, 0.0))[0]

    async def close(self) -> None:
        await self.primary.close()
        await self.fallback.close()

    # -- helpers -----------------------------------------------------------------------
    async def _route(self, op: Callable[[LimitStore], Awaitable[T]]) -> tuple[T, bool]:
        """Run ``op`` on the primary when allowed, else (or when it fails) on the fallback."""
        if self._gate.claim():
            try:
                result = await op(self.primary)
            except StoreUnavailable as exc:
                self._gate.fail(exc)
            else:
                await self._succeeded()
                return result, True
        return await op(self.fallback), False

    async def _succeeded(self) -> None:
        if self._gate.succeed():
            await self._replay()

    async def _replay(self) -> None:
        """Back on Redis: release the holds and add the spend queued during the outage.
        One replay at a time (a flickering Redis may end two outages while the first replay
        still waits on it); each takes what is queued when it starts, so releases queued
        meanwhile wait for the next one, and what it could not do is queued again."""
        if self._replaying:
            return
        self._replaying = True
        pending, self._pending_releases = self._pending_releases, []
        settles, self._pending_settles = self._pending_settles, []
        try:
            while pending:
                key, hold = pending[-1]
                await self.primary.release(key, hold)
                pending.pop()
            while settles:
                key, period, hold, ttl_s = settles[-1]
                await self.primary.add_spend(key, 0.0, period, ttl_s, hold)
                settles.pop()
            for pk in list(self._unsynced):
                usd, ttl_s = self._unsynced[pk]
                self._remember(pk, await self.primary.add_spend(pk[0], usd, pk[1], ttl_s))
                left = self._unsynced[pk][0] - usd  # more may have been added meanwhile
                if abs(left) < 1e-12:
                    del self._unsynced[pk]
                else:
                    self._unsynced[pk] = (left, ttl_s)
        except StoreUnavailable as exc:
            self._gate.fail(exc)
        finally:
            self._pending_releases[:0] = pending[:MAX_QUEUED - len(self._pending_releases)]
            self._pending_settles[:0] = settles[:MAX_QUEUED - len(self._pending_settles)]
            self._replaying = False
        if (self._pending_releases or self._pending_settles) and not self._gate.degraded:
            await self._replay()  # released while it ran, Redis still answering

    def _remember(self, pk: tuple[str, str], total: float) -> None:
        self._known.pop(pk, None)
        self._known[pk] = total  # most recent last, so the oldest is evicted first
        if len(self._known) > MAX_QUEUED:
            del self._known[next(iter(self._known))]


def _tag(on_primary: bool, name: str) -> str:
    """A hold, entry or reservation id, tagged with the store that issued it."""
    return ("p:" if on_primary else "f:") + name


class FailoverSharedState:
    """``SharedState`` that never raises: no peers (own counts only) while Redis is down."""

    def __init__(self, inner: SharedState, retry_every_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.inner = inner
        self._gate = _Gate("routing on this replica's own load meanwhile", retry_every_s,
                           clock)

    @property
    def degraded(self) -> bool:
        return self._gate.degraded

    async def publish(self, replica_id: str, shares: Mapping[str, EndpointShare],
                      ttl_s: float) -> None:
        if not self._gate.claim():
            return
        try:
            await self.inner.publish(replica_id, shares, ttl_s)
        except StoreUnavailable as exc:
            self._gate.fail(exc)
        else:
            self._gate.succeed()

    async def peers(self, replica_id: str) -> dict[str, dict[str, EndpointShare]]:
        if not self._gate.claim():
            return {}
        try:
            result = await self.inner.peers(replica_id)
        except StoreUnavailable as exc:
            self._gate.fail(exc)
            return {}
        self._gate.succeed()
        return result

    async def put_registration(self, key: str, record: bytes, ttl_s: float,
                               now: float) -> None:
        await self._write(lambda: self.inner.put_registration(key, record, ttl_s, now))

    async def drop_registration(self, key: str) -> None:
        await self._write(lambda: self.inner.drop_registration(key))

    async def registrations(self) -> list[Registered]:
        return await self._read(self.inner.registrations, [])

    async def publish_blob(self, kind: str, replica_id: str, blob: bytes,
                           ttl_s: float) -> None:
        await self._write(lambda: self.inner.publish_blob(kind, replica_id, blob, ttl_s))

    async def blobs(self, kind: str) -> dict[str, bytes]:
        return await self._read(lambda: self.inner.blobs(kind), {})

    async def close(self) -> None:
        await self.inner.close()

    async def _write(self, op: Callable[[], Awaitable[None]]) -> None:
        if not self._gate.claim():
            return
        try:
            await op()
        except StoreUnavailable as exc:
            self._gate.fail(exc)
        else:
            self._gate.succeed()

    async def _read(self, op: Callable[[], Awaitable[T]], empty: T) -> T:
        if not self._gate.claim():
            return empty
        try:
            result = await op()
        except StoreUnavailable as exc:
            self._gate.fail(exc)
            return empty
        self._gate.succeed()
        return result
