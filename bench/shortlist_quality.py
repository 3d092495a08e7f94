"""What the shortlist costs in routing quality (issue 26 item 2, BENCHMARKS.md).

A decision over a model's thousands of endpoints looks at a shortlist of a few hundred
(``routing/shortlist.py``). The decision-time bench shows what that saves; this shows what
it costs: the scenario matrix's 42-replica fleet (``examples/scenarios/big-mixed.yaml``)
scaled ``--scale`` times (10: 420 replicas), simulated at ``--load`` of the 60% cell's rate
per replica (228.5 requests/s for 42 replicas) on ``examples/scenarios/chat.yaml``, once
with every endpoint looked at and once with the shortlist forced on at ``--size`` (48 of
420 is 11%, a harder cut than 384 of 10,000's pools' windows, which also see small pools
whole). Each policy's SLO attainment, busy $/Mtok and traffic shares per pool, side by
side. The two runs go in two processes (the shortlist's constants are module globals, set
in the child). Virtual time: one seed gives the same table on any machine.

Run: PYTHONPATH=src .venv/bin/python bench/shortlist_quality.py [--scale 10]
     [--duration 300] [--size 48] [--policies cost,least_loaded,round_robin,power_of_two]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "examples" / "scenarios"
RATE_42 = 228.525  # the matrix's 60% cell for big-mixed chat (bench/results/autoscale.json)


def scaled_fleet(scale: int, directory: Path) -> Path:
    raw = yaml.safe_load((SCENARIOS / "big-mixed.yaml").read_text())
    raw["policies"]["power_of_two"] = {"strategy": "power_of_two"}
    for pool in raw["pools"]:
        base = pool["endpoints"][0].split("#")[0]
        pool["endpoints"] = [f"{base}#{k}" for k in range(1, len(pool["endpoints"]) * scale + 1)]
    path = directory / f"big-mixed-x{scale}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def run(mode: str, fleet: str, scale: int, load: float, duration: float, size: int,
        policies: list[str]) -> dict[str, Any]:
    import fleetgate.routing.pipeline as pipeline
    import fleetgate.routing.shortlist as shortlist
    import fleetgate.state.live as live
    from fleetgate.config.loader import load_config
    from fleetgate.sim.run import simulate
    from fleetgate.sim.workload import load_workload

    if mode == "every endpoint":
        pipeline.SHORTLIST_FROM = live.SHORTLIST_FROM = 10**9
    else:
        pipeline.SHORTLIST_FROM = live.SHORTLIST_FROM = 1
        shortlist.SHORTLIST_SIZE = size
    work = load_workload(SCENARIOS / "chat.yaml")
    arrivals = work.arrivals.model_copy(update={"rate_per_s": RATE_42 * scale * load})
    work = work.model_copy(update={"duration_s": duration, "arrivals": arrivals})
    t0 = time.perf_counter()
    report = simulate(load_config(Path(fleet)), work, policies, None, 1).as_json()
    return {"mode": mode, "wall_s": round(time.perf_counter() - t0, 1),
            "requests": report["requests"],
            "policies": {name: {"slo": p["slo_attainment"], "usd_per_mtok": p["usd_per_mtok"],
                                "pools": {k: v["share"] for k, v in p["pools"].items()}}
                         for name, p in report["policies"].items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--scale", type=int, default=10)
    parser.add_argument("--load", type=float, default=1.0, help="x the 60%% cell's rate")
    parser.add_argument("--duration", type=float, default=300.0)
    parser.add_argument("--size", type=int, default=48)
    parser.add_argument("--policies", default="cost,least_loaded,round_robin,power_of_two")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    policies = args.policies.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        fleet = str(scaled_fleet(args.scale, Path(tmp)))
        jobs = [(mode, fleet, args.scale, args.load, args.duration, args.size, policies)
                for mode in ("every endpoint", "shortlist")]
        with multiprocessing.get_context("spawn").Pool(2) as pool:
            full, short = pool.starmap(run, jobs)
    replicas = 42 * args.scale
    print(f"big-mixed x{args.scale} ({replicas} replicas), chat at "
          f"{RATE_42 * args.scale * args.load:.0f} requests/s, {args.duration:.0f} s, "
          f"{full['requests']:,} requests; shortlist of {args.size} windows "
          f"(+ the recent winners for scoring pickers)\n")
    print("| policy | SLO met, every endpoint | SLO met, shortlist | $/Mtok, every endpoint "
          "| $/Mtok, shortlist | largest share difference (pool) |")
    print("|---|--:|--:|--:|--:|---|")
    for name in policies:
        a, b = full["policies"][name], short["policies"][name]
        diff, pool = max((abs(b["pools"].get(p, 0) - s), p) for p, s in a["pools"].items())
        print(f"| {name} | {a['slo']:.2%} | {b['slo']:.2%} | {a['usd_per_mtok']:.4f} "
              f"| {b['usd_per_mtok']:.4f} | {diff:.3f} ({pool}) |")
    print(f"\nwall: {full['wall_s']} s every endpoint, {short['wall_s']} s shortlist")
    if args.json:
        args.json.write_text(json.dumps({"every endpoint": full, "shortlist": short}, indent=1))


if __name__ == "__main__":
    main()
