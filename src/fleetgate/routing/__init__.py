"""Routing: pure decisions from a request and an immutable snapshot of endpoint state."""

from fleetgate.routing.router import RoundRobinRouter, Router
from fleetgate.routing.types import (
    Candidate,
    Decision,
    EndpointView,
    RoutingRequest,
    Snapshot,
)

__all__ = [
    "Candidate",
    "Decision",
    "EndpointView",
    "RoundRobinRouter",
    "Router",
    "RoutingRequest",
    "Snapshot",
]
