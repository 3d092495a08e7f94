"""Filters: each returns a boolean mask over the candidates (True = keep).

- ``select``: keep endpoints whose pool / vendor / accelerator / engine is in the given
  lists and whose labels include every given ``labels`` pair (omitted = no constraint).
- ``max_queue``: keep endpoints whose engine queue (scraped + dispatched since) is <= ``max``.
- ``context_fit``: keep endpoints whose max model length holds prompt + max_tokens.
- ``meets_slo``: keep endpoints predicted to meet the policy's SLO (the ``cost`` strategy
  uses it softly: when nobody meets it, it falls back to the fastest).
- ``max_cost``: keep endpoints whose $/Mtok at the SLO is <= ``usd_per_mtok``.

May touch: numpy, routing plugin contracts. Must not touch: I/O.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from fleetgate.routing.plugins.base import ScoringInput
from fleetgate.routing.types import BoolArray


class SelectParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    pools: list[str] | None = None
    vendors: list[str] | None = None
    accelerators: list[str] | None = None
    engines: list[str] | None = None
    labels: dict[str, str] = Field(default_factory=dict)


def select(inp: ScoringInput, p: SelectParams) -> BoolArray:
    keep = np.ones(len(inp.idx), dtype=bool)
    for k, i in enumerate(inp.idx):
        ep = inp.snap.endpoints[i]
        keep[k] = (
            (p.pools is None or ep.pool in p.pools)
            and (p.vendors is None or ep.vendor in p.vendors)
            and (p.accelerators is None or ep.accelerator in p.accelerators)
            and (p.engines is None or ep.engine in p.engines)
            and all(ep.labels.get(key) == value for key, value in p.labels.items())
        )
    return keep


class MaxQueueParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    max: int = Field(ge=0)


def max_queue(inp: ScoringInput, p: MaxQueueParams) -> BoolArray:
    return np.asarray(inp.col("queued") <= p.max)


def context_fit(inp: ScoringInput, _: object) -> BoolArray:
    return np.asarray(inp.est.fits_context > 0)


def meets_slo(inp: ScoringInput, _: object) -> BoolArray:
    return np.asarray(inp.est.meets_slo > 0)


class MaxCostParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    usd_per_mtok: float = Field(gt=0)


def max_cost(inp: ScoringInput, p: MaxCostParams) -> BoolArray:
    return np.asarray(inp.est.usd_per_mtok <= p.usd_per_mtok)
