"""The performance prior of an endpoint: what its GPU, model and TP degree promise on paper.

From the GPU catalog and the model profile (``catalog/gpus.py``), linearised around the
memory-bound decode regime where serving lives (batch well below the compute ridge):

    decode step(B, C)  ~  step_base_s + step_per_ctx_token_s * B * C
    step_base_s        =  step_seconds(T=1, R=0)          (weights over bandwidth + overhead)
    step_per_ctx_token_s = kv_bytes_per_token / (TP * eta_bw * BW)
    prefill(n)         ~  step_base_s + prefill_s_per_token * n
    prefill_s_per_token = 2 * P_active / (TP * eta_fl * F)

with B sequences of C context tokens each. The router multiplies these by a correction it
learns online (measured / predicted), so a wrong prior (another software stack, a CPU
engine, an emulator running X times faster) is corrected after a few requests; ``time_scale``
lets the gateway start from the right scale when it knows it (emulated engines' ``speed``).

May touch: catalog (pure data). Must not touch: I/O, clocks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from fleetgate.catalog.gpus import GPUS
from fleetgate.catalog.models import MODEL_PROFILES, profile_for_served_name
from fleetgate.catalog.roofline import StepLoad, kv_capacity_tokens, step_seconds

MAX_NUM_SEQS = 256  # vLLM's default max_num_seqs; SGLang's is similar in practice


@dataclass(frozen=True, slots=True)
class Prior:
    step_base_s: float
    step_per_ctx_token_s: float
    prefill_s_per_token: float
    kv_capacity_tokens: float
    max_batch: float
    max_model_len: float


# An engine on an unknown accelerator (a CPU test server): deliberately pessimistic, the
# learned correction takes over within a few requests.
UNKNOWN_PRIOR = Prior(0.05, 1e-7, 1e-3, 65536.0, 64.0, 1e9)


def endpoint_prior(accelerator: str, served_model: str, tp: int = 1, stack: str = "stock",
                   time_scale: float = 1.0, max_model_len: int | None = None,
                   profile_name: str | None = None) -> Prior:
    gpu = GPUS.get(accelerator)
    if gpu is None:
        return replace(UNKNOWN_PRIOR, max_model_len=float(max_model_len or 1e9))
    profile = (MODEL_PROFILES[profile_name] if profile_name in MODEL_PROFILES
               else profile_for_served_name(served_model))
    base = step_seconds(gpu, profile, StepLoad(1, 0.0, 0.0), tp, stack)
    bandwidth = gpu.eta_bw.get(stack) * gpu.hbm_tb_s * 1e12
    flops = gpu.eta_fl.get(stack) * gpu.peak_flops(profile.bytes_per_weight)
    return Prior(
        step_base_s=base * time_scale,
        step_per_ctx_token_s=profile.kv_bytes_per_token / (tp * bandwidth) * time_scale,
        prefill_s_per_token=2 * profile.active_params / (tp * flops) * time_scale,
        kv_capacity_tokens=float(kv_capacity_tokens(gpu, profile, tp)),
        max_batch=float(MAX_NUM_SEQS),
        max_model_len=float(max_model_len or profile.max_model_len),
    )
