"""The simulator drives the emulator's own engine model: decode runs change no result.

Stepping ``EngineSim`` one step at a time (what the live emulator does) and driving it through
``SimReplica`` (decode runs as single events, only first and last tokens reported) must give
the same first-token and finish times, and a scrape part-way through a run the same gauges.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fleetgate.catalog.gpus import GB, GPUS
from fleetgate.catalog.models import MODEL_PROFILES
from fleetgate.emulator.perfmodel import DecodeRun, EngineSim, SchedulerConfig
from fleetgate.sim.capacity import drive
from fleetgate.sim.replica import SimReplica

P8B = MODEL_PROFILES["llama-3.1-8b"]


def small_kv_gpu(tokens: int) -> object:
    free = tokens * P8B.kv_bytes_per_token + P8B.weight_bytes + 1.0 * GB
    return dataclasses.replace(GPUS["h100"], hbm_gb=free / 0.9 / GB + 1e-9)


ENGINES = {
    "vllm-h100": lambda: EngineSim(GPUS["h100"], P8B),
    "sglang-mi300x": lambda: EngineSim(GPUS["mi300x"], P8B, scheduler=SchedulerConfig(
        max_num_seqs=1024, kv_reserve_ratio=0.5)),
    "preempting": lambda: EngineSim(small_kv_gpu(30_000), P8B),  # type: ignore[arg-type]
    "few-seqs": lambda: EngineSim(GPUS["h200"], P8B, scheduler=SchedulerConfig(
        max_num_seqs=4, max_num_batched_tokens=512)),
}


def stepped(sim: EngineSim, arrivals: list[float], prompts: list[int],
            outputs: list[int]) -> tuple[dict[int, float], dict[int, float], list[tuple]]:
    """The live emulator's way: plan a step, let arrivals in meanwhile, run it. ``states``
    holds what a scrape reads while each step runs (after it was planned)."""
    first: dict[int, float] = {}
    done: dict[int, float] = {}
    states: list[tuple] = []
    now, k, end = 0.0, 0, None
    while True:
        if end is None:
            duration = sim.next_step_duration()
            end = None if duration is None else now + duration
            if end is not None:
                states.append((now, sim.kv_used_tokens, sim.counters().generation_tokens_total))
        if k < len(arrivals) and (end is None or arrivals[k] < end):
            now = arrivals[k] if end is None else now
            sim.add(str(k), prompts[k], outputs[k])
            k += 1
            continue
        if end is None:
            return first, done, states
        now, end = end, None
        for ev in sim.step():
            if ev.index == 0:
                first[int(ev.request_id)] = now
            if ev.finished:
                done[int(ev.request_id)] = now


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_decode_runs_give_the_stepped_times(name: str) -> None:
    rng = np.random.default_rng(5)
    n = 400
    arrivals = np.cumsum(rng.exponential(1 / 12, n))
    prompts = [int(v) for v in rng.integers(50, 2500, n)]
    outputs = [int(v) for v in rng.integers(1, 600, n)]
    first, done, _ = stepped(ENGINES[name](), arrivals.tolist(), prompts, outputs)
    ttft, _, e2e = drive(SimReplica(ENGINES[name]), arrivals, prompts, outputs)
    assert len(done) == n
    for r in range(n):
        assert ttft[r] + arrivals[r] == pytest.approx(first[r], abs=1e-9)
        assert e2e[r] + arrivals[r] == pytest.approx(done[r], abs=1e-9)


def test_gauges_part_way_through_a_run_match_stepping() -> None:
    arrivals, prompts, outputs = [0.0, 0.0, 0.0], [300, 400, 500], [200, 300, 400]
    _, _, states = stepped(EngineSim(GPUS["h100"], P8B), arrivals, prompts, outputs)
    replica = SimReplica(lambda: EngineSim(GPUS["h100"], P8B))
    for k in range(3):
        replica.add(str(k), prompts[k], outputs[k], 0.0)
    checked = 0
    for t, kv_used, generated in states:
        while replica.next_time is not None and replica.next_time <= t + 1e-9:
            replica.advance()
        g = replica.gauges(t + 1e-9)
        assert (round(g.kv_usage * replica.kv_capacity_tokens), g.generation_tokens_total) \
            == (kv_used, generated)
        checked += 1
    assert checked > 300


def test_sim_view_of_a_step_is_first_and_last_tokens_only() -> None:
    a, b = EngineSim(GPUS["h100"], P8B), EngineSim(GPUS["h100"], P8B)
    for sim in (a, b):
        sim.add("x", 100, 3)
        sim.add("y", 100, 1)
    for _ in range(3):
        every = a.step()
        sim_view = b.step(every_token=False)
        assert sim_view == [e for e in every if e.index == 0 or e.finished]
        assert a.counters() == b.counters() and a.kv_used_tokens == b.kv_used_tokens


def test_decode_run_time_arithmetic() -> None:
    linear = DecodeRun(batch=4, steps=50, first_s=0.01, slope_s=0.0001)
    table = DecodeRun(batch=4, steps=3, first_s=0.0, slope_s=0.0, ends=(0.1, 0.25, 0.45))
    for run in (linear, table):
        for m in range(1, run.steps + 1):
            assert run.steps_done(run.elapsed(m)) == m
            assert run.steps_done(run.elapsed(m) - 1e-12) == m - 1
        assert run.steps_done(1e9) == run.steps and run.steps_done(0.0) == 0
    assert linear.elapsed(3) == pytest.approx(0.01 + 0.0101 + 0.0102)


def test_scheduler_refuses_a_token_budget_below_max_num_seqs() -> None:
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=32)
