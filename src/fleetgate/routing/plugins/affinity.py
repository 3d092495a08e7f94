"""Session / prefix affinity by rendezvous hashing.

The session key is the ``x-session-id`` or ``x-fleetgate-session`` header, else the OpenAI
``user`` field. Every candidate gets a weight ``mix(hash(key) ^ hash(endpoint id))`` (the
splitmix64 finaliser, so each pair's weight is independent); the highest weight among the
eligible candidates wins and scores 1, the others 0. Rendezvous hashing moves only the
sessions of an endpoint that leaves (or is unhealthy), so prefix caches stay warm when the
fleet changes. No key: every candidate scores 0.5. The endpoint ids are hashed once per
fleet, so a decision costs a few vector operations however many endpoints there are.

May touch: numpy, hashlib. Must not touch: I/O.
"""

from __future__ import annotations

import hashlib

import numpy as np

from fleetgate.routing.compiled import compiled
from fleetgate.routing.plugins.base import ScoringInput, per_fleet
from fleetgate.routing.types import Endpoint, FloatArray


def affinity(inp: ScoringInput, _: object) -> FloatArray:
    key = inp.req.session_key
    if key is None:
        return np.full(len(inp.idx), 0.5)
    hashes = per_fleet(inp.snap.endpoints, None, _id_hashes)
    out = np.zeros(len(inp.idx))
    winner = _rendezvous(hashes, inp.idx, np.uint64(_hash(key)), inp.mask)
    if winner >= 0:
        out[winner] = 1.0
    return out


_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


@compiled
def _rendezvous(hashes: np.ndarray, idx: np.ndarray, key: np.uint64, mask: np.ndarray) -> int:
    """The eligible candidate with the highest splitmix64(key ^ endpoint hash), or -1."""
    winner, best = -1, np.uint64(0)
    for j in range(idx.shape[0]):
        if not mask[j]:
            continue
        weight = hashes[idx[j]] ^ key
        weight = (weight ^ (weight >> _S30)) * _M1
        weight = (weight ^ (weight >> _S27)) * _M2
        weight = weight ^ (weight >> _S31)
        if winner < 0 or weight > best:
            winner, best = j, weight
    return winner


def _id_hashes(endpoints: tuple[Endpoint, ...], _: None) -> np.ndarray:
    return np.array([_hash(ep.id) for ep in endpoints], dtype=np.uint64)


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


_rendezvous(np.zeros(1, dtype=np.uint64), np.zeros(1, dtype=np.intp), np.uint64(1),
            np.ones(1, dtype=bool))  # compile (or load numba's cache) at import
