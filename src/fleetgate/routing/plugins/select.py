"""``select`` filter: keep endpoints whose pool / vendor / accelerator / engine is in the
given lists and whose labels include every given ``labels`` pair (omitted = no constraint).
Who matches depends on the fleet only, so the mask is worked out once per fleet.

May touch: numpy, pydantic. Must not touch: I/O.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from fleetgate.routing.plugins.base import ScoringInput, per_fleet
from fleetgate.routing.types import BoolArray, Endpoint


class SelectParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    pools: list[str] | None = None
    vendors: list[str] | None = None
    accelerators: list[str] | None = None
    engines: list[str] | None = None
    labels: dict[str, str] = Field(default_factory=dict)


def select(inp: ScoringInput, p: SelectParams) -> BoolArray:
    return per_fleet(inp.snap.endpoints, p, _selected)[inp.idx]


def _selected(endpoints: tuple[Endpoint, ...], p: SelectParams) -> BoolArray:
    return np.array([
        (p.pools is None or ep.pool in p.pools)
        and (p.vendors is None or ep.vendor in p.vendors)
        and (p.accelerators is None or ep.accelerator in p.accelerators)
        and (p.engines is None or ep.engine in p.engines)
        and all(ep.labels.get(key) == value for key, value in p.labels.items())
        for ep in endpoints], dtype=bool)
