"""``max_cost`` filter: keep endpoints whose $/Mtok at the SLO is <= ``usd_per_mtok``.

May touch: numpy, pydantic. Must not touch: I/O.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from fleetgate.routing.plugins.base import ScoringInput
from fleetgate.routing.types import BoolArray


class MaxCostParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    usd_per_mtok: float = Field(gt=0)


def max_cost(inp: ScoringInput, p: MaxCostParams) -> BoolArray:
    return np.asarray(inp.est.usd_per_mtok <= p.usd_per_mtok)
