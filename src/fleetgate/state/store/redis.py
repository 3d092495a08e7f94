"""Redis stores: several gateway replicas share load, limits and spend through one Redis.

Layout (every key under the caller's ``prefix``, default ``"fleetgate:"``):

- ``{p}replica:{id}``: one replica's shares, a JSON blob (``base.encode_shares``) written
  with ``SET ... PX ttl``; a replica that stops publishing disappears with its key.
  ``{p}replicas`` is the set of replica ids; ``peers`` reads it and every live blob in one
  Lua call and drops ids whose blob expired. ``publish`` is one pipelined round trip.
- ``{p}reg:{key}``: one worker registration's record (``SET ... PX ttl``); ``{p}registrations``
  is a sorted set of the keys scored by the time they first registered (``lua.REGISTER``
  keeps it across heartbeats, ``lua.REGISTRATIONS`` lists the live ones and drops lapsed
  keys).
- ``{p}costs:{id}``: one replica's cost-ledger snapshot (``SET ... PX ttl``), ``{p}cost-replicas``
  the set of their ids (read with ``lua.PEERS``, as the shares are).
- ``{p}rl:{key}`` / ``{p}rl:{key}:sum``: sliding-window log and its running total
  (``lua.TAKE``/``lua.RECORD``: check-and-add is one atomic script).
- ``{p}sem:{key}``: concurrency holds, a sorted set of hold ids scored by expiry
  (``lua.ACQUIRE``); ``release`` is a ZREM.
- ``{p}usd:{key}:{period}``: spend total, INCRBYFLOAT + PEXPIRE in one MULTI/EXEC (or in
  ``lua.SETTLE_SPEND``, which also drops a reservation); ``...:res`` / ``...:resamt`` /
  ``...:ressum``: its reservations (``lua.RESERVE_SPEND``).

Failure: the client is built with short socket timeouts, one retry after a connection error
only (a stale pooled connection, ``connect``) and a blocking pool
of ``max_connections`` (a burst waits for a connection, within the timeout); every call also
runs under ``asyncio.timeout(timeout_s)``, and any Redis/socket error or timeout raises
``StoreUnavailable``: a dead Redis costs at most ``timeout_s`` per call, never a hang.
A call that timed out has an unknown outcome: a frozen Redis may still run it when it wakes
(a ``take`` may then count once without having been admitted).

May touch: redis.asyncio, ``base``, ``lua``. Must not touch: routing, HTTP, config.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import uuid
from collections.abc import Awaitable, Mapping
from typing import Any, TypeVar

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError, RedisError

from fleetgate.state.store import lua
from fleetgate.state.store.base import (
    EndpointShare,
    Registered,
    StoreUnavailable,
    Verdict,
    decode_shares,
    encode_shares,
)

T = TypeVar("T")
log = logging.getLogger("fleetgate.store")
DEFAULT_TIMEOUT_S = 0.25
DEFAULT_PREFIX = "fleetgate:"
DEFAULT_MAX_CONNECTIONS = 64
REGISTRY_TTL_MS = 7 * 86400 * 1000  # the registrations' index outlives every record in it


def connect(url: str, timeout_s: float = DEFAULT_TIMEOUT_S,
            max_connections: int = DEFAULT_MAX_CONNECTIONS) -> Redis:
    """A client that fails fast: socket timeouts of ``timeout_s``, no retry after a timeout.

    One retry, on a new connection, after a connection error: after Redis restarts, every
    pooled connection is stale (closed by the old server) and its first command fails; that
    is not an outage, and taking it for one flipped the stores between degraded and
    recovered once per stale connection. A Redis that is really down refuses the second
    connection as fast as the first.

    A blocking pool: a burst of calls beyond ``max_connections`` waits for a connection
    (within the same ``timeout_s``) instead of failing with "too many connections" (the
    default pool's behaviour at 100), which would put the gateway in degraded mode.
    No CLIENT SETINFO on connect (one round trip less). Creating it does no I/O.
    """
    pool = BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=timeout_s, socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s, retry=Retry(NoBackoff(), 1, (ConnectionError,)),
        health_check_interval=0, lib_name=None, lib_version=None)
    return Redis.from_pool(pool)  # the client owns the pool: aclose() disconnects it


class _RedisBase:
    def __init__(self, client: Redis, prefix: str = DEFAULT_PREFIX,
                 timeout_s: float = DEFAULT_TIMEOUT_S, owns_client: bool = False) -> None:
        self.client = client
        self.prefix = prefix
        self.timeout_s = timeout_s
        self._owns_client = owns_client

    async def _run(self, call: Awaitable[T]) -> T:
        try:
            async with asyncio.timeout(self.timeout_s):
                return await call
        except (RedisError, OSError, TimeoutError) as exc:
            raise StoreUnavailable(f"redis: {type(exc).__name__}: {exc}") from exc

    async def close(self) -> None:
        if self._owns_client:
            await self.client.aclose()


class RedisSharedState(_RedisBase):
    """``SharedState`` over Redis."""

    def __init__(self, client: Redis, prefix: str = DEFAULT_PREFIX,
                 timeout_s: float = DEFAULT_TIMEOUT_S, owns_client: bool = False) -> None:
        super().__init__(client, prefix, timeout_s, owns_client)
        self._registry = f"{prefix}replicas"
        self._blob_prefix = f"{prefix}replica:"
        self._peers = client.register_script(lua.PEERS)
        self._reg_registry = f"{prefix}registrations"
        self._reg_prefix = f"{prefix}reg:"
        self._register = client.register_script(lua.REGISTER)
        self._registrations = client.register_script(lua.REGISTRATIONS)
        self._prefix = prefix

    @classmethod
    def from_url(cls, url: str, prefix: str = DEFAULT_PREFIX,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> RedisSharedState:
        return cls(connect(url, timeout_s), prefix, timeout_s, owns_client=True)

    async def publish(self, replica_id: str, shares: Mapping[str, EndpointShare],
                      ttl_s: float) -> None:
        ttl_ms = max(1, math.ceil(ttl_s * 1000))
        pipe = self.client.pipeline(transaction=False)
        pipe.set(self._blob_prefix + replica_id, encode_shares(shares), px=ttl_ms)
        pipe.sadd(self._registry, replica_id)
        pipe.pexpire(self._registry, 10 * ttl_ms)  # only matters once every replica is gone
        await self._run(pipe.execute())

    async def peers(self, replica_id: str) -> dict[str, dict[str, EndpointShare]]:
        flat: list[bytes] = await self._run(self._peers(
            keys=[self._registry], args=[self._blob_prefix, replica_id]))
        out = {}
        for i in range(0, len(flat), 2):
            try:
                out[flat[i].decode()] = decode_shares(flat[i + 1])
            except ValueError:  # one replica of an incompatible version: route without it
                log.debug("skipping malformed shares of replica %r", flat[i])
        return out

    async def put_registration(self, key: str, record: bytes, ttl_s: float,
                               now: float) -> None:
        ttl_ms = max(1, math.ceil(ttl_s * 1000))
        await self._run(self._register(
            keys=[self._reg_prefix + key, self._reg_registry],
            args=[record, ttl_ms, key, repr(float(now)), REGISTRY_TTL_MS]))

    async def drop_registration(self, key: str) -> None:
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(self._reg_prefix + key)
        pipe.zrem(self._reg_registry, key)
        await self._run(pipe.execute())

    async def registrations(self) -> list[Registered]:
        flat: list[Any] = await self._run(self._registrations(
            keys=[self._reg_registry], args=[self._reg_prefix]))
        return [Registered(flat[i].decode(), bytes(flat[i + 1]), float(flat[i + 2]),
                           max(0.0, int(flat[i + 3]) / 1000))
                for i in range(0, len(flat), 4)]

    async def publish_blob(self, kind: str, replica_id: str, blob: bytes,
                           ttl_s: float) -> None:
        ttl_ms = max(1, math.ceil(ttl_s * 1000))
        pipe = self.client.pipeline(transaction=False)
        pipe.set(f"{self._prefix}{kind}:{replica_id}", blob, px=ttl_ms)
        pipe.sadd(f"{self._prefix}{kind}-replicas", replica_id)
        pipe.pexpire(f"{self._prefix}{kind}-replicas", 2 * ttl_ms)
        await self._run(pipe.execute())

    async def blobs(self, kind: str) -> dict[str, bytes]:
        flat: list[bytes] = await self._run(self._peers(
            keys=[f"{self._prefix}{kind}-replicas"], args=[f"{self._prefix}{kind}:", ""]))
        return {flat[i].decode(): bytes(flat[i + 1]) for i in range(0, len(flat), 2)}


class RedisLimits(_RedisBase):
    """``RateLimits`` and ``Budgets`` over Redis; every check-and-change is one Lua call."""

    def __init__(self, client: Redis, prefix: str = DEFAULT_PREFIX,
                 timeout_s: float = DEFAULT_TIMEOUT_S, owns_client: bool = False) -> None:
        super().__init__(client, prefix, timeout_s, owns_client)
        self._take = client.register_script(lua.TAKE)
        self._record = client.register_script(lua.RECORD)
        self._acquire = client.register_script(lua.ACQUIRE)
        self._reserve_spend = client.register_script(lua.RESERVE_SPEND)
        self._settle_spend = client.register_script(lua.SETTLE_SPEND)
        self._instance = uuid.uuid4().hex[:12]  # unique across replicas and restarts
        self._seq = itertools.count(1)

    @classmethod
    def from_url(cls, url: str, prefix: str = DEFAULT_PREFIX,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> RedisLimits:
        return cls(connect(url, timeout_s), prefix, timeout_s, owns_client=True)

    # -- RateLimits --------------------------------------------------------------------
    async def take(self, key: str, amount: float, limit: float, window_s: float,
                   now: float) -> Verdict:
        log = f"{self.prefix}rl:{key}"
        res: list[Any] = await self._run(self._take(
            keys=[log, log + ":sum"],
            args=[repr(float(amount)), repr(float(limit)), repr(float(window_s)),
                  repr(float(now)), self._uid(), _gc_ms(window_s)]))
        entry = res[3].decode() if len(res) > 3 else None
        return Verdict(bool(res[0]), float(res[1]), float(res[2]), entry)

    async def record(self, key: str, amount: float, window_s: float, now: float,
                     replaces: str | None = None) -> None:
        if amount <= 0 and replaces is None:
            return
        log = f"{self.prefix}rl:{key}"
        await self._run(self._record(
            keys=[log, log + ":sum"],
            args=[repr(float(amount)), repr(float(window_s)), repr(float(now)), self._uid(),
                  _gc_ms(window_s), replaces or ""]))

    async def acquire(self, key: str, limit: int, ttl_s: float, now: float) -> str | None:
        hold_id = self._uid()
        held = await self._run(self._acquire(
            keys=[f"{self.prefix}sem:{key}"],
            args=[int(limit), repr(float(now)), repr(float(ttl_s)), hold_id, _gc_ms(ttl_s)]))
        return hold_id if held == 1 else None

    async def release(self, key: str, hold_id: str) -> None:
        await self._run(self.client.zrem(f"{self.prefix}sem:{key}", hold_id))

    # -- Budgets -----------------------------------------------------------------------
    async def add_spend(self, key: str, usd: float, period_key: str, ttl_s: float,
                        settles: str | None = None) -> float:
        name = f"{self.prefix}usd:{key}:{period_key}"
        ttl_ms = max(1, math.ceil(ttl_s * 1000))
        if settles is not None:
            total = await self._run(self._settle_spend(
                keys=_spend_keys(name), args=[repr(float(usd)), ttl_ms, settles]))
            return float(total)
        pipe = self.client.pipeline(transaction=True)
        pipe.incrbyfloat(name, usd)
        pipe.pexpire(name, ttl_ms)
        total, _ = await self._run(pipe.execute())
        return float(total)

    async def reserve_spend(self, key: str, usd: float, period_key: str, cap: float,
                            ttl_s: float, now: float) -> str | None:
        name, hold_id = f"{self.prefix}usd:{key}:{period_key}", self._uid()
        held = await self._run(self._reserve_spend(
            keys=_spend_keys(name),
            args=[repr(float(usd)), repr(float(cap)), repr(float(now)), repr(float(ttl_s)),
                  hold_id, _gc_ms(ttl_s)]))
        return hold_id if held == 1 else None

    async def spent(self, key: str, period_key: str) -> float:
        value = await self._run(self.client.get(f"{self.prefix}usd:{key}:{period_key}"))
        return 0.0 if value is None else float(value)

    def _uid(self) -> str:
        return f"{self._instance}.{next(self._seq)}"


def _spend_keys(name: str) -> list[str]:
    return [name, name + ":res", name + ":resamt", name + ":ressum"]


def _gc_ms(seconds: float) -> int:
    """Key TTL: the data's own lifetime plus a second (garbage collection only)."""
    return math.ceil(seconds * 1000) + 1000
