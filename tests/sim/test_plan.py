"""The lower bound (LP) and the planner (integer program) on cases with known optima, and
``plan`` end to end on a small workload: its fleet file is one ``simulate`` accepts."""

from __future__ import annotations

import itertools
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from sim_fixtures import requests, workload

from fleetgate.config.schema import FleetConfig
from fleetgate.sim.bound import PoolCapacity, lower_bound
from fleetgate.sim.candidates import Candidate, PriceSheet
from fleetgate.sim.capacity import Capacity
from fleetgate.sim.parallel import Runner
from fleetgate.sim.plan import (
    Fleet,
    Results,
    Rung,
    break_even,
    choose,
    design_rate,
    plan,
    rungs,
    search,
    solve,
)
from fleetgate.sim.run import dumps, simulate


def row(gpu: str, price: float, rate: float, tp: int = 1) -> Candidate:
    return Candidate(gpu, "vllm", "stock", tp, price, Capacity(rate, rate * 100, rate, 0.99))


def test_lower_bound_fills_the_cheapest_per_token_capacity_first() -> None:
    pools = [PoolCapacity("dear", 4, 4.0 / 3600, 4000.0),  # $1/h per 1000 tok/s
             PoolCapacity("cheap", 2, 1.0 / 3600, 2000.0)]  # $0.5/h per 1000 tok/s
    duration = 3600.0
    tokens = 2 * 2000 * duration + 1000 * duration  # both cheap replicas full, then some dear
    bound = lower_bound(pools, tokens, duration)
    assert bound is not None
    assert bound.busy_replica_s == pytest.approx({"cheap": 2 * duration, "dear": duration / 4})
    assert bound.usd == pytest.approx(2 * 1.0 + 0.25 * 4.0)
    assert bound.usd_per_mtok == pytest.approx(bound.usd / tokens * 1e6)
    assert lower_bound(pools, 1e12, duration) is None  # more than the fleet can make


@pytest.mark.parametrize(("demand", "expected"), [
    (30.0, {"a": 3}),  # 3 x $2 beats a + b ($6.5)
    (35.0, {"a": 1, "b": 1}),  # mixing: $6.5 beats 4 x a ($8) and 2 x b ($9)
    (50.0, {"b": 2}),
    (5.0, {"a": 1}),
])
def test_integer_program_finds_the_known_optimum(demand: float, expected: dict[str, int]) -> None:
    rows = [row("a", 2.0, 10.0), row("b", 4.5, 25.0)]
    fleet = solve(rows, demand)
    assert fleet is not None
    assert {r.gpu: n for r, n in fleet.counts} == expected
    brute = min(na * 2.0 + nb * 4.5 for na, nb in itertools.product(range(10), range(5))
                if na * 10 + nb * 25 >= demand)
    assert fleet.usd_per_hour == pytest.approx(brute)


def test_break_even_matches_brute_force() -> None:
    rows = [row("a", 2.0, 10.0), row("b", 4.5, 25.0)]

    def uses_b(price_b: float) -> bool:
        priced = [rows[0], row("b", price_b, 25.0)]
        fleet = solve(priced, 30.0)
        return fleet is not None and "b" in fleet.gpus()

    enters, direction = break_even("b", rows, 30.0)  # b is not in the solution at $4.5
    assert direction == "enters_below" and not uses_b(4.5)
    assert enters is not None and uses_b(enters - 0.01) and not uses_b(enters + 0.01)
    assert enters == pytest.approx(4.0, abs=1e-6)  # a + b ($2 + p) vs 3a ($6): p < 4
    leaves, direction = break_even("a", rows, 30.0)
    assert direction == "leaves_above"
    assert leaves == pytest.approx(4.5, abs=1e-5)  # a + b ($p + 4.5) vs 2b ($9)


