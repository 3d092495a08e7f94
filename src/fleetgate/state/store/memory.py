"""In-memory stores: one replica, the default, and the fallback when Redis is down.

Same semantics as the Redis stores (the contract suite runs against both), kept in this
process's dicts:

- ``MemorySharedState``: replica id -> (expires_at, shares) on an injected monotonic clock.
  With one replica ``peers`` is always empty; it is real so the contract is the same.
  Registrations (key -> (first_seen, record, expires_at)) and blobs (kind -> replica id ->
  (expires_at, blob)) expire on the same clock.
- ``MemoryLimits`` (``RateLimits`` + ``Budgets``): per key, a deque of ``[time, amount,
  id]`` entries plus their running total (trimmed from the left on every call, so a call
  costs O(entries that expired)) and ``id -> entry`` for the reservations ``take`` made (a
  settled one is zeroed in place: O(1)); concurrency holds as ``hold id -> expires_at``;
  spend as ``(key, period) -> (total, expires_at)``; spend reservations as ``(key, period)
  -> {id: (usd, expires_at)}`` in the order made (expired ones are dropped from the front)
  plus their sum.

Nothing here awaits anything, so every method is atomic with respect to the event loop.

May touch: ``base``. Must not touch: I/O, redis, asyncio primitives.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fleetgate.state.store.base import EndpointShare, Registered, Verdict, fits


class MemorySharedState:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._replicas: dict[str, tuple[float, dict[str, EndpointShare]]] = {}
        self._registrations: dict[str, tuple[float, bytes, float]] = {}
        self._blobs: dict[str, dict[str, tuple[float, bytes]]] = {}  # kind -> replica -> blob

    async def publish(self, replica_id: str, shares: Mapping[str, EndpointShare],
                      ttl_s: float) -> None:
        self._replicas[replica_id] = (self._clock() + ttl_s, dict(shares))

    async def peers(self, replica_id: str) -> dict[str, dict[str, EndpointShare]]:
        now = self._clock()
        for rid in [r for r, (exp, _) in self._replicas.items() if exp <= now]:
            del self._replicas[rid]
        return {rid: dict(shares) for rid, (_, shares) in self._replicas.items()
                if rid != replica_id}

    async def put_registration(self, key: str, record: bytes, ttl_s: float,
                               now: float) -> None:
        self._expire_registrations()
        known = self._registrations.get(key)
        first_seen = now if known is None else known[0]
        self._registrations[key] = (first_seen, bytes(record), self._clock() + ttl_s)

    async def drop_registration(self, key: str) -> None:
        self._registrations.pop(key, None)

    async def registrations(self) -> list[Registered]:
        self._expire_registrations()
        now = self._clock()
        return sorted((Registered(key, record, first, exp - now)
                       for key, (first, record, exp) in self._registrations.items()),
                      key=lambda r: (r.first_seen, r.key))

    async def publish_blob(self, kind: str, replica_id: str, blob: bytes,
                           ttl_s: float) -> None:
        self._blobs.setdefault(kind, {})[replica_id] = (self._clock() + ttl_s, bytes(blob))

    async def blobs(self, kind: str) -> dict[str, bytes]:
        now, blobs = self._clock(), self._blobs.get(kind, {})
        for rid in [r for r, (exp, _) in blobs.items() if exp <= now]:
            del blobs[rid]
        return {rid: blob for rid, (_, blob) in blobs.items()}

    async def close(self) -> None:
        self._replicas.clear()
        self._registrations.clear()
        self._blobs.clear()

    def _expire_registrations(self) -> None:
        now = self._clock()
        for key in [k for k, (_, _, exp) in self._registrations.items() if exp <= now]:
            del self._registrations[key]


@dataclass(slots=True)
class _Window:
    """One key's sliding window: entries ``[time, amount, id]`` oldest first, their sum, and
    the entries ``take`` named (reservations not yet trimmed)."""

    entries: deque[list[Any]] = field(default_factory=deque)
    total: float = 0.0
    named: dict[str, list[Any]] = field(default_factory=dict)

    def trim(self, cutoff: float) -> None:
        entries = self.entries
        while entries and entries[0][0] <= cutoff:
            _, amount, name = entries.popleft()
            self.total -= amount
            if name is not None:
                self.named.pop(name, None)
        if not entries:
            self.total = 0.0  # no float drift survives an empty window

    def add(self, t: float, amount: float, name: str | None = None) -> None:
        entries, entry = self.entries, [t, amount, name]
        if not entries or entries[-1][0] <= t:
            entries.append(entry)
        else:  # a caller's clock ran behind another's: keep the log ordered
            i = len(entries)
            while i > 0 and entries[i - 1][0] > t:
                i -= 1
            entries.insert(i, entry)
        self.total += amount
        if name is not None:
            self.named[name] = entry

    def drop(self, name: str) -> None:
        """Settle a reservation: its entry counts nothing from now on."""
        entry = self.named.pop(name, None)
        if entry is not None:
            self.total -= entry[1]
            entry[1] = 0.0

    def retry_after(self, amount: float, limit: float, window_s: float, now: float) -> float:
        if amount > limit:
            return window_s
        used = self.total
        for t, a, _ in self.entries:
            used -= a
            if fits(used, amount, limit):
                return max(0.0, t + window_s - now)
        return 0.0


@dataclass(slots=True)
class _Reserved:
    """One (key, period)'s spend reservations: id -> (usd, expires_at), and their sum."""

    held: dict[str, tuple[float, float]] = field(default_factory=dict)
    total: float = 0.0

    def expire(self, now: float) -> None:
        held = self.held
        while held:
            name = next(iter(held))
            usd, expires_at = held[name]
            if expires_at > now:
                break
            del held[name]
            self.total -= usd
        if not held:
            self.total = 0.0

    def drop(self, name: str) -> None:
        entry = self.held.pop(name, None)
        if entry is not None:
            self.total = self.total - entry[0] if self.held else 0.0


