"""``fleetgate plan``: the cheapest fleet that carries a workload within its SLO.

1. Rows to rent (``candidates.py``): GPU x engine x stack x TP at the sheet's prices, each
   with the request rate one replica sustains within the SLO on this workload's mix (one
   search per row, the rows in parallel: ``parallel.Runner``, ``--jobs``).
2. An integer program (scipy ``milp``, HiGHS), Mélange-style with one request class:

       minimise    Σ_c usd_per_hour_c · n_c
       subject to  Σ_c rate_c · n_c  >=  design rate,      n_c ∈ {0, 1, 2, ...}

   The design rate is the arrival rate (Poisson, bursty), the diurnal peak
   ``rate·(1+amplitude)``, or a trace's busiest minute. Integrality is where mixing pays: the
   last few requests/s are bought on whatever row covers them cheapest.
3. Fleets to try (``rungs``): the program's solution over all rows, over each GPU type
   alone and over the NVIDIA rows, at the design rate and at more (``HEADROOMS``: +10%,
   +20%, +30%, then up to 3x): a single replica's capacity is measured alone on Poisson
   arrivals, and a fleet run near the sum of them loses some to imperfect routing and to
   bursts, which headroom buys back. One list, each fleet once (at the least headroom that
   gives it), cheapest first.
4. Confirmation (``search``): each fleet is simulated on the real router with ``cost`` (the
   policy the plan is for) and ``least_loaded`` (a check that does not lean on the cost
   router's predictions), each policy one task of the runner, cheapest fleet first. A fleet
   is simulated only while it can matter: no cheaper fleet is confirmed by the cost policy
   yet (the plan), or it has one GPU type and no cheaper such fleet is confirmed
   (``best_single_type``), or it is NVIDIA-only and no cheaper such fleet is
   (``nvidia_only``); a baseline is searched up to the plan's headroom or
   ``BASELINE_HEADROOM``, whichever is more (null beyond). So every fleet cheaper than the
   plan is simulated with both policies, and ``least_loaded_confirmed`` (the cheapest
   fleet on which least_loaded meets the target) is exact below the plan. With several
   jobs the next fleets start before it is known whether they matter; only those that do
   are reported, so the JSON is the same whatever ``--jobs`` is. A fleet is simulated
   once, whichever lists it came from.
5. The plan is the cheapest fleet the cost policy confirms, unless least_loaded confirms a
   cheaper one: then that fleet with ``policy: least_loaded`` (also its fleet file's
   default), and the cost router's shortfall is listed in ``misses``: the plan never costs
   more than the cheapest fleet least_loaded confirms. When nothing is confirmed, the fleet
   the cost policy came closest on, ``meets_target`` false. ``ip_optimum_usd_per_hour`` is
   the program's optimum at the demand itself; a plan above ``IP_SLACK`` x it is a miss.
6. ``break_even`` (``break_even``): per GPU type, the $/GPU-hour at which it enters (it is
   not in the program's solution at the plan's design rate) or leaves (it is) that
   solution, every other price fixed, by bisection; ``break_even_direction`` says which.

May touch: scipy, the simulator, the catalog. Must not touch: the gateway.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from fleetgate.config.schema import FleetConfig
from fleetgate.sim.arrivals import RequestSet
from fleetgate.sim.candidates import Candidate, Measured, PriceSheet, candidates
from fleetgate.sim.capacity import PROBE_REQUESTS, TARGET
from fleetgate.sim.parallel import Runner
from fleetgate.sim.run import policy_summary, workload_mix, workload_requests
from fleetgate.sim.summary import sig
from fleetgate.sim.workload import Workload

# the design rate is multiplied by each of these in turn; the baselines stop at the
# plan's headroom or BASELINE_HEADROOM, whichever is more (module docstring, 3. and 4.)
HEADROOMS = (1.0, 1.1, 1.2, 1.3, 1.5, 1.75, 2.0, 2.5, 3.0)
BASELINE_HEADROOM = 1.3
PRICE_STEPS = 40  # bisection steps for a break-even price
PRICE_CEILING = 100.0  # $/GPU-hour: above this a GPU type "never" leaves the plan
IP_SLACK = 1.2  # a plan above this x the program's optimum at the demand is a miss


@dataclass(frozen=True)
class Fleet:
    counts: tuple[tuple[Candidate, int], ...]

    @property
    def usd_per_hour(self) -> float:
        return sum(c.usd_per_hour * n for c, n in self.counts)

    @property
    def rate_per_s(self) -> float:
        return sum(c.capacity.rate_per_s * n for c, n in self.counts)

    @property
    def label(self) -> str:
        return " + ".join(f"{n} x {c.name}" for c, n in self.counts)

    def gpus(self) -> set[str]:
        return {c.gpu for c, n in self.counts if n > 0}

    def kinds(self) -> set[str]:
        """What this fleet may be confirmed as: the plan, and maybe a baseline."""
        out = {"plan"}
        if len(self.gpus()) == 1:
            out.add("single")
        if all(c.vendor == "nvidia" for c, _n in self.counts):
            out.add("nvidia")
        return out


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


def fleet_config(fleet: Fleet, model: str, workload: Workload,
                 policy: str = "cost") -> dict[str, Any]:
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
            "default_policy": policy}


CONFIRMING = ("cost", "least_loaded")
ACCEPTING = "cost"  # the policy the plan is for
CHECKING = "least_loaded"
Results = dict[int, dict[str, dict[str, Any]]]  # rung -> policy -> its simulate summary


@dataclass(frozen=True)
class Rung:
    fleet: Fleet
    headroom: float  # the design rate was multiplied by this


def rungs(rows: list[Candidate], gpus: list[str], demand: float) -> list[Rung]:
    """The fleets to try (module docstring, 3.), cheapest first."""
    groups = [rows, *([r for r in rows if r.gpu == g] for g in gpus),
              [r for r in rows if r.vendor == "nvidia"]]
    least: dict[tuple[tuple[Candidate, int], ...], Rung] = {}
    for group in groups:
        for headroom in HEADROOMS:
            fleet = solve(group, demand * headroom)
            if fleet is not None and (fleet.counts not in least
                                      or least[fleet.counts].headroom > headroom):
                least[fleet.counts] = Rung(fleet, headroom)
    return sorted(least.values(),
                  key=lambda r: (r.fleet.usd_per_hour, -r.fleet.rate_per_s, r.fleet.label))


def meets(result: dict[str, dict[str, Any]], target: float, policy: str = ACCEPTING) -> bool:
    """Whether ``policy`` (by default the cost policy, the one the plan is for) meets the
    target in a fleet's simulation."""
    return (result[policy].get("slo_attainment") or 0.0) >= target


