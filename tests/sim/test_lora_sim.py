"""LoRA adapters in the simulator (issue 25 item 2): workload requests that name adapters go
through the same router and adapter table as live, in virtual time.

Pool ``cheap`` (two vLLM H100 replicas, run-time loading, at most 2 adapters each) declares
``a``, ``b`` and ``c``; pool ``dear`` (one SGLang H200) declares only ``d``, which its engine
starts with. Every adapter request lands on a pool that declares its adapter; each adapter
is loaded on one endpoint and its requests gather there (affinity), so the loads are few
and counted; the requests that waited for a load still finish within the SLO.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from sim_fixtures import fleet, pool, workload

from fleetgate.config.loader import load_config
from fleetgate.sim.arrivals import generate
from fleetgate.sim.outcomes import OK
from fleetgate.sim.run import build_fleet, policy_run, simulate
from fleetgate.sim.workload import load_workload

ADAPTERS = [{"name": n, "share": 0.15} for n in ("a", "b", "c", "d")]


def _config() -> Any:
    return fleet(
        pool("cheap", "emulated://vllm/h100", n=2, price=2.0, load_adapters=True,
             max_adapters=2, adapters=[{"name": n, "path": f"/adapters/{n}"} for n in "abc"]),
        pool("dear", "emulated://sglang/h200", price=4.0, adapters=["d"]),
        policies={"cost": {"strategy": "cost", "slo": {"ttft_ms": 1500, "tpot_ms": 80}}})


def test_adapter_requests_gather_where_their_adapter_is_loaded() -> None:
    config = _config()
    load = workload(rate=4.0, duration=60.0,
                    requests={"model": "llama-3.1-8b",
                              "input_tokens": {"dist": "fixed", "value": 400},
                              "output_tokens": {"dist": "fixed", "value": 60},
                              "adapters": ADAPTERS})
    requests = generate(load, seed=3)
    out, summary = policy_run(config, load, requests, "cost", 3, 60.0)
    ids = [ep.id for ep in build_fleet(config).endpoints]
    served = {name: {ids[int(i)] for i in out.endpoint[(requests.model == m) & (out.status == OK)]}
              for m, name in enumerate(requests.models)}
    assert (out.status == OK).all()
    assert served["d"] == {"dear-0"}  # only its pool declares it
    for name in "abc":  # one cheap endpoint each: the one that loaded it
        assert len(served[name]) == 1 and served[name] <= {"cheap-0", "cheap-1"}, served
    assert summary["adapter_loads"] == 3  # a, b, c once each; d came with its engine
    shares = {n: summary["adapters"][n]["requests"] / summary["requests"] for n in "abcd"}
    assert all(0.1 < s < 0.2 for s in shares.values()), shares
    assert summary["slo_attainment"] >= 0.99


def test_without_adapters_the_workload_is_unchanged() -> None:
    """The adapters' draw uses its own random stream: the other columns stay as they were."""
    plain = workload(rate=4.0, duration=30.0)
    mixed = workload(rate=4.0, duration=30.0,
                     requests={**plain.model_dump()["requests"], "adapters": ADAPTERS})
    a, b = generate(plain, seed=5), generate(mixed, seed=5)
    assert np.array_equal(a.arrival_s, b.arrival_s)
    assert np.array_equal(a.prompt_tokens, b.prompt_tokens)
    assert a.models == ("llama-3.1-8b",) and b.models == ("llama-3.1-8b", "a", "b", "c", "d")
    assert not a.model.any() and b.model.any()


def test_simulate_reports_the_adapters() -> None:
    load = workload(rate=2.0, duration=30.0,
                    requests={"model": "llama-3.1-8b",
                              "input_tokens": {"dist": "fixed", "value": 300},
                              "output_tokens": {"dist": "fixed", "value": 40},
                              "adapters": ADAPTERS[:2]})
    report = simulate(_config(), load, seed=1).as_json()
    cost = report["policies"]["cost"]
    assert set(cost["adapters"]) == {"a", "b"} and cost["adapter_loads"] == 2
    assert cost["completed"] == cost["requests"]


def test_the_shipped_lora_example_simulates() -> None:
    """examples/lora-fleet.yaml with examples/lora-workload.yaml (60 s of it): every adapter
    request served, each of the run-time adapters loaded once, the SGLang one never."""
    root = Path(__file__).resolve().parents[2] / "examples"
    report = simulate(load_config(root / "lora-fleet.yaml"),
                      load_workload(root / "lora-workload.yaml"), ["cost"], 60.0, seed=1)
    cost = report.as_json()["policies"]["cost"]
    assert cost["adapter_loads"] == 3 and cost["completed"] == cost["requests"]
    assert set(cost["adapters"]) == {"sql-lora", "support-lora", "legal-lora", "chat-lora"}