class MemoryLimits:
    """``RateLimits`` and ``Budgets`` for one replica (``clock`` only expires spend totals;
    windows and holds run on the caller's ``now``)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._windows: dict[str, _Window] = {}
        self._holds: dict[str, dict[str, float]] = {}
        self._spend: dict[tuple[str, str], tuple[float, float]] = {}
        self._reserved: dict[tuple[str, str], _Reserved] = {}
        self._ids = itertools.count(1)

    # -- RateLimits --------------------------------------------------------------------
    async def take(self, key: str, amount: float, limit: float, window_s: float,
                   now: float) -> Verdict:
        w = self._window(key, window_s, now)
        if not fits(w.total, amount, limit):
            return Verdict(False, w.total, w.retry_after(amount, limit, window_s, now))
        if amount <= 0:
            return Verdict(True, w.total, 0.0)
        name = f"w{next(self._ids)}"
        w.add(now, amount, name)
        return Verdict(True, w.total, 0.0, name)

    async def record(self, key: str, amount: float, window_s: float, now: float,
                     replaces: str | None = None) -> None:
        if amount <= 0 and replaces is None:
            return
        w = self._window(key, window_s, now)
        if replaces is not None:
            w.drop(replaces)
        if amount > 0:
            w.add(now, amount)

    async def acquire(self, key: str, limit: int, ttl_s: float, now: float) -> str | None:
        holds = self._holds.setdefault(key, {})
        for hold_id in [h for h, exp in holds.items() if exp <= now]:
            del holds[hold_id]
        if len(holds) >= limit:
            return None
        hold_id = f"m{next(self._ids)}"
        holds[hold_id] = now + ttl_s
        return hold_id

    async def release(self, key: str, hold_id: str) -> None:
        holds = self._holds.get(key)
        if holds is not None:
            holds.pop(hold_id, None)
            if not holds:
                del self._holds[key]

    # -- Budgets -----------------------------------------------------------------------
    async def add_spend(self, key: str, usd: float, period_key: str, ttl_s: float,
                        settles: str | None = None) -> float:
        if settles is not None:
            reserved = self._reserved.get((key, period_key))
            if reserved is not None:
                reserved.drop(settles)
                if not reserved.held:
                    del self._reserved[(key, period_key)]
        total = await self.spent(key, period_key) + usd
        self._spend[(key, period_key)] = (total, self._clock() + ttl_s)
        return total

    async def reserve_spend(self, key: str, usd: float, period_key: str, cap: float,
                            ttl_s: float, now: float) -> str | None:
        reserved = self._reserved.get((key, period_key))
        if reserved is None:
            reserved = self._reserved[(key, period_key)] = _Reserved()
        reserved.expire(now)
        if await self.spent(key, period_key) + reserved.total >= cap:
            if not reserved.held:
                del self._reserved[(key, period_key)]
            return None
        name = f"r{next(self._ids)}"
        reserved.held[name] = (usd, now + ttl_s)
        reserved.total += usd
        return name

    async def spent(self, key: str, period_key: str) -> float:
        entry = self._spend.get((key, period_key))
        if entry is None:
            return 0.0
        if entry[1] <= self._clock():
            del self._spend[(key, period_key)]
            return 0.0
        return entry[0]

    async def close(self) -> None:
        self._windows.clear()
        self._holds.clear()
        self._spend.clear()
        self._reserved.clear()

    # -- helpers -----------------------------------------------------------------------
    def _window(self, key: str, window_s: float, now: float) -> _Window:
        w = self._windows.get(key)
        if w is None:
            w = self._windows[key] = _Window()
        w.trim(now - window_s)
        return w
