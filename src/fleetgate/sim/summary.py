"""One policy's run in numbers: the ``policies.NAME`` object of ``simulate --json``.

From ``Outcomes`` (per request) and the fleet: SLO attainment over every request that
arrived (failed, shed and unfinished ones count as misses), TTFT/TPOT/e2e percentiles of the
finished ones (ms), output throughput, busy GPU-hours, the two money numbers and each pool's
share:

* ``usd``: the ledger's charges (``catalog.pricing``: busy replica-time shared among the
  requests running on it; failed attempts included) — what the traffic *used*;
* ``provisioned_usd``: every replica that existed x the time it existed within the run
  (cold starts and draining included) x its $/s — what the bill *is*.

A hosted API priced per token has no replicas: its requests are charged their tokens at
its prices (in ``usd``; it adds nothing to ``provisioned_usd``, a bill for replicas), and
its spend and share are also reported apart: ``hosted_usd``, ``hosted_share`` and, per
pool, ``hosted: true``.

Both per million output tokens (``*_per_mtok``). Floats are rounded to 6 significant digits
so the JSON is short and the same run always prints the same bytes.

May touch: numpy, the sim fleet's descriptions. Must not touch: the simulator's state.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from fleetgate.sim.arrivals import PRIORITIES, RequestSet
from fleetgate.sim.fleet import SimFleet
from fleetgate.sim.outcomes import (
    BAD_REQUEST,
    FAILED,
    NO_CAPACITY,
    OK,
    PENDING,
    SHED,
    Outcomes,
)

PERCENTILES = (50, 95, 99)


def sig(value: float, digits: int = 6) -> float | None:
    """``value`` rounded to ``digits`` significant digits; None for NaN and infinities."""
    if value is None or not np.isfinite(value):
        return None
    if value == 0:
        return 0.0
    return float(f"{value:.{digits}g}")


def percentiles(values: npt.NDArray[np.float64], scale: float = 1000.0) -> dict[str, Any]:
    v = values[~np.isnan(values)]
    if not len(v):
        return {f"p{q}": None for q in PERCENTILES} | {"mean": None}
    out: dict[str, Any] = {f"p{q}": sig(float(np.percentile(v, q)) * scale)
                           for q in PERCENTILES}
    out["mean"] = sig(float(np.mean(v)) * scale)
    return out


def summarize(out: Outcomes, requests: RequestSet, fleet: SimFleet, duration_s: float,
              ttft_s: float, tpot_s: float) -> dict[str, Any]:
    n = len(requests)
    ok = out.status == OK
    met = out.met_slo(ttft_s, tpot_s)
    tokens = int(out.tokens[ok].sum())
    usd = float(out.usd.sum())
    prov_by_pool = provisioned_usd(out, fleet, duration_s)
    provisioned = sum(prov_by_pool.values())
    mtok = tokens / 1e6
    result: dict[str, Any] = {
        "requests": n, "completed": int(ok.sum()),
        "failed": int(np.isin(out.status, (FAILED, BAD_REQUEST)).sum()),
        "shed": int((out.status == SHED).sum()),
        "no_capacity": int((out.status == NO_CAPACITY).sum()),
        "unfinished": int((out.status == PENDING).sum()),
        "slo_attainment": sig(float(met.sum()) / n if n else 1.0),
        "goodput_rps": sig(float(met.sum()) / duration_s),  # requests/s that met the SLO
        "usd": sig(usd), "usd_per_mtok": sig(usd / mtok) if mtok else None,
        "failed_usd": sig(float(out.failed_usd.sum())),
        "provisioned_usd": sig(provisioned),
        "provisioned_usd_per_mtok": sig(provisioned / mtok) if mtok else None,
        "gpu_hours": sig(float(out.gpu_seconds.sum()) / 3600.0),
        "provisioned_gpu_hours": sig(provisioned_gpu_hours(out, fleet, duration_s)),
        "output_tokens": tokens,
        "throughput_tok_s": sig(tokens / duration_s),
        "ttft_ms": percentiles(out.ttft_s[ok]), "tpot_ms": percentiles(out.tpot_s[ok]),
        "e2e_ms": percentiles(out.e2e_s[ok]),
        "pools": pool_rows(out, fleet, prov_by_pool, duration_s, ttft_s, tpot_s),
    }
    if any(p.per_token for p in fleet.pools):
        hosted = [p.name for p in fleet.pools if p.per_token]
        rows = result["pools"]
        result["hosted_usd"] = sig(sum(rows[name]["usd"] or 0.0 for name in hosted))
        result["hosted_share"] = sig(sum(rows[name]["share"] or 0.0 for name in hosted))
    if len(requests.models) > 1:  # LoRA adapters: each one's share and SLO, and the loads
        result["adapters"] = {
            name: {"requests": int((requests.model == m).sum()),
                   "slo_attainment": sig(float(met[requests.model == m].mean()))
                   if (requests.model == m).any() else None}
            for m, name in enumerate(requests.models) if m}
        result["adapter_loads"] = int(sum(fleet.live.adapters.loads.values()))
    if len(set(requests.priority.tolist())) > 1:
        result["priorities"] = {
            PRIORITIES[p]: {"requests": int((requests.priority == p).sum()),
                            "slo_attainment": sig(float(met[requests.priority == p].mean())),
                            "shed": int((out.status[requests.priority == p] == SHED).sum())}
            for p in sorted(set(requests.priority.tolist()))}
    return result


def _clipped(out: Outcomes, duration_s: float) -> list[tuple[int, float]]:
    return [(i, max(0.0, min(b, duration_s) - min(a, duration_s)))
            for i, a, b in out.provisioned]


def provisioned_usd(out: Outcomes, fleet: SimFleet, duration_s: float) -> dict[str, float]:
    by_pool = {p.name: 0.0 for p in fleet.pools}
    for i, seconds in _clipped(out, duration_s):
        pool = fleet.pools[int(fleet.pool_of[i])]
        by_pool[pool.name] += seconds * pool.usd_per_s
    return by_pool


def provisioned_gpu_hours(out: Outcomes, fleet: SimFleet, duration_s: float) -> float:
    total = 0.0
    for i, seconds in _clipped(out, duration_s):
        pool = fleet.pools[int(fleet.pool_of[i])]
        total += 0.0 if pool.per_token else seconds * pool.gpus_per_replica
    return total / 3600.0


def pool_rows(out: Outcomes, fleet: SimFleet, prov: dict[str, float], duration_s: float,
              ttft_s: float, tpot_s: float) -> dict[str, Any]:
    """Per pool: its share of the answers, their SLO attainment and which limit the misses
    broke (where a fleet's misses come from), its spend and replicas."""
    ok = out.status == OK
    met = out.met_slo(ttft_s, tpot_s)
    late_first = ok & (out.ttft_s > ttft_s)
    slow = ok & ~np.isnan(out.tpot_s) & (out.tpot_s > tpot_s)
    done = int(ok.sum())
    ep_pool = fleet.pool_of
    final_pool = np.where(out.endpoint >= 0, ep_pool[np.maximum(out.endpoint, 0)], -1)
    replica_s = {p.name: 0.0 for p in fleet.pools}
    for i, seconds in _clipped(out, duration_s):
        pool = fleet.pools[int(ep_pool[i])]
        replica_s[pool.name] += 0.0 if pool.per_token else seconds  # no replicas of ours
    rows: dict[str, Any] = {}
    for p, pool in enumerate(fleet.pools):
        mine = ok & (final_pool == p)
        k_ttft = [fleet.live.value(i, "k_ttft") for i in pool.slots]
        k_tpot = [fleet.live.value(i, "k_tpot") for i in pool.slots]
        rows[pool.name] = {
            "share": sig(float(mine.sum()) / done if done else 0.0),
            "requests": int(mine.sum()),
            "slo_attainment": sig(float(met[mine].mean())) if mine.any() else None,
            "ttft_misses": int((late_first & mine).sum()),
            "tpot_misses": int((slow & mine).sum()),
            "output_tokens": int(out.tokens[mine].sum()),
            "usd": sig(float(out.usd[final_pool == p].sum())),
            "provisioned_usd": sig(prov[pool.name]),
            "replicas_mean": sig(replica_s[pool.name] / duration_s),
            "k_ttft_max": sig(max(k_ttft)), "k_tpot_max": sig(max(k_tpot)),
        }
        if pool.per_token:
            rows[pool.name]["hosted"] = True
    return rows


def share_over_time(out: Outcomes, requests: RequestSet, fleet: SimFleet, duration_s: float,
                    bins: int = 60) -> tuple[npt.NDArray[np.float64], dict[str, Any]]:
    """Per pool, the share of requests that arrived in each time bin and finished there."""
    edges = np.linspace(0.0, duration_s, bins + 1)
    which = np.clip(np.searchsorted(edges, requests.arrival_s, side="right") - 1, 0, bins - 1)
    ok = out.status == OK
    pool = np.where(out.endpoint >= 0, fleet.pool_of[np.maximum(out.endpoint, 0)], -1)
    total = np.bincount(which[ok], minlength=bins).astype(float)
    shares = {}
    for p, sp in enumerate(fleet.pools):
        counts = np.bincount(which[ok & (pool == p)], minlength=bins)
        shares[sp.name] = np.divide(counts, total, out=np.zeros(bins), where=total > 0)
    return (edges[:-1] + edges[1:]) / 2, shares
