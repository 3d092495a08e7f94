"""The values the router works on: a request's routing facts, an endpoint snapshot, a decision.

All frozen: the router reads an immutable snapshot and returns a ``Decision`` that keeps
every candidate's per-scorer scores, so any choice can be explained later (admin API,
traces, dashboard). Nothing here does I/O or reads a clock.

May touch: dataclasses only. Must not touch: HTTP, asyncio, the gateway.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

Health = Literal["pending", "ready", "not_ready"]


@dataclass(frozen=True, slots=True)
class RoutingRequest:
    """What routing needs to know about a request; the body itself is never parsed further."""

    model: str
    stream: bool = False
    max_tokens: int | None = None
    prompt_chars: int = 0
    headers: Mapping[str, str] = field(default_factory=dict)
    user: str | None = None
    tenant: str | None = None
    policy: str | None = None  # asked for by name (x-fleetgate-policy), already authorised


@dataclass(frozen=True, slots=True)
class EndpointView:
    """One endpoint as the router sees it at one instant."""

    id: str
    pool: str
    url: str
    engine: str
    accelerator: str
    vendor: str
    models: Mapping[str, str]  # public -> served
    price_per_replica_hour: float
    health: Health = "pending"
    breaker_open: bool = False
    in_flight: int = 0

    def serves(self, model: str) -> bool:
        return model in self.models


@dataclass(frozen=True, slots=True)
class Snapshot:
    """An immutable view of the fleet, taken once per request."""

    endpoints: tuple[EndpointView, ...]
    taken_at: float = 0.0


@dataclass(frozen=True, slots=True)
class Candidate:
    endpoint: EndpointView
    score: float
    scores: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Decision:
    """The router's answer: endpoints best-first (the tail is the retry order)."""

    policy: str
    model: str
    ranked: tuple[Candidate, ...]
    reason: str
    rejected: Mapping[str, str] = field(default_factory=dict)  # endpoint id -> why filtered

    @property
    def chosen(self) -> Candidate | None:
        return self.ranked[0] if self.ranked else None
