"""The GPU catalog, model profiles and the roofline cost of one engine step.

One place for GPU facts (``/work/shared/reference/gpus.md`` §2.1 and §6): the emulated engines,
the fleet simulator and the router's cost prior all read them from here. Prices are defaults
for demos and priors only (the "mid" column of gpus.md §6); the gateway takes real prices from
its config.

The cost of one continuous-batching step (gpus.md §4.1), for a replica of tensor-parallel
degree TP running a step that processes ``T`` tokens (decodes + prefill-chunk tokens), reads
``R`` KV-cache tokens and attends over ``A`` (query, key) pairs:

    t_mem  = (W/TP + kv·R/TP) / (η_bw·BW)
    t_cmp  = (2·P_act·T + 4·L·d_model·A) / (TP·η_fl·F)
    t_comm = 2·L·(alpha + 2·(TP-1)/TP · T·d_model·2 B / BW_link)        (0 when TP = 1)
    t_step = max(t_mem, t_cmp) + t_comm + t_ovh

W = weight bytes, kv = KV bytes per token, F = dense peak FLOPS of the weights' precision,
η and t_ovh per software stack ("stock" upstream release vs "tuned"), both η scaled by the
GPU's small-model factor for models under 20B active parameters. alpha and BW_link (the
all-reduce latency and per-direction link bandwidth) are estimates [E]. KV capacity:
``K_max = (HBM·gpu_memory_utilization - W/TP - workspace)·TP / kv``.

May touch: nothing but the standard library (pure data and arithmetic). Must not touch: I/O,
clocks, asyncio, other fleetgate packages.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

Stack = Literal["stock", "tuned"]
Vendor = Literal["amd", "nvidia"]
STACKS: tuple[Stack, ...] = ("stock", "tuned")
GB = 1e9  # catalog sizes are decimal gigabytes, as datasheets print them


@dataclass(frozen=True)
class PerStack:
    """One efficiency figure for the upstream release ("stock") and for a tuned stack."""

    stock: float
    tuned: float

    def get(self, stack: str) -> float:
        if stack not in STACKS:
            raise ValueError(f"stack must be one of {STACKS}, got {stack!r}")
        return self.stock if stack == "stock" else self.tuned


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator type: datasheet figures [S] and serving efficiencies [E]."""

    name: str
    vendor: Vendor
    runtime: Literal["rocm", "cuda"]
    hbm_gb: float
    hbm_tb_s: float
    bf16_tflops: float
    fp8_tflops: float
    fp4_tflops: float | None
    default_price_per_gpu_hour: float
    eta_bw: PerStack
    eta_fl: PerStack
    step_overhead_ms: PerStack
    link_gb_s: float  # per-GPU, per-direction scale-up link bandwidth (NVLink / Infinity Fabric)
    allreduce_latency_us: float  # alpha: fixed cost of one small all-reduce [E]
    small_model_efficiency: PerStack = PerStack(1.0, 1.0)  # x eta below 20B active params [E]

    def peak_flops(self, bytes_per_weight: float) -> float:
        """Dense FLOP/s for the compute precision that matches the weights."""
        if bytes_per_weight >= 2:
            return self.bf16_tflops * 1e12
        if bytes_per_weight >= 1 or self.fp4_tflops is None:
            return self.fp8_tflops * 1e12
        return self.fp4_tflops * 1e12


def _gpu(
    name: str,
    vendor: Vendor,
    hbm: float,
    bw: float,
    bf16: float,
    fp8: float,
    fp4: float | None,
    price: float,
    eta_bw: tuple[float, float],
    eta_fl: tuple[float, float],
    ovh: tuple[float, float],
    link: float,
    alpha: float,
    small: tuple[float, float] = (1.0, 1.0),
) -> GpuSpec:
    return GpuSpec(
        name=name,
        vendor=vendor,
        runtime="rocm" if vendor == "amd" else "cuda",
        hbm_gb=hbm,
        hbm_tb_s=bw,
        bf16_tflops=bf16,
        fp8_tflops=fp8,
        fp4_tflops=fp4,
        default_price_per_gpu_hour=price,
        eta_bw=PerStack(*eta_bw),
        eta_fl=PerStack(*eta_fl),
        step_overhead_ms=PerStack(*ovh),
        link_gb_s=link,
        allreduce_latency_us=alpha,
        small_model_efficiency=PerStack(*small),
    )


