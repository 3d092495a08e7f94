"""``fleetgate plan``: the cheapest fleet that carries a workload within its SLO.

1. Rows to rent (``candidates.py``): GPU x engine x stack x TP at the sheet's prices, each
   with the request rate one replica sustains within the SLO on this workload's mix.
2. An integer program (scipy ``milp``, HiGHS), Mélange-style with one request class:

       minimise    Σ_c usd_per_hour_c · n_c
       subject to  Σ_c rate_c · n_c  >=  design rate,      n_c ∈ {0, 1, 2, ...}

   The design rate is the arrival rate (Poisson, bursty), the diurnal peak
   ``rate·(1+amplitude)``, or a trace's busiest minute. Integrality is where mixing pays: the
   last few requests/s are bought on whatever row covers them cheapest.
3. The plan is simulated with the ``cost`` policy on the real router (``run.simulate``);
   while it misses the attainment target, one replica of the row that is cheapest per
   request/s is added and the fleet simulated again (at most ``MAX_TOP_UPS`` times).
4. Beside it: the best single-GPU-type fleet and the best NVIDIA-only fleet (same program,
   fewer rows, same top-up), and per GPU type the break-even $/GPU-hour at which it would
   enter (it is not in the plan) or leave (it is) the plan, by bisection on its price.

May touch: scipy, the simulator, the catalog. Must not touch: the gateway.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from fleetgate.config.schema import FleetConfig
from fleetgate.sim.arrivals import RequestSet
from fleetgate.sim.candidates import Candidate, PriceSheet, candidates
from fleetgate.sim.capacity import TARGET
from fleetgate.sim.run import simulate, workload_mix, workload_requests
from fleetgate.sim.summary import sig
from fleetgate.sim.workload import Workload

MAX_TOP_UPS = 3
PRICE_STEPS = 40  # bisection steps for a break-even price
PRICE_CEILING = 100.0  # $/GPU-hour: above this a GPU type "never" leaves the plan


@dataclass(frozen=True)
class Fleet:
    counts: tuple[tuple[Candidate, int], ...]

    @property
    def usd_per_hour(self) -> float:
        return sum(c.usd_per_hour * n for c, n in self.counts)

    @property
    def rate_per_s(self) -> float:
        return sum(c.capacity.rate_per_s * n for c, n in self.counts)

    def add(self, row: Candidate) -> Fleet:
        counts = dict(self.counts)
        counts[row] = counts.get(row, 0) + 1
        return Fleet(tuple(sorted(counts.items(), key=lambda kv: kv[0].name)))

    def gpus(self) -> set[str]:
        return {c.gpu for c, n in self.counts if n > 0}


def solve(rows: list[Candidate], demand: float) -> Fleet | None:
    """The integer program of the module docstring; None when ``rows`` is empty."""
    if not rows:
        return None
    cost = np.array([r.usd_per_hour for r in rows])
    rate = np.array([r.capacity.rate_per_s for r in rows])
    upper = np.ceil(demand / rate) + 1
    result = milp(cost, constraints=[LinearConstraint(rate[None, :], lb=demand)],
                  integrality=np.ones(len(rows)), bounds=Bounds(0, upper))
    if result.status != 0 or result.x is None:
        return None
    counts = [(r, round(x)) for r, x in zip(rows, result.x, strict=True)]
    return Fleet(tuple(sorted(((r, n) for r, n in counts if n > 0), key=lambda kv: kv[0].name)))


def design_rate(workload: Workload, requests: RequestSet, duration_s: float) -> float:
    arr = workload.arrivals
    if arr.process in ("poisson", "bursty"):
        return float(arr.rate_per_s or 0.0)
    if arr.process == "diurnal":
        return float(arr.rate_per_s or 0.0) * (1.0 + arr.amplitude)
    window = min(60.0, duration_s)
    counts = np.bincount((requests.arrival_s // window).astype(int))
    return float(counts.max()) / window if len(counts) else 0.0


def fleet_config(fleet: Fleet, model: str, workload: Workload) -> dict[str, Any]:
    """The fleet as a config file (``--out``): ``simulate`` and ``serve`` accept it."""
    slo = {"ttft_ms": workload.slo.ttft_ms, "tpot_ms": workload.slo.tpot_ms}
    pools = [{"name": row.name, "accelerator": row.gpu, "engine": row.engine,
              "gpus_per_replica": row.tp, "price_per_gpu_hour": row.price_per_gpu_hour,
              "endpoints": [f"{row.source}#{k + 1}" for k in range(n)],
              "models": {model: model}} for row, n in fleet.counts]
    return {"pools": pools,
            "policies": {"cost": {"strategy": "cost", "slo": slo},
                         "round_robin": {"strategy": "round_robin"}},
            "default_policy": "cost"}


Simulated = Callable[[Fleet], dict[str, Any]]


def confirm(fleet: Fleet, rows: list[Candidate], simulated: Simulated,
            target: float) -> tuple[Fleet, dict[str, Any]]:
    """Simulate; top up with the row cheapest per request/s while the SLO is missed."""
    best = min(rows, key=lambda r: r.usd_per_hour / r.capacity.rate_per_s)
    result = simulated(fleet)
    for _ in range(MAX_TOP_UPS):
        if (result.get("slo_attainment") or 0.0) >= target:
            break
        fleet = fleet.add(best)
        result = simulated(fleet)
    return fleet, result


def break_even(gpu: str, rows: list[Candidate], demand: float, in_plan: bool) -> float | None:
    """The $/GPU-hour at which ``gpu`` enters (or, if ``in_plan``, leaves) the optimal plan."""
    def uses(price: float) -> bool:
        priced = [r.with_price(price) if r.gpu == gpu else r for r in rows]
        found = solve(priced, demand)
        return found is not None and gpu in found.gpus()

    current = max((r.price_per_gpu_hour for r in rows if r.gpu == gpu), default=None)
    if current is None:
        return None
    lo, hi = (current, PRICE_CEILING) if in_plan else (0.0, current)
    if in_plan and uses(hi):
        return None
    if not in_plan and not uses(lo):
        return None
    for _ in range(PRICE_STEPS):
        mid = (lo + hi) / 2
        if uses(mid):
            lo = mid
        else:
            hi = mid
    return lo


def plan(workload: Workload, sheet: PriceSheet, gpus: list[str], seed: int = 1,
         duration_s: float | None = None, target: float = TARGET) -> dict[str, Any]:
    if workload.requests is None and workload.trace_path() is None:
        raise ValueError("the workload says nothing about its requests")
    requests, duration = workload_requests(workload, seed, duration_s)
    model = workload.requests.model if workload.requests else requests.models[0]
    rows = candidates(model, gpus, sheet, workload_mix(workload, requests), seed)
    demand = design_rate(workload, requests, duration)
    if not rows:
        raise ValueError(f"none of {gpus} can hold {model}")

    def simulated(fleet: Fleet) -> dict[str, Any]:
        config = FleetConfig.model_validate(fleet_config(fleet, model, workload))
        report = simulate(config, workload, ["cost"], duration, seed)
        return dict(report.as_json()["policies"]["cost"])

    def planned(subset: list[Candidate]) -> dict[str, Any] | None:
        found = solve(subset, demand)
        if found is None:
            return None
        fleet, result = confirm(found, subset, simulated, target)
        return {"fleet": fleet, "solved": found, "simulated": result}

    best = planned(rows)
    assert best is not None
    singles = [p for g in gpus if (p := planned([r for r in rows if r.gpu == g])) is not None]
    single = min(singles, key=lambda p: p["fleet"].usd_per_hour) if singles else None
    nvidia = planned([r for r in rows if r.vendor == "nvidia"])
    chosen = best["solved"].gpus()
    return {
        "model": model, "demand_rps": sig(demand), "target_attainment": target,
        **_fleet_json(best), "fleet_config": fleet_config(best["fleet"], model, workload),
        "baselines": {"best_single_type": _fleet_json(single),
                      "nvidia_only": _fleet_json(nvidia)},
        "break_even": {g: sig(v) if (v := break_even(g, rows, demand, g in chosen)) is not None
                       else None for g in gpus},
        "candidates": [_row_json(r) for r in rows],
    }


def _fleet_json(planned: dict[str, Any] | None) -> dict[str, Any]:
    if planned is None:
        return {"fleet": [], "usd_per_hour": None, "simulated": None}
    fleet: Fleet = planned["fleet"]
    sim = planned["simulated"]
    return {
        "fleet": [{"accelerator": r.gpu, "engine": r.engine, "stack": r.stack,
                   "gpus_per_replica": r.tp, "replicas": n,
                   "price_per_gpu_hour": r.price_per_gpu_hour} for r, n in fleet.counts],
        "usd_per_hour": sig(fleet.usd_per_hour),
        "solved_usd_per_hour": sig(planned["solved"].usd_per_hour),
        "capacity_rps": sig(fleet.rate_per_s),
        "simulated": {k: sim.get(k) for k in ("slo_attainment", "usd_per_mtok",
                                             "provisioned_usd_per_mtok", "usd",
                                             "provisioned_usd", "ttft_ms", "tpot_ms")},
    }


def _row_json(r: Candidate) -> dict[str, Any]:
    cap = r.capacity
    return {"accelerator": r.gpu, "engine": r.engine, "stack": r.stack, "gpus_per_replica": r.tp,
            "price_per_gpu_hour": r.price_per_gpu_hour, "rate_per_s": sig(cap.rate_per_s),
            "tokens_per_s": sig(cap.tokens_per_s),
            "usd_per_mtok_at_capacity": sig(r.usd_per_hour / 3600 / cap.tokens_per_s * 1e6)}
