"""The live dashboard: ``GET /dashboard``, a static page served by the gateway itself.

The page (``static/``: one HTML file, two scripts, one stylesheet, no build step, no
third-party code, nothing fetched from another origin) polls the admin JSON routes
(``/admin/endpoints``, ``/admin/costs``, ``/admin/decisions``, ``/admin/shadow``,
``/admin/scaling``) at a bounded rate, so every number it shows is the admin API's number
by construction. When auth is on, the page itself holds no data: it asks for an admin key
and sends it as ``Authorization: Bearer`` on each admin call, which ``AdminGate`` checks as
for any client. The replicas and bill per pool: an autoscaled pool's figures are
``/admin/scaling``'s (the scaler's last tick, read, never computed by the page), a fixed
pool's are ``/admin/endpoints``'; endpoints the scaler parks (``parked``) show as off, not
as failures.

May touch: starlette, the files in ``static/``. Must not touch: the app state, the request path.
"""

from fleetgate.gateway.dashboard.routes import router

__all__ = ["router"]
