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

    @property
    def path(self) -> str:
        return self.api.path
