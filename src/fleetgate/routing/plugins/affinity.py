"""Session / prefix affinity by rendezvous hashing.

The session key is the ``x-session-id`` or ``x-fleetgate-session`` header, else the OpenAI
``user`` field. Every candidate gets ``hash(key, endpoint id)``; the highest wins and scores
1, the others 0. Rendezvous hashing moves only the sessions of an endpoint that leaves, so
prefix caches stay warm when the fleet changes. No key: every candidate scores 0.5.

May touch: numpy, hashlib. Must not touch: I/O.
"""

from __future__ import annotations

import hashlib

import numpy as np

from fleetgate.routing.plugins.base import ScoringInput
from fleetgate.routing.types import FloatArray


def affinity(inp: ScoringInput, _: object) -> FloatArray:
    key = inp.req.session_key
    if key is None:
        return np.full(len(inp.idx), 0.5)
    weights = [_hash(key, inp.snap.endpoints[i].id) for i in inp.idx]
    out = np.zeros(len(inp.idx))
    out[int(np.argmax(weights))] = 1.0
    return out


def _hash(key: str, endpoint_id: str) -> int:
    digest = hashlib.blake2b(f"{key}\x00{endpoint_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")
