"""Unit tests of the emulator's performance model and the GPU catalog (pure, no clocks).

Every test drives ``EngineSim`` step by step on a virtual clock (the sum of step durations)
and compares quantities the model must order correctly; nothing sleeps, nothing is timed.
"""

from __future__ import annotations

import dataclasses

import pytest

from fleetgate.catalog.gpus import GB, GPUS, GpuSpec
from fleetgate.catalog.models import MODEL_PROFILES, profile_for_served_name
from fleetgate.catalog.roofline import (
    StepLoad,
    bandwidth_efficiency,
    efficiency_scale,
    kv_capacity_tokens,
    prior_decode_tokens_per_s,
    step_seconds,
)
from fleetgate.emulator.config import EmulatorConfig
from fleetgate.emulator.perfmodel import EngineSim, SchedulerConfig, TokenEvent

P8B = MODEL_PROFILES["llama-3.1-8b"]
P70B = MODEL_PROFILES["llama-3.1-70b-fp8"]


def gpu_with_kv_tokens(tokens: int, base: str = "h100") -> GpuSpec:
    """A GPU like ``base`` whose HBM leaves exactly ``tokens`` KV tokens for the 8B model."""
    free = tokens * P8B.kv_bytes_per_token + P8B.weight_bytes + 1.0 * GB
    return dataclasses.replace(GPUS[base], hbm_gb=free / 0.9 / GB + 1e-9)


def run(sim: EngineSim, max_steps: int = 100_000) -> tuple[float, list[tuple[float, TokenEvent]]]:
    """Step until idle; returns the virtual time and every event with its time."""
    now, events = 0.0, []
    for _ in range(max_steps):
        duration = sim.next_step_duration()
        if duration is None:
            return now, events
        now += duration
        events += [(now, ev) for ev in sim.step()]
    raise AssertionError("the simulation did not drain")


def decode_step(sim: EngineSim, n: int, prompt: int) -> float:
    """Duration of a decode step once ``n`` requests of ``prompt`` tokens are all decoding."""
    for i in range(n):
        sim.add(f"r{i}", prompt, 1000)
    started = 0
    while started < n:
        started += sum(ev.index == 0 for ev in sim.step())
    duration = sim.next_step_duration()
    assert duration is not None
    return duration


# -- the step cost ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("smaller", "larger"),
    [
        (StepLoad(1, 1000, 1000), StepLoad(64, 64_000, 64_000)),  # batch
        (StepLoad(32, 32 * 500, 32 * 500), StepLoad(32, 32 * 8000, 32 * 8000)),  # context
        (StepLoad(32, 32_000, 32_000), StepLoad(32 + 4096, 40_000, 9e6)),  # + prefill chunk
        (StepLoad(256, 256_000, 256_000), StepLoad(1024, 1_024_000, 1_024_000)),  # compute
    ],
)
@pytest.mark.parametrize("gpu", sorted(GPUS))
def test_step_time_grows_with_batch_and_context(
    gpu: str, smaller: StepLoad, larger: StepLoad
) -> None:
    assert step_seconds(GPUS[gpu], P8B, smaller) < step_seconds(GPUS[gpu], P8B, larger)


@pytest.mark.parametrize("gpu", sorted(GPUS))
def test_sim_decode_step_grows_with_running_batch(gpu: str) -> None:
    steps = [decode_step(EngineSim(GPUS[gpu], P8B), n, 2000) for n in (1, 16, 128)]
    assert steps == sorted(steps) and steps[0] < steps[-1]


@pytest.mark.parametrize("gpu", sorted(GPUS))
def test_stock_is_slower_than_tuned(gpu: str) -> None:
    times = {}
    for stack in ("stock", "tuned"):
        sim = EngineSim(GPUS[gpu], P8B, stack=stack)
        for i in range(8):
            sim.add(f"r{i}", 1500, 200)
        times[stack], _ = run(sim)
    assert times["tuned"] < times["stock"]
    assert prior_decode_tokens_per_s(GPUS[gpu], P8B, stack="tuned") > prior_decode_tokens_per_s(
        GPUS[gpu], P8B, stack="stock"
    )


