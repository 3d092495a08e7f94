"""LoRA adapters in routing: which endpoints a request naming an adapter may go to.

A request whose ``model`` is a LoRA adapter (an ``Endpoint.adapters`` name) is a candidate on
every endpoint whose pool declares the adapter; the adapter stage (``adapter_stage``, run by
the pipeline right after the builtin prefilters) then narrows them:

1. affinity: when any usable endpoint has it loaded (or is loading it:
   ``AdapterView.loaded``), only those stay, so requests for one adapter gather where its
   weights already are (AIBrix's high-density LoRA routing, llm-d's LoRA affinity);
2. otherwise, where the pool loads adapters at run time (``load_adapters`` and a ``path``),
   the endpoints with room (fewer adapters than ``max_adapters``) stay, and the decision
   says the chosen one must load it first (``Decision.load_adapter``); the policy's scorers
   rank them as always, so the ``cost`` strategy loads it on the cheapest;
3. with no room anywhere, every endpoint that may load it stays: the one chosen unloads its
   least recently used adapter first (``state/adapters.py`` keeps the limit);
4. an adapter nobody has and nobody may load: no endpoint stays (the request is unserved:
   503, or its route's fallbacks).

Pure: reads the snapshot's ``AdapterView`` only. May touch: numpy, routing types.
"""

from __future__ import annotations

import numpy as np

from fleetgate.routing.types import BoolArray, IntArray, Snapshot

STAGE = "adapter not loaded here"


def is_adapter(snap: Snapshot, model: str, idx: IntArray) -> bool:
    """Whether ``model`` is a LoRA adapter on the endpoints ``idx`` (any of them says)."""
    return snap.adapters is not None and model in snap.endpoints[int(idx[0])].adapters


def adapter_stage(snap: Snapshot, adapter: str, idx: IntArray,
                  alive: BoolArray) -> tuple[BoolArray, bool]:
    """(which of the candidates ``idx`` stay, whether the ones that stay must load it)."""
    view = snap.adapters
    assert view is not None
    loaded = view.loaded.get(adapter)
    here = loaded[idx] if loaded is not None else np.zeros(len(idx), dtype=bool)
    if np.any(here & alive):
        return here, False
    may = view.loadable.get(adapter)
    if may is None:
        return np.zeros(len(idx), dtype=bool), False
    can = may[idx]
    room = can & (view.count[idx] < view.limit[idx])
    if np.any(room & alive):
        return room, True
    return can, True
