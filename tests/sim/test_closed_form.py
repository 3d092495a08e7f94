"""Closed-form cases: the simulator reproduces the engine model's own arithmetic.

* Below capacity (one request at a time) every latency is the model's unloaded latency: TTFT
  is one prefill step, TPOT the mean of the single-sequence decode steps, through the whole
  simulator (router, gateway, live state).
* Saturated (one sequence at a time, arrivals faster than service) the queue grows at the
  arrival rate minus the service rate.
"""

from __future__ import annotations

import numpy as np
import pytest
from sim_fixtures import fleet, pool, requests

from fleetgate.catalog.gpus import GPUS
from fleetgate.catalog.models import MODEL_PROFILES
from fleetgate.catalog.roofline import StepLoad, step_seconds
from fleetgate.emulator.perfmodel import EngineSim, SchedulerConfig
from fleetgate.sim.fleet import build_fleet
from fleetgate.sim.loop import Simulation
from fleetgate.sim.outcomes import OK
from fleetgate.sim.replica import SimReplica

P8B = MODEL_PROFILES["llama-3.1-8b"]


def unloaded(gpu: str, prompt: int, output: int, stack: str = "stock") -> tuple[float, float]:
    """(TTFT, TPOT) of a lone request: one prefill step, then single-sequence decodes."""
    g = GPUS[gpu]
    ttft = step_seconds(g, P8B, StepLoad(prompt, prompt, prompt * prompt / 2), 1, stack)
    decodes = [step_seconds(g, P8B, StepLoad(1, prompt + j, prompt + j), 1, stack)
               for j in range(output - 1)]
    return ttft, float(np.mean(decodes))


@pytest.mark.parametrize(("source", "gpu"), [("emulated://vllm/h100", "h100"),
                                             ("emulated://sglang/mi300x", "mi300x")])
def test_below_capacity_latency_is_the_unloaded_latency(source: str, gpu: str) -> None:
    config = fleet(pool("p", source), policies={"rr": {"strategy": "round_robin"}})
    reqs = requests(np.arange(20) * 5.0, prompt=700, output=120)  # 5 s apart, ~1.5 s each
    sim_fleet = build_fleet(config)
    out = Simulation(sim_fleet, reqs, "rr", seed=1, duration_s=100.0).run()
    ttft, tpot = unloaded(gpu, 700, 120)
    assert np.all(out.status == OK)
    assert out.ttft_s == pytest.approx(np.full(20, ttft), rel=1e-9)
    assert out.tpot_s == pytest.approx(np.full(20, tpot), rel=1e-9)
    assert out.e2e_s == pytest.approx(np.full(20, ttft + tpot * 119), rel=1e-9)
    # the gateway's learning loop saw the same numbers the client did
    assert sim_fleet.live.value(0, "ttft_s") == pytest.approx(ttft, rel=1e-9)
    assert sim_fleet.live.stats[0].requests == 20


def test_saturated_queue_grows_at_arrival_minus_service_rate() -> None:
    engine = lambda: EngineSim(GPUS["h200"], P8B,  # noqa: E731
                               scheduler=SchedulerConfig(max_num_seqs=1))
    ttft, tpot = unloaded("h200", 1000, 50)
    service = ttft + 49 * tpot  # one request at a time: prefill + 49 decode steps
    rate = 3.0 / service  # three times what it serves
    replica = SimReplica(engine)
    arrivals = np.arange(600) / rate
    k, checks = 0, []
    for t_check in (40 * service, 80 * service, 160 * service):
        while True:
            t_engine = replica.next_time
            due = k < len(arrivals) and arrivals[k] <= t_check
            if due and (t_engine is None or arrivals[k] < t_engine):
                replica.add(str(k), 1000, 50, float(arrivals[k]))
                k += 1
            elif t_engine is not None and t_engine <= t_check:
                replica.advance()
            else:
                break
        g = replica.gauges(t_check)
        expected = (rate - 1.0 / service) * t_check
        checks.append((g.waiting, expected))
        assert g.running == 1
    for waiting, expected in checks:
        assert waiting == pytest.approx(expected, abs=1.5)
