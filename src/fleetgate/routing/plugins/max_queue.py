"""``max_queue`` filter: keep endpoints whose engine queue (scraped + dispatched since) is
<= ``max``.

May touch: numpy, pydantic. Must not touch: I/O.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from fleetgate.routing.plugins.base import ScoringInput
from fleetgate.routing.types import BoolArray


class MaxQueueParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    max: int = Field(ge=0)


def max_queue(inp: ScoringInput, p: MaxQueueParams) -> BoolArray:
    return np.asarray(inp.col("queued") <= p.max)