def settle(ladder: list[Rung], results: Results, target: float) -> list[str]:
    """Per rung: ``need`` (it matters, every cheaper one is settled), ``maybe`` (it matters
    unless a cheaper one still running is confirmed) or ``skip`` (module docstring, 4.)."""
    found: set[str] = set()
    settled, out, reach = True, [], max(HEADROOMS)
    for i, rung in enumerate(ladder):
        wanted = rung.fleet.kinds() - found
        if not wanted or (wanted != {"plan"} and "plan" in found and rung.headroom > reach):
            out.append("skip")
            continue
        out.append("need" if settled else "maybe")
        done = results.get(i, {})
        if ACCEPTING not in done:
            settled = False
        elif settled and meets(done, target):
            if "plan" not in found:
                reach = max(BASELINE_HEADROOM, rung.headroom)
            found |= rung.fleet.kinds()
    return out


@dataclass(frozen=True)
class Confirmation:
    """What one fleet's simulation needs besides the fleet: the runner's task arguments."""

    model: str
    workload: Workload
    requests: RequestSet
    seed: int
    duration: float

    def submit(self, runner: Runner, fleet: Fleet, policy: str) -> Future[dict[str, Any]]:
        config = FleetConfig.model_validate(fleet_config(fleet, self.model, self.workload))
        return runner.submit(f"{policy} on {fleet.label}", policy_summary, config,
                             self.workload, self.requests, policy, self.seed, self.duration)


