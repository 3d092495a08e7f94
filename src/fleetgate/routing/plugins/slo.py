"""``slo`` scorer: 1 when the endpoint is predicted to meet the policy's SLO, else 0.

May touch: numpy. Must not touch: I/O.
"""

from __future__ import annotations

import numpy as np

from fleetgate.routing.plugins.base import ScoringInput
from fleetgate.routing.types import FloatArray


def slo(inp: ScoringInput, _: object) -> FloatArray:
    return np.asarray(inp.est.meets_slo, dtype=float)
