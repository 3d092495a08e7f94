"""The cost scorer: cheaper $/Mtok at the SLO scores higher.

score = min($/Mtok over candidates) / $/Mtok; an endpoint that cannot meet the SLO at any
batch size has infinite $/Mtok and scores 0. $/Mtok is the replica's $/s over the tokens/s
it sustains at the SLO (``routing/estimate.py``), so a cheap-per-hour GPU that is slow is
not mistaken for a cheap-per-token one.

May touch: numpy. Must not touch: I/O.
"""

from __future__ import annotations

from fleetgate.routing.plugins.base import ScoringInput, normalise_min_over
from fleetgate.routing.types import FloatArray


def cost(inp: ScoringInput, _: object) -> FloatArray:
    return normalise_min_over(inp.est.usd_per_mtok, inp.mask)
