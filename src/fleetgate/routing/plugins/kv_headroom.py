"""``kv_headroom`` scorer: free KV-cache tokens (scraped usage, or estimated from load) over
the best candidate's, so headroom compares across GPU types in tokens, not percent.

May touch: numpy. Must not touch: I/O.
"""

from __future__ import annotations

from fleetgate.routing.plugins.base import ScoringInput, normalise_max_over
from fleetgate.routing.types import FloatArray


def kv_headroom(inp: ScoringInput, _: object) -> FloatArray:
    return normalise_max_over(inp.est.kv_headroom_tokens, inp.mask)
