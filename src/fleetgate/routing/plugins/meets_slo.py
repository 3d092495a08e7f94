"""``meets_slo`` filter: keep endpoints predicted to meet the policy's SLO (the ``cost``
strategy uses the SLO softly instead: when nobody meets it, it falls back to the fastest).

May touch: numpy. Must not touch: I/O.
"""

from __future__ import annotations

from fleetgate.routing.plugins.base import ScoringInput
from fleetgate.routing.types import BoolArray


def meets_slo(inp: ScoringInput, _: object) -> BoolArray:
    return inp.est.meets_slo
