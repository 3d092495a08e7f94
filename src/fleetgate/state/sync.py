"""Replica sync: share per-endpoint load with the other gateway replicas, off the hot path.

Every ``interval_s`` the sync task publishes this replica's view of each endpoint (its own
in-flight count, latency EWMAs, learned corrections, breaker, health) to the shared state
with a TTL of a few intervals, and reads the other live replicas' views: their in-flight
counts are summed into each endpoint's ``peer_in_flight`` and their open breakers into
``peer_block_until``, which the router reads from its local snapshot. Routing never waits on
Redis; a replica that dies stops publishing and its load expires with the TTL.

A failing store (Redis down) costs one logged warning and a ``degraded`` flag; the sync
keeps trying every interval and resumes by itself.

May touch: the shared-state store, routing live state. Must not touch: HTTP.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable

from fleetgate.state.fleet import Fleet
from fleetgate.state.store import EndpointShare, SharedState, StoreUnavailable

log = logging.getLogger("fleetgate.sync")


class PeerSync:
    def __init__(self, shared: SharedState, replica_id: str, fleet: Callable[[], Fleet],
                 interval_s: float = 0.5, wall: Callable[[], float] = time.time) -> None:
        self._shared = shared
        self.replica_id = replica_id
        self._fleet = fleet
        self.interval_s = interval_s
        self._wall = wall
        self.failures = 0
        self.peers_seen = 0

    async def tick(self) -> None:
        fleet = self._fleet()
        await self._shared.publish(self.replica_id, self._shares(fleet), 3 * self.interval_s)
        peers = await self._shared.peers(self.replica_id)
        self.peers_seen = len(peers)
        in_flight: dict[str, float] = defaultdict(float)
        blocked: dict[str, float] = defaultdict(float)
        for shares in peers.values():
            for endpoint_id, share in shares.items():
                in_flight[endpoint_id] += share.in_flight
                blocked[endpoint_id] = max(blocked[endpoint_id], share.breaker_open_until)
        mono, wall = fleet.clock(), self._wall()
        for i, ep in enumerate(fleet.endpoints):
            until = blocked.get(ep.id, 0.0)
            local_until = mono + (until - wall) if until > wall else 0.0
            fleet.live.on_peers(i, in_flight.get(ep.id, 0.0), local_until)

    async def run(self) -> None:
        while True:
            try:
                await self.tick()
                if self.failures:
                    log.warning("shared state is back after %d failed syncs", self.failures)
                    self.failures = 0
            except StoreUnavailable as exc:
                if not self.failures:
                    log.warning("shared state unavailable, routing on local state: %s", exc)
                self.failures += 1
            except Exception:
                log.exception("replica sync failed")
            await asyncio.sleep(self.interval_s)

    def _shares(self, fleet: Fleet) -> dict[str, EndpointShare]:
        live, mono, wall = fleet.live, fleet.clock(), self._wall()
        out = {}
        for i, ep in enumerate(fleet.endpoints):
            block = live.value(i, "block_until")
            until = wall + (block - mono) if block > mono else 0.0
            out[ep.id] = EndpointShare(
                in_flight=live.value(i, "in_flight"), ttft_s=_opt(live.value(i, "ttft_s")),
                tpot_s=_opt(live.value(i, "tpot_s")),
                tokens_per_s=_opt(live.value(i, "tokens_per_s")),
                k_ttft=live.value(i, "k_ttft"), k_tpot=live.value(i, "k_tpot"),
                breaker_open_until=until, health=live.stats[i].health.state)
        return out


def _opt(value: float) -> float | None:
    return None if math.isnan(value) else value