@pytest.mark.parametrize(
    ("gpu", "small_tp", "large_tp"),
    [("h200", 1, 2), ("mi300x", 1, 4), ("h100", 2, 4), ("b200", 1, 8)],
)
def test_tensor_parallel_speeds_up_decode_and_adds_kv(
    gpu: str, small_tp: int, large_tp: int
) -> None:
    small = EngineSim(GPUS[gpu], P70B, tp=small_tp)
    large = EngineSim(GPUS[gpu], P70B, tp=large_tp)
    assert large.kv_capacity_tokens > small.kv_capacity_tokens
    assert decode_step(large, 8, 1000) < decode_step(small, 8, 1000)


# -- scheduling ------------------------------------------------------------------------------
@pytest.mark.parametrize(("reserve", "max_running"), [(1.0, 5), (0.5, 6)])
def test_kv_capacity_limits_the_running_batch(reserve: float, max_running: int) -> None:
    sched = SchedulerConfig(kv_reserve_ratio=reserve, max_num_batched_tokens=100_000)
    sim = EngineSim(gpu_with_kv_tokens(10_000), P8B, scheduler=sched)
    assert sim.kv_capacity_tokens == 10_000
    for i in range(12):
        sim.add(f"r{i}", 1000, 1000)
    sim.step()
    assert sim.num_running == max_running
    assert sim.num_waiting == 12 - max_running
    _, events = run(sim)
    finished = [ev for _, ev in events if ev.finished]
    assert len(finished) == 12
    if reserve == 1.0:  # a full reservation never needs to preempt
        assert sim.counters().preemptions_total == 0


def test_vllm_style_admission_preempts_and_still_completes_every_request() -> None:
    sim = EngineSim(gpu_with_kv_tokens(10_000), P8B, scheduler=SchedulerConfig())
    for i in range(12):
        sim.add(f"r{i}", 1000, 1000)
    _, events = run(sim)
    per_request: dict[str, list[int]] = {}
    for _, ev in events:
        per_request.setdefault(ev.request_id, []).append(ev.index)
    assert sim.counters().preemptions_total > 0
    assert all(idx == list(range(1000)) for idx in per_request.values())
    assert len(per_request) == 12 and sim.kv_used_tokens == 0


def test_max_num_seqs_caps_the_batch() -> None:
    sim = EngineSim(GPUS["mi325x"], P8B, scheduler=SchedulerConfig(max_num_seqs=4))
    for i in range(10):
        sim.add(f"r{i}", 10, 50)
    sim.step()
    assert (sim.num_running, sim.num_waiting) == (4, 6)


@pytest.mark.parametrize(
    ("prompt", "budget", "prefill_steps"),
    [(20_000, 8192, 3), (8192, 8192, 1), (8193, 8192, 2), (5000, 2048, 3)],
)
def test_chunked_prefill_spreads_a_long_prompt_over_steps(
    prompt: int, budget: int, prefill_steps: int
) -> None:
    sim = EngineSim(GPUS["h200"], P8B, scheduler=SchedulerConfig(max_num_batched_tokens=budget))
    sim.add("long", prompt, 4)
    steps_until_first = 0
    while True:
        steps_until_first += 1
        if any(ev.index == 0 for ev in sim.step()):
            break
    assert steps_until_first == prefill_steps


def test_decodes_keep_flowing_while_a_long_prompt_prefills() -> None:
    sim = EngineSim(GPUS["h100"], P8B, scheduler=SchedulerConfig(max_num_batched_tokens=4096))
    sim.add("chat", 100, 50)
    sim.step()  # its prefill
    sim.add("long", 9000, 4)
    chat_tokens = 0
    for _ in range(2):  # "long" needs three chunked steps; "chat" decodes in each
        events = sim.step()
        assert all(ev.request_id == "chat" for ev in events)
        chat_tokens += len(events)
    assert chat_tokens == 2
    assert any(ev.request_id == "long" and ev.index == 0 for ev in sim.step())


def test_ttft_waits_for_kv_while_itl_does_not() -> None:
    sched = SchedulerConfig(kv_reserve_ratio=1.0)
    sim = EngineSim(gpu_with_kv_tokens(4_000), P8B, scheduler=sched)
    for i in range(4):
        sim.add(f"r{i}", 1000, 1000)  # only two fit at a time
    _, events = run(sim)
    first = {ev.request_id: t for t, ev in events if ev.index == 0}
    assert first["r2"] > first["r1"] * 10  # queued behind a whole generation


