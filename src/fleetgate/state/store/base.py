"""The state-store seams: protocols, value types and the one error every store raises.

Three small protocols, each with an in-memory implementation (``memory.py``, one replica,
the default) and a Redis one (``redis.py``, several replicas acting as one):

- ``SharedState``: each replica publishes its per-endpoint load (``EndpointShare``) with a
  TTL and reads the other live replicas' latest shares. A replica that stops publishing
  disappears after its TTL. Never awaited on the routing hot path: a background sync task
  publishes and pulls, the router reads a local snapshot. The same store holds the fleet's
  worker registrations (``put_registration``: an opaque record per key, here the engine URL,
  that lapses ``ttl_s`` after the last put; ``registrations`` lists the live ones in the
  order they first registered, so every replica merges them into the same endpoint ids) and
  opaque blobs per kind and replica id (``publish_blob`` / ``blobs``, own blob included, each
  kept ``ttl_s`` after its last publish): each replica's cost-ledger snapshot (kind
  ``"costs"``, kept long, so a replica that stopped still counts in the fleet's costs) and
  the engine rows it scraped (kind ``"rows"``, ``state/shard.py``).
- ``RateLimits``: sliding-window counters (``take`` = check-and-add in one atomic step,
  ``record`` = add unconditionally) and a concurrency semaphore whose holds expire. An
  amount ``take`` admits is a reservation: its ``Verdict.entry`` names it, and ``record``
  with ``replaces=entry`` swaps it for what was really used, in one atomic step (a
  reservation never settled leaves the window with it: it cannot leak).
- ``Budgets``: spend totals per key and period (``"2026-11-30"``, ``"2026-11"``: the caller
  computes the period), and reservations against a cap: ``reserve_spend`` admits while the
  total plus the live reservations is below the cap (so the last one admitted may pass it by
  its own reservation, never more), ``add_spend`` with ``settles=id`` adds the real charge
  and drops the reservation in one atomic step; a reservation never settled expires at
  ``now + ttl_s`` (a replica that died).

Time: every limit method takes ``now`` (wall-clock epoch seconds) from the caller, so tests
inject it and replicas agree as far as their clocks do (NTP). Only ``SharedState`` expiry runs
on the store's own clock (Redis key TTLs; the memory store's injected ``clock``).

Errors: a store that cannot answer (connection refused, timeout, Redis error) raises
``StoreUnavailable`` and nothing else; it never hangs (see ``failover.py`` for what the
gateway does with it).

May touch: the standard library, orjson. Must not touch: redis, I/O, clocks.
"""

from __future__ import annotations

import math
import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import orjson


class StoreUnavailable(Exception):
    """The store did not answer (down, unreachable, too slow, or it returned an error)."""


@dataclass(frozen=True, slots=True)
class EndpointShare:
    """One replica's view of one endpoint, as the other replicas see it.

    ``breaker_open_until`` is wall-clock epoch seconds (0 = closed; inf = open until a
    probe succeeds); ``health`` is the health state name (``"ready"``, ``"not_ready"``, ...).
    """

    in_flight: float
    ttft_s: float | None
    tpot_s: float | None
    tokens_per_s: float | None
    k_ttft: float
    k_tpot: float
    breaker_open_until: float
    health: str
    requests_per_s: float = 0.0  # sent it per second recently (the scaler's demand)


@dataclass(frozen=True, slots=True)
class Verdict:
    """The answer of ``RateLimits.take``.

    ``used`` is the window's total after the call (including ``amount`` when allowed);
    ``retry_after_s`` is 0 when allowed, else the seconds until enough of the window has
    expired to admit ``amount`` (``window_s`` when ``amount`` exceeds ``limit``: it never fits).
    ``entry`` names the amount added (allowed and ``amount > 0``), for ``record(replaces=)``;
    opaque, unique per store.
    """

    allowed: bool
    used: float
    retry_after_s: float
    entry: str | None = None


@dataclass(frozen=True, slots=True)
class Registered:
    """One live registration: its key, its record as put, the wall-clock time it was first
    put (kept across heartbeats; ``now`` of the first ``put_registration``) and the seconds
    left before it lapses."""

    key: str
    record: bytes
    first_seen: float
    ttl_left_s: float


class SharedState(Protocol):
    async def publish(self, replica_id: str, shares: Mapping[str, EndpointShare],
                      ttl_s: float) -> None:
        """Replace this replica's shares; they vanish ``ttl_s`` after the last publish."""

    async def peers(self, replica_id: str) -> dict[str, dict[str, EndpointShare]]:
        """The other live replicas' latest shares: replica id -> endpoint id -> share."""

    async def put_registration(self, key: str, record: bytes, ttl_s: float,
                               now: float) -> None:
        """Add or refresh a registration (``record`` replaces the previous one); it lapses
        ``ttl_s`` after the last put. ``now`` (wall clock) is kept as ``first_seen`` only
        when the key is not registered already."""

    async def drop_registration(self, key: str) -> None:
        """Remove a registration (an unknown key is ignored)."""

    async def registrations(self) -> list[Registered]:
        """The live registrations, ordered by ``first_seen`` then key."""

    async def publish_blob(self, kind: str, replica_id: str, blob: bytes,
                           ttl_s: float) -> None: ...

    async def blobs(self, kind: str) -> dict[str, bytes]: ...

    async def close(self) -> None: ...


