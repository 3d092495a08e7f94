"""Routing: pure decisions from a request and an immutable snapshot of endpoint state.

No I/O, no awaits, no clocks: the same router runs in the live gateway and the simulator.
"""

from fleetgate.routing.policies import PolicyError, PolicyRouter, build_router
from fleetgate.routing.router import Router
from fleetgate.routing.types import (
    Candidate,
    Decision,
    Endpoint,
    RoutingRequest,
    Snapshot,
)

__all__ = [
    "Candidate",
    "Decision",
    "Endpoint",
    "PolicyError",
    "PolicyRouter",
    "Router",
    "RoutingRequest",
    "Snapshot",
    "build_router",
]