# -- aborts and counters ---------------------------------------------------------------------
def test_abort_frees_kv_and_leaves_the_batch_at_once() -> None:
    sim = EngineSim(GPUS["h100"], P8B)
    sim.add("a", 500, 100)
    sim.add("b", 500, 100)
    for _ in range(3):
        sim.step()
    used = sim.kv_used_tokens
    assert sim.abort("a") is True
    assert sim.num_running == 1 and 0 < sim.kv_used_tokens < used
    assert sim.abort("a") is False and sim.abort("nope") is False
    assert sim.abort("b") is True
    assert (sim.num_running, sim.kv_used_tokens, sim.kv_usage) == (0, 0, 0.0)
    assert sim.next_step_duration() is None and sim.counters().aborted_total == 2


def test_abort_of_a_waiting_request_and_of_one_in_the_planned_step() -> None:
    sim = EngineSim(GPUS["h100"], P8B, scheduler=SchedulerConfig(max_num_seqs=1))
    sim.add("running", 10, 10)
    sim.add("queued", 10, 10)
    assert sim.next_step_duration() is not None  # plans a step with "running" in it
    assert sim.abort("queued") and sim.abort("running")
    assert sim.step() == [] and sim.num_waiting == 0


def test_counters_and_exact_token_counts() -> None:
    sim = EngineSim(GPUS["mi300x"], P8B)
    for i, n in enumerate((1, 2, 17)):
        sim.add(f"r{i}", 100 + i, n)
    _, events = run(sim)
    c = sim.counters()
    assert (c.prompt_tokens_total, c.generation_tokens_total, c.finished_total) == (303, 20, 3)
    assert [ev.finished for _, ev in events if ev.request_id == "r1"] == [False, True]


def test_the_model_is_deterministic() -> None:
    def trace() -> list[tuple[float, TokenEvent]]:
        sim = EngineSim(GPUS["b200"], P70B, stack="tuned")
        for i in range(20):
            sim.add(f"r{i}", 300 + 97 * i, 30 + i)
        return run(sim)[1]

    assert trace() == trace()


@pytest.mark.parametrize(("prompt", "out"), [(0, 5), (5, 0), (500_000, 1)])
def test_add_rejects_impossible_requests(prompt: int, out: int) -> None:
    with pytest.raises(ValueError):
        EngineSim(GPUS["h100"], P8B).add("x", prompt, out)


def test_add_rejects_a_duplicate_id() -> None:
    sim = EngineSim(GPUS["h100"], P8B)
    sim.add("x", 5, 5)
    with pytest.raises(ValueError):
        sim.add("x", 5, 5)


# -- catalog and config ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "profile"),
    [
        ("meta-llama/Llama-3.1-70B-Instruct", P70B),
        ("amd/Llama-3.1-70b-FP8-KV", P70B),
        ("meta-llama/Llama-3.1-8B-Instruct", P8B),
        ("anything", P8B),
    ],
)
def test_profile_for_served_name(name: str, profile: object) -> None:
    assert profile_for_served_name(name) is profile


def test_catalog_kv_sizes_and_capacity() -> None:
    assert P70B.kv_bytes_per_token == 160 * 1024 and P8B.kv_bytes_per_token == 128 * 1024
    assert {g.vendor for g in GPUS.values()} == {"amd", "nvidia"}
    assert all((g.runtime == "rocm") == (g.vendor == "amd") for g in GPUS.values())
    assert kv_capacity_tokens(GPUS["h100"], P70B, tp=1) < P70B.max_model_len
    assert kv_capacity_tokens(GPUS["mi300x"], P70B, tp=1) > 8 * kv_capacity_tokens(
        GPUS["h100"], P70B, tp=1
    )


def test_config_picks_or_checks_tensor_parallel() -> None:
    base = {"engine": "vllm", "gpu": "h100", "served_models": ["llama-3.1-70b"]}
    assert EmulatorConfig(**base).tensor_parallel == 2
    assert EmulatorConfig(**base | {"gpu": "mi300x"}).tensor_parallel == 1
    with pytest.raises(ValueError, match="tp >= 2"):
        EmulatorConfig(**base | {"tp": 1})
    with pytest.raises(ValueError):
        EmulatorConfig(**base | {"gpu": "tpu"})


