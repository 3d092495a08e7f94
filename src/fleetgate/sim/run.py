"""``simulate``: replay one workload through every asked-for policy of a fleet; the JSON report.

For each policy: a fresh fleet (idle engines, live state at its priors, breakers closed), a
router built with the run's seed, the same requests (drawn once from the seed, or read from
a trace), the same faults; then ``summary.summarize``. Policies share nothing, so each is
one task of a ``parallel.Runner`` (``--jobs``: one process per policy) and the report is
the same bytes whatever the number of processes. Beside the policies, the lower bound
(``bound.py``) from each pool's SLO capacity on this workload (``bound_capacities``): the
self-hosted pools' (a hosted API priced per token is left out of the bound: it is what
the self-hosted fleet could not carry, at someone else's price). Autoscaled
pools are scaled by ``fleetgate.scaling`` on the router's own (learned) SLO capacity.

The result is the ``simulate --json`` object of DESIGN.md §1 (extra keys: per-pool rows,
percentiles of e2e, counts of failed and shed requests, the capacities used). It holds no
wall-clock time, so one seed always gives the same bytes (``dumps``).

May touch: everything in ``sim``, config loading. Must not touch: the gateway, wall clocks
(the caller times runs if it wants to).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import orjson

from fleetgate.config.schema import FleetConfig
from fleetgate.sim.arrivals import DEFAULT_DURATION_S, RequestSet, generate
from fleetgate.sim.bound import BIN_S, PoolCapacity, lower_bound, provisioned_bound
from fleetgate.sim.capacity import (
    PROBE_REQUESTS,
    TARGET,
    Capacity,
    Mix,
    replica_capacities,
    sample_mix,
)
from fleetgate.sim.fleet import SimFleet, build_fleet, emulator_config, source_speed
from fleetgate.sim.loop import Simulation
from fleetgate.sim.outcomes import Outcomes
from fleetgate.sim.parallel import Runner
from fleetgate.sim.summary import sig, summarize
from fleetgate.sim.trace import read_trace
from fleetgate.sim.workload import Workload


@dataclass
class PolicyRun:
    policy: str
    fleet: SimFleet
    outcomes: Outcomes
    summary: dict[str, Any]


@dataclass
class Report:
    seed: int
    duration_s: float
    requests: RequestSet
    runs: list[PolicyRun]
    capacities: dict[str, Capacity]
    bound: dict[str, Any] | None

    def as_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed, "duration_s": sig(self.duration_s), "requests": len(self.requests),
            "policies": {run.policy: run.summary for run in self.runs},
            "lower_bound": self.bound,
            "capacity": {name: {"rate_per_s": sig(c.rate_per_s),
                                "tokens_per_s": sig(c.tokens_per_s),
                                "concurrency": sig(c.concurrency)}
                         for name, c in self.capacities.items()},
        }


def dumps(obj: dict[str, Any]) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)


def workload_requests(workload: Workload, seed: int,
                      duration_s: float | None) -> tuple[RequestSet, float]:
    """The run's requests and its duration (a trace's span when nothing says otherwise)."""
    path = workload.trace_path()
    if path is None:
        duration = duration_s or workload.duration_s or DEFAULT_DURATION_S
        return generate(workload, seed, duration), duration
    rule = workload.requests.max_tokens if workload.requests else "exact"
    read = read_trace(path, workload.arrivals.speedup, rule)
    duration = duration_s or workload.duration_s or read.span_s + 1e-6
    return read.requests.until(duration), duration


def workload_mix(workload: Workload, requests: RequestSet,
                 probe_requests: int = PROBE_REQUESTS) -> Mix:
    """The request shapes and SLO a replica's capacity is measured on, with each sampled
    request's prefix group (the probe then hits the replica's prefix cache as a fleet would,
    capacity.py). Arrivals are Poisson whatever the workload's process: one replica's share
    of a fleet's stream is close to Poisson (splitting thins bursts), and the burstiness of
    the whole stream is judged where it matters, by simulating the fleet."""
    return sample_mix(requests.prompt_tokens, requests.output_tokens,
                      workload.slo.ttft_ms / 1000, workload.slo.tpot_ms / 1000,
                      groups=requests.prefix_group, prefix_tokens=requests.prefix_tokens,
                      probe_requests=probe_requests)


def pool_capacities(config: FleetConfig, mix: Mix, seed: int, target: float = TARGET,
                    runner: Runner | None = None) -> dict[str, Capacity]:
    """One replica's SLO capacity per pool (measured in ``runner``'s workers, if given)."""
    calls = []
    own = [pool for pool in config.pools if not pool.per_token]  # hosted APIs: no replicas
    for pool in own:
        source = pool.endpoints[0].split("#", 1)[0]
        calls.append((emulator_config(pool, source), mix, seed, target, source_speed(source)))
    caps = replica_capacities(calls, runner)
    return {pool.name: cap for pool, cap in zip(own, caps, strict=True)}


def bound_capacities(config: FleetConfig, mix: Mix, seed: int, target: float = TARGET,
                     runner: Runner | None = None, per_busy_s: bool = True,
                     ) -> dict[str, Capacity]:
    """What the lower bound gives one replica of each pool: the better of its capacity at
    evenly spaced arrivals and at the workload's own (more output tokens per busy second;
    with ``per_busy_s`` False, per second, for the provisioned bound).

    A router shapes each replica's arrivals: spreading them smooths them (a short answer
    then rarely shares its few steps with another prompt's prefill, and fewer prompts
    queue), so a bound measured only at the workload's arrivals was undercut by policies
    within the SLO (the cost router's $/Mtok was 0.73x it on a 70B with short answers);
    keeping a burst together batches it (more tokens per busy second, then idle), so evenly
    spaced alone was above some bursty workloads' (``capacity.py``; BENCHMARKS.md, issue
    22)."""
    mixes = [replace(mix, cv=0.0)] + ([mix] if mix.cv > 0 else [])
    found = [pool_capacities(config, m, seed, target, runner) for m in mixes]
    rate = (lambda c: c.tokens_per_busy_s) if per_busy_s else (lambda c: c.tokens_per_s)
    return {name: max((caps[name] for caps in found), key=rate) for name in found[0]}


def policy_run(config: FleetConfig, workload: Workload, requests: RequestSet, policy: str,
               seed: int, duration: float) -> tuple[Outcomes, dict[str, Any]]:
    """One policy over a fresh fleet: its outcomes and its ``policies.NAME`` summary (a
    runner's task: everything it needs comes in its arguments)."""
    fleet = build_fleet(config)
    sim = Simulation(fleet, requests, policy, seed, duration, workload.faults)
    out = sim.run()
    slo = workload.slo
    return out, summarize(out, sim.requests, fleet, duration, slo.ttft_ms / 1000,
                          slo.tpot_ms / 1000)


def policy_summary(config: FleetConfig, workload: Workload, requests: RequestSet, policy: str,
                   seed: int, duration: float) -> dict[str, Any]:
    """``policy_run``'s summary alone (what the planner needs; nothing large to send back)."""
    return policy_run(config, workload, requests, policy, seed, duration)[1]


def simulate(config: FleetConfig, workload: Workload, policies: list[str] | None = None,
             duration_s: float | None = None, seed: int = 1,
             runner: Runner | None = None, probe_requests: int = PROBE_REQUESTS) -> Report:
    """Every policy over the same requests, each a task of ``runner`` (a started one; by
    default one after the other in this process); the bound's capacities are probed with
    ``probe_requests`` requests a rate."""
    if runner is None:
        with Runner(1, quiet=True) as own:
            return simulate(config, workload, policies, duration_s, seed, own, probe_requests)
    names = policies or list(config.policies)
    unknown = [p for p in names if p not in config.policies]
    if unknown:
        raise ValueError(f"policies not in the fleet config: {', '.join(unknown)} "
                         f"(it has: {', '.join(config.policies)})")
    requests, duration = workload_requests(workload, seed, duration_s)
    mix = workload_mix(workload, requests, probe_requests)
    futures = [runner.submit(name, policy_run, config, workload, requests, name, seed,
                             duration) for name in names]
    capacities = bound_capacities(config, mix, seed, runner=runner)
    runs = []
    for name, future in zip(names, futures, strict=True):
        out, summary = future.result()
        runs.append(PolicyRun(name, build_fleet(config), out, summary))
    judged = requests.until(duration)
    tokens = int(judged.output_tokens.sum())
    best = max(float(run.summary["slo_attainment"]) for run in runs) if runs else 0.0
    bound = bound_json(config, capacities, tokens, duration, best,
                       lambda target: bound_capacities(config, mix, seed, target))
    if any(p.autoscale for p in config.pools):
        steady = bound_capacities(config, mix, seed, runner=runner, per_busy_s=False)
        bound.update(provisioned_json(config, steady, judged, duration))
    return Report(seed, duration, judged, runs, capacities, bound)


FALLBACK_TARGETS = (0.9, 0.5)


def bound_json(config: FleetConfig, capacities: dict[str, Capacity], tokens: int,
               duration_s: float, best_attainment: float = 0.0,
               remeasure: Callable[[float], dict[str, Capacity]] | None = None,
               ) -> dict[str, Any]:
    """The lower bound over ``capacities`` (measured at ``TARGET``). Where these pools cannot
    make the tokens at that attainment (no pool sustains any rate, or not enough) while a
    policy made them (``best_attainment`` > 0), the capacities are measured again
    (``remeasure``) at the best policy's attainment when it is below ``TARGET``, then at each
    of ``FALLBACK_TARGETS`` below that, and the first bound that exists is reported with the
    attainment it assumes (``slo_attainment``): a replica allowed to miss more sustains more,
    so the bound only gets lower (looser), never above a policy's ``usd``. Null only when no
    policy finished anything within the SLO or no target makes the tokens."""
    targets = [TARGET]
    if best_attainment > 0 and remeasure is not None:
        first = min(TARGET, best_attainment)
        targets += ([first] if first < TARGET else []) + [t for t in FALLBACK_TARGETS
                                                          if t < first]
    for target in targets:
        caps = capacities if target == TARGET or remeasure is None else remeasure(target)
        bound = lower_bound(_pool_rows(config, caps), tokens, duration_s)
        if bound is None:
            continue
        out: dict[str, Any] = {
            "usd": sig(bound.usd), "usd_per_mtok": sig(bound.usd_per_mtok),
            "output_tokens": tokens, "slo_attainment": sig(target),
            "busy_replica_hours": {k: sig(v / 3600) for k, v in bound.busy_replica_s.items()}}
        if target < TARGET:
            out["note"] = (f"these pools cannot make the tokens with {TARGET:.0%} of requests "
                           f"within the SLO on one replica's measured capacity; the bound is "
                           f"at {target:.2%}")
        return out
    return {"usd": None, "usd_per_mtok": None,
            "note": "these pools cannot make the tokens within the SLO"}


def _pool_rows(config: FleetConfig, capacities: dict[str, Capacity]) -> list[PoolCapacity]:
    return [PoolCapacity(p.name, p.autoscale.max_replicas if p.autoscale else len(p.endpoints),
                         p.price_per_replica_hour / 3600.0,
                         capacities[p.name].tokens_per_busy_s)
            for p in config.pools if p.name in capacities]


def provisioned_json(config: FleetConfig, capacities: dict[str, Capacity], judged: RequestSet,
                     duration_s: float) -> dict[str, Any]:
    """``lower_bound.provisioned_usd`` for a fleet that autoscales (``bound.provisioned_bound``:
    floors paid and used first, the rest per minute on the cheapest capacity up to each
    ceiling), a replica making its tokens/s at its SLO capacity for every second it exists."""
    rows = [PoolCapacity(p.name, p.autoscale.max_replicas if p.autoscale else len(p.endpoints),
                         p.price_per_replica_hour / 3600.0, capacities[p.name].tokens_per_s)
            for p in config.pools if p.name in capacities]
    floors = {p.name: p.autoscale.min_replicas if p.autoscale else len(p.endpoints)
              for p in config.pools if p.name in capacities}
    bins = max(1, math.ceil(duration_s / BIN_S))
    per_bin = np.bincount(np.minimum((judged.arrival_s // BIN_S).astype(int), bins - 1),
                          weights=judged.output_tokens, minlength=bins)
    found = provisioned_bound(rows, floors, per_bin.tolist())
    if found is None:
        return {"provisioned_usd": None}
    return {"provisioned_usd": sig(found.usd), "provisioned_floors_usd": sig(found.floors_usd),
            "provisioned_replica_hours": {k: sig(v / 3600) for k, v in found.replica_s.items()}}
