"""``python -m fleetgate``: the command line (how ``serve --workers`` starts its workers)."""

from fleetgate.cli import app

app()
