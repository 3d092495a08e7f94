"""The roofline cost of one continuous-batching engine step, and the KV capacity of a replica.

For a replica of tensor-parallel degree TP running a step that processes ``T`` tokens
(decodes + prefill-chunk tokens), reads ``R`` KV-cache tokens and attends over ``A``
(query, key) pairs (gpus.md §4.1):

    t_mem  = (W/TP + kv·R/TP) / (s·η_bw(T)·BW)
    t_cmp  = (2·P_act·(T + T_half) + 4·L·d_model·A) / (TP·s·η_fl·F)
    t_comm = 2·L·(alpha + 2·(TP-1)/TP · T·d_model·2 B / BW_link)        (0 when TP = 1)
    t_step = max(t_mem, t_cmp) + t_comm + t_ovh

W = weight bytes, kv = KV bytes per token, F = dense peak FLOPS of the weights' precision,
η and t_ovh per (GPU, software stack) (``gpus.py``). Efficiency is a function of (GPU,
stack, model size, step size), gpus.md §4.1:

* step size: a step's GEMMs over T tokens run at T/(T + T_half) of the large-GEMM
  efficiency η_fl (small GEMMs fill few tiles), which is the same as paying T_half tokens
  of extra work: t_cmp stays linear and increasing in T. T_half = 64 is well below every
  GPU's ridge point (~120-300 tokens), so a small decode batch stays memory-bound.
* model size: s = min(1, g(P_act)/g(70e9)) with g(P) = P/(P + P_half(GPU, stack)), the
  efficiency relative to a 70B-class model (the calibration anchor); P_half = 0 (NVIDIA
  rows) means no loss on small models; stock ROCm loses most (small kernels, launches).
* small steps (16-bit weights): η_bw(T) = η_bw + (η_small - η_bw)·S/(S + T - 1), S = 16.
  A decode step of a few sequences is a few long streaming kernels in one CUDA graph (GEMV
  weight reads, split-KV attention over a few long contexts) that run near the HBM
  roofline: vLLM's own single-request fit on H100 reads KV at 0.90 of peak and the 8B
  weights plus the fixed cost in 6.44 ms. As T grows the step becomes GEMM tiles, paged
  attention over many short sequences and per-sequence sampling, which the large-batch
  η_bw (fitted on NIM, MLPerf and the same-vLLM comparisons) describes. FP8 weights keep
  η_bw at every T: their small-M GEMMs run through scaled-mm tensor-core kernels with
  per-token activation quantization, whose streaming at batch 1 is what η_bw was fitted on
  (NIM's 70B FP8 single stream). η_small = 0 (AMD rows) means no small-step regime.

KV capacity: ``K_max = (HBM·gpu_memory_utilization - W/TP - workspace)·TP / kv``.

Used by the emulated engines, the simulator and the router's prior.

May touch: the catalog's data modules, math. Must not touch: I/O, clocks, asyncio.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fleetgate.catalog.gpus import GB, GpuSpec
from fleetgate.catalog.models import ModelProfile


def kv_capacity_tokens(
    gpu: GpuSpec,
    profile: ModelProfile,
    tp: int = 1,
    gpu_memory_utilization: float = 0.9,
    workspace_gb: float = 1.0,
) -> int:
    """K_max: KV-cache tokens a replica can hold (0 when the weights do not fit)."""
    free_per_gpu = gpu.hbm_gb * GB * gpu_memory_utilization - profile.weight_bytes / tp
    free_per_gpu -= workspace_gb * GB
    return max(0, math.floor(free_per_gpu * tp / profile.kv_bytes_per_token))


def min_tensor_parallel(
    gpu: GpuSpec,
    profile: ModelProfile,
    max_model_len: int,
    gpu_memory_utilization: float = 0.9,
    workspace_gb: float = 1.0,
) -> int:
    """Smallest power-of-two TP (<= 8) whose KV capacity holds one max_model_len sequence."""
    for tp in (1, 2, 4, 8):
        if (
            kv_capacity_tokens(gpu, profile, tp, gpu_memory_utilization, workspace_gb)
            >= max_model_len
        ):
            return tp
    raise ValueError(f"{profile.name} does not fit on 8 x {gpu.name}")


REFERENCE_ACTIVE_PARAMS = 70e9  # the size the catalog's eta are calibrated on (gpus.md)
GEMM_HALF_TOKENS = 64  # T_half: tokens at which a step's GEMMs reach half of eta_fl [E]
SMALL_STEP_TOKENS = 16  # S: step size at which eta_bw is halfway back from eta_small [E]


def bandwidth_efficiency(gpu: GpuSpec, profile: ModelProfile, tokens: int, stack: str) -> float:
    """eta_bw of a step of ``tokens`` tokens (before the model-size scale): for 16-bit
    weights on a GPU with a small-batch figure, ``eta_bw + (eta_small - eta_bw) *
    S / (S + T - 1)`` with S = ``SMALL_STEP_TOKENS``; else eta_bw at every step size."""
    large = gpu.eta_bw.get(stack)
    small = gpu.eta_bw_small.get(stack)
    if small <= large or profile.bytes_per_weight < 2:
        return large
    t = max(1, tokens)
    return large + (small - large) * SMALL_STEP_TOKENS / (SMALL_STEP_TOKENS + t - 1)


def efficiency_scale(gpu: GpuSpec, profile: ModelProfile, stack: str) -> float:
    """Multiplier on eta_bw and eta_fl for the model's size: ``min(1, g(P)/g(70e9))`` with
    ``g(P) = P/(P + P_half)``, P_half the (GPU, stack)'s ``size_half_params`` (0: 1.0)."""
    active = profile.active_params
    if active >= REFERENCE_ACTIVE_PARAMS:
        return 1.0
    half = gpu.size_half_params.get(stack)
    if half <= 0:
        return 1.0
    return active * (REFERENCE_ACTIVE_PARAMS + half) / ((active + half) * REFERENCE_ACTIVE_PARAMS)


