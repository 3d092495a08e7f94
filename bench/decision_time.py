"""Decision time of the router at 10, 100 and 1,000 endpoints (BENCHMARKS.md).

Builds a LiveFleet of N endpoints over the six GPU types with random load, then times
``snapshot(now)`` + ``route(request, snapshot)`` per strategy: the full cost of one routing
decision on the request path. Pure CPU, one process; prints a markdown table.

Run: .venv/bin/python bench/decision_time.py
"""

from __future__ import annotations

import random
import statistics
import time

from fleetgate.config.schema import PolicyConfig
from fleetgate.routing import EndpointInfo, LiveFleet, RoutingRequest, endpoint_prior
from fleetgate.routing.policies import build_pipeline

GPUS = [
    ("mi300x", "amd", 1.99),
    ("mi325x", "amd", 2.25),
    ("mi355x", "amd", 2.90),
    ("h100", "nvidia", 2.95),
    ("h200", "nvidia", 3.60),
    ("b200", "nvidia", 6.00),
]
MODEL, SERVED = "llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct"
POLICIES = {
    "cost": {"strategy": "cost", "slo": {"ttft_ms": 1500, "tpot_ms": 40}},
    "latency": {"strategy": "latency"},
    "least_loaded": {"strategy": "least_loaded"},
    "power_of_two": {"strategy": "power_of_two"},
    "round_robin": {"strategy": "round_robin"},
}


def fleet(n: int, rng: random.Random) -> LiveFleet:
    infos, priors = [], []
    for i in range(n):
        gpu, vendor, price = GPUS[i % len(GPUS)]
        infos.append(
            EndpointInfo(
                f"{gpu}-{i}",
                f"{gpu}-pool",
                f"http://10.0.0.{i}",
                "vllm",
                gpu,
                vendor,
                {MODEL: SERVED},
                {},
                price,
            )
        )
        priors.append(endpoint_prior(gpu, SERVED))
    live = LiveFleet(infos, priors)
    for i in range(n):
        live.on_probe(i, 0.0, True, "200")
        live.on_scrape(i, 0.0, rng.randint(0, 5), rng.randint(0, 40), rng.random() * 0.8, 1e6, None)
        for _ in range(rng.randint(0, 20)):
            live.on_dispatch(i, 0.0)
    return live


def time_decisions(live: LiveFleet, policy: dict, reps: int) -> tuple[float, float]:
    pipe = build_pipeline("p", PolicyConfig.model_validate(policy), seed=1)
    req = RoutingRequest(model=MODEL, prompt_chars=2000, max_tokens=256)
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        pipe.route(req, live.snapshot(1.0))
        samples.append(time.perf_counter() - t0)
    samples.sort()
    return statistics.median(samples) * 1e6, samples[int(len(samples) * 0.99)] * 1e6


def main() -> None:
    rng = random.Random(42)
    print("| endpoints | strategy | p50 µs | p99 µs |")
    print("|---|---|---|---|")
    for n in (10, 100, 1000):
        live = fleet(n, rng)
        for name, policy in POLICIES.items():
            p50, p99 = time_decisions(live, policy, 3000 if n < 1000 else 1000)
            print(f"| {n} | {name} | {p50:.1f} | {p99:.1f} |")


if __name__ == "__main__":
    main()
