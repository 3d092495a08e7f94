"""The gateway as an ASGI app for granian (``--systems fleetgate-granian``): the same app
``fleetgate serve`` builds, from the config in ``$FG_CONFIG``, served by granian instead of
uvicorn, to measure the server alone (BENCHMARKS.md: granian did not pay here)."""

import logging
import os

from fleetgate.gateway.app import create_app
from fleetgate.gateway.settings import Settings

logging.basicConfig(level=logging.WARNING)
app = create_app(Settings.from_env(config_path=os.environ["FG_CONFIG"]))
