"""``fleetgate plan``: the cheapest fleet that carries a workload within its SLO.

1. Rows to rent (``candidates.py``): GPU x engine x stack x TP at the sheet's prices, each
   with the request rate one replica sustains within the SLO on this workload's mix.
2. An integer program (scipy ``milp``, HiGHS), Mélange-style with one request class:

       minimise    Σ_c usd_per_hour_c · n_c
       subject to  Σ_c rate_c · n_c  >=  design rate,      n_c ∈ {0, 1, 2, ...}

   The design rate is the arrival rate (Poisson, bursty), the diurnal peak
   ``rate·(1+amplitude)``, or a trace's busiest minute. Integrality is where mixing pays: the
   last few requests/s are bought on whatever row covers them cheapest.
3. The solution is simulated on the real router (``run.simulate``) with the ``cost`` policy
   and, as a check of the fleet's size that does not lean on the cost router's predictions,
   ``least_loaded``; while the cost policy (the one the plan is for) does not meet the
   attainment target, the program is solved again for 10% more requests/s (at most
   ``MAX_ROUNDS`` rounds). A single replica's capacity is
   measured alone; a fleet run near the sum of them loses some to imperfect routing, which
   is what the rounds buy back. ``simulated`` reports the cost policy,
   ``simulated_least_loaded`` the other.
4. The same for the best single-GPU-type fleet (types in the order of their solved cost; a
   type that cannot beat a confirmed fleet is not simulated) and the best NVIDIA-only one.
   The plan is the cheaper confirmed fleet of the mixed and the single-type search, so it
   never costs more than the best single type. Per GPU type the break-even $/GPU-hour at
   which it would enter (it is not in the plan) or leave (it is) the plan, by bisection on
   its price, at the plan's design rate.

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
from fleetgate.sim.candidates import Candidate, Measured, PriceSheet, candidates
from fleetgate.sim.capacity import TARGET
from fleetgate.sim.run import simulate, workload_mix, workload_requests
from fleetgate.sim.summary import sig
from fleetgate.sim.workload import Workload

HEADROOM_STEP = 0.1  # each confirmation round asks the program for 10% more capacity
MAX_ROUNDS = 4
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
                         "least_loaded": {"strategy": "least_loaded"},
                         "round_robin": {"strategy": "round_robin"}},
            "default_policy": "cost"}


CONFIRMING = ("cost", "least_loaded")
ACCEPTING = "cost"  # the policy whose attainment confirms a fleet
Simulated = Callable[[Fleet], dict[str, dict[str, Any]]]


@dataclass(frozen=True)
class Confirmed:
    fleet: Fleet
    headroom: float  # the design rate was multiplied by this
    simulated: dict[str, dict[str, Any]]
    meets: bool


def meets(result: dict[str, dict[str, Any]], target: float) -> bool:
    """The plan is for the gateway's cost router: the fleet is confirmed when the ``cost``
    policy meets the target on it (``least_loaded`` is reported beside it, as a check of
    the fleet's size that does not lean on the cost router's predictions)."""
    return (result[ACCEPTING].get("slo_attainment") or 0.0) >= target


def confirm(rows: list[Candidate], demand: float, simulated: Simulated,
            target: float) -> Confirmed | None:
    """Solve at the design rate and simulate; while the SLO is missed, solve again for
    ``HEADROOM_STEP`` more (a fleet already simulated is not simulated again)."""
    tried: set[tuple[tuple[Candidate, int], ...]] = set()
    last: Confirmed | None = None
    for k in range(MAX_ROUNDS):
        headroom = 1.0 + HEADROOM_STEP * k
        fleet = solve(rows, demand * headroom)
        if fleet is None:
            return last
        if fleet.counts in tried:
            continue
        tried.add(fleet.counts)
        result = simulated(fleet)
        last = Confirmed(fleet, headroom, result, meets(result, target))
        if last.meets:
            break
    return last


def cheapest_confirmed(groups: list[list[Candidate]], demand: float, simulated: Simulated,
                       target: float) -> Confirmed | None:
    """The cheapest fleet drawn from one of ``groups`` that meets the target in simulation.
    Groups are tried in the order of their solved cost; one that cannot beat the best
    confirmed fleet even before headroom is not simulated."""
    priced = [(f.usd_per_hour, g) for g in groups if g and (f := solve(g, demand)) is not None]
    best: Confirmed | None = None
    for cost, group in sorted(priced, key=lambda cg: cg[0]):
        if best is not None and best.meets and cost >= best.fleet.usd_per_hour:
            break
        found = confirm(group, demand, simulated, target)
        if found is not None and (best is None or (found.meets, -found.fleet.usd_per_hour)
                                  > (best.meets, -best.fleet.usd_per_hour)):
            best = found
    return best


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
         duration_s: float | None = None, target: float = TARGET,
         measured: Measured | None = None) -> dict[str, Any]:
    if workload.requests is None and workload.trace_path() is None:
        raise ValueError("the workload says nothing about its requests")
    requests, duration = workload_requests(workload, seed, duration_s)
    model = workload.requests.model if workload.requests else requests.models[0]
    rows = candidates(model, gpus, sheet, workload_mix(workload, requests), seed, measured)
    demand = design_rate(workload, requests, duration)
    if not rows:
        raise ValueError(f"none of {gpus} can hold {model}")

    seen: dict[tuple[tuple[Candidate, int], ...], dict[str, dict[str, Any]]] = {}

    def simulated(fleet: Fleet) -> dict[str, dict[str, Any]]:
        if fleet.counts not in seen:
            config = FleetConfig.model_validate(fleet_config(fleet, model, workload))
            report = simulate(config, workload, list(CONFIRMING), duration, seed)
            seen[fleet.counts] = dict(report.as_json()["policies"])
        return seen[fleet.counts]

    singles = [[r for r in rows if r.gpu == g] for g in gpus]
    nvidia = [r for r in rows if r.vendor == "nvidia"]
    single = cheapest_confirmed(singles, demand, simulated, target)
    mixed = confirm(rows, demand, simulated, target)
    options = [c for c in (mixed, single) if c is not None]
    chosen = max(options, key=lambda c: (c.meets, -c.fleet.usd_per_hour))
    in_plan = chosen.fleet.gpus()
    design = demand * chosen.headroom
    return {
        "model": model, "demand_rps": sig(demand), "design_rps": sig(design),
        "target_attainment": target, **_fleet_json(chosen),
        "fleet_config": fleet_config(chosen.fleet, model, workload),
        "baselines": {"best_single_type": _fleet_json(single),
                      "nvidia_only": _fleet_json(cheapest_confirmed([nvidia], demand,
                                                                     simulated, target))},
        "break_even": {g: sig(v) if (v := break_even(g, rows, design, g in in_plan)) is not None
                       else None for g in gpus},
        "candidates": [{**_row_json(r), "capacity_source": "measured" if measured and (
            r.gpu, r.engine, r.tp) in measured else "simulated"} for r in rows],
    }


def _fleet_json(found: Confirmed | None) -> dict[str, Any]:
    if found is None:
        return {"fleet": [], "usd_per_hour": None, "simulated": None}
    fleet, sims = found.fleet, found.simulated
    return {
        "fleet": [{"accelerator": r.gpu, "engine": r.engine, "stack": r.stack,
                   "gpus_per_replica": r.tp, "replicas": n,
                   "price_per_gpu_hour": r.price_per_gpu_hour} for r, n in fleet.counts],
        "usd_per_hour": sig(fleet.usd_per_hour),
        "headroom": sig(found.headroom),
        "capacity_rps": sig(fleet.rate_per_s),
        "meets_target": found.meets,
        **{"simulated" + ("" if name == "cost" else f"_{name}"): _sim_json(sims[name])
           for name in CONFIRMING},
    }


def _sim_json(sim: dict[str, Any]) -> dict[str, Any]:
    return {k: sim.get(k) for k in ("slo_attainment", "usd_per_mtok", "provisioned_usd_per_mtok",
                                    "usd", "provisioned_usd", "ttft_ms", "tpot_ms")}


def _row_json(r: Candidate) -> dict[str, Any]:
    cap = r.capacity
    return {"accelerator": r.gpu, "engine": r.engine, "stack": r.stack, "gpus_per_replica": r.tp,
            "price_per_gpu_hour": r.price_per_gpu_hour, "rate_per_s": sig(cap.rate_per_s),
            "tokens_per_s": sig(cap.tokens_per_s),
            "usd_per_mtok_at_capacity": sig(r.usd_per_hour / 3600 / cap.tokens_per_s * 1e6)}
