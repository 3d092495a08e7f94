"""``queue`` scorer: less loaded scores higher, normalised by each endpoint's own capacity.

score = 1 / (1 + active / capacity), where active = max(in-flight, running + queued) and
capacity is the batch the endpoint can run within the SLO (its KV-limited batch when the
policy has no TPOT SLO). A 288 GB MI355X with 20 requests is less loaded than an 80 GB
H100 with 20.

May touch: numpy. Must not touch: I/O.
"""

from __future__ import annotations

import numpy as np

from fleetgate.routing.plugins.base import ScoringInput
from fleetgate.routing.types import FloatArray


def queue(inp: ScoringInput, _: object) -> FloatArray:
    return np.asarray(1.0 / (1.0 + inp.est.load))
