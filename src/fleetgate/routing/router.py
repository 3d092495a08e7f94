"""The ``Router`` seam and the round-robin router of the gateway core.

``Router.route(request, snapshot) -> Decision`` is pure and synchronous: no I/O, no awaits,
no clock. The same router runs in the live gateway and (later) in the simulator. The
round-robin router keeps one counter so consecutive requests rotate; the rest of the ranked
list is the retry order.

May touch: routing types. Must not touch: HTTP, asyncio, the gateway.
"""

from __future__ import annotations

import itertools
from typing import Protocol

from fleetgate.routing.types import Candidate, Decision, EndpointView, RoutingRequest, Snapshot


class Router(Protocol):
    def route(self, request: RoutingRequest, snapshot: Snapshot) -> Decision: ...


def eligible(request: RoutingRequest, snapshot: Snapshot) -> tuple[list[EndpointView], dict[str, str]]:
    """Builtin prefilters: serves the model, not known to be down, breaker allows."""
    keep: list[EndpointView] = []
    rejected: dict[str, str] = {}
    for ep in snapshot.endpoints:
        if not ep.serves(request.model):
            continue
        if ep.health == "not_ready":
            rejected[ep.id] = "not ready"
        elif ep.breaker_open:
            rejected[ep.id] = "breaker open"
        else:
            keep.append(ep)
    return keep, rejected


class RoundRobinRouter:
    """Rotates over eligible endpoints; ready endpoints come before pending ones."""

    def __init__(self, policy: str = "round_robin") -> None:
        self._policy = policy
        self._counter = itertools.count()

    def route(self, request: RoutingRequest, snapshot: Snapshot) -> Decision:
        keep, rejected = eligible(request, snapshot)
        if not keep:
            return Decision(self._policy, request.model, (), "no eligible endpoint", rejected)
        start = next(self._counter) % len(keep)
        rotated = keep[start:] + keep[:start]
        rotated.sort(key=lambda ep: ep.health != "ready")  # stable: keeps the rotation
        ranked = tuple(Candidate(ep, 1.0, {"round_robin": 1.0}) for ep in rotated)
        return Decision(self._policy, request.model, ranked, "round robin", rejected)
