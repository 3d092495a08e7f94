"""Random fleets and workloads nobody tuned on: the cost router against least_loaded and
round_robin, cell by cell, where the scenario matrix (``bench/scenarios.py``) is fixed.

    PYTHONPATH=src python bench/scenario_fuzz.py [--cases 40] [--seed 7] [--jobs N]
        [--autoscale] [--json OUT] [--markdown OUT]

Each case draws, from ``--seed`` and its index only (so a case is reproducible alone):

- a fleet of 2-5 pools over the six catalog GPUs, vLLM or SGLang, 1-6 replicas each, at
  each GPU's catalog price times 0.6-1.5 (so any pool can be the cheapest per token);
- an 8B or, one case in four, a 70B FP8 (two-GPU replicas on the 80 GB cards);
- a workload: prompts lognormal (mean 200-4,000 tokens, at most 6,000) and answers
  exponential or lognormal (mean 30-800, at most 2,000: every request fits the models'
  8,192-token context), Poisson or bursty (CV 2-4) arrivals, and an SLO a user might write
  (TTFT 0.8-3 s, more for long prompts and a 70B; TPOT 30-100 ms, 1.5x for a 70B);
- a load, 20-90% of the fleet's SLO capacity as the simulator measures it.

Every case runs ``bench/scenarios.py``'s ``run_cell`` (the same capacity, rate and bound as
the matrix) for the three policies. A case *fails* when the cost router is under 99% within
the SLO where least_loaded reaches it, or pays more busy $/Mtok than least_loaded or
round_robin where either of those reaches 99% (the product's claim: never worse), or when a
policy within the SLO pays less than the lower bound (then it is no bound); the matrix's
finer targets are printed per case, not judged.

``--autoscale``: the same cases with every pool autoscaling (``bench/autoscale.py``'s
settings: one to twice its replicas, 60 s cold start and scale-down delay, target 0.7,
starting from its configured count) for 15 minutes, judged on the bill (provisioned $):
cost under 99% where least_loaded holds it, a bill above a policy's that holds 99%, or a
policy within the SLO under ``lower_bound.provisioned_usd``. Simulated, virtual time: the
same table on any machine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from autoscale import autoscaled  # bench/ is not a package: the path above finds them
from scenarios import run_cell

from fleetgate.catalog.gpus import GPUS

DRAWN = ("mi300x", "mi325x", "mi355x", "h100", "h200", "b200")  # the catalog's, in draw order
SMALL_MEMORY = ("h100",)  # a 70B FP8 needs two of these per replica
MODELS = {"8b": ("llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct"),
          "70b": ("llama-3.1-70b", "meta-llama/Llama-3.1-70B-Instruct-FP8")}
POLICIES = ["cost", "least_loaded", "round_robin"]
AUTOSCALE_S = 900.0
AUTOSCALE_TARGET = 0.7


def draw_case(seed: int, index: int) -> dict[str, Any]:
    """One case's fleet, workload and load, from (seed, index) alone."""
    rng = random.Random(seed * 100_003 + index)
    big = rng.random() < 0.25
    model, served = MODELS["70b" if big else "8b"]
    pools = []
    for gpu in rng.sample(DRAWN, rng.randint(2, 5)):
        engine = rng.choice(("vllm", "sglang"))
        count = rng.randint(1, 6)
        pool: dict[str, Any] = {
            "name": f"{gpu}-{engine}", "accelerator": gpu, "engine": engine,
            "price_per_gpu_hour": round(GPUS[gpu].default_price_per_gpu_hour
                                        * rng.uniform(0.6, 1.5), 2),
            "endpoints": [f"emulated://{engine}/{gpu}#{i + 1}" for i in range(count)],
            "models": {model: served}}
        if big and gpu in SMALL_MEMORY:
            pool["gpus_per_replica"] = 2
        pools.append(pool)
    prompt = round(rng.uniform(200, 4000))
    answer = round(rng.uniform(30, 800))
    # SLOs a user would write for such a workload: tight for an 8B, looser for a 70B.
    ttft_ms = round(rng.uniform(800, 3000) * (2 if big else 1) * (1 + prompt / 2000))
    tpot_ms = round(rng.uniform(30, 100) * (1.5 if big else 1))
    slo = {"ttft_ms": ttft_ms, "tpot_ms": tpot_ms}
    arrivals: dict[str, Any] = {"process": "poisson", "rate_per_s": 10}
    if rng.random() < 0.4:
        arrivals = {"process": "bursty", "rate_per_s": 10, "cv": round(rng.uniform(2, 4), 1)}
    longest = min(answer * 5, 2000)  # with the longest prompt, within the 8,192 context
    out_dist: dict[str, Any] = {"dist": "exponential", "mean": answer, "max": longest}
    if rng.random() < 0.5:
        out_dist = {"dist": "lognormal", "mean": answer, "cv": round(rng.uniform(0.3, 1.5), 2),
                    "max": longest}
    workload = {"duration_s": 240, "slo": slo, "arrivals": arrivals,
                "requests": {"model": model,
                             "input_tokens": {"dist": "lognormal", "mean": prompt,
                                              "cv": round(rng.uniform(0.3, 1.2), 2),
                                              "max": min(prompt * 4, 6000)},
                             "output_tokens": out_dist, "stream": True}}
    config = {"pools": pools,
              "policies": {"cost": {"strategy": "cost", "slo": slo},
                           "least_loaded": {"strategy": "least_loaded"},
                           "round_robin": {"strategy": "round_robin"}},
              "default_policy": "cost"}
    return {"index": index, "config": config, "workload": workload,
            "load": round(rng.uniform(0.2, 0.9), 2)}


