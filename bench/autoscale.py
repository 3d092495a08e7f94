"""The bill under the fleet scaler (issue 23): the scenario matrix's fleets with every pool
autoscaling, 30 minutes, at 60% of the fixed fleet's SLO capacity (Poisson and bursty chat)
and under a diurnal day (period 1 h, amplitude 0.6), each cell simulated for the cost,
least_loaded and round_robin policies under the same scaler.

    PYTHONPATH=src python bench/autoscale.py [--jobs N] [--json OUT] [--target-utilization U]

Each pool of a fleet keeps its configured replicas at t=0 and scales between one and twice
that many (``cold_start_s`` 60, ``scale_down_delay_s`` 60). The rate is set as
``bench/scenarios.py`` sets it: ``load x`` the sum over the fixed fleet's replicas of what
one sustains with 99% of the workload's requests within the SLO. Per cell: SLO met and
provisioned $ (the bill) per policy, the bill's lower bound with floors
(``lower_bound.provisioned_usd``), and the issue's checks: cost + scaler >= 99% within the
SLO, provisioned $ <= 0.85x least_loaded's and <= 0.80x round_robin's (a policy under 99% is
reported, not compared), <= 1.15x the bound. Misses are listed with their numbers. Virtual
time: one seed gives the same table on any machine.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "examples" / "scenarios"
FLEETS = ("amd-cheap", "nvidia-cheap", "big-mixed")
CELLS = [(f, w, 0.6) for f in FLEETS for w in ("chat", "chat-bursty")] + \
    [(f, "diurnal-1h", 0.6) for f in FLEETS]
POLICIES = ["cost", "least_loaded", "round_robin"]
DURATION_S = 1800.0


def autoscaled(config: dict[str, Any], target: float) -> dict[str, Any]:
    out = copy.deepcopy(config)
    for pool in out["pools"]:
        n = len(pool["endpoints"])
        pool["autoscale"] = {"min_replicas": 1, "max_replicas": 2 * n, "cold_start_s": 60,
                             "target_utilization": target, "scale_down_delay_s": 60}
    return out


def workload_of(name: str) -> dict[str, Any]:
    if name == "diurnal-1h":  # the matrix's diurnal mix, over an hour-long day
        work = yaml.safe_load((SCENARIOS / "diurnal.yaml").read_text())
        work["arrivals"].update(period_s=3600, amplitude=0.6)
        return dict(work)
    return dict(yaml.safe_load((SCENARIOS / f"{name}.yaml").read_text()))


def run_cell(fleet: str, work: str, load: float, target: float, seed: int) -> dict[str, Any]:
    from fleetgate.config.schema import FleetConfig
    from fleetgate.sim.run import pool_capacities, simulate, workload_mix, workload_requests
    from fleetgate.sim.workload import Workload

    fixed = yaml.safe_load((SCENARIOS / f"{fleet}.yaml").read_text())
    config = FleetConfig.model_validate(fixed)
    workload = Workload.model_validate(workload_of(work))
    requests, _ = workload_requests(workload, seed, None)
    caps = pool_capacities(config, workload_mix(workload, requests), seed)
    rate = round(load * sum(caps[p.name].rate_per_s * len(p.endpoints)
                            for p in config.pools), 3)
    arrivals = workload.arrivals.model_copy(update={"rate_per_s": rate})
    workload = workload.model_copy(update={"arrivals": arrivals, "duration_s": DURATION_S})
    scaled = FleetConfig.model_validate(autoscaled(fixed, target))
    report = simulate(scaled, workload, POLICIES, DURATION_S, seed).as_json()
    return {"fleet": fleet, "workload": work, "load": load, "rate_per_s": rate,
            "policies": {name: {k: p.get(k) for k in ("slo_attainment", "provisioned_usd",
                                                      "usd", "gpu_hours")}
                         for name, p in report["policies"].items()},
            "lower_bound": report["lower_bound"]}


def checks(cell: dict[str, Any]) -> list[str]:
    p, bound = cell["policies"], cell["lower_bound"].get("provisioned_usd")
    cost = p["cost"]
    misses = []
    if cost["slo_attainment"] < 0.99:
        misses.append(f"cost {cost['slo_attainment']:.2%} within the SLO (< 99%)")
    for other, limit in (("least_loaded", 0.85), ("round_robin", 0.80)):
        if p[other]["slo_attainment"] < 0.99:
            continue  # reported, not compared
        ratio = cost["provisioned_usd"] / p[other]["provisioned_usd"]
        if ratio > limit:
            misses.append(f"provisioned $ {ratio:.2f}x {other}'s (target {limit})")
    if bound:
        ratio = cost["provisioned_usd"] / bound
        if ratio > 1.15:
            misses.append(f"provisioned $ {ratio:.2f}x the bound (target 1.15)")
    return misses


def table(cells: list[dict[str, Any]]) -> str:
    head = ("| fleet | workload | rate/s | cost: SLO, prov. $ | least_loaded | round_robin | "
            "bound $ | cost / ll | cost / rr | cost / bound |")
    lines = [head, "|" + "---|" * 10]
    for c in cells:
        p, bound = c["policies"], c["lower_bound"].get("provisioned_usd")
        shown = {name: f"{row['slo_attainment']:.2%}, ${row['provisioned_usd']:.2f}"
                 for name, row in p.items()}
        cost = p["cost"]["provisioned_usd"]
        lines.append(
            f"| {c['fleet']} | {c['workload']} | {c['rate_per_s']} | {shown['cost']} | "
            f"{shown['least_loaded']} | {shown['round_robin']} | "
            f"{'—' if not bound else f'${bound:.2f}'} | "
            f"{cost / p['least_loaded']['provisioned_usd']:.2f} | "
            f"{cost / p['round_robin']['provisioned_usd']:.2f} | "
            f"{'—' if not bound else f'{cost / bound:.2f}'} |")
    return "\n".join(lines)


def main() -> int:
    from fleetgate.sim.parallel import Runner, default_jobs

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=default_jobs())
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--target-utilization", type=float, default=0.8)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    with Runner(args.jobs, title="autoscaled cells") as runner:
        futures = [runner.submit(f"{f} {w}", run_cell, f, w, load, args.target_utilization,
                                 args.seed) for f, w, load in CELLS]
        cells = [f.result() for f in futures]
    print(table(cells))
    for c in cells:
        for miss in checks(c):
            print(f"MISS {c['fleet']} {c['workload']}: {miss}")
    if args.json:
        args.json.write_text(json.dumps({"seed": args.seed, "cells": cells}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
