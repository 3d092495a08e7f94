"""``simulate`` end to end on small fleets: the JSON contract, same seed -> same bytes,
failover and breakers under injected faults, slow-downs, autoscaling and the lower bound."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest
from sim_fixtures import fleet, pool, requests, workload

from fleetgate.routing.types import STATIC_ROW
from fleetgate.sim.fleet import build_fleet
from fleetgate.sim.loop import Simulation
from fleetgate.sim.outcomes import FAILED, OK
from fleetgate.sim.run import dumps, pool_capacities, simulate, workload_mix
from fleetgate.sim.workload import Fault, load_workload

TWO_POOLS = fleet(pool("cheap", "emulated://sglang/mi300x", 2, price=1.5),
                  pool("dear", "emulated://vllm/h200", 2, price=4.0))


def test_json_has_the_design_contract() -> None:
    report = simulate(TWO_POOLS, workload(rate=8, duration=30), None, None, seed=3).as_json()
    assert {"seed", "duration_s", "requests", "policies", "lower_bound"} <= set(report)
    assert set(report["policies"]) == {"cost", "round_robin"}
    for p in report["policies"].values():
        assert {"slo_attainment", "usd", "usd_per_mtok", "provisioned_usd",
                "provisioned_usd_per_mtok", "gpu_hours", "throughput_tok_s", "ttft_ms",
                "tpot_ms", "pools"} <= set(p)
        assert set(p["ttft_ms"]) >= {"p50", "p95", "p99"}
        assert sum(row["share"] for row in p["pools"].values()) == pytest.approx(1.0)
        # the pools' attainments, weighted by their answers, make the policy's (none shed)
        rows = p["pools"].values()
        assert sum((r["slo_attainment"] or 0) * r["requests"] for r in rows) == pytest.approx(
            p["slo_attainment"] * p["requests"], abs=1.5)
        assert all(r["ttft_misses"] >= 0 and r["tpot_misses"] >= 0 for r in rows)
        # a fixed fleet is billed for every replica the whole time
        assert p["provisioned_usd"] == pytest.approx(30 * (2 * 1.5 + 2 * 4.0) / 3600, rel=1e-5)
        assert 0 < p["usd"] <= p["provisioned_usd"] * 1.0001
    bound = report["lower_bound"]
    assert 0 < bound["usd_per_mtok"] <= min(p["usd_per_mtok"] for p in
                                            report["policies"].values())


def test_same_seed_same_bytes_other_seed_other_bytes() -> None:
    w = workload(rate=10, duration=20, arrivals={"process": "bursty", "rate_per_s": 10,
                                                 "cv": 2})
    one = dumps(simulate(TWO_POOLS, w, None, None, seed=5).as_json())
    two = dumps(simulate(TWO_POOLS, w, None, None, seed=5).as_json())
    three = dumps(simulate(TWO_POOLS, w, None, None, seed=6).as_json())
    assert one == two and one != three
    assert orjson.loads(one)["seed"] == 5


def test_a_replica_that_dies_fails_over_before_the_first_token_only() -> None:
    config = fleet(pool("a", "emulated://vllm/h100"), pool("b", "emulated://vllm/h100"),
                   policies={"rr": {"strategy": "round_robin"}})
    sim_fleet = build_fleet(config)
    busy = np.arange(0.0, 12.0, 0.05)  # more prefill than two replicas do: queues form
    reqs = requests(np.concatenate([busy, np.arange(12.0, 60.0, 0.5)]), prompt=3000,
                    output=300)
    fault = Fault(at_s=10.0, endpoint="a-0", down_for_s=20.0)
    out = Simulation(sim_fleet, reqs, "rr", seed=1, duration_s=60.0, faults=[fault]).run()
    arrival = reqs.arrival_s
    failed = out.status == FAILED
    assert failed.any() and np.all(out.ttft_s[failed] + arrival[failed] < 10.0)  # mid-stream
    assert np.all(out.endpoint[failed] == 0)
    retried = (out.status == OK) & (out.attempts > 1)
    assert retried.any() and np.all(out.endpoint[retried] == 1)
    assert np.all(out.status[(arrival > 10.0) & (arrival < 30.0)] == OK)  # none lost
    back = (arrival > 32.0) & (out.endpoint == 0)
    assert back.any()  # after the outage the endpoint takes traffic again
    assert sim_fleet.live.stats[0].failures > 0


def test_a_slowed_replica_is_slower_while_slowed() -> None:
    config = fleet(pool("a", "emulated://vllm/h100"), policies={"rr": {"strategy": "round_robin"}})
    reqs = requests(np.arange(0.0, 90.0, 5.0), prompt=500, output=100)  # one at a time
    fault = Fault(at_s=30.0, endpoint="a-0", slow=3.0, for_s=30.0)
    out = Simulation(build_fleet(config), reqs, "rr", seed=1, duration_s=90.0,
                     faults=[fault]).run()
    before = out.tpot_s[reqs.arrival_s < 25]
    during = out.tpot_s[(reqs.arrival_s > 31) & (reqs.arrival_s < 55)]
    after = out.tpot_s[reqs.arrival_s > 61]
    assert during.mean() == pytest.approx(3 * before.mean(), rel=1e-6)
    assert after.mean() == pytest.approx(before.mean(), rel=1e-6)


def test_autoscaling_follows_the_load_and_bills_what_existed() -> None:
    scaled = fleet(pool("p", "emulated://vllm/h100", 1, price=3.0,
                        autoscale={"min_replicas": 1, "max_replicas": 6,
                                   "target_utilization": 0.5, "cold_start_s": 20}))
    mix = workload_mix(workload(), requests([0.0], 500, 100))
    one = pool_capacities(scaled, mix, seed=2)["p"]  # what one replica sustains at the SLO
    w = workload(rate=1, duration=600, arrivals={
        "process": "diurnal", "rate_per_s": one.rate_per_s, "period_s": 600,
        "amplitude": 0.9, "phase_s": 450})  # starts at the trough, peaks at t=300
    report = simulate(scaled, w, ["round_robin"], None, seed=2)
    run = report.runs[0]
    spans = run.outcomes.provisioned
    assert len(spans) > 1  # it scaled up (and down again)
    assert all(0 <= a <= b <= 600 for _, a, b in spans)
    busiest = max(sum(1 for _, a, b in spans if a <= t < b) for t in range(0, 600, 10))
    assert 2 <= busiest <= 6
    p = run.summary
    assert p["provisioned_usd"] < 6 * 3.0 * 600 / 3600
    assert p["provisioned_usd"] == pytest.approx(
        sum(b - a for _, a, b in spans) * 3.0 / 3600, rel=1e-5)
    assert p["slo_attainment"] > 0.9
    bound = report.as_json()["lower_bound"]  # the bill's bound with floors (bound.py)
    assert 0 < bound["provisioned_floors_usd"] <= bound["provisioned_usd"]
    assert bound["provisioned_usd"] <= p["provisioned_usd"]


def test_a_request_log_replays_through_simulate(tmp_path: Path) -> None:
    lines = [{"ts": 100.0 + k * 0.5, "event": "request", "status": 200, "e2e_ms": 400,
              "model": "llama-3.1-8b", "tenant": "t", "stream": True,
              "input_tokens": 300 + k, "output_tokens": 50} for k in range(40)]
    (tmp_path / "requests.jsonl").write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    (tmp_path / "w.yaml").write_text("slo: {ttft_ms: 1500, tpot_ms: 80}\n"
                                     "arrivals: {trace: requests.jsonl}\n")
    report = simulate(TWO_POOLS, load_workload(tmp_path / "w.yaml"), ["round_robin"], None,
                      seed=1).as_json()
    p = report["policies"]["round_robin"]
    assert report["requests"] == 40 and p["completed"] == 40
    assert p["output_tokens"] == 40 * 50
    assert report["duration_s"] == pytest.approx(19.5, abs=1e-3)  # the trace's span


def test_the_router_sees_each_engines_reported_capacity_as_live() -> None:
    # The live collector reads SGLang's max_running_requests at first contact; vLLM does
    # not report max_num_seqs. Capped at the prior's 256, a simulated SGLang replica was
    # predicted to queue what its engine runs, and admission shed what it could serve.
    sim = build_fleet(fleet(pool("s", "emulated://sglang/mi355x", 2),
                            pool("v", "emulated://vllm/mi355x", 1)))
    static = sim.live.snapshot(0.0).static
    assert static[STATIC_ROW["max_batch"]].tolist() == [1024.0, 1024.0, 256.0]
    engine = sim.replicas[0].engine  # what the emulated engine holds
    assert static[STATIC_ROW["kv_capacity_tokens"], 0] == engine.kv_capacity_tokens