def run_case(case: dict[str, Any], seed: int, autoscale: bool = False) -> dict[str, Any]:
    """One case's row (``fixed_row`` or ``autoscaled_row``) and the claims it fails."""
    try:
        row = autoscaled_row(case, seed) if autoscale else fixed_row(case, seed)
    except Exception as exc:  # a case the simulator refuses is a finding, not a crash
        return {"index": case["index"], "error": f"{type(exc).__name__}: {exc}"}
    row["index"] = case["index"]
    row["failures"] = failures(row, bill=autoscale)
    return row


def fixed_row(case: dict[str, Any], seed: int) -> dict[str, Any]:
    """The case's fixed fleet: ``bench/scenarios.py``'s cell."""
    with tempfile.TemporaryDirectory(prefix="fleetgate-fuzz-") as tmp:
        name = f"case{case['index']}"
        (Path(tmp) / f"{name}-fleet.yaml").write_text(yaml.safe_dump(case["config"]))
        (Path(tmp) / f"{name}-work.yaml").write_text(yaml.safe_dump(case["workload"]))
        return run_cell(f"{name}-fleet", f"{name}-work", case["load"], POLICIES, seed, tmp)


def autoscaled_row(case: dict[str, Any], seed: int) -> dict[str, Any]:
    """The case's fleet autoscaling, at the rate its fixed fleet's capacity gives the load."""
    from fleetgate.config.schema import FleetConfig
    from fleetgate.sim.run import pool_capacities, simulate, workload_mix, workload_requests
    from fleetgate.sim.workload import Workload

    fixed = FleetConfig.model_validate(case["config"])
    workload = Workload.model_validate(case["workload"])
    requests, _ = workload_requests(workload, seed, None)
    caps = pool_capacities(fixed, workload_mix(workload, requests), seed)
    rate = round(case["load"] * sum(caps[p.name].rate_per_s * len(p.endpoints)
                                    for p in fixed.pools), 3)
    arrivals = workload.arrivals.model_copy(update={"rate_per_s": rate})
    workload = workload.model_copy(update={"arrivals": arrivals, "duration_s": AUTOSCALE_S})
    scaled = FleetConfig.model_validate(autoscaled(case["config"], AUTOSCALE_TARGET))
    report = simulate(scaled, workload, POLICIES, AUTOSCALE_S, seed).as_json()
    return {"load": case["load"], "rate_per_s": rate, "requests": report["requests"],
            "bound_provisioned_usd": report["lower_bound"].get("provisioned_usd"),
            "policies": {name: {"slo": p["slo_attainment"],
                                "provisioned_usd": p["provisioned_usd"], "shed": p["shed"]}
                         for name, p in report["policies"].items()}}