def search(ladder: list[Rung], confirmation: Confirmation, runner: Runner,
           target: float) -> tuple[list[str], Results]:
    """Simulate the rungs that matter, at most ``runner.jobs`` tasks at a time (module
    docstring, 4.); returns each rung's state and the results of the ``need`` ones."""
    results: Results = {}
    running: dict[tuple[int, str], Future[dict[str, Any]]] = {}
    while True:
        states = settle(ladder, results, target)
        todo = sorted(((i, p) for i, state in enumerate(states) if state != "skip"
                       for p in CONFIRMING if p not in results.get(i, {})
                       and (i, p) not in running),
                      key=lambda ip: ((0, ip[0], ip[1] != ACCEPTING) if states[ip[0]] == "need"
                                      else (1, ip[1] != ACCEPTING, ip[0])))
        wanted = any(s == "maybe" or (s == "need" and len(results.get(i, {})) < len(CONFIRMING))
                     for i, s in enumerate(states))
        if not wanted:
            break
        while todo and len(running) < runner.jobs:
            i, policy = todo.pop(0)
            running[i, policy] = confirmation.submit(runner, ladder[i].fleet, policy)
        runner.wait_any(running.values())
        for key in [k for k, f in running.items() if f.done()]:
            results.setdefault(key[0], {})[key[1]] = running.pop(key).result()
    return states, {i: results[i] for i, s in enumerate(states) if s == "need"}


@dataclass(frozen=True)
class Choice:
    plan: int
    policy: str
    baselines: dict[str, int | None]
    misses: list[str]


def choose(ladder: list[Rung], results: Results, target: float, ip_usd: float | None) -> Choice:
    """The plan and the baselines among the simulated rungs (module docstring, 5.)."""
    def first(kind: str, policy: str = ACCEPTING) -> int | None:
        return next((i for i in sorted(results) if kind in ladder[i].fleet.kinds()
                     and meets(results[i], target, policy)), None)

    by_cost, by_check = first("plan"), first("plan", CHECKING)
    misses: list[str] = []
    plan_i, policy = by_cost, ACCEPTING
    if by_check is not None and (by_cost is None or ladder[by_check].fleet.usd_per_hour
                                 < ladder[by_cost].fleet.usd_per_hour):
        plan_i, policy = by_check, CHECKING
        got = results[by_check][ACCEPTING].get("slo_attainment") or 0.0
        misses.append(f"the cost router reaches {got:.2%} on the cheapest fleet least_loaded "
                      f"confirms ({ladder[by_check].fleet.label}); the plan runs least_loaded")
    if plan_i is None:
        plan_i = max(results, key=lambda i: (results[i][ACCEPTING].get("slo_attainment") or 0.0,
                                             -i))
        misses.append(f"no fleet tried meets {target:.0%} of requests within the SLO")
    usd = ladder[plan_i].fleet.usd_per_hour
    if ip_usd and usd > IP_SLACK * ip_usd:
        misses.append(f"the plan costs {usd / ip_usd:.2f}x the integer program's optimum at "
                      f"the demand (${ip_usd:.2f}/h; target <= {IP_SLACK}x)")
    baselines = {"best_single_type": first("single"), "nvidia_only": first("nvidia"),
                 "least_loaded_confirmed": by_check}
    return Choice(plan_i, policy, baselines, misses)


def break_even(gpu: str, rows: list[Candidate], demand: float) -> tuple[float | None, str]:
    """The $/GPU-hour at which ``gpu`` leaves the program's solution at ``demand`` (when it
    is in it at its price: ``"leaves_above"``) or enters it (``"enters_below"``). Every row
    of the type (engines, stacks, TP) takes the price together. None: it never leaves below
    ``PRICE_CEILING``, or is not used even free."""
    def uses(price: float) -> bool:
        found = solve([r.with_price(price) if r.gpu == gpu else r for r in rows], demand)
        return found is not None and gpu in found.gpus()

    current = max((r.price_per_gpu_hour for r in rows if r.gpu == gpu), default=None)
    if current is None:
        return None, "not_a_candidate"
    inside = uses(current)
    lo, hi = (current, PRICE_CEILING) if inside else (0.0, current)
    direction = "leaves_above" if inside else "enters_below"
    if (inside and uses(hi)) or (not inside and not uses(lo)):
        return None, direction
    for _ in range(PRICE_STEPS):  # invariant: uses(lo) and not uses(hi)
        mid = (lo + hi) / 2
        if uses(mid):
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2, direction