# -- efficiency per (GPU, stack, model size, step size) -----------------------------------------
@pytest.mark.parametrize("stack", ["stock", "tuned"])
@pytest.mark.parametrize("gpu", sorted(GPUS))
def test_small_models_never_run_more_efficiently_than_large_ones(gpu: str, stack: str) -> None:
    scales = [efficiency_scale(GPUS[gpu], dataclasses.replace(P8B, active_params=p), stack)
              for p in (1e9, 8e9, 30e9, 70e9, 400e9)]
    assert scales == sorted(scales) and scales[0] > 0 and scales[-2] == scales[-1] == 1.0


@pytest.mark.parametrize("stack", ["stock", "tuned"])
@pytest.mark.parametrize("gpu", sorted(GPUS))
def test_a_small_decode_batch_stays_memory_bound(gpu: str, stack: str) -> None:
    """GEMM_HALF_TOKENS only makes medium steps costlier: at batch 16 with no context the
    step is the weights over bandwidth (that step size's, ``bandwidth_efficiency``),
    whatever the model."""
    g = GPUS[gpu]
    for profile in (P8B, P70B):
        scale = efficiency_scale(g, profile, stack)
        eta = bandwidth_efficiency(g, profile, 16, stack)
        t_mem = profile.weight_bytes / (scale * eta * g.hbm_tb_s * 1e12)
        overhead = g.step_overhead_ms.get(stack) * 1e-3
        step = step_seconds(g, profile, StepLoad(16, 0.0, 0.0), 1, stack)
        assert step == pytest.approx(t_mem + overhead)


@pytest.mark.parametrize("stack", ["stock", "tuned"])
@pytest.mark.parametrize("gpu", sorted(GPUS))
def test_bandwidth_efficiency_falls_from_its_small_step_value_to_eta_bw(gpu: str,
                                                                         stack: str) -> None:
    """16-bit weights: eta_small at a one-token step, never rising with the step size, down
    to eta_bw for large steps; FP8 weights (and GPUs without a small-step figure): eta_bw
    at every step size, so no FP8 step moved with the small-batch calibration."""
    g = GPUS[gpu]
    large, small = g.eta_bw.get(stack), g.eta_bw_small.get(stack)
    etas = [bandwidth_efficiency(g, P8B, t, stack) for t in (1, 2, 8, 16, 64, 256, 8192)]
    assert etas == sorted(etas, reverse=True)
    assert etas[0] == pytest.approx(max(small, large))
    assert etas[-1] == pytest.approx(large, abs=0.01)
    assert all(bandwidth_efficiency(g, P70B, t, stack) == large for t in (1, 8, 256))


def test_8b_batch_one_decode_step_on_h100_matches_vllms_own_fit() -> None:
    """vLLM 0.19.1's single-request ITL on one H100 (blog "The State of FP8 KV-Cache...",
    BF16 KV): 6.44 ms + 4.37e-5 ms per context token; the stock roofline within 3%."""
    for context in (1_000, 32_000):
        step = step_seconds(GPUS["h100"], P8B, StepLoad(1, context, context), 1, "stock")
        assert step * 1e3 == pytest.approx(6.44 + 4.37e-5 * context, rel=0.03)


def test_same_software_orderings_on_paper() -> None:
    """gpus.md "Same software, different GPU": stock H200 beats stock MI300X on one 70B
    stream and by more on 8B; MI300X's wins at high concurrency come from its KV room."""
    h200, mi300x = GPUS["h200"], GPUS["mi300x"]
    one = StepLoad(1, 1000, 1000)
    big = StepLoad(256, 256 * 1500, 256 * 1500)
    ratio_70b = step_seconds(mi300x, P70B, one) / step_seconds(h200, P70B, one)
    ratio_8b = step_seconds(mi300x, P8B, big) / step_seconds(h200, P8B, big)
    assert 1.05 < ratio_70b < ratio_8b
    assert kv_capacity_tokens(mi300x, P70B) > 1.8 * kv_capacity_tokens(h200, P70B)
