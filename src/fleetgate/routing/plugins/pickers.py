"""Pickers: turn total scores into an order, best first (the tail is the retry order).

- ``max_score``: highest total first; ties broken at random (a shuffled stable sort).
- ``weighted_random``: the first pick is drawn with probability proportional to the score,
  the rest follow by score.
- ``power_of_two``: two candidates drawn at random, the better of them first; the rest by
  score (spreads load without herding on one "best" endpoint).
- ``round_robin``: rotates through candidates in order, one step per request.

Pickers keep a seeded ``random.Random``/counter as their only state: still no I/O or clock.

May touch: numpy, random. Must not touch: I/O.
"""

from __future__ import annotations

import itertools
import random

import numpy as np

from fleetgate.routing.types import FloatArray, IntArray


def top_k(total: FloatArray, k: int) -> IntArray:
    """Positions of the k highest totals, best first (repeated argmax: cheap for small k)."""
    k = min(k, len(total))
    if k == len(total) or k > 8:
        return np.argsort(-total, kind="stable")[:k]
    work = total.copy()
    out = np.empty(k, dtype=np.intp)
    for j in range(k):
        best = int(work.argmax())
        out[j] = best
        work[best] = -np.inf
    return out


class MaxScore:
    def __init__(self, seed: int | None = None) -> None:
        self._rng = np.random.default_rng(seed)

    def order(self, total: FloatArray, k: int) -> IntArray:
        if len(total) <= 1:
            return np.arange(len(total))
        jitter = self._rng.random(len(total)) * 1e-9  # random tie-break, never reorders
        return top_k(total + jitter, k)


class WeightedRandom:
    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)

    def order(self, total: FloatArray, k: int) -> IntArray:
        weights = np.clip(total, 0.0, None)
        if len(total) <= 1 or weights.sum() <= 0:
            return top_k(total, k)
        first = self._rng.choices(range(len(total)), weights=weights.tolist())[0]
        rest = total.copy()
        rest[first] = -np.inf
        return np.concatenate(([first], top_k(rest, k - 1)))[:k]


class PowerOfTwo:
    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)

    def order(self, total: FloatArray, k: int) -> IntArray:
        if len(total) <= 2:
            return top_k(total, k)
        a, b = self._rng.sample(range(len(total)), 2)
        first, second = (a, b) if total[a] >= total[b] else (b, a)
        rest = total.copy()
        rest[[first, second]] = -np.inf
        return np.concatenate(([first, second], top_k(rest, k - 2)))[:k]


class RoundRobin:
    def __init__(self, seed: int | None = None) -> None:
        self._counter = itertools.count()

    def order(self, total: FloatArray, k: int) -> IntArray:
        n = len(total)
        if n == 0:
            return np.arange(0)
        start = next(self._counter) % n
        return (np.arange(min(k, n)) + start) % n