# gpus.md §6, one row per GPU: name, vendor, HBM GB, TB/s, BF16 / FP8 / FP4 dense TFLOPS,
# mid $/GPU-hr, eta_bw, eta_fl and step overhead ms as (stock, tuned), link GB/s per
# direction (NVLink4 450, NVLink5 900, MI300X/MI325X 7 x 64 GB/s Infinity Fabric, MI355X
# 7 x 76.8), all-reduce alpha us, and the small-model efficiency multiplier (stock, tuned):
# stock ROCm stacks lose much more on small dense models than on 70B (gpus.md: H200 beats
# MI300X by 1.40-2.06x on Llama-8B at c=256 with the same vLLM, but not on 70B) [E].
# fmt: off
GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        _gpu("h100", "nvidia", 80, 3.35, 989, 1979, None, 2.95,
             (0.52, 0.65), (0.40, 0.55), (2.0, 0.7), 450, 8),
        _gpu("h200", "nvidia", 141, 4.8, 989, 1979, None, 3.60,
             (0.52, 0.65), (0.40, 0.55), (2.0, 0.7), 450, 8),
        _gpu("b200", "nvidia", 180, 7.7, 2250, 4500, 9000, 6.00,
             (0.48, 0.65), (0.35, 0.55), (2.0, 0.7), 900, 6),
        _gpu("mi300x", "amd", 192, 5.3, 1307.4, 2614.9, None, 2.00,
             (0.42, 0.60), (0.30, 0.45), (3.0, 1.0), 448, 12, small=(0.70, 0.85)),
        _gpu("mi325x", "amd", 256, 6.0, 1307.4, 2614.9, None, 2.25,
             (0.42, 0.60), (0.30, 0.45), (3.0, 1.0), 448, 12, small=(0.70, 0.85)),
        _gpu("mi355x", "amd", 288, 8.0, 2516.6, 5033.2, 10066, 3.00,
             (0.40, 0.60), (0.28, 0.45), (3.0, 1.0), 537, 10, small=(0.70, 0.85)),
    )
}
# fmt: on


@dataclass(frozen=True)
class ModelProfile:
    """What the performance model needs to know about a served model."""

    name: str
    params: float
    active_params: float
    bytes_per_weight: float
    layers: int
    kv_heads: int
    head_dim: int
    d_model: int
    kv_bytes_per_elem: float
    max_model_len: int
    architecture: str = "LlamaForCausalLM"

    @property
    def weight_bytes(self) -> float:
        return self.params * self.bytes_per_weight

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V, every layer: 2·L·n_kv·d_head·b_kv."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.kv_bytes_per_elem


def _llama(
    name: str,
    params: float,
    bpw: float,
    layers: int,
    d_model: int,
    kv_bytes: float,
    max_len: int = 8192,
) -> ModelProfile:
    return ModelProfile(
        name=name,
        params=params,
        active_params=params,
        bytes_per_weight=bpw,
        layers=layers,
        kv_heads=8,
        head_dim=128,
        d_model=d_model,
        kv_bytes_per_elem=kv_bytes,
        max_model_len=max_len,
    )


MODEL_PROFILES: dict[str, ModelProfile] = {
    p.name: p
    for p in (
        _llama("llama-3.1-8b", 8.03e9, 2, 32, 4096, 2),
        _llama("llama-3.1-70b-fp8", 70.6e9, 1, 80, 8192, 1),
        _llama("llama-3.3-70b-fp8", 70.6e9, 1, 80, 8192, 1),
        # MLPerf Inference Llama-2-70B (FP8 weights and KV in the submissions), 4k context.
        _llama("llama-2-70b-fp8", 68.98e9, 1, 80, 8192, 1, max_len=4096),
    )
}
DEFAULT_SMALL_PROFILE = "llama-3.1-8b"
DEFAULT_LARGE_PROFILE = "llama-3.1-70b-fp8"


def profile_for_served_name(name: str) -> ModelProfile:
    """The default profile for a served model name: "70b" in it -> 70B FP8, else 8B."""
    key = DEFAULT_LARGE_PROFILE if "70b" in name.lower() else DEFAULT_SMALL_PROFILE
    return MODEL_PROFILES[key]


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


SMALL_MODEL_ACTIVE_PARAMS = 20e9


def efficiency_scale(gpu: GpuSpec, profile: ModelProfile, stack: str) -> float:
    """Multiplier on eta_bw and eta_fl: the GPU's small-model factor below 20B active params."""
    if profile.active_params < SMALL_MODEL_ACTIVE_PARAMS:
        return gpu.small_model_efficiency.get(stack)
    return 1.0


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
    bw = scale * gpu.eta_bw.get(stack) * gpu.hbm_tb_s * 1e12
    flops = scale * gpu.eta_fl.get(stack) * gpu.peak_flops(profile.bytes_per_weight)
    bytes_moved = (profile.weight_bytes + profile.kv_bytes_per_token * load.kv_tokens_read) / tp
    t_mem = bytes_moved / bw
    work = 2 * profile.active_params * load.tokens
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
