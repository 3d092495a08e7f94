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

``SloLimits`` learns, per endpoint, how many requests it can run and still meet the SLO:
the tail of per-request latency (a short answer that shares a step with a long prompt's
prefill chunk) sets that limit well below where the mean TPOT would, and no prior models
tails. AIMD, as TCP's window and concurrency-limit libraries do, judged only on requests the
router predicted to meet the SLO, and only once misses are more than a tail: an SLO of
"99% of requests" allows 1%, so the limit reacts when the endpoint's recent miss rate (an
EWMA over about 1 / MISS_ALPHA judged results) passes TARGET_MISS_RATE:

    start : INITIAL_LIMIT, in slow start (as TCP): +1 per request met at the limit, so it
            doubles every round until the first decrease
    miss  : when miss rate > TARGET_MISS_RATE, limit = DECREASE * min(limit, active at
            dispatch), at most once per DECREASE_EVERY_S (what was dispatched before a
            decrease is still draining: its misses say nothing about the new limit); slow
            start ends
    met   : with active at dispatch >= limit - 1, limit += INCREASE
    idle  : with no result for IDLE_S, the limit grows back by e every LIMIT_RELAX_S

Slow start keeps a cold fleet from being packed to the prior's capacity guess before any
request has told how the endpoint really does. A round is a whole request (seconds of
decoding), so where it starts matters: from 16, a cold fleet of four MI355X replicas under
40 chat requests/s (about 250 in flight) held requests back and shed them for the first
~30 s while the limits doubled; 64 is still well below the SLO batch the prior gives an 8B
model on the catalog's GPUs (about 150 to 250), and the SLO filter still judges every
dispatch by the predictions. An endpoint's first decrease is also given
to its siblings still in slow start (``siblings``: the replicas with the same prior: same
GPU, engine, model and speed), so the other replicas of a pool do not each have to fail
before they are believed.

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
DECREASE = 0.9
INITIAL_LIMIT = 64.0
DECREASE_EVERY_S = 10.0
INCREASE = 0.3
TARGET_MISS_RATE = 0.005
MISS_ALPHA = 1 / 1000
LIMIT_RELAX_S = 300.0
_LOG_LIMITS = (math.log(K_LIMITS[0]), math.log(K_LIMITS[1]))
_LOG_RATIO = math.log(RATIO_LIMIT)


@dataclass(frozen=True, slots=True)
class Sample:
    """What one attempt was dispatched with: the inputs of its uncorrected predictions."""

    prior_ttft_s: float  # the router's TTFT prediction without k_ttft (NaN: none)
    prompt_tokens: int
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


class SloLimits:
    """Per endpoint, the concurrency it meets the SLO at (a row of the live matrix)."""

    def __init__(self, row: FloatArray, siblings: list[list[int]]) -> None:
        self.limit = row  # a row of the live matrix
        self.limit[:] = INITIAL_LIMIT
        self.siblings = siblings  # per endpoint: the others with the same prior
        n = row.shape[0]
        self.slow_start = np.ones(n, dtype=bool)
        self.miss_rate = np.zeros(n)
        self.decreased_at = np.full(n, -np.inf)
        self.last_result = np.full(n, -np.inf)
        self.last_relax = np.full(n, -np.inf)

    def result(self, i: int, now: float, sample: Sample, met: bool) -> None:
        self.last_result[i] = self.last_relax[i] = now
        limit = self.limit[i]
        self.miss_rate[i] += MISS_ALPHA * ((0.0 if met else 1.0) - self.miss_rate[i])
        if not met:
            if (self.miss_rate[i] > TARGET_MISS_RATE and sample.active > 1
                    and now - self.decreased_at[i] >= DECREASE_EVERY_S):
                self.limit[i] = max(1.0, DECREASE * min(limit, sample.active))
                self.decreased_at[i] = now
                for j in self.siblings[i] if self.slow_start[i] else ():
                    if self.slow_start[j]:
                        self.limit[j], self.slow_start[j] = self.limit[i], False
                        self.last_result[j] = self.last_relax[j] = now
                self.slow_start[i] = False
        elif sample.active >= limit - 1:
            self.limit[i] = limit + (1.0 if self.slow_start[i] else INCREASE)

    def relax(self, now: float) -> None:
        idle = (now - self.last_result >= IDLE_S) & (self.last_result > -np.inf)
        if not idle.any():
            return
        since = now - np.maximum(self.last_relax, self.last_result + IDLE_S)
        self.limit[idle] *= np.exp(np.clip(since[idle], 0.0, None) / LIMIT_RELAX_S)
        self.last_relax[idle] = now

    def carry(self, i: int, old: SloLimits, j: int) -> None:
        self.limit[i], self.miss_rate[i] = old.limit[j], old.miss_rate[j]
        self.slow_start[i] = old.slow_start[j]
        self.decreased_at[i], self.last_result[i] = old.decreased_at[j], old.last_result[j]
        self.last_relax[i] = old.last_relax[j]