def plan(workload: Workload, sheet: PriceSheet, gpus: list[str], seed: int = 1,
         duration_s: float | None = None, target: float = TARGET,
         measured: Measured | None = None, runner: Runner | None = None,
         probe_requests: int = PROBE_REQUESTS) -> dict[str, Any]:
    """The plan's JSON (``plan --json``); simulations run as ``runner``'s tasks (a started
    one; by default one after the other in this process); each candidate's capacity is
    probed with ``probe_requests`` requests a rate."""
    if runner is None:
        with Runner(1, quiet=True) as own:
            return plan(workload, sheet, gpus, seed, duration_s, target, measured, own,
                        probe_requests)
    if workload.requests is None and workload.trace_path() is None:
        raise ValueError("the workload says nothing about its requests")
    requests, duration = workload_requests(workload, seed, duration_s)
    model = workload.requests.model if workload.requests else requests.models[0]
    rows = candidates(model, gpus, sheet, workload_mix(workload, requests, probe_requests), seed,
                      measured, runner)
    if not rows:
        raise ValueError(f"none of {gpus} can hold {model}")
    demand = design_rate(workload, requests, duration)
    ladder = rungs(rows, gpus, demand)
    _states, results = search(ladder, Confirmation(model, workload, requests, seed, duration),
                             runner, target)
    ip = solve(rows, demand)
    choice = choose(ladder, results, target, ip.usd_per_hour if ip else None)
    chosen = ladder[choice.plan]
    design = demand * chosen.headroom
    even = {g: break_even(g, rows, design) for g in gpus}
    return {
        "model": model, "demand_rps": sig(demand), "design_rps": sig(design),
        "target_attainment": target, "policy": choice.policy,
        **_fleet_json(chosen, results[choice.plan], target, choice.policy),
        "ip_optimum_usd_per_hour": sig(ip.usd_per_hour) if ip else None,
        "ip_optimum_fleet": _counts_json(ip) if ip else [],
        "vs_ip_optimum": sig(chosen.fleet.usd_per_hour / ip.usd_per_hour) if ip else None,
        "misses": choice.misses,
        "fleet_config": fleet_config(chosen.fleet, model, workload, choice.policy),
        "baselines": {name: _fleet_json(ladder[i] if i is not None else None,
                                        results.get(i, {}) if i is not None else {}, target,
                                        CHECKING if name == "least_loaded_confirmed"
                                        else ACCEPTING)
                      for name, i in choice.baselines.items()},
        "break_even": {g: sig(v) if v is not None else None for g, (v, _d) in even.items()},
        "break_even_direction": {g: d for g, (_v, d) in even.items()},
        "tried": [_tried_json(ladder[i], results[i]) for i in sorted(results)],
        "candidates": [{**_row_json(r), "capacity_source": "measured" if measured and (
            r.gpu, r.engine, r.tp) in measured else "simulated"} for r in rows],
    }


def _counts_json(fleet: Fleet) -> list[dict[str, Any]]:
    return [{"accelerator": r.gpu, "engine": r.engine, "stack": r.stack,
             "gpus_per_replica": r.tp, "replicas": n,
             "price_per_gpu_hour": r.price_per_gpu_hour} for r, n in fleet.counts]


def _fleet_json(rung: Rung | None, sims: dict[str, dict[str, Any]], target: float,
                policy: str = ACCEPTING) -> dict[str, Any]:
    if rung is None:
        return {"fleet": [], "usd_per_hour": None, "simulated": None}
    return {
        "fleet": _counts_json(rung.fleet),
        "usd_per_hour": sig(rung.fleet.usd_per_hour),
        "headroom": sig(rung.headroom),
        "capacity_rps": sig(rung.fleet.rate_per_s),
        "meets_target": meets(sims, target, policy),
        **{"simulated" + ("" if name == ACCEPTING else f"_{name}"): _sim_json(sims[name])
           for name in CONFIRMING},
    }


def _tried_json(rung: Rung, sims: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {"fleet": rung.fleet.label, "usd_per_hour": sig(rung.fleet.usd_per_hour),
            "headroom": sig(rung.headroom), "capacity_rps": sig(rung.fleet.rate_per_s),
            "slo_attainment": {name: sims[name].get("slo_attainment") for name in CONFIRMING}}


def _sim_json(sim: dict[str, Any]) -> dict[str, Any]:
    return {k: sim.get(k) for k in ("slo_attainment", "usd_per_mtok", "provisioned_usd_per_mtok",
                                    "usd", "provisioned_usd", "ttft_ms", "tpot_ms")}


def _row_json(r: Candidate) -> dict[str, Any]:
    cap = r.capacity
    return {"accelerator": r.gpu, "engine": r.engine, "stack": r.stack, "gpus_per_replica": r.tp,
            "price_per_gpu_hour": r.price_per_gpu_hour, "rate_per_s": sig(cap.rate_per_s),
            "tokens_per_s": sig(cap.tokens_per_s),
            "usd_per_mtok_at_capacity": sig(r.usd_per_hour / 3600 / cap.tokens_per_s * 1e6)}
