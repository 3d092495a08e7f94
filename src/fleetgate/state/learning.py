"""Learned corrections of the performance prior: ``k_ttft`` and ``k_tpot`` per endpoint.

The router predicts ``k * prior`` (``routing/estimate.py``). Each finished request gives a
sample pair (measured, *uncorrected* prior for the conditions the request met):

- TPOT: the prior evaluated at the mean of the endpoint's active requests at dispatch and at
  the end, for this request's prompt and output length. Under load the batch grows after a
  request is dispatched; judging it against the batch it saw at dispatch would teach the
  router that a busy endpoint is slow even when idle.
- TTFT: the router's prediction at dispatch divided by the ``k_ttft`` it was made with.

So ``k`` estimates measured / prior directly, whatever ``k`` was at dispatch. (The old rule,
``k *= 1 + alpha * (measured / predicted - 1)`` with the prediction already multiplied by an
older ``k``, compounded once per request in flight: a burst of 48 streams drove ``k`` to its
cap and the endpoint never got traffic again to unlearn it.)

The update, in log space (ratios are symmetric there, and one outlier moves ``k`` by at most
``RATIO_LIMIT ** ALPHA``):

    target   = clip(log(measured / prior), ±log RATIO_LIMIT)
    step     = ALPHA * (target - log k)
    log k   += clip(step, ±MAX_LOG_RATE * seconds since the last step)   (bounded change per
               unit of time: a burst of completions at one instant moves k like one sample)
    idle     : with no sample for IDLE_S, log k decays toward 0 (the prior) with time constant
               RELAX_S, so an endpoint predicted too slow to be chosen is tried again and
               either re-learns its slowness or gets its traffic back.

The concurrency an endpoint may take within the SLO is learned elsewhere, per endpoint
class, from the requests' own latency (``slo_capacity.py``); it replaced the AIMD limits
that lived here (a miss counter that the tail every load has kept cutting: BENCHMARKS.md,
issue 22).

May touch: numpy. Must not touch: I/O, clocks (``now`` comes from the caller).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fleetgate.routing.types import FloatArray

ALPHA = 0.2
RATIO_LIMIT = 8.0
K_LIMITS = (0.02, 50.0)
MAX_LOG_RATE = math.log(2.0)  # per second: k at most doubles or halves in a second
IDLE_S = 10.0
RELAX_S = 30.0
_LOG_LIMITS = (math.log(K_LIMITS[0]), math.log(K_LIMITS[1]))
_LOG_RATIO = math.log(RATIO_LIMIT)


@dataclass(frozen=True, slots=True)
class Sample:
    """What one attempt was dispatched with: the inputs of its uncorrected predictions."""

    prior_ttft_s: float  # the router's TTFT prediction without k_ttft (NaN: none)
    prompt_tokens: int  # the whole prompt, cached part included (the TPOT prior's context)
    active: float  # requests on the endpoint right after dispatch, this one included
    ttft_limit_s: float = math.inf  # the SLO it is judged by (inf: not judged)
    tpot_limit_s: float = math.inf

    def met(self, ttft_s: float | None, tpot_s: float | None) -> bool | None:
        """Whether the measured times met the SLO (None: nothing to judge)."""
        if self.ttft_limit_s == math.inf and self.tpot_limit_s == math.inf:
            return None
        return (ttft_s is None or ttft_s <= self.ttft_limit_s) and \
            (tpot_s is None or tpot_s <= self.tpot_limit_s)


NO_SAMPLE = Sample(math.nan, 0, 1.0)


class Corrections:
    """One learned correction (a row of the live matrix) for every endpoint."""

    def __init__(self, row: FloatArray) -> None:
        self.k = row  # a view into the live matrix: the router reads it from there
        n = row.shape[0]
        self.last_step = np.full(n, -np.inf)  # when k last moved on a sample
        self.last_relax = np.full(n, -np.inf)

    def learn(self, i: int, now: float, measured: float, prior: float) -> None:
        if not (measured > 0 and prior > 0 and math.isfinite(measured) and math.isfinite(prior)):
            return
        log_k = math.log(self.k[i])
        target = min(max(math.log(measured / prior), -_LOG_RATIO), _LOG_RATIO)
        step = ALPHA * (target - log_k)
        bound = MAX_LOG_RATE * (now - self.last_step[i])
        step = min(max(step, -bound), bound)
        self.k[i] = math.exp(min(max(log_k + step, _LOG_LIMITS[0]), _LOG_LIMITS[1]))
        self.last_step[i] = self.last_relax[i] = now

    def relax(self, now: float) -> None:
        """Pull the corrections of endpoints idle for ``IDLE_S`` toward 1 (the prior)."""
        idle = now - self.last_step >= IDLE_S
        if not idle.any():
            return
        since = now - np.maximum(self.last_relax, self.last_step + IDLE_S)
        decay = np.exp(-np.clip(since, 0.0, None) / RELAX_S)
        self.k[idle] = np.exp(np.log(self.k[idle]) * decay[idle])
        self.last_relax[idle] = now

    def carry(self, i: int, old: Corrections, j: int) -> None:
        """Take over endpoint ``j`` of ``old`` (a reload keeps what was learned)."""
        self.k[i] = old.k[j]
        self.last_step[i], self.last_relax[i] = old.last_step[j], old.last_relax[j]
