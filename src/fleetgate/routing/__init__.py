"""Routing: pure decisions from a request and an immutable snapshot of endpoint state."""

from fleetgate.routing.live import LiveFleet
from fleetgate.routing.policies import PolicyError, PolicyRouter, build_router
from fleetgate.routing.prior import Prior, endpoint_prior
from fleetgate.routing.router import Router
from fleetgate.routing.types import (
    Candidate,
    Decision,
    EndpointInfo,
    RoutingRequest,
    Snapshot,
)

__all__ = [
    "Candidate",
    "Decision",
    "EndpointInfo",
    "LiveFleet",
    "PolicyError",
    "PolicyRouter",
    "Prior",
    "Router",
    "RoutingRequest",
    "Snapshot",
    "build_router",
    "endpoint_prior",
]
