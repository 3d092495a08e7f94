"""The cost scorer: cheaper $/Mtok at the SLO scores higher.

score = min($/Mtok over candidates) / $/Mtok; an endpoint that cannot meet the SLO at any
batch size has infinite $/Mtok and scores 0. $/Mtok is the replica's $/s over the tokens/s
it sustains at the SLO (``routing/estimate.py``), so a cheap-per-hour GPU that is slow is
not mistaken for a cheap-per-token one.

Among endpoints of the same price (the replicas of one pool), the busier one scores up to
``PACK`` higher: load = active / SLO batch, clipped to [0, 1]. Requests then fill one
replica to its SLO capacity before the next gets any, so every busy replica runs near the
batch its $/Mtok assumes (a spread of light batches costs the same GPU-seconds for fewer
tokens), and replicas nobody needs stay idle for an autoscaler to stop. ``PACK`` is small
enough never to reorder pools whose $/Mtok differ by more than 1%; the SLO filter of the
``cost`` strategy keeps packing within what the SLO allows.

May touch: numpy. Must not touch: I/O.
"""

from __future__ import annotations

import numpy as np

from fleetgate.routing.plugins.base import ScoringInput, normalise_min_over
from fleetgate.routing.types import FloatArray

PACK = 0.01


def cost(inp: ScoringInput, _: object) -> FloatArray:
    score = normalise_min_over(inp.est.usd_per_mtok, inp.mask)
    return score * (1.0 + PACK * np.minimum(np.maximum(inp.est.load, 0.0), 1.0))  # np.clip costs 2x
