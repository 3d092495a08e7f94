"""Fidelity: one emulated replica simulated in virtual time vs the live emulator over HTTP.

Two tests: the original one-point comparison below (means), and a bounded smoke of the
fidelity matrix (``bench/fidelity_matrix.py``, ``make fidelity``: vLLM and SGLang, 8B and
70B, light / medium / near-capacity load): two of its cells, short, at faster clocks than the
full matrix, each figure (TTFT p50, TPOT p50, output throughput) within 10% as here, but TTFT
within 15% (CPU contention, at the test).

The same requests (prompt token ids, exact output lengths, Poisson arrivals) go to a real
emulated vLLM engine process (70B FP8 on one H200, clock 2x) by a streaming HTTP client, and
through ``fleetgate simulate``'s machinery (router, gateway, live state) to a simulated
replica of the same engine. Mean TTFT, mean TPOT and output throughput agree within 10%.
The live side is paced by its schedule of arrivals; nothing waits for a state.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import orjson
import pytest
from sim_fixtures import fleet, requests

from fleetgate.sim.fleet import build_fleet
from fleetgate.sim.loop import Simulation
from fleetgate.sim.outcomes import OK
from procs import spawn_emulator

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import fidelity_matrix

SPEED = 2.0
PROFILE = "llama-3.1-70b-fp8"
SERVED = "meta-llama/Llama-3.1-70B-Instruct-FP8"


def workload(n: int = 50, rate: float = 1.25, seed: int = 4) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, n))
    prompts = rng.integers(200, 1500, n)
    outputs = rng.integers(40, 200, n)
    return arrivals, prompts, outputs


async def _one(client: httpx.AsyncClient, url: str, start: float, arrival: float,
               prompt: int, output: int) -> tuple[float, float, float]:
    await asyncio.sleep(max(0.0, start + arrival / SPEED - time.perf_counter()))
    sent = time.perf_counter()
    first = last = 0.0
    body = {"model": SERVED, "prompt": [1] * prompt, "max_tokens": output, "stream": True}
    async with client.stream("POST", url + "/v1/completions", json=body) as resp:
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            if line.startswith("data: {") and orjson.loads(line[6:]).get("choices"):
                last = time.perf_counter()
                first = first or last
    return (sent - start) * SPEED, (first - start) * SPEED, (last - start) * SPEED


async def _live(url: str, arrivals: np.ndarray, prompts: np.ndarray,
                outputs: np.ndarray) -> np.ndarray:
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=200)) as c:
        start = time.perf_counter() + 0.2
        rows = await asyncio.gather(*(_one(c, url, start, float(a), int(p), int(g))
                                      for a, p, g in zip(arrivals, prompts, outputs,
                                                         strict=True)))
    return np.array(rows)


def test_simulated_replica_matches_the_live_emulator() -> None:
    arrivals, prompts, outputs = workload()
    proc = spawn_emulator("vllm", "h200", [SERVED], speed=SPEED, extra=["--profile", PROFILE])
    try:
        live = asyncio.run(_live(proc.url, arrivals, prompts, outputs))
    finally:
        proc.stop()
    sent, first, last = live.T
    live_ttft = first - sent
    live_tpot = (last - first) / (outputs - 1)
    live_tput = outputs.sum() / (last.max() - sent.min())

    config = fleet({"name": "h200", "accelerator": "h200", "engine": "vllm",
                    "price_per_gpu_hour": 3.6, "endpoints": [f"emulated://vllm/h200?profile="
                                                             f"{PROFILE}"],
                    "models": {"m": SERVED}}, policies={"rr": {"strategy": "round_robin"}})
    reqs = requests(arrivals, 0, 0)
    reqs = type(reqs)(**{**reqs.__dict__, "prompt_tokens": prompts.astype(np.int64),
                         "output_tokens": outputs.astype(np.int64),
                         "max_tokens": outputs.astype(np.int64), "models": ("m",)})
    out = Simulation(build_fleet(config), reqs, "rr", seed=1, duration_s=1e9).run()
    assert np.all(out.status == OK)
    sim_tput = outputs.sum() / (np.max(arrivals + out.e2e_s) - arrivals.min())

    print(f"fidelity, live / simulated: TTFT {live_ttft.mean() / out.ttft_s.mean():.3f}, "
          f"TPOT {live_tpot.mean() / out.tpot_s.mean():.3f}, throughput {live_tput / sim_tput:.3f}")
    assert live_ttft.mean() == pytest.approx(out.ttft_s.mean(), rel=0.10)
    assert live_tpot.mean() == pytest.approx(out.tpot_s.mean(), rel=0.10)
    assert live_tput == pytest.approx(sim_tput, rel=0.10)


# Cells whose figures are large beside the HTTP hop even at these faster clocks (the light
# 8B cell's TTFT is one ~25 ms prefill: it needs the full matrix's --speed 0.25).
SMOKE = [("sglang-8b-medium", 0.5), ("vllm-70b-near", 1.0)]


@pytest.mark.parametrize(("name", "speed"), SMOKE)
def test_fidelity_matrix_cell(name: str, speed: float, tmp_path: Path) -> None:
    cell = next(c for c in fidelity_matrix.all_cells() if c.name == name)
    r = fidelity_matrix.run_cell(replace(cell, speed_override=speed), seconds=4.0, seed=3,
                                 min_requests=20, max_requests=30, workdir=tmp_path)
    print("\n" + fidelity_matrix.table([r], 0.10))
    assert not r.notes  # every live request answered, every prompt the planned length
    ttft, tpot, tput = r.ratios()
    # TTFT within 15% here, 10% in the full matrix (`make fidelity`): the live side's ~34 ms
    # TTFT of the SGLang cell reads up to 12% high from CPU contention alone, as under `make
    # test`'s two workers (2026-12-07: 1.085-1.125 with both cores busy, on this code and on
    # the commit before, against 1.025-1.089 alone); TPOT and throughput stay within 1%.
    assert ttft == pytest.approx(1.0, rel=0.15)
    assert tpot == pytest.approx(1.0, rel=0.10)
    assert tput == pytest.approx(1.0, rel=0.10)