@pytest.mark.parametrize("price_b", [6.0, 4.0])
@pytest.mark.parametrize("tp", [1, 2])
def test_break_even_is_the_price_ratio_times_the_capacity_ratio(price_b: float, tp: int) -> None:
    """At a demand both rows fill exactly (50 req/s: 5 x a or 2 x b), type b is in the
    solution while its $ per request/s is below a's: its break-even $/GPU-hour is a's price
    x b's capacity / a's (over its GPUs per replica), whichever side of it b's price is and
    however many rows (engines) b has."""
    a = row("mi300x", 2.0, 10.0)
    b_rows = [row("h100", price_b, 25.0, tp=tp),
              Candidate("h100", "sglang", "stock", tp, price_b, Capacity(25.0, 2500.0, 25, 0.99))]
    expected = 2.0 * (25.0 / 10.0) / tp  # 5.0 at TP 1, 2.5 at TP 2
    price, direction = break_even("h100", [a, *b_rows], 50.0)
    assert price == pytest.approx(expected, rel=1e-6)
    assert direction == ("leaves_above" if price_b < expected else "enters_below")
    mi300x, other = break_even("mi300x", [a, *b_rows], 50.0)
    assert mi300x == pytest.approx(price_b * tp * 10.0 / 25.0, rel=1e-6)
    assert other == ("enters_below" if price_b < expected else "leaves_above")


def test_design_rate_per_process() -> None:
    reqs = requests([0.0], 10, 10)
    assert design_rate(workload(rate=7), reqs, 60) == 7
    diurnal = workload(arrivals={"process": "diurnal", "rate_per_s": 10, "amplitude": 0.5})
    assert design_rate(diurnal, reqs, 60) == 15


def test_plan_end_to_end_meets_the_slo_and_writes_a_fleet_simulate_accepts() -> None:
    w = workload(rate=12, duration=60)
    sheet = PriceSheet(prices={"h100": 2.0, "mi300x": 1.5}, engines=["vllm"])
    result = plan(w, sheet, ["h100", "mi300x"], seed=1)
    assert result["meets_target"]
    assert max(result["simulated"]["slo_attainment"],
               result["simulated_least_loaded"]["slo_attainment"]) >= 0.99
    assert result["usd_per_hour"] <= result["baselines"]["best_single_type"]["usd_per_hour"]
    assert result["baselines"]["nvidia_only"]["fleet"][0]["accelerator"] == "h100"
    assert set(result["break_even"]) == {"h100", "mi300x"}
    config = FleetConfig.model_validate(yaml.safe_load(yaml.safe_dump(result["fleet_config"])))
    replicas = sum(len(p.endpoints) for p in config.pools)
    assert replicas == sum(r["replicas"] for r in result["fleet"])
    again = simulate(config, w, ["cost"], None, seed=1).as_json()["policies"]["cost"]
    assert again["slo_attainment"] == result["simulated"]["slo_attainment"]


ROWS = [row("mi300x", 2.0, 10.0), row("h100", 4.5, 25.0)]


def fake_sim(capacity: float, policy: str, need: dict[str, float]) -> dict[str, Any]:
    """A policy meets the target once the fleet's capacity reaches ``need[policy]``."""
    return {"slo_attainment": 0.995 if capacity >= need[policy] - 1e-9 else 0.97}


@dataclass(frozen=True)
class FakeConfirmation:
    need: dict[str, float]

    def submit(self, runner: Runner, fleet: Fleet, policy: str) -> Future[dict[str, Any]]:
        return runner.submit(f"{policy} on {fleet.label}", fake_sim, fleet.rate_per_s, policy,
                             self.need)


def run_search(need: dict[str, float], jobs: int = 1) -> tuple[list[Rung], Results]:
    ladder = rungs(ROWS, ["mi300x", "h100"], 30.0)
    with Runner(jobs, quiet=True) as runner:
        _states, results = search(ladder, FakeConfirmation(need), runner, 0.99)  # type: ignore[arg-type]
    return ladder, results


