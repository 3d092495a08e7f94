"""The lower bound: the LP on cases with a hand-computed optimum, its fallback when no pool
sustains the SLO at 99%, and prefix hits counted in a replica's capacity (virtual time only:
no wall-clock assert)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from sim_fixtures import SLO, fleet, pool

from fleetgate.config.loader import load_config
from fleetgate.emulator.config import EmulatorConfig
from fleetgate.sim.bound import PoolCapacity, lower_bound
from fleetgate.sim.capacity import TARGET, Capacity, Mix, busy_share, replica_capacity
from fleetgate.sim.run import (
    bound_json,
    dumps,
    pool_capacities,
    simulate,
    workload_mix,
    workload_requests,
)
from fleetgate.sim.workload import Workload, load_workload

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
HOUR = 3600.0

# $ per 1000 tok/s-hour: cheap 1.0, dear 1.5, slow 2.5 (cheapest per replica, dearest per token)
CHEAP = PoolCapacity("cheap", 2, 1.0 / HOUR, 1000.0)
DEAR = PoolCapacity("dear", 3, 3.0 / HOUR, 2000.0)
SLOW = PoolCapacity("slow", 4, 0.5 / HOUR, 200.0)
POOLS = [DEAR, SLOW, CHEAP]


def test_lp_puts_every_token_on_the_cheapest_per_token_pool_when_it_can_carry_them() -> None:
    tokens = 1.5e6  # < the cheap pool's 2 x 1000 x 3600 = 7.2M
    bound = lower_bound(POOLS, tokens, HOUR)
    assert bound is not None
    assert bound.busy_replica_s == pytest.approx({"cheap": 1500.0, "dear": 0.0, "slow": 0.0},
                                                 abs=1e-6)
    assert bound.usd == pytest.approx(1500.0 / HOUR)  # 1500 replica-s at $1/h
    assert bound.usd_per_mtok == pytest.approx(bound.usd / tokens * 1e6)


def test_lp_fills_the_cheapest_per_token_pool_then_the_next() -> None:
    tokens = 7.2e6 + 3.6e6  # the cheap pool full for the hour, then 3.6M on the next
    bound = lower_bound(POOLS, tokens, HOUR)
    assert bound is not None
    # dear (1.5 per 1000 tok/s-h) before slow (2.5), though slow costs less per replica-hour
    assert bound.busy_replica_s == pytest.approx({"cheap": 2 * HOUR, "dear": 1800.0,
                                                  "slow": 0.0}, abs=1e-6)
    assert bound.usd == pytest.approx(2 * 1.0 + 0.5 * 3.0)
    # beyond cheap + dear (7.2M + 21.6M): slow makes the rest
    tokens = 7.2e6 + 21.6e6 + 0.72e6
    bound = lower_bound(POOLS, tokens, HOUR)
    assert bound is not None
    assert bound.busy_replica_s["slow"] == pytest.approx(3600.0)
    assert bound.usd == pytest.approx(2 * 1.0 + 3 * 3.0 + 1 * 0.5)
    assert lower_bound(POOLS, 7.2e6 + 21.6e6 + 2.88e6 + 1.0, HOUR) is None  # past them all


def test_lp_skips_pools_without_capacity() -> None:
    bound = lower_bound([CHEAP, PoolCapacity("none", 8, 0.1 / HOUR, 0.0)], 3.6e6, HOUR)
    assert bound is not None and set(bound.busy_replica_s) == {"cheap"}
    assert bound.usd == pytest.approx(1.0)
    assert lower_bound([PoolCapacity("none", 8, 0.1 / HOUR, 0.0)], 1.0, HOUR) is None


TWO = fleet(pool("cheap", "emulated://vllm/h100", 2, price=1.0),
            pool("dear", "emulated://vllm/h200", 3, price=3.0))


def caps(cheap: float, dear: float, busy: float = 1.0) -> dict[str, Capacity]:
    return {"cheap": Capacity(cheap / 100, cheap, 1.0, TARGET, busy),
            "dear": Capacity(dear / 100, dear, 1.0, TARGET, busy)}


def test_bound_json_counts_tokens_per_busy_second() -> None:
    # a replica busy half the time at its SLO rate makes 2000 tokens per busy second
    out = bound_json(TWO, caps(1000.0, 2000.0, busy=0.5), int(3.6e6), HOUR)
    assert out["usd"] == pytest.approx(1800.0 / HOUR)  # 1800 busy s of one $1/h replica
    assert out["slo_attainment"] == TARGET and "note" not in out


def test_no_capacity_at_99_but_a_policy_met_the_slo_measures_again_lower() -> None:
    asked: list[float] = []

    def remeasure(target: float) -> dict[str, Capacity]:
        asked.append(target)
        return caps(1000.0, 2000.0) if target <= 0.9 else caps(0.0, 0.0)

    out = bound_json(TWO, caps(0.0, 0.0), int(3.6e6), HOUR, best_attainment=0.995,
                     remeasure=remeasure)
    assert asked == [0.9]  # the best policy reached 99%: the next target is 90%
    assert out["usd"] == pytest.approx(1.0) and out["slo_attainment"] == 0.9
    assert "90.00%" in out["note"]

    asked.clear()
    out = bound_json(TWO, caps(0.0, 0.0), int(3.6e6), HOUR, best_attainment=0.97,
                     remeasure=remeasure)
    assert asked == [0.97, 0.9]  # the best policy's attainment first, then lower
    assert out["slo_attainment"] == 0.9

    # no policy finished anything within the SLO: nothing to bound
    out = bound_json(TWO, caps(0.0, 0.0), int(3.6e6), HOUR, best_attainment=0.0,
                     remeasure=remeasure)
    assert out["usd"] is None and out["note"]


def test_busy_share_is_the_union_of_the_requests_in_the_replica() -> None:
    starts = np.array([0.0, 0.5, 3.0, 4.5])
    ends = np.array([1.0, 2.0, 4.0, np.nan])  # the last never finished: held to the end
    assert busy_share(starts, ends, 0.0, 5.0) == pytest.approx((2.0 + 1.0 + 0.5) / 5.0)
    assert busy_share(starts, ends, 1.5, 3.5) == pytest.approx(1.0 / 2.0)


def test_mix_blocks_share_a_groups_prefix_and_fold_groups_onto_the_replica() -> None:
    mix = Mix((2100, 2100, 2100, 300), (20, 20, 20, 20), 1.5, 0.08,
              prefix_groups=(0, 0, 1, -1), prefix_tokens=2000)
    a, b, c = mix.blocks(0, 0), mix.blocks(1, 1), mix.blocks(2, 2)
    assert len(a) == 2100 // 16 and a[:125] == b[:125] and not set(a[125:]) & set(b)
    assert c[:125] == a[:125]  # groups_seen = 1: group 1 is folded onto group 0
    apart = dataclasses.replace(mix, groups_seen=2)
    assert not set(apart.blocks(2, 2)) & set(apart.blocks(0, 0))
    assert not set(mix.blocks(3, 3)) & set(a)  # no group: unique blocks only
    assert Mix((2100,), (20,), 1.5, 0.08).blocks(0, 0) == ()


H100 = EmulatorConfig(engine="vllm", gpu="h100",
                      served_models=["meta-llama/Llama-3.1-8B-Instruct"], profile="llama-3.1-8b")


def test_a_shared_prefix_raises_a_replicas_capacity() -> None:
    # 2,000 shared tokens + 100 of its own: prefilled in full, one H100 sustains a few
    # requests/s; with the prefix cached, only the 100 (and the answer) cost anything
    groups = tuple(range(8)) * 4
    cached = Mix((2100,) * 32, (60,) * 32, SLO["ttft_ms"] / 1000, SLO["tpot_ms"] / 1000,
                 prefix_groups=groups, prefix_tokens=2000)
    plain = dataclasses.replace(cached, prefix_groups=(), prefix_tokens=0)
    with_prefix = replica_capacity(H100, cached, seed=3)
    without = replica_capacity(H100, plain, seed=3)
    assert without.rate_per_s > 0
    assert with_prefix.rate_per_s > 1.5 * without.rate_per_s, (with_prefix, without)
    assert with_prefix.tokens_per_s > without.tokens_per_s


def test_the_prefix_workloads_bound_exists_and_is_below_every_policy() -> None:
    config = load_config(EXAMPLES / "prefix-fleet.yaml")
    report = simulate(config, load_workload(EXAMPLES / "prefix-heavy.yaml"), duration_s=60.0,
                      seed=1).as_json()
    bound = report["lower_bound"]
    assert bound["usd"] is not None and bound["slo_attainment"] == TARGET, bound
    for name, run in report["policies"].items():
        assert run["slo_attainment"] >= TARGET, name  # these policies meet the SLO
        assert 0 < bound["usd"] <= run["usd"], (name, bound, run["usd"])
        assert bound["usd_per_mtok"] <= run["usd_per_mtok"]


def test_a_prefix_run_is_byte_identical_per_seed() -> None:
    config = fleet(pool("a", "emulated://vllm/h100"), pool("b", "emulated://sglang/mi300x"))
    w = Workload.model_validate({
        "duration_s": 20, "slo": SLO, "arrivals": {"process": "poisson", "rate_per_s": 6},
        "requests": {"model": "llama-3.1-8b", "input_tokens": {"dist": "fixed", "value": 100},
                     "output_tokens": {"dist": "fixed", "value": 40},
                     "prefix": {"groups": 4, "tokens": 1000}}})
    one = dumps(simulate(config, w, seed=4).as_json())
    assert one == dumps(simulate(config, w, seed=4).as_json())


def test_the_provisioned_bound_pays_the_floors_then_the_cheapest_capacity_per_bin() -> None:
    # floors: one dear replica (3 $/h, 2000 tok/s) paid for two 60 s bins = $0.1;
    # bin 1 asks for 60 s x 2000 tok/s (the floor makes it all), bin 2 for 60 s x 3500:
    # 1500 tok/s more, on the cheapest per token first (cheap: 1000 tok/s per replica, 2
    # replicas -> 90 replica-s at 1 $/h = $0.025) -- bin 2 needs only 90 of its 120 s
    from fleetgate.sim.bound import provisioned_bound

    found = provisioned_bound(POOLS, {"dear": 1}, [120_000.0, 210_000.0], bin_s=60.0)
    assert found is not None
    assert found.floors_usd == pytest.approx(3.0 / HOUR * 120)
    assert found.replica_s == pytest.approx({"cheap": 90.0, "dear": 0.0, "slow": 0.0})
    assert found.usd == pytest.approx(3.0 / HOUR * 120 + 1.0 / HOUR * 90)
    # more than every ceiling makes: no bound
    assert provisioned_bound(POOLS, {"dear": 1}, [1e9], bin_s=60.0) is None


def test_a_policy_that_smooths_each_replicas_arrivals_does_not_undercut_the_bound() -> None:
    # A 70B with short answers under a TPOT SLO: a short answer misses when another
    # prompt's prefill lands in its few steps. round_robin over four replicas spaces each
    # one's arrivals (gaps with CV 1/2) and holds the SLO at 0.7 requests/s a replica, where
    # one replica fed Poisson arrivals holds 99% only to ~0.3: measured at the workload's own
    # arrivals, "these pools cannot make the tokens with 99% within the SLO" and the bound
    # fell back to 90%, beside a policy that made them at 99.5% (elsewhere such a bound was
    # 1.36x the cost router's $/Mtok at 99.85% within the SLO: bench/scenario_fuzz.py, case
    # 29). At evenly spaced arrivals it exists at 99% and stays below.
    served = {"llama-3.1-70b": "meta-llama/Llama-3.1-70B-Instruct-FP8"}
    slo = {"ttft_ms": 9354, "tpot_ms": 65}
    config = fleet(pool("mi325x", "emulated://vllm/mi325x", 4, price=3.21, models=served),
                   policies={"round_robin": {"strategy": "round_robin"}})
    work = Workload.model_validate({
        "duration_s": 240, "slo": slo, "arrivals": {"process": "poisson", "rate_per_s": 3.2},
        "requests": {"model": "llama-3.1-70b",
                     "input_tokens": {"dist": "lognormal", "mean": 1636, "cv": 0.5,
                                      "max": 6000},
                     "output_tokens": {"dist": "exponential", "mean": 110, "max": 550}}})
    report = simulate(config, work, seed=7).as_json()
    run = report["policies"]["round_robin"]
    bound = report["lower_bound"]
    assert run["slo_attainment"] >= TARGET, run["slo_attainment"]
    assert bound["slo_attainment"] == TARGET
    assert 0 < bound["usd"] <= run["usd"], (bound, run["usd"])
    # the workload's own (Poisson) arrivals give one replica less than round_robin ran
    requests, _ = workload_requests(work, 7, None)
    poisson = pool_capacities(config, workload_mix(work, requests), 7)["mi325x"]
    ran = run["pools"]["mi325x"]["requests"] / 240 / 4
    assert poisson.rate_per_s < ran < report["capacity"]["mi325x"]["rate_per_s"]
