"""The ``Router`` seam: ``route(request, snapshot) -> Decision``, pure and synchronous.

No I/O, no awaits, no clock: everything it needs is in its arguments, so the same router
runs in the live gateway and in the simulator. ``PolicyRouter`` (policies.py) implements it.

May touch: routing types. Must not touch: HTTP, asyncio, the gateway.
"""

from __future__ import annotations

from typing import Protocol

from fleetgate.routing.types import Decision, RoutingRequest, Snapshot


class Router(Protocol):
    def route(self, request: RoutingRequest, snapshot: Snapshot) -> Decision: ...
