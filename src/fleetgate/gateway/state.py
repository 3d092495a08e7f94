"""What one running gateway holds: settings, the fleet, the router, the services.

Built by the lifespan in ``app.py`` and hung on ``app.state.fleetgate``; never global.

May touch: gateway services. Must not touch: HTTP routes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fleetgate.config.schema import FleetConfig
from fleetgate.gateway.chat import ChatService
from fleetgate.gateway.fleet import Fleet
from fleetgate.gateway.settings import Settings
from fleetgate.routing import Router


@dataclass(slots=True)
class AppState:
    settings: Settings
    config: FleetConfig
    fleet: Fleet
    router: Router
    chat: ChatService
    started_at: float
    models: frozenset[str] = field(default_factory=frozenset)
