"""The SLO capacity the router learns for an endpoint class, against the capacity ``plan``
bisects for one replica of it (issue 22): printed, and held within a band.

Two replicas of one class at 0.9x their simulated SLO capacity (cost policy, so the
router packs them to what it believes they hold) for the scenario matrix's chat mix; at the
end, the concurrency the router allows one replica (its ``slo_capacity`` for a typical
request, learned capacity and prior combined as ``routing/estimate.py`` does) is compared
with the mean concurrency one replica holds at the rate ``sim/capacity.py`` bisects
(Poisson arrivals, 99% within the SLO). The two measure different things (a cap against a
Poisson mean, and under packing the replica's prefill share binds before the cap does), so
this test holds a wide band only; the issue's 15% is missed (ratios 1.7-2.1 at the end of
issue 22's session), reported in BENCHMARKS.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetgate.config.schema import FleetConfig
from fleetgate.routing import RoutingRequest
from fleetgate.sim import loop
from fleetgate.sim.run import pool_capacities, simulate, workload_mix, workload_requests
from fleetgate.sim.workload import load_workload

CHAT = Path(__file__).resolve().parents[2] / "examples" / "scenarios" / "chat.yaml"


@pytest.mark.parametrize(("gpu", "engine"), [("h100", "vllm"), ("mi355x", "sglang")])
def test_learned_capacity_against_the_planners(gpu: str, engine: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    work = load_workload(CHAT)
    config = FleetConfig.model_validate({
        "pools": [{"name": "p", "accelerator": gpu, "engine": engine,
                   "price_per_gpu_hour": 2.0,
                   "endpoints": [f"emulated://{engine}/{gpu}#{k}" for k in range(2)],
                   "models": {"llama-3.1-8b": "meta-llama/Llama-3.1-8B-Instruct"}}],
        "policies": {"cost": {"strategy": "cost", "slo": {"ttft_ms": 1500, "tpot_ms": 80}}},
        "default_policy": "cost"})
    requests, _ = workload_requests(work, 1, None)
    planned = pool_capacities(config, workload_mix(work, requests), 1)["p"]
    rate = 2 * 0.9 * planned.rate_per_s
    work = work.model_copy(update={
        "duration_s": 360.0, "arrivals": work.arrivals.model_copy(update={"rate_per_s": rate})})
    seen: dict[str, float] = {}
    run = loop.Simulation.run

    def keep(sim: loop.Simulation) -> object:
        out = run(sim)
        live = sim.fleet.live
        mean_prompt = float(live.column("prompt_tokens_mean")[0])
        request = RoutingRequest(model="llama-3.1-8b", prompt_chars=int(4 * mean_prompt),
                                 max_tokens=int(live.column("output_tokens_mean")[0]))
        decision = sim.gw.router.route(request, live.snapshot(sim.duration + 1.0))
        seen["allowed"] = float(decision.estimates["slo_capacity"][0])
        table = live.slo_capacity.table(0)
        seen["judged"] = float(table.results if table is not None else 0)
        return out

    monkeypatch.setattr(loop.Simulation, "run", keep)
    simulate(config, work, ["cost"], None, 1)
    ratio = seen["allowed"] / planned.concurrency
    print(f"{gpu}/{engine}: learned {seen['allowed']:.0f} per replica, plan's bisection "
          f"{planned.concurrency:.1f} (ratio {ratio:.2f}; {seen['judged']:.0f} results)")
    assert seen["judged"] > 500  # the class learned from its own requests
    # A sanity range, not the 15% (missed; BENCHMARKS.md, issue 22): without a knee
    # the learned value sits a bin above the heaviest load seen, so it grows with how far
    # the engine lets the router pack (SGLang reports a cap of 1,024 running requests, and
    # the simulator applies it as the live collector does: 303 against 95.4 here).
    assert 0.5 < ratio < 4.0