def failures(row: dict[str, Any], bill: bool = False) -> list[str]:
    """The claims a cost router must hold on any fleet: never under 99% where least_loaded
    holds it, never dearer than a policy that holds 99%; and the lower bound's: no policy
    within the SLO under it. Judged on busy $/Mtok, or with ``bill`` on the bill."""
    money, what = ("provisioned_usd", "bill") if bill else ("usd_per_mtok", "$/Mtok")
    pol = row["policies"]
    cost = pol["cost"]
    out = []
    if pol["least_loaded"]["slo"] >= 0.99 and cost["slo"] < 0.99:
        out.append(f"SLO {cost['slo']:.2%} where least_loaded {pol['least_loaded']['slo']:.2%}")
    for other in ("least_loaded", "round_robin"):
        o = pol[other]
        if o["slo"] >= 0.99 and cost[money] and o[money] and cost[money] > o[money] * 1.001:
            out.append(f"{what} {cost[money] / o[money]:.2f}x {other}'s")
    bound = row["bound_provisioned_usd" if bill else "bound_usd_per_mtok"]
    for name, o in pol.items():
        if bound and o["slo"] >= 0.99 and o[money] and o[money] < bound:
            out.append(f"{name}'s {what} {o[money] / bound:.2f}x the lower bound at "
                       f"{o['slo']:.2%}")
    return out


def describe(case: dict[str, Any]) -> str:
    pools = ", ".join(f"{len(p['endpoints'])}x{p['accelerator']}/{p['engine']}"
                      f"@{p['price_per_gpu_hour']}" for p in case["config"]["pools"])
    w = case["workload"]
    req = w["requests"]
    arr = w["arrivals"]
    kind = "poisson" if arr["process"] == "poisson" else f"bursty cv{arr['cv']}"
    return (f"{req['model'].split('-')[-1]} [{pools}] in {req['input_tokens']['mean']} "
            f"out {req['output_tokens']['mean']} {kind} slo {w['slo']['ttft_ms']}/"
            f"{w['slo']['tpot_ms']} ms")


def markdown(cases: list[dict[str, Any]], rows: list[dict[str, Any]], bill: bool = False) -> str:
    """One row a case: each policy's SLO met and busy $/Mtok (with ``bill``, its bill), cost's
    ratios to the others and to the lower bound, and the claims it fails."""
    money, bound = (("provisioned_usd", "bound_provisioned_usd") if bill
                    else ("usd_per_mtok", "bound_usd_per_mtok"))
    head = ["#", "case", "load", "cost", "least_loaded", "round_robin", "cost/LL", "cost/RR",
            "cost/bound", "fails"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]

    def ratio(a: float | None, b: float | None) -> str:
        return f"{a / b:.2f}" if a and b else "—"

    for case, row in zip(cases, rows, strict=True):
        first = f"| {case['index']} | {describe(case)} | {case['load']:.0%} |"
        if "error" in row:
            lines.append(f"{first} error: {row['error']} |" + "|" * (len(head) - 4))
            continue
        p = row["policies"]
        cost = p["cost"][money]
        cells = [f"{p[n]['slo']:.2%}, {p[n][money] or 0:.3f}" for n in POLICIES]
        cells += [ratio(cost, p["least_loaded"][money]), ratio(cost, p["round_robin"][money]),
                  ratio(cost, row[bound]), "; ".join(row["failures"]) or "none"]
        lines.append(f"{first} " + " | ".join(cells) + " |")
    bad = sum(1 for r in rows if "error" in r or r["failures"])
    lines.append(f"\n{len(rows) - bad} of {len(rows)} cases hold every claim.")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=40)
    parser.add_argument("--first", type=int, default=0, help="index of the first case")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--autoscale", action="store_true",
                        help="every pool autoscales; judged on the bill")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    from fleetgate.sim.parallel import Runner

    cases = [draw_case(args.seed, i) for i in range(args.first, args.first + args.cases)]
    with Runner(args.jobs, "fuzz cases") as runner:
        rows = runner.map(lambda a: f"case {a[0]['index']}", run_case,
                          [(case, args.seed, args.autoscale) for case in cases])
    text = markdown(cases, rows, bill=args.autoscale)
    print(text)
    if args.json:
        args.json.write_text(json.dumps({"seed": args.seed, "cases": cases, "rows": rows},
                                        indent=1) + "\n")
    if args.markdown:
        args.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
