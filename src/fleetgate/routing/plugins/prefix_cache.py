"""``prefix_cache`` scorer: send a prompt where its prefix is probably still cached.

In the spirit of SGLang's cache-aware router and llm-d's prefix scorer: the gateway keeps,
per endpoint, an approximate index of the prompt chunks it recently sent there
(``state/prefix.py``, an LRU sized from the endpoint's KV capacity), and scores each
candidate with the fraction of the request's leading chunks that endpoint holds, in [0,1].
A policy mixes it with cost and load by its weights, e.g.
``scorers: [{name: cost, weight: 1}, {name: prefix_cache, weight: 1}]``.

Chunks: ``CHUNK_CHARS`` characters of the prompt text (~``CHUNK_TOKENS`` tokens at 4
characters a token); chunk i's hash covers chunks 0..i (chained), so a match of chunk i means
the whole prefix up to it matches. ``chunk_hashes`` uses Python's own string hash (salted
per process; the index lives in one process), about 1 µs per KB of prompt, so the gateway
computes it for every request (``gateway/api/parse.py``). A prompt shorter than one chunk
has no hashes and every candidate scores 0.

Balance (SGLang's ``balance_abs_threshold`` / ``balance_rel_threshold``): a candidate whose
active requests exceed the least loaded eligible candidate's by more than ``balance_abs``
*and* more than ``balance_rel`` times loses its prefix score, so affinity yields to load
instead of hot-spotting one endpoint.

May touch: numpy, pydantic. Must not touch: I/O, clocks.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from fleetgate.routing.plugins.base import ScoringInput
from fleetgate.routing.types import CHUNK_CHARS, CHUNK_TOKENS, FloatArray

__all__ = ["CHUNK_CHARS", "CHUNK_TOKENS", "PrefixCacheParams", "chunk_hashes", "prefix_cache"]


class PrefixCacheParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    balance_abs: float = Field(default=8.0, ge=0, description="active requests over the least "
                                                             "loaded before affinity yields")
    balance_rel: float = Field(default=1.5, ge=1, description="and this many times its load")


def chunk_hashes(text: str, chunk_chars: int = CHUNK_CHARS) -> tuple[int, ...]:
    """Chained hashes of the full ``chunk_chars``-character chunks of ``text``."""
    out: list[int] = []
    h = 0
    for start in range(0, len(text) - chunk_chars + 1, chunk_chars):
        h = hash((h, text[start:start + chunk_chars]))
        out.append(h)
    return tuple(out)


def prefix_cache(inp: ScoringInput, params: PrefixCacheParams) -> FloatArray:
    hashes = inp.req.prefix_hashes
    if not hashes:
        return np.zeros(len(inp.idx))
    matched = inp.est.prefix_chunks * (1.0 / len(hashes))
    if not matched.any():
        return matched
    active = inp.est.active
    least = float(np.min(active, where=inp.mask, initial=np.inf))
    hot = (active - least > params.balance_abs) & (active > params.balance_rel * least)
    return np.where(hot, 0.0, matched)
