"""Shared state for gateway replicas: load shares, rate limits, concurrency and spend.

``create_stores(None)`` gives in-memory stores (one replica, the default);
``create_stores("redis://...")`` gives Redis stores behind failover wrappers, sharing one
client (one connection pool); ``create_stores(None, local_socket=path)`` gives the stores a
``serve --workers N`` supervisor serves its workers (``local``), behind the same failover.
The lifespan owns the returned ``Stores`` and closes it. See ``base`` for the protocols and
their semantics, ``failover`` for what happens while the store is down.

May touch: the store modules. Must not touch: routing, HTTP, config.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fleetgate.state.store.base import (
    Budgets,
    EndpointShare,
    LimitStore,
    RateLimits,
    Registered,
    SharedState,
    StoreUnavailable,
    Verdict,
    new_replica_id,
)
from fleetgate.state.store.failover import FailoverLimitStore, FailoverSharedState
from fleetgate.state.store.memory import MemoryLimits, MemorySharedState

__all__ = [
    "Budgets",
    "EndpointShare",
    "FailoverLimitStore",
    "FailoverSharedState",
    "LimitStore",
    "MemoryLimits",
    "MemorySharedState",
    "RateLimits",
    "Registered",
    "SharedState",
    "StoreUnavailable",
    "Stores",
    "Verdict",
    "create_stores",
    "new_replica_id",
]


@dataclass(slots=True)
class Stores:
    """What one gateway process uses: ``limits`` is both ``RateLimits`` and ``Budgets``."""

    shared: SharedState
    limits: LimitStore
    close_client: Callable[[], Awaitable[None]] | None = None

    @property
    def degraded(self) -> bool:
        """True while a Redis store is down and its fallback answers."""
        return any(getattr(s, "degraded", False) for s in (self.shared, self.limits))

    async def close(self) -> None:
        await self.shared.close()
        await self.limits.close()
        if self.close_client is not None:
            await self.close_client()


def create_stores(redis_url: str | None, *, prefix: str = "fleetgate:",
                  timeout_s: float = 0.25, retry_every_s: float = 1.0,
                  clock: Callable[[], float] = time.monotonic,
                  local_socket: str | None = None) -> Stores:
    """In-memory stores for ``None``; Redis stores with failover for a URL; the supervisor's
    stores for ``local_socket`` (Redis wins when both are given). No I/O here: the first
    call connects, and a store that is down at start-up is an outage like any."""
    if redis_url is None and local_socket is not None:
        from fleetgate.state.store.local import LocalStore

        local = LocalStore(local_socket, timeout_s)
        return Stores(FailoverSharedState(local, retry_every_s, clock),
                      FailoverLimitStore(local, MemoryLimits(clock), retry_every_s, clock),
                      local.close)
    if redis_url is None:
        return Stores(MemorySharedState(clock), MemoryLimits(clock))
    from fleetgate.state.store.redis import RedisLimits, RedisSharedState, connect

    client = connect(redis_url, timeout_s)
    shared = FailoverSharedState(RedisSharedState(client, prefix, timeout_s),
                                 retry_every_s, clock)
    limits = FailoverLimitStore(RedisLimits(client, prefix, timeout_s), MemoryLimits(clock),
                                retry_every_s, clock)
    return Stores(shared, limits, client.aclose)
