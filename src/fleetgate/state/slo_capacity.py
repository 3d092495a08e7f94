"""Each endpoint class's SLO capacity, learned from its own latency: how many requests one
replica may run and still meet the SLO, per class (GPU x engine x model x TP x stack x
speed: the endpoints that share a prior), from every judged request's result.

The model, per class: the requests that ended are binned by the load they were dispatched
into (``active`` at dispatch, this request included, in geometric bins of ratio 2^(1/4));
per bin it keeps

- exponentially decayed counts of results and of SLO misses (a miss: TTFT or TPOT over the
  policy's limit), halved whenever a bin passes ``BIN_MEMORY`` results, and decayed with
  time constant ``FORGET_S`` in bins that get no results (so a bin judged bad once is tried
  again later: the engine, the workload or the SLO may have changed);
- running quantiles (stochastic approximation) of TTFT and TPOT at p50 and at the SLO's
  percentile (p99 for "99% of requests"): the predictions ``predicted`` returns and the
  decision log shows.

Predicted miss share at load B = the miss share of B's bin. The class's capacity ends at
its *knee*, the lowest load from which every heavier load seen misses *significantly* more
than the budget allows:

    budget = max(TARGET_MISS, floor + TARGET_MISS / 2)
    over(b) = m >= 3 and m > budget * n + Z * sqrt(budget * n), with n and m the results and
              misses of bin b and the bin below it together (one-sided, Z = 1.5: a miss or
              two in a thinly sampled bin is the tail, not load)
    knee = the lowest sampled bin k with over(b) for every sampled bin b >= k, walking down
           from the heaviest load seen (none when that one is not over)

``floor`` is the miss share at up to half the highest load seen: a miss that every load has (a
short answer whose few steps share one with a long prefill) is the workload's, not the
load's, and does not shrink capacity; only misses that grow with load do. Nor do misses
that bunch at a few light loads while heavier ones meet the SLO: under bursts, a request
sent to a nearly idle replica just as a burst lands there misses its TPOT in the burst's
prefills (the load at dispatch is not the load it lived through), and with ~25 bins judged
one at a time some bin is over by chance. Walking up and stopping at the first bin over
set the H100 class's capacity at 4-5 requests on nvidia-cheap's bursty cell, where that
class met the SLO at 13 to 90 in flight (BENCHMARKS.md, issue 23).

With a knee, capacity = the top of the bin below it. Without one, capacity = one bin (19%)
above the heaviest load well sampled (``MIN_EXPLORE`` results in it and the bin below), an
exploration: it grows as the router fills replicas to it and they meet the SLO, up to the
load where misses rise and stay up: measured, with no miss counter that the tail every load
has keeps cutting (the AIMD limits this replaces: BENCHMARKS.md, issue 22).

Before ``MIN_RESULTS`` judged results a class has no capacity (NaN) and the router uses the
prior's SLO batch (``routing/estimate.py``): the catalog prior is the cold start. The
estimator was chosen by measurement (BENCHMARKS.md, "Learned SLO capacity").

One model is learned per class and per SLO (the limits a result was judged by): a class
serving two policies with different SLOs keeps one table per SLO, and the capacity the
router reads is the table of the SLO most results were judged by.

May touch: numpy. Must not touch: I/O, clocks (``now`` comes from the caller).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fleetgate.routing.types import FloatArray

BINS_PER_DOUBLING = 4
NBINS = 44  # loads up to 2^(44/4) = 2,048 requests
TARGET_MISS = 0.003  # of a 1% budget ("99% within the SLO"): room for noise and the floor
Z = 1.5
MIN_MISSES = 3.0
MIN_BIN = 60  # results before a bin's miss share counts toward the floor
MIN_SEEN = 5.0  # results before a bin is judged at all
MIN_EXPLORE = 200.0  # results at the highest load before the next bin is tried
UNFIT_FLOOR = 0.015  # a class missing more than this even at light load has no learned
# capacity (0: the router keeps the prior's B_slo, estimate.py); capping it at one request
# instead shed 8,274 requests on nvidia-cheap at 60% (40.95% within the SLO), whose H100 and
# MI355X classes miss over 1.5% at light load under the cost router (BENCHMARKS.md, issue 22)
MIN_RESULTS = 100  # judged results before a class has a learned capacity
OUTCOME_TAU_S = 60.0  # the time constant of each endpoint's judged and missed rates
BIN_MEMORY = 4000.0
FORGET_S = 120.0
QUANTILE = 0.99
QUANTILE_STEP = 0.02  # relative step of the running quantiles
_TOP = np.array([2.0 ** ((b + 1) / BINS_PER_DOUBLING) for b in range(NBINS)])


def load_bin(active: float) -> int:
    """The bin of a request dispatched with ``active`` requests on its endpoint (itself
    included): bin b holds loads in [2^(b/4), 2^((b+1)/4))."""
    if not active >= 1:
        return 0
    return min(int(BINS_PER_DOUBLING * math.log2(active)), NBINS - 1)


def _below(b: int) -> float:
    """The largest whole load below bin ``b``."""
    return max(math.ceil(2.0 ** (b / BINS_PER_DOUBLING)) - 1.0, 1.0)


def bin_top(b: int) -> float:
    """The largest whole load in bin ``b``."""
    return max(math.ceil(_TOP[b]) - 1.0, 1.0)


@dataclass
class ClassTable:
    """One class's bins for one SLO: plain lists, since every finished request updates one
    bin (numpy scalars took 1.5 µs more a request, in a tight loop), read as arrays by the
    collector's tick."""

    n: list[float]
    misses: list[float]
    q: list[list[float]]  # 4 x NBINS: TTFT p50, TTFT pQ, TPOT p50, TPOT pQ (s; NaN: none)
    last: list[float]  # when each bin last had a result
    results: int = 0

    @classmethod
    def empty(cls) -> ClassTable:
        return cls([0.0] * NBINS, [0.0] * NBINS, [[math.nan] * NBINS for _ in range(4)],
                   [-math.inf] * NBINS)

    def add(self, b: int, now: float, met: bool, ttft_s: float | None,
            tpot_s: float | None) -> None:
        n, misses = self.n, self.misses
        if n[b] >= BIN_MEMORY:
            n[b] *= 0.5
            misses[b] *= 0.5
        n[b] += 1.0
        if not met:
            misses[b] += 1.0
        self.last[b] = now
        self.results += 1
        for row, value in ((0, ttft_s), (2, tpot_s)):
            if value is not None and value >= 0:
                _quantile(self.q[row], b, value, 0.5)
                _quantile(self.q[row + 1], b, value, QUANTILE)

    def forget(self, now: float) -> None:
        """Bins without results for a while fade (time constant FORGET_S)."""
        fade = math.exp(-10.0 / FORGET_S)
        for b in range(NBINS):
            if self.n[b] > 0 and now - self.last[b] > 10.0:
                self.n[b] *= fade
                self.misses[b] *= fade
                self.last[b] = now - 10.0 * 0.999  # fade again one period later

    def capacity(self) -> tuple[float, bool]:
        """(capacity, whether a knee was found): the bin walk of the module docstring."""
        n, misses = np.array(self.n), np.array(self.misses)
        seen = np.flatnonzero(n >= MIN_SEEN)
        if not len(seen):
            return 1.0, False
        light = slice(0, max(int(seen[-1]) - BINS_PER_DOUBLING + 1, 1))  # half the top load
        light_n = float(n[light].sum())
        floor = float(misses[light].sum()) / light_n if light_n >= MIN_BIN else 0.0
        if floor > UNFIT_FLOOR:  # misses at every load: no capacity in requests explains them
            return 0.0, True
        budget = max(TARGET_MISS, floor + TARGET_MISS / 2)
        pooled_n = n + np.concatenate(([0.0], n[:-1]))  # each bin and the one below it
        pooled = misses + np.concatenate(([0.0], misses[:-1]))
        sampled = np.flatnonzero(n >= MIN_SEEN)
        knee = None
        for b in sampled[::-1]:  # down from the heaviest load, while misses stay up
            if not _over(pooled[b], pooled_n[b], budget):
                break
            knee = int(b)
        if knee is not None:
            return _below(knee), True
        explored = sampled[pooled_n[sampled] >= MIN_EXPLORE]
        confirmed = int(explored[-1]) if len(explored) else 0
        top = bin_top(confirmed)  # explore one bin above the highest load judged good
        return max(top + 1.0, math.floor(top * 2.0 ** (1 / BINS_PER_DOUBLING))), False

    def predicted(self, active: float) -> tuple[float, float, float]:
        """(TTFT pQ, TPOT pQ, miss share) predicted for a request dispatched at ``active``;
        NaN where the bin (and the nearest sampled one below it) knows nothing."""
        b = load_bin(active)
        while b > 0 and self.n[b] < 1:
            b -= 1
        miss = self.misses[b] / self.n[b] if self.n[b] >= 1 else math.nan
        return self.q[1][b], self.q[3][b], miss


