"""The GPU catalog: ONE row per accelerator (datasheet figures and serving efficiencies).

Facts from gpus.md (docs/gpus.md): HBM size and bandwidth,
dense peak FLOPS per precision, a default $/GPU-hour (demos and priors only; the gateway
takes real prices from its config), and per software stack ("stock" upstream release vs
"tuned") the bandwidth and compute efficiencies, the per-step overhead and the model-size
curve (``size_half_params``) the roofline model
(``roofline.py``) uses. Adding a GPU is one row in ``GPUS``; the config schema, the
emulator, the simulator and the cost prior all read it from here.

``ACCELERATORS`` is what a pool's ``accelerator`` may say: every GPU row plus ``cpu`` (a CPU
engine: vendor ``none``, runtime ``cpu``, no performance facts).

May touch: nothing but the standard library (pure data). Must not touch: I/O, other packages.
"""

from __future__ import annotations

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
    # P_half: active parameters at which the stack's kernels reach half their efficiency on
    # ever larger models (0 = no model-size loss); roofline.efficiency_scale [E]
    size_half_params: PerStack = PerStack(0.0, 0.0)
    # eta_bw at a one-token decode step of a 16-bit-weight model (0 = no small-batch regime:
    # eta_bw at every batch); roofline.bandwidth_efficiency blends it into eta_bw as the
    # step grows [E, fitted on vLLM's own single-request numbers, docs/gpus.md]
    eta_bw_small: PerStack = PerStack(0.0, 0.0)

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
    size_half: tuple[float, float] = (0.0, 0.0),
    bw_small: tuple[float, float] = (0.0, 0.0),
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
        size_half_params=PerStack(*size_half),
        eta_bw_small=PerStack(*bw_small),
    )


# gpus.md §6, one row per GPU: name, vendor, HBM GB, TB/s, BF16 / FP8 / FP4 dense TFLOPS,
# mid $/GPU-hr, eta_bw, eta_fl (large-GEMM efficiency, roofline.GEMM_HALF_TOKENS) and step
# overhead ms as (stock, tuned), link GB/s per direction (NVLink4 450, NVLink5 900,
# MI300X/MI325X 7 x 64 GB/s Infinity Fabric, MI355X 7 x 76.8), all-reduce alpha us, and
# P_half (stock, tuned), the model-size curve (roofline.efficiency_scale). Calibrated in
# bench/results/calibration.md [E]: NVIDIA eta on NIM's curve and MLPerf; AMD eta_fl on
# MLPerf (MI300X at 750 W sustains lower clocks than MI325X at 1,000 W); stock ROCm's
# larger per-step overhead and P_half on the same-vLLM H200 vs MI300X comparison (single
# stream 1.12x, 8B at c=256 1.40-2.06x to H200). MI355X: not calibrated, MI325X-like.
# bw_small = eta_bw_small (stock, tuned), the small-step bandwidth efficiency of 16-bit
# weights (roofline.bandwidth_efficiency), with the stock per-step overhead (1.1 ms on
# NVIDIA, 4.6 on ROCm: the newer vLLM's asynchronous scheduling takes ~0.9 ms off both,
# the 3.5 ms vendor gap of the same-vLLM single stream kept), fitted on vLLM 0.19.1's own
# single-request Llama-3.1-8B numbers (H100 6.44 ms + 4.37e-5 ms per context token, B200
# 3.93 ms; docs/gpus.md "Small models at small batch"). AMD: no published small-batch
# figure of the engines' own, so none (eta_bw at every batch).
# fmt: off
GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        _gpu("h100", "nvidia", 80, 3.35, 989, 1979, None, 2.95,
             (0.52, 0.65), (0.40, 0.55), (1.1, 0.7), 450, 8, bw_small=(0.90, 0.90)),
        _gpu("h200", "nvidia", 141, 4.8, 989, 1979, None, 3.60,
             (0.52, 0.65), (0.40, 0.55), (1.1, 0.7), 450, 8, bw_small=(0.90, 0.90)),
        _gpu("b200", "nvidia", 180, 7.7, 2250, 4500, 9000, 6.00,
             (0.48, 0.65), (0.35, 0.55), (1.1, 0.7), 900, 6, bw_small=(0.80, 0.80)),
        _gpu("mi300x", "amd", 192, 5.3, 1307.4, 2614.9, None, 2.00,
             (0.47, 0.60), (0.28, 0.30), (4.6, 1.0), 448, 12, size_half=(5e9, 1.6e9)),
        _gpu("mi325x", "amd", 256, 6.0, 1307.4, 2614.9, None, 2.25,
             (0.47, 0.60), (0.30, 0.38), (4.6, 1.0), 448, 12, size_half=(5e9, 1.6e9)),
        _gpu("mi355x", "amd", 288, 8.0, 2516.6, 5033.2, 10066, 3.00,
             (0.45, 0.60), (0.26, 0.38), (4.6, 1.0), 537, 10, size_half=(5e9, 1.6e9)),
    )
}
# fmt: on




# accelerator -> (vendor, runtime), for the config: every GPU above plus a CPU engine.
ACCELERATORS: dict[str, tuple[str, str]] = {
    **{g.name: (g.vendor, g.runtime) for g in GPUS.values()},
    "cpu": ("none", "cpu"),
}
