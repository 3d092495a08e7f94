"""Replica sync: share per-endpoint load with the other gateway replicas, off the hot path.

Every ``interval_s`` the sync task publishes this replica's view of the endpoints it has
something to say about (its own in-flight requests, recent requests or an open breaker
there: at 10,000 endpoints a share of every one would cost more than the scraping it saves)
to the shared state with a TTL of a few intervals, and reads the other live replicas'
views: their in-flight counts are summed into each endpoint's ``peer_in_flight``, their
request rates into ``peer_requests_per_s`` (the scaler's demand) and their open breakers
into ``peer_block_until``, which the router reads from its local snapshot; an endpoint no
peer mentions any more goes back to 0. Routing never waits on Redis; a replica that dies
stops publishing and its load expires with the TTL.

The same tick keeps the collector's scraping shard (``state/shard.py``) current: the live
replicas are this one and those whose shares are live (the collector reads the peers'
scraped rows itself, at each of its steps).

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
from collections.abc import Callable, Mapping

import numpy as np

from fleetgate.state.fleet import Fleet
from fleetgate.state.shard import ScrapeShard
from fleetgate.state.store import EndpointShare, SharedState, StoreUnavailable

log = logging.getLogger("fleetgate.sync")
MIN_SHARED_RATE = 0.01  # requests/s: an endpoint sent less (and nothing in flight) is idle


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
        self._mentioned: set[int] = set()  # endpoints with peer load or breakers last tick

    async def tick(self) -> None:
        fleet = self._fleet()
        await self._shared.publish(self.replica_id, self._shares(fleet), 3 * self.interval_s)
        peers = await self._shared.peers(self.replica_id)
        self.peers_seen = len(peers)
        in_flight: dict[str, float] = defaultdict(float)
        blocked: dict[str, float] = defaultdict(float)
        rates: dict[str, float] = defaultdict(float)
        for shares in peers.values():
            for endpoint_id, share in shares.items():
                in_flight[endpoint_id] += share.in_flight
                blocked[endpoint_id] = max(blocked[endpoint_id], share.breaker_open_until)
                rates[endpoint_id] += share.requests_per_s
        mono, wall, index = fleet.clock(), self._wall(), fleet.live.index
        mentioned = {i for eid in (*in_flight, *blocked) if (i := index.get(eid)) is not None}
        for i in mentioned | self._mentioned:
            eid = fleet.endpoints[i].id
            until = blocked.get(eid, 0.0)
            local_until = mono + (until - wall) if until > wall else 0.0
            fleet.live.on_peers(i, in_flight.get(eid, 0.0), local_until, rates.get(eid, 0.0))
        self._mentioned = mentioned
        await self._scrape_shard(fleet, peers)

    async def _scrape_shard(self, fleet: Fleet, peers: Mapping[str, object]) -> None:
        collector = fleet.collector
        if collector is None:
            return
        if collector.shard is None:  # a new fleet (start, reload): its own shard
            collector.shard = ScrapeShard(fleet.endpoints, fleet.live, self.replica_id,
                                          self._shared, fleet.interval_s, fleet.clock,
                                          collector.peer_capacity, self._wall)
        collector.shard.assign(peers)  # the collector pulls the peers' rows at each step

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
        rates = live.request_rates(mono)
        busy = ((live.column("in_flight") > 0) | (live.column("block_until") > mono)
                | (rates >= MIN_SHARED_RATE))
        for i in np.flatnonzero(busy).tolist():  # the rest: nothing the others need from here
            ep = fleet.endpoints[i]
            block = live.value(i, "block_until")
            in_flight = live.value(i, "in_flight")
            until = wall + (block - mono) if block > mono else 0.0
            out[ep.id] = EndpointShare(
                in_flight=in_flight, ttft_s=_opt(live.value(i, "ttft_s")),
                tpot_s=_opt(live.value(i, "tpot_s")),
                tokens_per_s=_opt(live.value(i, "tokens_per_s")),
                k_ttft=live.value(i, "k_ttft"), k_tpot=live.value(i, "k_tpot"),
                breaker_open_until=until, health=live.stats[i].health.state,
                requests_per_s=float(rates[i]))
        return out


def _opt(value: float) -> float | None:
    return None if math.isnan(value) else value