def _over(misses: float, n: float, budget: float) -> bool:
    """Significantly more misses than ``budget`` allows in ``n`` results (one-sided, Z)."""
    return misses >= MIN_MISSES and misses > budget * n + Z * math.sqrt(budget * n)


def _quantile(q: list[float], b: int, value: float, level: float) -> None:
    """A running ``level``-quantile (q += step * (level - [value < q]), the step relative to
    q): it rests where a share ``level`` of the values lies below."""
    old = q[b]
    if old != old:  # NaN: the first value
        q[b] = value
        return
    step = QUANTILE_STEP * max(old, 1e-4)
    q[b] = old - step * (1 - level) if value < old else old + step * level


class SloCapacity:
    """Per endpoint class, the learned SLO capacity (written into a row of the live matrix)."""

    def __init__(self, row: FloatArray, knee_row: FloatArray, classes: list[int]) -> None:
        self.limit = row  # a view into the live matrix: the router reads it from there
        self.knee = knee_row
        self.limit[:] = np.nan
        self.knee[:] = 0.0
        self.classes = classes  # per endpoint: its class (the first endpoint with its prior)
        self._members: dict[int, list[int]] = {}
        for i, c in enumerate(classes):
            self._members.setdefault(c, []).append(i)
        self.tables: dict[tuple[int, float, float], ClassTable] = {}
        n = len(classes)  # per endpoint: results judged and missed a second, as of ``_at``
        self._judged, self._missed, self._at = [0.0] * n, [0.0] * n, [0.0] * n

    def table(self, i: int) -> ClassTable | None:
        """The table endpoint ``i``'s capacity comes from (its class's busiest SLO)."""
        c = self.classes[i]
        best = None
        for (cls, _, _), table in self.tables.items():
            if cls == c and (best is None or table.results > best.results):
                best = table
        return best

    def result(self, i: int, now: float, active: float, limits: tuple[float, float],
               met: bool, ttft_s: float | None, tpot_s: float | None) -> None:
        key = (self.classes[i], *limits)
        table = self.tables.get(key)
        if table is None:
            table = self.tables[key] = ClassTable.empty()
        table.add(load_bin(active), now, met, ttft_s, tpot_s)
        fade = math.exp(min(self._at[i] - now, 0.0) / OUTCOME_TAU_S)
        self._judged[i] = self._judged[i] * fade + 1.0 / OUTCOME_TAU_S
        self._missed[i] = self._missed[i] * fade + (0.0 if met else 1.0 / OUTCOME_TAU_S)
        self._at[i] = now

    def outcomes(self, now: float) -> tuple[FloatArray, FloatArray]:
        """(judged, missed) results per second per endpoint over about ``OUTCOME_TAU_S``:
        how the fleet holds its SLO now (the fleet scaler's feedback)."""
        fade = np.exp(np.minimum(np.array(self._at) - now, 0.0) / OUTCOME_TAU_S)
        return np.array(self._judged) * fade, np.array(self._missed) * fade

    def update(self, now: float) -> None:
        """Forget old bins and recompute every class's capacity (the collector's tick)."""
        for table in self.tables.values():
            table.forget(now)
        for members in self._members.values():
            busiest = self.table(members[0])
            if busiest is None or busiest.results < MIN_RESULTS:
                continue
            cap, knee = busiest.capacity()
            self.limit[members] = cap
            self.knee[members] = 1.0 if knee else 0.0

    def carry(self, i: int, old: SloCapacity, j: int) -> None:
        """Take over what ``old`` learned for its endpoint ``j`` (same prior: same class)."""
        for (c, ttft, tpot), table in old.tables.items():
            if c == old.classes[j]:
                self.tables.setdefault((self.classes[i], ttft, tpot), table)
        self.limit[i], self.knee[i] = old.limit[j], old.knee[j]
        self._judged[i], self._missed[i], self._at[i] = old._judged[j], old._missed[j], old._at[j]

    def describe(self, i: int) -> dict[str, float | bool | None]:
        """The class's learned capacity and its predictions at that load (admin, tests)."""
        table = self.table(i)
        cap = float(self.limit[i])
        if table is None or not cap > 0:
            return {"slo_capacity_learned": None, "knee": False, "judged": 0}
        ttft, tpot, miss = table.predicted(cap)
        return {"slo_capacity_learned": cap, "knee": bool(self.knee[i]),
                "judged": table.results, "ttft_pq_s": _num(ttft), "tpot_pq_s": _num(tpot),
                "miss_share": _num(miss)}


def _num(v: float) -> float | None:
    return None if not math.isfinite(v) else round(v, 6)
