"""``latency`` scorer: predicted end-to-end time of this request (TTFT + TPOT * (max_tokens
- 1)); score = fastest / this.

May touch: numpy. Must not touch: I/O.
"""

from __future__ import annotations

from fleetgate.routing.plugins.base import ScoringInput, normalise_min_over
from fleetgate.routing.types import FloatArray


def latency(inp: ScoringInput, _: object) -> FloatArray:
    return normalise_min_over(inp.est.e2e_s, inp.mask)