@dataclass(frozen=True)
class StepLoad:
    """What one engine step processes (see the module docstring for the symbols)."""

    tokens: int  # T: decode tokens + prefill-chunk tokens
    kv_tokens_read: float  # R: KV-cache tokens read (context of every sequence in the step)
    attention_pairs: float  # A: sum over processed tokens of the context each attends to


def step_seconds(
    gpu: GpuSpec, profile: ModelProfile, load: StepLoad, tp: int = 1, stack: str = "stock"
) -> float:
    """Roofline duration of one continuous-batching step (module docstring formula)."""
    scale = efficiency_scale(gpu, profile, stack)
    bw = scale * bandwidth_efficiency(gpu, profile, load.tokens, stack) * gpu.hbm_tb_s * 1e12
    flops = scale * gpu.eta_fl.get(stack) * gpu.peak_flops(profile.bytes_per_weight)
    bytes_moved = (profile.weight_bytes + profile.kv_bytes_per_token * load.kv_tokens_read) / tp
    t_mem = bytes_moved / bw
    work = 2 * profile.active_params * (load.tokens + GEMM_HALF_TOKENS)
    work += 4 * profile.layers * profile.d_model * load.attention_pairs
    t_cmp = work / (tp * flops)
    t_comm = 0.0
    if tp > 1:
        per_reduce = gpu.allreduce_latency_us * 1e-6
        per_reduce += 2 * (tp - 1) / tp * load.tokens * profile.d_model * 2 / (gpu.link_gb_s * GB)
        t_comm = 2 * profile.layers * per_reduce
    return max(t_mem, t_cmp) + t_comm + gpu.step_overhead_ms.get(stack) * 1e-3


PRIOR_BATCH = 32
PRIOR_CONTEXT_TOKENS = 2048


def prior_decode_tokens_per_s(
    gpu: GpuSpec, profile: ModelProfile, tp: int = 1, stack: str = "stock"
) -> float:
    """Ideal steady-state decode throughput of one replica, the router's cost prior.

    Formula: B = min(32, K_max // 2048) sequences, each with a 2,048-token context, decode only
    (prefill time excluded); one step reads the weights and B·2048 KV tokens, so
    ``tokens/s = B / step_seconds(T=B, R=B·2048, A=B·2048)``. Returns 0 when the model does
    not fit (K_max < 2048). A moderate batch, not the saturation point: it is what a replica
    sustains with headroom for an SLO.
    """
    batch = min(PRIOR_BATCH, kv_capacity_tokens(gpu, profile, tp) // PRIOR_CONTEXT_TOKENS)
    if batch <= 0:
        return 0.0
    context = batch * PRIOR_CONTEXT_TOKENS
    load = StepLoad(tokens=batch, kv_tokens_read=context, attention_pairs=context)
    return batch / step_seconds(gpu, profile, load, tp, stack)
