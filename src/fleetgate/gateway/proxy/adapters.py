"""A request for a LoRA adapter: make the adapter ready where the request goes.

The router (``routing/adapters.py``) sends an adapter request only to endpoints that hold
the adapter, or, when none does and its pool may load it, to the endpoints with room for
it (``Decision.load_adapter``). Before each attempt ``ProxyService`` asks ``adapter_ready``:
nothing to do when the endpoint holds it (its last use is noted, for the least recently
used eviction), else the request awaits the one load of that adapter on that endpoint
(``state/adapters.py``: single-flight, so 20 concurrent requests load it once). The load
runs shielded: a client that leaves does not cancel a load other requests wait for.

A failed load is not the engine failing a request: no attempt is started, no breaker
counts it; the decision log records it and the request tries its next candidate.

May touch: state (the fleet's adapter loader), backends' adapter errors.
"""

from __future__ import annotations

import asyncio

from fleetgate.backends.adapters import AdapterError
from fleetgate.routing import Decision
from fleetgate.state.fleet import Fleet


async def adapter_ready(fleet: Fleet, decision: Decision, i: int) -> str | None:
    """None once endpoint ``i`` holds the decision's adapter (at once when it already
    does, or when the model is no adapter), else why it could not be loaded there."""
    if decision.adapter is None or fleet.adapters is None:
        return None
    load = fleet.adapters.ready(i, decision.adapter)
    if load is None:
        return None
    try:
        await asyncio.shield(load)
    except AdapterError as exc:
        return f"could not load adapter {decision.adapter!r}: {exc.message}"
    return None
