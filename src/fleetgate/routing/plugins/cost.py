"""The cost scorer: busy replicas by the request's marginal $, idle ones by $/Mtok.

A request on a busy candidate (one with a request in flight) scores 0.5 + 0.5 x cheapest
marginal $ / its marginal $ (``routing/estimate.py``, ``marginal_usd``: the replica time it
adds there, priced; on a busy replica a share of steps that run anyway, larger the emptier
the replica, so the fullest of a price is filled first); on an idle candidate it scores
0.5 x cheapest $/Mtok at capacity / its $/Mtok. So a busy replica with room within its SLO
capacity (the ``cost`` strategy's SLO filter) always goes before an idle one, and when none
has room the idle replica cheapest per token at capacity is opened: the router fills the
cheapest capacity that is already busy and leaves whole replicas idle for a scaler to
release. Ranking every candidate by the idle rule alone (the average $/Mtok, as before)
spread the load over every replica that was cheapest on average and paid each one's whole
time: 1.7% dearer than round robin on a ten-replica mixed fleet (BENCHMARKS.md, issue 22);
ranking every candidate by marginal $ opened replicas by the price of their steps, not of
their tokens (the shipped fleet's H200s before its MI355Xs).

An endpoint that cannot meet the SLO at any batch size has an infinite price and scores 0.

May touch: numpy. Must not touch: I/O.
"""

from __future__ import annotations

import numpy as np

from fleetgate.routing.compiled import compiled
from fleetgate.routing.plugins.base import ScoringInput
from fleetgate.routing.types import BoolArray, FloatArray


def cost(inp: ScoringInput, _: object) -> FloatArray:
    out = np.empty(len(inp.mask))
    _score(inp.est.marginal_usd, inp.est.usd_per_mtok, inp.est.active, inp.mask, out)
    return out


@compiled
def _score(marginal: FloatArray, per_mtok: FloatArray, active: FloatArray, mask: BoolArray,
           out: FloatArray) -> None:
    """Busy candidates: 0.5 + 0.5 x cheapest marginal $ / marginal $ (in (0.5, 1]); idle
    ones: 0.5 x cheapest $/Mtok / $/Mtok (in (0, 0.5]); masked-out or infinitely dear: 0.
    Two passes in one compiled call (two normalisations and a select were five numpy calls)."""
    best_busy = best_idle = np.inf
    for i in range(mask.shape[0]):
        if mask[i]:
            if active[i] >= 1.0:
                best_busy = min(best_busy, marginal[i]) if marginal[i] > 0 else best_busy
            elif per_mtok[i] > 0:
                best_idle = min(best_idle, per_mtok[i])
    for i in range(mask.shape[0]):
        busy = active[i] >= 1.0
        value, best = (marginal[i], best_busy) if busy else (per_mtok[i], best_idle)
        if not (mask[i] and value > 0 and value < np.inf and best < np.inf):
            out[i] = 0.0
        else:
            out[i] = (0.5 + 0.5 * best / value) if busy else 0.5 * best / value


_score(np.ones(2), np.ones(2), np.array([0.0, 1.0]), np.ones(2, dtype=bool), np.empty(2))