class RateLimits(Protocol):
    async def take(self, key: str, amount: float, limit: float, window_s: float,
                   now: float) -> Verdict:
        """Admit ``amount`` if ``used + amount <= limit`` over the last ``window_s`` seconds
        (adding it), else refuse without adding. ``amount == 0`` is a pure check that
        refuses once ``used >= limit``. The added amount is ``Verdict.entry``."""

    async def record(self, key: str, amount: float, window_s: float, now: float,
                     replaces: str | None = None) -> None:
        """Add ``amount`` at ``now`` unconditionally (tokens known after a response); with
        ``replaces``, the same atomic step removes that ``take`` entry if it is still in the
        window (settling a reservation; an unknown or expired entry is ignored)."""

    async def acquire(self, key: str, limit: int, ttl_s: float, now: float) -> str | None:
        """Take one of ``limit`` concurrency slots; returns a hold id, or None when all are
        held. A hold not released expires at ``now + ttl_s`` (a crashed replica's holds)."""

    async def release(self, key: str, hold_id: str) -> None:
        """Give a slot back (unknown or expired holds are ignored)."""

    async def close(self) -> None: ...


class Budgets(Protocol):
    async def add_spend(self, key: str, usd: float, period_key: str, ttl_s: float,
                        settles: str | None = None) -> float:
        """Add ``usd`` to the key's total for ``period_key``; returns the new total. The
        total is forgotten ``ttl_s`` after the last addition. With ``settles``, the same
        atomic step drops that reservation (unknown or expired: ignored)."""

    async def reserve_spend(self, key: str, usd: float, period_key: str, cap: float,
                            ttl_s: float, now: float) -> str | None:
        """Reserve ``usd`` for ``period_key`` if its total plus the live reservations is
        below ``cap``; returns the reservation id, or None (nothing reserved). A
        reservation not settled expires at ``now + ttl_s``."""

    async def spent(self, key: str, period_key: str) -> float:
        """The key's total for ``period_key`` (0 when nothing was spent)."""

    async def close(self) -> None: ...


class LimitStore(RateLimits, Budgets, Protocol):
    """Both limit seams in one object (what ``create_stores`` hands out); adds no methods."""


def fits(used: float, amount: float, limit: float) -> bool:
    """The admission rule shared by every store: ``amount == 0`` means "is there room"."""
    return used < limit if amount <= 0 else used + amount <= limit


def new_replica_id() -> str:
    """A replica id unique across restarts: host, pid and a random suffix."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


# -- wire format of shares (Redis) ------------------------------------------------------
# One JSON object per replica: {endpoint_id: [in_flight, ttft_s, tpot_s, tokens_per_s,
# k_ttft, k_tpot, breaker_open_until, health]}. Non-finite floats travel as strings
# ("inf", "nan") because JSON has no literal for them; None stays null.

def _wire(x: float | None) -> float | str | None:
    if x is None or math.isfinite(x):
        return x
    return repr(float(x))


def encode_shares(shares: Mapping[str, EndpointShare]) -> bytes:
    return orjson.dumps({
        eid: [_wire(s.in_flight), _wire(s.ttft_s), _wire(s.tpot_s), _wire(s.tokens_per_s),
              _wire(s.k_ttft), _wire(s.k_tpot), _wire(s.breaker_open_until), s.health,
              _wire(s.requests_per_s)]
        for eid, s in shares.items()
    })


def decode_shares(blob: bytes | str) -> dict[str, EndpointShare]:
    """Inverse of ``encode_shares``; fields appended by a newer replica are ignored, a
    malformed blob raises ``ValueError``."""
    out = {}
    try:
        for eid, row in orjson.loads(blob).items():
            v = row[:7] + row[8:9]  # a replica before requests_per_s sends 8 fields
            if str in map(type, v):  # rare: a non-finite float travelled as a string
                v = [float(x) if isinstance(x, str) else x for x in v]
            out[eid] = EndpointShare(v[0], v[1], v[2], v[3], v[4], v[5], v[6], str(row[7]),
                                     v[7] if len(v) > 7 else 0.0)
    except (TypeError, AttributeError, IndexError, orjson.JSONDecodeError) as exc:
        raise ValueError(f"malformed shares: {exc}") from exc
    return out
