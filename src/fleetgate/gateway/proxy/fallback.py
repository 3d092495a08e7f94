"""Model fallbacks: when the asked model cannot be served, the next model of its route's
``fallbacks`` (``routing/policies.py`` ``FallbackRoutes`` says which, in which order).

``ProxyService`` raises ``Unserved`` where a model cannot be served, for one of ``REASONS``:

- ``context_window``: the request fits the context of no endpoint serving the model (prompt
  + ``max_tokens`` against each endpoint's context: the ``context_fit`` filter and the
  catalog's or the engine's ``max_model_len``); alone, the client's 400
  ``context_length_exceeded``;
- ``capacity``: admission shed it: every endpoint serving the model is past its SLO
  capacity and a slot would not free within the TTFT SLO (alone, 429 ``overloaded``). A
  caller's own limits (429 ``rate_limit_exceeded``) are judged before the service is
  called, so they never fall back;
- ``unavailable``: no endpoint serving the model may take a request now (unhealthy, breaker
  open, draining): alone, 503;
- ``refused``: every attempt failed before the first byte (connect errors, timeouts, the
  engines' 429/502/503/504): alone, 502/503/504.

Nothing else falls back: an engine's 4xx is the client's answer, a poison request is the
request's fault, and after a stream's first byte the model has answered.

``fall_back`` tries the fallbacks in order, each routed as a request for that model (its
route's policy unless ``x-fleetgate-policy`` names one), with the same body, its ``model``
rewritten to that model's served name. The answer says ``x-fleetgate-model: <model>``, the
model's decision in ``/admin/decisions`` says ``fallback`` (asked, from, reason, error) and
the decision it replaces ``fell_back_to``, and the route span carries the same; the
attempts are charged to the model that served (the observers read the request's model).
When the fallbacks cannot serve it either, the last one's error is the answer, its message
naming each model tried and why; with no fallback to try, the asked model's error goes out
unchanged. Nothing here runs unless a model could not be served.

May touch: the request, routing policies (the chain), the decision log, gateway errors.
Must not touch: HTTP, backends.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace

from starlette.responses import Response

from fleetgate.gateway.decisions import DecisionEntry, DecisionLog
from fleetgate.gateway.errors import GatewayError
from fleetgate.gateway.proxy.request import Fallback, ProxyRequest
from fleetgate.routing import Decision
from fleetgate.routing.policies import FallbackRoutes

CONTEXT_WINDOW, CAPACITY, UNAVAILABLE, REFUSED = REASONS = (
    "context_window", "capacity", "unavailable", "refused")


class Unserved(Exception):
    """The request's model cannot serve it: ``error`` is the client's answer if no fallback
    can; ``entry`` is the decision's log entry (None: not logged yet)."""

    def __init__(self, reason: str, error: GatewayError, decision: Decision,
                 entry: DecisionEntry | None) -> None:
        super().__init__(error.message)
        self.reason, self.error, self.decision, self.entry = reason, error, decision, entry


Serve = Callable[[ProxyRequest], Awaitable[Response]]


def _any_model(model: str) -> bool:
    return True


async def fall_back(req: ProxyRequest, routes: FallbackRoutes, failed: Unserved, serve: Serve,
                    log: DecisionLog) -> Response:
    """Serve ``req`` with the fallbacks of its model, which ``failed``; raise the error of
    the last model tried when none can."""
    asked = req.routing.model
    allowed = req.allowed_models
    trail = [f"{asked!r}: {failed.reason}"]
    for model in routes.chain(req.routing, _any_model if allowed is None else
                              allowed.__contains__):
        entry = failed.entry or log.record(req.request_id, failed.decision)
        entry.fell_back_to = model
        req.fallback = Fallback(asked, req.routing.model, failed.reason, failed.error.message)
        req.routing = replace(req.routing, model=model)
        try:
            return await serve(req)
        except Unserved as exc:
            failed = exc
            trail.append(f"{model!r}: {exc.reason}")
    error = failed.error
    if len(trail) > 1:
        error.message = f"{error.message} (no model could serve it: {', '.join(trail)})"
        error.args = (error.message,)
    raise error
