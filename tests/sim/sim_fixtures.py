"""Small fleets, workloads and request sets for the simulator tests (no files, no clocks)."""

from __future__ import annotations

from typing import Any

import numpy as np

from fleetgate.config.schema import FleetConfig
from fleetgate.sim.arrivals import PRIORITIES, RequestSet
from fleetgate.sim.workload import Workload

MODEL = "llama-3.1-8b"
SERVED = "meta-llama/Llama-3.1-8B-Instruct"
SLO = {"ttft_ms": 1500, "tpot_ms": 80}


def pool(name: str, source: str, n: int = 1, price: float = 2.0, **extra: Any) -> dict[str, Any]:
    engine, gpu = source.split("://")[1].split("?")[0].split("/")
    return {"name": name, "accelerator": gpu, "engine": engine, "price_per_gpu_hour": price,
            "endpoints": [f"{source}#{k}" for k in range(1, n + 1)],
            "models": {MODEL: SERVED}, **extra}


def fleet(*pools: dict[str, Any], policies: dict[str, Any] | None = None) -> FleetConfig:
    return FleetConfig.model_validate({
        "pools": list(pools),
        "policies": policies or {"cost": {"strategy": "cost", "slo": SLO},
                                 "round_robin": {"strategy": "round_robin"}},
        "default_policy": next(iter(policies or {"cost": None})),
    })


def workload(rate: float = 5.0, duration: float = 60.0, **changes: Any) -> Workload:
    return Workload.model_validate({
        "duration_s": duration, "slo": SLO,
        "arrivals": {"process": "poisson", "rate_per_s": rate},
        "requests": {"model": MODEL, "input_tokens": {"dist": "fixed", "value": 500},
                     "output_tokens": {"dist": "fixed", "value": 100}},
    } | changes)


def requests(arrivals: list[float] | np.ndarray, prompt: int, output: int,
             stream: bool = True) -> RequestSet:
    """Requests of one shape at the given arrival times."""
    n = len(arrivals)
    full = lambda v: np.full(n, v, dtype=np.int64)  # noqa: E731
    return RequestSet(np.asarray(arrivals, dtype=float), full(prompt), full(output),
                      full(output), full(-1), full(0), full(PRIORITIES.index("normal")),
                      np.full(n, stream), full(0), (MODEL,), ("default",))
