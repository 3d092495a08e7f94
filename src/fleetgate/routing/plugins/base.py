"""The plugin contracts: filters narrow, scorers vote in [0,1], pickers order.

Every plugin gets a ``ScoringInput``: the snapshot, the candidate indices, the request and
the per-candidate estimates (``routing/estimate.py``), all aligned with ``idx``. Each plugin
declares a pydantic ``Params`` model (``extra="forbid"``) that the registry validates when
a policy is built, so a typo in a policy fails at config load, not at request time.

May touch: numpy, pydantic, routing types. Must not touch: I/O, clocks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from fleetgate.routing.types import BoolArray, FloatArray, IntArray, RoutingRequest, Snapshot


class NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True, slots=True)
class ScoringInput:
    snap: Snapshot
    idx: IntArray
    req: RoutingRequest
    est: Any  # routing.estimate.Estimates: lazily computed predictions, aligned with idx
    mask: BoolArray  # the candidates still eligible (scores of the others are ignored)

    def col(self, name: str) -> Any:
        return self.snap.col(name)[self.idx]


FilterFn = Callable[[ScoringInput, Any], BoolArray]
ScorerFn = Callable[[ScoringInput, Any], FloatArray]


def normalise_min_over(values: FloatArray, mask: BoolArray) -> FloatArray:
    """Score = best eligible / value for "lower is better" values; inf or NaN -> 0."""
    clean = np.where(mask & (values > 0), values, np.inf)  # NaN, <= 0, masked: unusable
    best = clean.min() if len(clean) else np.inf
    if not np.isfinite(best):
        return np.zeros(len(values))
    return np.asarray(best / clean)
