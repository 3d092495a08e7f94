"""The HTTP edge: the ASGI app, request parsing, relaying, the fleet's runtime state."""
