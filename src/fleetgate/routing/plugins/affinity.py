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
def _weight(endpoint_hash: np.uint64, key: np.uint64) -> np.uint64:
    weight = endpoint_hash ^ key
    weight = (weight ^ (weight >> _S30)) * _M1
    weight = (weight ^ (weight >> _S27)) * _M2
    return weight ^ (weight >> _S31)


@compiled
def _rendezvous(hashes: np.ndarray, idx: np.ndarray, key: np.uint64, mask: np.ndarray) -> int:
    """The eligible candidate with the highest splitmix64(key ^ endpoint hash), or -1."""
    winner, best = -1, np.uint64(0)
    for j in range(idx.shape[0]):
        if not mask[j]:
            continue
        weight = _weight(hashes[idx[j]], key)
        if winner < 0 or weight > best:
            winner, best = j, weight
    return winner


def session_top(endpoints: tuple[Endpoint, ...], idx: np.ndarray, key: str, k: int) -> np.ndarray:
    """The ``k`` endpoints of ``idx`` with the highest weight for session ``key``, highest
    first: the ones the affinity scorer would pick, in that order, as they become
    ineligible (the shortlist keeps them in view, ``routing/shortlist.py``)."""
    out = np.full(min(k, len(idx)), -1, dtype=np.intp)
    _top_weights(per_fleet(endpoints, None, _id_hashes), idx, np.uint64(_hash(key)), out)
    return out


@compiled
def _top_weights(hashes: np.ndarray, idx: np.ndarray, key: np.uint64, out: np.ndarray) -> None:
    best = np.zeros(out.shape[0], dtype=np.uint64)
    kept = 0
    for j in range(idx.shape[0]):
        weight = _weight(hashes[idx[j]], key)
        if kept == out.shape[0] and weight <= best[kept - 1]:
            continue
        at = kept if kept < out.shape[0] else kept - 1
        while at > 0 and best[at - 1] < weight:
            best[at], out[at] = best[at - 1], out[at - 1]
            at -= 1
        best[at], out[at] = weight, idx[j]
        kept = min(kept + 1, out.shape[0])


def _id_hashes(endpoints: tuple[Endpoint, ...], _: None) -> np.ndarray:
    return np.array([_hash(ep.id) for ep in endpoints], dtype=np.uint64)


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


_rendezvous(np.zeros(1, dtype=np.uint64), np.zeros(1, dtype=np.intp), np.uint64(1),
            np.ones(1, dtype=bool))  # compile (or load numba's cache) at import
_top_weights(np.zeros(1, dtype=np.uint64), np.zeros(1, dtype=np.intp), np.uint64(1),
             np.full(1, -1, dtype=np.intp))
