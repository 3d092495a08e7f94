"""The lower bound: the cheapest the same work could cost on these pools, within the SLO.

A linear program (scipy's HiGHS) over ``x_p``, the busy replica-seconds spent on pool ``p``:

    minimise    Σ_p usd_per_s_p · x_p
    subject to  Σ_p tokens_per_s_p · x_p  >=  output tokens of the run
                0 <= x_p <= replicas_p · duration      (max_replicas for autoscaled pools)

``tokens_per_s_p`` is what one replica of the pool makes per *busy* second while meeting the
SLO on this workload's mix (``capacity.py``: its tokens/s at its SLO capacity over the share of
time it holds a request), so the bound is "every token made on the cheapest-per-token
capacity there is, each busy replica exactly at its SLO limit". It is in the units of a
policy's ``usd`` (busy GPU-time, the ledger's rule): a policy that keeps replicas busier
than their SLO limit can undercut it only by missing the SLO. Shared prefixes count: the
capacity is measured with every prefix cached where it is sent (the optimistic case, see
``capacity.py``), so a prefix-aware router cannot beat it by its cache hits.

``None`` when the pools cannot make the tokens at these rates (or none has any). The caller
(``run.bound_json``) then measures the capacities again at a lower attainment (the best
policy's, then 90%, 50%) rather than report nothing where a policy did meet the SLO.

``provisioned_bound``, for fleets that autoscale, bounds the bill (``provisioned_usd``)
instead: each pool's floor (``min_replicas``; every replica of a pool that does not scale)
is paid for the whole run and its capacity used first; per ``BIN_S`` of the run, the tokens
asked for then that the floors cannot make are made on the cheapest per-token capacity up
to each pool's ceiling, in fractional replica-seconds (no cold start, no whole replicas, no
headroom: what no scaler can undercut within the SLO).

May touch: scipy.optimize. Must not touch: the simulator's state.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog


@dataclass(frozen=True)
class PoolCapacity:
    name: str
    replicas: int
    usd_per_s: float  # one replica
    tokens_per_s: float  # one replica at the SLO


@dataclass(frozen=True)
class Bound:
    usd: float
    usd_per_mtok: float
    busy_replica_s: dict[str, float]


def lower_bound(pools: list[PoolCapacity], output_tokens: float,
                duration_s: float) -> Bound | None:
    usable = [p for p in pools if p.tokens_per_s > 0 and p.replicas > 0]
    if output_tokens <= 0 or not usable:
        return None
    cost = np.array([p.usd_per_s for p in usable])
    rate = np.array([p.tokens_per_s for p in usable])
    result = linprog(cost, A_ub=-rate[None, :], b_ub=[-output_tokens],
                     bounds=[(0.0, p.replicas * duration_s) for p in usable], method="highs")
    if result.status != 0:
        return None
    usd = float(result.fun)
    busy = {p.name: float(x) for p, x in zip(usable, result.x, strict=True)}
    return Bound(usd, usd / output_tokens * 1e6, busy)


BIN_S = 60.0


@dataclass(frozen=True)
class Provisioned:
    usd: float
    floors_usd: float
    replica_s: dict[str, float]  # above the floors


def provisioned_bound(pools: list[PoolCapacity], floors: dict[str, int],
                      tokens_per_bin: list[float], bin_s: float = BIN_S) -> Provisioned | None:
    """The bill's lower bound of the module docstring; ``tokens_per_bin``: the output tokens
    of the requests that arrived in each ``bin_s`` of the run. None when some bin's tokens
    cannot be made even at every ceiling."""
    duration = bin_s * len(tokens_per_bin)
    floors_usd = sum(floors.get(p.name, 0) * p.usd_per_s * duration for p in pools)
    floor_rate = sum(floors.get(p.name, 0) * p.tokens_per_s for p in pools)
    extra = sorted((p for p in pools if p.tokens_per_s > 0 and p.replicas > floors.get(p.name, 0)),
                   key=lambda p: p.usd_per_s / p.tokens_per_s)
    usd, used = floors_usd, {p.name: 0.0 for p in extra}
    for tokens in tokens_per_bin:
        rest = tokens - floor_rate * bin_s
        for p in extra:
            if rest <= 0:
                break
            seconds = min(rest / p.tokens_per_s, (p.replicas - floors.get(p.name, 0)) * bin_s)
            usd += seconds * p.usd_per_s
            used[p.name] += seconds
            rest -= seconds * p.tokens_per_s
        if rest > 1e-6 * max(tokens, 1.0):
            return None
    return Provisioned(usd, floors_usd, used)
