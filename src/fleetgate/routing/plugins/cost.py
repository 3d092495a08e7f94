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

A hosted API priced per token (the ``per_token`` column) is overflow: it scores in
(0, HOSTED_BAND], HOSTED_BAND x the cheapest hosted marginal $ / its marginal $ (what this
request would be charged there), and every self-hosted score is lifted above that band (idle
ones into (HOSTED_BAND, 0.5]). Under the ``cost`` strategy's SLO preference every
self-hosted endpoint predicted to meet the SLO goes first, then the hosted APIs that have
room under their cap, then the rest fastest-first: a hosted API takes what the self-hosted
fleet cannot carry within the SLO (a burst that outruns the scaler's cold start) and before
admission waits or sheds, however cheap its tokens look against an idle replica (that
replica is paid for either way).

May touch: numpy. Must not touch: I/O.
"""

from __future__ import annotations

import numpy as np

from fleetgate.routing.compiled import compiled
from fleetgate.routing.plugins.base import ScoringInput
from fleetgate.routing.types import BoolArray, FloatArray

HOSTED_BAND = 0.05  # hosted APIs score in (0, HOSTED_BAND], self-hosted ones above it


def cost(inp: ScoringInput, _: object) -> FloatArray:
    out = np.empty(len(inp.mask))
    _score(inp.est.marginal_usd, inp.est.usd_per_mtok, inp.est.active,
           inp.est.column("per_token"), inp.mask, out)
    return out


@compiled
def _score(marginal: FloatArray, per_mtok: FloatArray, active: FloatArray,
           per_token: FloatArray, mask: BoolArray, out: FloatArray) -> None:
    """Busy self-hosted candidates: 0.5 + 0.5 x cheapest marginal $ / marginal $ (in
    (0.5, 1]); idle ones: HOSTED_BAND + (0.5 - HOSTED_BAND) x cheapest $/Mtok / $/Mtok;
    hosted ones: HOSTED_BAND x cheapest hosted marginal $ / marginal $; masked-out or
    infinitely dear: 0. Two passes in one compiled call (two normalisations and a select
    were five numpy calls)."""
    best_busy = best_idle = best_hosted = np.inf
    for i in range(mask.shape[0]):
        if mask[i]:
            if per_token[i] > 0:
                best_hosted = min(best_hosted, marginal[i]) if marginal[i] > 0 else best_hosted
            elif active[i] >= 1.0:
                best_busy = min(best_busy, marginal[i]) if marginal[i] > 0 else best_busy
            elif per_mtok[i] > 0:
                best_idle = min(best_idle, per_mtok[i])
    for i in range(mask.shape[0]):
        hosted, busy = per_token[i] > 0, active[i] >= 1.0
        if hosted:
            value, best = marginal[i], best_hosted
        else:
            value, best = (marginal[i], best_busy) if busy else (per_mtok[i], best_idle)
        if not (mask[i] and value > 0 and value < np.inf and best < np.inf):
            out[i] = 0.0
        elif hosted:
            out[i] = HOSTED_BAND * best / value
        else:
            out[i] = (0.5 + 0.5 * best / value) if busy else \
                HOSTED_BAND + (0.5 - HOSTED_BAND) * best / value


_score(np.ones(3), np.ones(3), np.array([0.0, 1.0, 0.0]), np.array([0.0, 0.0, 1.0]),
       np.ones(3, dtype=bool), np.empty(3))
