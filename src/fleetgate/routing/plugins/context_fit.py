"""``context_fit`` filter (every policy has it first): keep endpoints whose max model length
holds prompt + max_tokens (256 when absent). Without ``max_tokens``, when no eligible
endpoint holds 256 more, the ones that hold the prompt stay: the engine generates into what
is left, as vLLM and SGLang do. A request no endpoint of the model can hold at all is the
pipeline's ``Decision.context_limit`` (the gateway answers 400 ``context_length_exceeded``).

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
    fits: BoolArray = inp.est.fits_context
    if inp.req.max_tokens is None and not (fits & inp.mask).any():
        keep: BoolArray = inp.est.column("max_model_len") > inp.req.prompt_tokens_estimate
        return keep
    return fits


def _shortest_context(endpoints: tuple[Endpoint, ...], static: FloatArray) -> float:
    return float(static[STATIC_ROW["max_model_len"]].min()) if len(endpoints) else 0.0
