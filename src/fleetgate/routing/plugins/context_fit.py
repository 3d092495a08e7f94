"""``context_fit`` filter (every policy has it first): keep endpoints whose max model length
holds prompt + max_tokens.

May touch: numpy. Must not touch: I/O.
"""

from __future__ import annotations

from fleetgate.routing.estimate import DEFAULT_MAX_TOKENS
from fleetgate.routing.plugins.base import ScoringInput, per_fleet
from fleetgate.routing.types import STATIC_ROW, BoolArray, Endpoint, FloatArray


def context_fit(inp: ScoringInput, _: object) -> BoolArray | None:
    if inp.req.prompt_tokens_estimate + (inp.req.max_tokens or DEFAULT_MAX_TOKENS) <= per_fleet(
            inp.snap.endpoints, inp.snap.static, _shortest_context):
        return None  # fits the shortest context in the fleet: no need to look further
    return inp.est.fits_context


def _shortest_context(endpoints: tuple[Endpoint, ...], static: FloatArray) -> float:
    return float(static[STATIC_ROW["max_model_len"]].min()) if len(endpoints) else 0.0
