"""``ProxyRequest``: one validated client request, everything the proxy path needs to carry.

Built by the API handler (``gateway/api/openai.py``) after parsing, auth and limits; read
by the service, the attempt, the stream relay and every observer. The limits admission
travels on it (not in a table keyed by the client's ``x-request-id``, which two requests
may share).

May touch: routing types, the API table. Must not touch: HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleetgate.gateway.proxy.apis import Api
from fleetgate.routing import RoutingRequest

if TYPE_CHECKING:
    from fleetgate.gateway.limits import Admission


@dataclass(frozen=True, slots=True)
class Fallback:
    """Why the request is tried on another model (``gateway/proxy/fallback.py``)."""

    asked: str  # the model the client asked for
    came_from: str  # the model tried just before
    reason: str  # fallback.REASONS
    error: str  # what the model before answered

    def explain(self) -> dict[str, str]:
        return {"asked": self.asked, "from": self.came_from, "reason": self.reason,
                "error": self.error}


@dataclass(slots=True)
class ProxyRequest:
    api: Api
    routing: RoutingRequest
    body: dict[str, Any]  # forwarded as is, except the model name (and include_usage)
    request_id: str
    client_wants_usage: bool = False
    traceparent: str | None = None
    admission: Admission | None = None  # the caller's limits to settle; None: no limits
    priority: str = "normal"  # state.admission.PRIORITIES: who waits and who is shed first
    weight: float = 1.0  # the tenant's share when requests wait (weighted fair queuing)
    # the ledger's charges for it so far, every attempt's (the telemetry recorder adds them)
    cost_usd: float = 0.0
    allowed_models: frozenset[str] | None = None  # the caller's key's models (None: any)
    # set while a fallback model is tried (``routing.model`` is then that model)
    fallback: Fallback | None = None
    tracestate: str | None = None  # the caller's W3C ``tracestate``, passed on with its trace

    @property
    def path(self) -> str:
        return self.api.path
