"""The live dashboard: ``GET /dashboard``, a static page served by the gateway itself.

The page (``static/``: one HTML file, one script, one stylesheet, no build step, no
third-party code, nothing fetched from another origin) polls the admin JSON routes
(``/admin/endpoints``, ``/admin/costs``, ``/admin/decisions``, ``/admin/shadow``) at a
bounded rate, so every number it shows is the admin API's number by construction. When
auth is on, the page itself holds no data: it asks for an admin key and sends it as
``Authorization: Bearer`` on each admin call, which ``AdminGate`` checks as for any client.

May touch: starlette, the files in ``static/``. Must not touch: the app state, the request path.
"""

from fleetgate.gateway.dashboard.routes import router

__all__ = ["router"]