def test_fleets_are_tried_cheapest_first_each_once() -> None:
    """The program's fleets at 30 req/s x each headroom, over both rows, each type alone and
    NVIDIA alone, each once at the least headroom that gives it, cheapest first."""
    ladder = rungs(ROWS, ["mi300x", "h100"], 30.0)
    assert [(r.fleet.label, r.headroom) for r in ladder][:8] == [
        ("3 x mi300x-vllm", 1.0),  # 30 req/s
        ("1 x h100-vllm + 1 x mi300x-vllm", 1.1),  # 35 >= 33
        ("4 x mi300x-vllm", 1.1),  # mi300x alone at 33
        ("1 x h100-vllm + 2 x mi300x-vllm", 1.5),  # 45
        ("2 x h100-vllm", 1.0),  # h100 alone (and NVIDIA alone) at 30
        ("5 x mi300x-vllm", 1.5),
        ("1 x h100-vllm + 3 x mi300x-vllm", 1.75),  # 55 >= 52.5
        ("2 x h100-vllm + 1 x mi300x-vllm", 2.0)]
    costs = [r.fleet.usd_per_hour for r in ladder]
    assert costs == sorted(costs) and len({r.fleet.counts for r in ladder}) == len(ladder)


def test_the_plan_is_the_cheapest_fleet_the_cost_policy_confirms() -> None:
    ladder, results = run_search({"cost": 35.0, "least_loaded": 35.0})
    # every fleet up to the plan, then what the baselines need: one type (4 x mi300x) and
    # NVIDIA only (2 x h100); not the mixed fleet between them, nor anything dearer
    assert sorted(results) == [0, 1, 2, 4]
    choice = choose(ladder, results, 0.99, 6.0)
    assert ladder[choice.plan].fleet.label == "1 x h100-vllm + 1 x mi300x-vllm"
    assert choice.policy == "cost" and choice.misses == []
    assert choice.baselines == {"best_single_type": 2, "nvidia_only": 4,
                                "least_loaded_confirmed": 1}


def test_the_plan_never_costs_more_than_what_least_loaded_confirms() -> None:
    ladder, results = run_search({"cost": 40.0, "least_loaded": 33.0})
    choice = choose(ladder, results, 0.99, 6.0)
    assert ladder[choice.plan].fleet.usd_per_hour == 6.5  # cost confirms only 4 x mi300x ($8)
    assert choice.policy == "least_loaded"
    assert any("cost router reaches 97.00%" in m for m in choice.misses)
    assert choice.baselines["least_loaded_confirmed"] == choice.plan


def test_nothing_confirmed_is_said_and_the_plan_is_the_closest() -> None:
    ladder, results = run_search({"cost": 1e9, "least_loaded": 1e9})
    assert sorted(results) == list(range(len(ladder)))  # every fleet was tried
    choice = choose(ladder, results, 0.99, 6.0)
    assert any("no fleet tried" in m for m in choice.misses)
    assert choice.baselines == {"best_single_type": None, "nvidia_only": None,
                                "least_loaded_confirmed": None}


@pytest.mark.parametrize("need", [{"cost": 35.0, "least_loaded": 35.0},
                                  {"cost": 40.0, "least_loaded": 33.0},
                                  {"cost": 1e9, "least_loaded": 31.0}])
def test_the_search_finds_the_same_in_parallel(need: dict[str, float]) -> None:
    """Started ahead in two processes, fleets that turn out not to matter are dropped."""
    assert run_search(need, jobs=2)[1] == run_search(need, jobs=1)[1]


def test_plan_json_is_the_same_bytes_whatever_jobs() -> None:
    w = workload(rate=12, duration=40)
    sheet = PriceSheet(prices={"h100": 2.0, "mi300x": 1.5}, engines=["vllm"])
    out = []
    for jobs in (1, 2):
        with Runner(jobs, quiet=True) as runner:
            out.append(dumps(plan(w, sheet, ["h100", "mi300x"], seed=2, runner=runner)))
    assert out[0] == out[1]
