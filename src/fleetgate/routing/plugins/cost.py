"""The cost scorer: the request's marginal $ scores higher the lower it is.

score = min(marginal $ over candidates) / marginal $ (``routing/estimate.py``,
``marginal_usd``): the replica time this request adds where it goes, priced. On a busy
replica that is its share of slightly longer steps (its KV reads and its prefill); on an
idle one also the steps' fixed part, at the share it has once the replica is full at its SLO
capacity, so the cheapest capacity per token is opened first and then filled, while busy
replicas are filled before idle ones are opened. An endpoint that cannot meet the SLO at any
batch size has an infinite price and scores 0; the ``cost`` strategy's SLO filter keeps
packing within the learned SLO capacity. (Ranking by the average $/Mtok at capacity, as
before, spread the load over every replica that was cheapest on average and paid each
one's whole time: 1.7% dearer than round robin on a ten-replica mixed fleet, BENCHMARKS.md.)

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
    busy = inp.est.active >= 1.0
    on_busy = normalise_min_over(inp.est.marginal_usd, inp.mask & busy)
    on_idle = normalise_min_over(inp.est.usd_per_mtok, inp.mask & ~busy)
    return np.where(busy, np.where(on_busy > 0, 0.5 + 0.5 * on_busy, 0.0), 0.5 * on_idle)
