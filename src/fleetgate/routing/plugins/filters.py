"""Filters: each returns a boolean mask over the candidates (True = keep), or None when it
keeps every candidate (a filter that can tell cheaply saves the pipeline a vector step).

- ``select``: keep endpoints whose pool / vendor / accelerator / engine is in the given
  lists and whose labels include every given ``labels`` pair (omitted = no constraint).
  Who matches depends on the fleet only, so the mask is worked out once per fleet.
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

from fleetgate.routing.estimate import DEFAULT_MAX_TOKENS
from fleetgate.routing.plugins.base import ScoringInput, per_fleet
from fleetgate.routing.types import STATIC_ROW, BoolArray, EndpointInfo, FloatArray


class SelectParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    pools: list[str] | None = None
    vendors: list[str] | None = None
    accelerators: list[str] | None = None
    engines: list[str] | None = None
    labels: dict[str, str] = Field(default_factory=dict)


def select(inp: ScoringInput, p: SelectParams) -> BoolArray:
    return per_fleet(inp.snap.endpoints, p, _selected)[inp.idx]


def _selected(endpoints: tuple[EndpointInfo, ...], p: SelectParams) -> BoolArray:
    return np.array([
        (p.pools is None or ep.pool in p.pools)
        and (p.vendors is None or ep.vendor in p.vendors)
        and (p.accelerators is None or ep.accelerator in p.accelerators)
        and (p.engines is None or ep.engine in p.engines)
        and all(ep.labels.get(key) == value for key, value in p.labels.items())
        for ep in endpoints], dtype=bool)


class MaxQueueParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    max: int = Field(ge=0)


def max_queue(inp: ScoringInput, p: MaxQueueParams) -> BoolArray:
    return np.asarray(inp.col("queued") <= p.max)


def context_fit(inp: ScoringInput, _: object) -> BoolArray | None:
    if inp.req.prompt_tokens_estimate + (inp.req.max_tokens or DEFAULT_MAX_TOKENS) <= per_fleet(
            inp.snap.endpoints, inp.snap.static, _shortest_context):
        return None  # fits the shortest context in the fleet: no need to look further
    return inp.est.fits_context


def _shortest_context(endpoints: tuple[EndpointInfo, ...], static: FloatArray) -> float:
    return float(static[STATIC_ROW["max_model_len"]].min()) if len(endpoints) else 0.0


def meets_slo(inp: ScoringInput, _: object) -> BoolArray:
    return inp.est.meets_slo


class MaxCostParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    usd_per_mtok: float = Field(gt=0)


def max_cost(inp: ScoringInput, p: MaxCostParams) -> BoolArray:
    return np.asarray(inp.est.usd_per_mtok <= p.usd_per_mtok)
