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
from typing import Any, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from fleetgate.routing.compiled import compiled
from fleetgate.routing.types import (
    BoolArray,
    Endpoint,
    FloatArray,
    IntArray,
    RoutingRequest,
    Snapshot,
)


class NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(slots=True)
class ScoringInput:
    snap: Snapshot
    idx: IntArray
    req: RoutingRequest
    est: Any  # routing.estimate.Estimates: lazily computed predictions, aligned with idx
    mask: BoolArray  # the candidates still eligible (scores of the others are ignored)

    def col(self, name: str) -> Any:
        return self.est.column(name)


FilterFn = Callable[[ScoringInput, Any], BoolArray | None]  # None: keeps every candidate
ScorerFn = Callable[[ScoringInput, Any], FloatArray]
T = TypeVar("T")
K = TypeVar("K")
_PER_FLEET: dict[tuple[int, int, int], tuple[object, object, object]] = {}


def per_fleet(endpoints: tuple[Endpoint, ...], key: K,
              build: Callable[[tuple[Endpoint, ...], K], T]) -> T:
    """``build(endpoints, key)``, computed once per fleet (the endpoints tuple changes only on
    a reload or a registration) instead of once per request. ``key`` and ``build`` must be
    long-lived objects (a policy's params, a module function). Entries hold their fleet and
    key, so a recycled ``id`` never matches a dead one; the table is emptied when it grows."""
    slot = (id(endpoints), id(key), id(build))
    hit = _PER_FLEET.get(slot)
    if hit is not None and hit[0] is endpoints and hit[1] is key:
        return hit[2]  # type: ignore[return-value]
    if len(_PER_FLEET) >= 256:
        _PER_FLEET.clear()
    value = build(endpoints, key)
    _PER_FLEET[slot] = (endpoints, key, value)
    return value


def normalise_min_over(values: FloatArray, mask: BoolArray) -> FloatArray:
    """Score = best eligible / value for "lower is better" values (>= 0); inf or NaN -> 0.

    A value of 0 (a free endpoint's $/Mtok) is the best there is: those score 1 and the
    others half of what they would score among themselves (so they keep their order).
    Masked-out candidates score 0.
    """
    out = np.empty(len(values))
    _normalise(values, mask, True, out)
    return out


def normalise_max_over(values: FloatArray, mask: BoolArray) -> FloatArray:
    """Score = value / best eligible for "higher is better" values (>= 0); NaN -> 0, and
    all 0 when the best is 0 or infinite."""
    out = np.empty(len(values))
    _normalise(values, mask, False, out)
    return out


@compiled
def _normalise(values: FloatArray, mask: BoolArray, lower_is_better: bool,
               out: FloatArray) -> None:
    # Two passes in one compiled call: numpy needed five calls (where, min, divide, ...),
    # each costing more than the loop over 1,000 candidates. NaN fails every comparison.
    best = np.inf if lower_is_better else 0.0  # lowest positive / highest eligible value
    free = False  # an eligible 0 among lower-is-better values
    for i in range(values.shape[0]):
        v = values[i]
        if not (mask[i] and v >= 0):
            continue
        if not lower_is_better:
            best = max(best, v)
        elif v == 0:
            free = True
        else:
            best = min(best, v)
    for i in range(values.shape[0]):
        v = values[i]
        if not (mask[i] and v >= 0):
            out[i] = 0.0
        elif not lower_is_better:
            out[i] = v / best if 0 < best < np.inf else 0.0
        elif v == 0:
            out[i] = 1.0
        else:  # an infinite value scores best / inf = 0; if all are, best is inf: 0 too
            out[i] = best / v * (0.5 if free else 1.0) if best < np.inf else 0.0


def _warm_up() -> None:
    """Compile (or load from numba's cache) at import, not on the first request."""
    normalise_min_over(np.ones(1), np.ones(1, dtype=bool))


_warm_up()
