"""What one engine step costs beyond the roofline's prefill and decode (``perfmodel.py``
runs the steps): a decode step's time from ``catalog.roofline``, whether it is linear in the
KV tokens it reads (then a run of decode steps is closed-form), and what LoRA adapters add.

LoRA adapters (``add(..., adapter=NAME)``): a step whose batch runs requests of k distinct
adapters takes ``lora_step_seconds(k)`` longer: the batched LoRA kernels' fixed cost
(``LORA_KERNEL_S``: vLLM's Punica shrink/expand launches, two per adapted projection and
layer) plus each adapter's weights read once (rank ``LORA_RANK`` on the q/k/v/o projections
of every layer, 16-bit, at the GPU's bandwidth). As vLLM v1's scheduler does, a waiting
request is skipped (not admitted, the queue behind it goes on) while the running batch
already has ``max_loras`` other adapters (``SchedulerConfig.max_loras``; 0: no limit).
These costs are this model's assumptions (the vLLM docs give no number), not measurements.

May touch: fleetgate.catalog. Must not touch: asyncio, clocks, I/O, HTTP.
"""

from __future__ import annotations

from collections.abc import Callable

from fleetgate.catalog.gpus import GpuSpec
from fleetgate.catalog.models import ModelProfile
from fleetgate.catalog.roofline import StepLoad, step_seconds
from fleetgate.emulator.decoderun import DecodeRun


def decode_seconds(gpu: GpuSpec, profile: ModelProfile, tp: int, stack: str, batch: int,
                   kv_read: float) -> float:
    """One decode step of ``batch`` sequences reading ``kv_read`` KV tokens."""
    load = StepLoad(tokens=batch, kv_tokens_read=kv_read, attention_pairs=kv_read)
    return step_seconds(gpu, profile, load, tp, stack)


def decode_run(batch: int, kv0: int, steps: int, fit: tuple[float, float] | None,
               seconds: Callable[[float], float], lora_s: float) -> DecodeRun:
    """``steps`` decode steps of ``batch`` sequences, step j reading ``kv0 + j*batch`` KV
    tokens: closed-form from ``fit`` (``linear_fit``) when there is one, else each step's
    ``seconds(kv_read)`` summed; ``lora_s`` is what the batch's adapters add to a step."""
    if fit is not None:
        base, per_token = fit
        return DecodeRun(batch, steps, base + per_token * kv0 + lora_s, per_token * batch)
    ends, total = [], 0.0
    for j in range(steps):
        total += seconds(kv0 + j * batch) + lora_s
        ends.append(total)
    return DecodeRun(batch, steps, ends[0], ends[1] - 2 * ends[0], tuple(ends))


def linear_fit(seconds: Callable[[float], float], lo: float,
               hi: float) -> tuple[float, float] | None:
    """(seconds at 0 KV tokens read, seconds per token read) when a decode step's
    ``seconds(kv_read)`` is linear over [lo, hi] (its midpoint on the chord: the step time is
    convex), else None."""
    if hi <= lo:
        return None
    a, b = seconds(lo), seconds(hi)
    if abs(seconds((lo + hi) / 2) - (a + b) / 2) > 1e-9 * b:
        return None
    per_token = (b - a) / (hi - lo)
    return a - per_token * lo, per_token


LORA_RANK = 16  # the adapters' rank the step cost assumes (a common fine-tuning choice)
LORA_TARGETS = 4  # adapted projections per layer: q, k, v, o
LORA_KERNEL_S = 5e-4  # per step with any adapter: ~256 shrink/expand launches of ~2 us
LORA_BYTES_PER_WEIGHT = 2.0


def lora_adapter_seconds(gpu: GpuSpec, profile: ModelProfile, tp: int) -> float:
    """Reading one adapter's weights (A: d x r and B: r x d per adapted projection and
    layer, split over ``tp`` GPUs) at the GPU's HBM bandwidth."""
    weights = profile.layers * LORA_TARGETS * 2 * LORA_RANK * profile.d_model
    return weights * LORA_BYTES_PER_WEIGHT / tp / (gpu.hbm_tb_s * 1e12)


def lora_step_seconds(per_adapter_s: float, adapters: int) -> float:
    """What ``adapters`` distinct adapters in one batch add to its step."""
    return 0.0 if adapters <= 0 else LORA_KERNEL_S + adapters * per_adapter_s
