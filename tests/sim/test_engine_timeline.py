"""The simulator's engine timeline is the live emulator's, step for step, without a wall clock.

``EngineRuntime`` (the live emulator's engine loop, ``emulator/runtime.py``) runs here on an
asyncio loop whose clock is virtual: its selector never blocks, it moves the clock by the
timeout it was asked to wait. The same requests (arrival times, prompt and output lengths,
prefix-cache blocks) go through ``Simulation`` (router, gateway, scrapes, ``SimReplica`` with
its decode-run shortcut). Every request's TTFT and TPOT must agree to a microsecond: the two
drive one ``EngineSim``, so any gap between ``fleetgate simulate`` and a live emulator at
light load comes from outside the engine model (HTTP, the client, a workload that does not
say what the live prompts share: issue 27 item 1, BENCHMARKS.md "Simulator speed and fidelity").
"""

from __future__ import annotations

import asyncio
import selectors
from typing import Any

import numpy as np
import pytest
from sim_fixtures import fleet, requests

from fleetgate.emulator.config import EmulatorConfig
from fleetgate.emulator.parsing import ParsedRequest
from fleetgate.emulator.runtime import EngineRuntime
from fleetgate.sim.fleet import build_fleet
from fleetgate.sim.loop import Simulation
from fleetgate.sim.prefixes import SimPrefixes

SERVED = "meta-llama/Llama-3.1-8B-Instruct"


class _VirtualSelector(selectors.DefaultSelector):
    """Never waits: a wait of ``timeout`` seconds moves the virtual clock by that much."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def select(self, timeout: float | None = None) -> list[Any]:
        if timeout is None:
            raise RuntimeError("the loop would wait forever")
        self.now += max(0.0, timeout)
        return []


class _VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._vsel = _VirtualSelector()
        super().__init__(self._vsel)

    def time(self) -> float:
        return self._vsel.now


class _NoMetrics:
    def on_first_token(self, ttft_s: float, prompt_tokens: int, streaming: bool) -> None: ...
    def on_token(self, itl_s: float | None) -> None: ...
    def on_finish(self, done: object) -> None: ...
    def on_rejected(self) -> None: ...
    def on_step(self, tokens: int) -> None: ...


def _request_set(arrivals: np.ndarray, prompts: np.ndarray, outputs: np.ndarray,
                 prefix: int) -> Any:
    reqs = requests(arrivals, 0, 0)
    return type(reqs)(**{**reqs.__dict__, "prompt_tokens": prompts, "output_tokens": outputs,
                         "max_tokens": outputs, "models": ("m",),
                         "prefix_group": np.full(len(arrivals), 0 if prefix else -1),
                         "prefix_tokens": prefix})


def _runtime(engine: str, reqs: Any, speed: float) -> tuple[np.ndarray, np.ndarray]:
    """Each request's (TTFT, TPOT) in engine seconds from the live engine loop."""
    cfg = EmulatorConfig.model_validate({"engine": engine, "gpu": "h100",
                                         "served_models": [SERVED]})
    blocks = SimPrefixes(reqs)
    loop = _VirtualLoop()
    runtime = EngineRuntime(cfg.build_sim(), _NoMetrics(), speed, lambda: 1.0,  # type: ignore[arg-type]
                            clock=loop.time)
    handles = []

    async def main() -> None:
        await runtime.start()
        for r in range(len(reqs)):
            await asyncio.sleep(max(0.0, float(reqs.arrival_s[r]) / speed - loop.time()))
            req = ParsedRequest(kind="completion", request_id=f"r{r}", model=SERVED, created=0,
                                prompt_tokens=int(reqs.prompt_tokens[r]),
                                max_tokens=int(reqs.output_tokens[r]), finish_reason="length",
                                stream=True, include_usage=False, continuous_usage=False,
                                block_hashes=blocks.engine_blocks(r))
            handles.append(runtime.submit(req))
        while runtime.in_flight:
            await asyncio.sleep(0.01)
        await runtime.stop()

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    ttft = np.array([(h.first_at - h.arrival) * speed for h in handles])
    tpot = np.array([(h.last_at - h.first_at) * speed / (h.generated - 1) for h in handles])
    return ttft, tpot


def _simulated(engine: str, reqs: Any, speed: float) -> tuple[np.ndarray, np.ndarray]:
    config = fleet({"name": "h100", "accelerator": "h100", "engine": engine,
                    "price_per_gpu_hour": 2.0, "endpoints": [f"emulated://{engine}/h100"
                                                             f"?speed={speed}"],
                    "models": {"m": SERVED}}, policies={"rr": {"strategy": "round_robin"}})
    scaled = type(reqs)(**{**reqs.__dict__, "arrival_s": reqs.arrival_s / speed})
    out = Simulation(build_fleet(config), scaled, "rr", seed=1, duration_s=1e9).run()
    return out.ttft_s * speed, out.tpot_s * speed


@pytest.mark.parametrize(("engine", "rate", "prefix", "speed"), [
    ("vllm", 3.0, 0, 1.0),  # issue 27's light chat: a few requests a second, short prompts
    ("vllm", 3.0, 400, 1.0),  # the same behind a shared 400-token system prompt
    ("vllm", 40.0, 0, 2.0),  # medium load, a faster clock (?speed= / --speed)
    ("sglang", 3.0, 400, 1.0),
])
def test_simulated_engine_timeline_is_the_live_runtimes(engine: str, rate: float, prefix: int,
                                                        speed: float) -> None:
    rng = np.random.default_rng(5)
    n = 60
    arrivals = np.cumsum(rng.exponential(1.0 / rate, n))
    prompts = (rng.integers(50, 600, n) + prefix).astype(np.int64)
    outputs = rng.integers(30, 200, n).astype(np.int64)
    reqs = _request_set(arrivals, prompts, outputs, prefix)
    live_ttft, live_tpot = _runtime(engine, reqs, speed)
    sim_ttft, sim_tpot = _simulated(engine, reqs, speed)
    np.testing.assert_allclose(sim_ttft, live_ttft, rtol=0, atol=1e-6)
    np.testing.assert_allclose(sim_tpot, live_tpot, rtol=0, atol=1e-6)
    # the light-load TTFT is one prefill step plus what remains of the step in progress
    assert np.median(live_ttft) < 0.05
