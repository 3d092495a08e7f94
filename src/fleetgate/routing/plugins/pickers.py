"""Pickers: turn total scores into an order, best first (the tail is the retry order).

- ``max_score``: highest total first; ties broken at random (a jitter far below any score gap).
- ``weighted_random``: the first pick is drawn with probability proportional to the score,
  the rest follow by score.
- ``power_of_two``: two candidates drawn at random, the better of them first; the rest by
  score (spreads load without herding on one "best" endpoint).
- ``round_robin``: rotates through candidates in order, one step per request.

A picker gets ``rank`` (the total score of each candidate, -inf for the filtered-out ones)
and ``k`` (at most the number of eligible candidates) and returns k positions, best first.
Pickers keep a seeded ``random.Random``/counter as their only state: still no I/O or clock.

May touch: numpy, random. Must not touch: I/O.
"""

from __future__ import annotations

import itertools
import random

import numpy as np

from fleetgate.routing.compiled import compiled
from fleetgate.routing.types import FloatArray, IntArray


def top_k(values: FloatArray, k: int, jitter: FloatArray | None = None) -> IntArray:
    """Positions of the k highest ``values + jitter``, best first; equal ones by position."""
    out = np.empty(max(0, min(k, len(values))), dtype=np.intp)
    if len(out):
        _top_k(values, _NO_JITTER if jitter is None else jitter, out)
    return out


_NO_JITTER = np.zeros(0)


@compiled
def _top_k(values: FloatArray, jitter: FloatArray, out: IntArray) -> None:
    # One pass keeping the best len(out) >= 1 in order (insertion): a single compiled call
    # where numpy needed an argmax and a store per place.
    k = out.shape[0]
    best = np.full(k, -np.inf)
    kept = 0
    for i in range(values.shape[0]):
        v = values[i] + jitter[i] if jitter.shape[0] else values[i]
        if kept == k and not v > best[k - 1]:
            continue
        j = kept if kept < k else k - 1
        while j > 0 and best[j - 1] < v:
            best[j] = best[j - 1]
            out[j] = out[j - 1]
            j -= 1
        best[j] = v
        out[j] = i
        kept = min(kept + 1, k)


class MaxScore:
    sampling = False  # orders by score: the shortlist may add the candidates worth seeing

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)
        self._jitter = np.zeros(0)

    def order(self, rank: FloatArray, k: int) -> IntArray:
        n = len(rank)
        if n <= 1:
            return np.arange(min(n, k))
        if len(self._jitter) < 2 * n:  # drawn once; a random window of it per decision
            fresh = np.random.default_rng(self._rng.getrandbits(64)).random(2 * n)
            self._jitter = fresh * 1e-9  # breaks ties at random, never reorders scores
        start = self._rng.randrange(n)
        return top_k(rank, k, self._jitter[start:start + n])


class WeightedRandom:
    sampling = True  # draws: the shortlist must be a fair sample (routing/shortlist.py)

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)

    def order(self, rank: FloatArray, k: int) -> IntArray:
        cumulative = np.cumsum(np.maximum(rank, 0.0))
        if len(rank) <= 1 or cumulative[-1] <= 0:
            return top_k(rank, k)
        drawn = self._rng.random() * cumulative[-1]
        first = min(int(np.searchsorted(cumulative, drawn, side="right")), len(rank) - 1)
        rest = rank.copy()
        rest[first] = -np.inf
        return np.concatenate(([first], top_k(rest, k - 1)))[:k]


class PowerOfTwo:
    sampling = True

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)

    def order(self, rank: FloatArray, k: int) -> IntArray:
        pair = self._draw_two(rank)
        if pair is None:
            return top_k(rank, k)
        a, b = pair
        first, second = (a, b) if rank[a] >= rank[b] else (b, a)
        if k <= 2:
            return np.array([first, second][:k], dtype=np.intp)
        rest = rank.copy()
        rest[first] = rest[second] = -np.inf
        return np.concatenate(([first, second], top_k(rest, k - 2)))

    def _draw_two(self, rank: FloatArray) -> tuple[int, int] | None:
        """Two distinct eligible positions at random (None: fewer than two eligible)."""
        n = len(rank)
        if n < 2:
            return None
        for _ in range(8):  # usually most are eligible: draw first, look later
            a, b = self._rng.randrange(n), self._rng.randrange(n)
            if a != b and rank[a] > -np.inf and rank[b] > -np.inf:
                return a, b
        eligible = np.flatnonzero(rank > -np.inf)
        if len(eligible) < 2:
            return None
        a, b = self._rng.sample(range(len(eligible)), 2)
        return int(eligible[a]), int(eligible[b])


class RoundRobin:
    sampling = True
    cycles = True  # one turn each: the shortlist holds still for a whole turn of it

    def __init__(self, seed: int | None = None) -> None:
        self._counter = itertools.count()

    def order(self, rank: FloatArray, k: int) -> IntArray:
        eligible = np.flatnonzero(rank > -np.inf)
        n = len(eligible)
        if n == 0:
            return eligible
        start = next(self._counter) % n
        return eligible[(np.arange(min(k, n)) + start) % n]


def _warm_up() -> None:
    """Compile (or load from numba's cache) at import, not on the first request."""
    top_k(np.ones(2), 1)
    top_k(np.ones(2), 1, np.ones(2))


_warm_up()
