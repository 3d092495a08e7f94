"""The performance prior of an endpoint: what its GPU, model and TP degree promise on paper.

From the GPU catalog and the model profile (``catalog/gpus.py``), linearised around the
memory-bound decode regime where serving lives (batch well below the compute ridge):

    decode step(B, C)  ~  step_base_s + step_per_ctx_token_s * B * C
    step_base_s        =  step_seconds(T=1, R=0)          (weights over bandwidth + overhead)
    step_per_ctx_token_s = kv_bytes_per_token / (TP * s * eta_bw * BW)
    prefill(n)         ~  step_base_s + prefill_s_per_token * n
    prefill_s_per_token = 2 * P_active / (TP * s * eta_fl * F)

with B sequences of C context tokens each, s the model-size efficiency of the (GPU, stack)
(``roofline.efficiency_scale``). The model's shape comes from the catalog
profile the served name names (``known_profile``); a name the catalog does not know gets
``UNKNOWN_MODEL_PROFILE`` (the largest catalog model's per-token costs, context unknown) and
``profile`` says so, for the one warning the fleet logs. The capacity part (KV tokens, batch
cap, context) is only the guess before the first contact: the collector replaces it with
what the engine reports (``LiveFleet.on_capacity``). The router multiplies these by a correction it
learns online (measured / predicted), so a wrong prior (another software stack, a CPU
engine, an emulator running X times faster) is corrected after a few requests; ``time_scale``
lets the gateway start from the right scale when it knows it (emulated engines' ``speed``).

``static_columns`` lays the priors and the endpoints' prices out as the live fleet's static
matrix.

May touch: catalog (pure data), numpy, routing types. Must not touch: I/O, clocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from fleetgate.catalog.gpus import GPUS
from fleetgate.catalog.models import MODEL_PROFILES, UNKNOWN_MODEL_PROFILE, known_profile
from fleetgate.catalog.roofline import (
    StepLoad,
    efficiency_scale,
    kv_capacity_tokens,
    step_seconds,
)
from fleetgate.routing.types import STATIC_COLUMNS, Endpoint, FloatArray

MAX_NUM_SEQS = 256  # vLLM's default max_num_seqs; SGLang's is similar in practice
# An engine that runs at all holds at least one sequence this long: the KV guess for an
# unknown model never goes below it (the conservative profile's weights may leave no room
# on paper).
MIN_KV_TOKENS = 4096
UNKNOWN_CONTEXT = 1e9  # no context limit known: context_fit keeps the endpoint


@dataclass(frozen=True, slots=True)
class Prior:
    step_base_s: float
    step_per_ctx_token_s: float
    prefill_s_per_token: float
    kv_capacity_tokens: float
    max_batch: float
    max_model_len: float
    profile: str = ""  # the catalog profile the costs come from ("" = unknown accelerator)


# An engine on an unknown accelerator (a CPU test server): deliberately pessimistic, the
# learned correction takes over within a few requests.
UNKNOWN_PRIOR = Prior(0.05, 1e-7, 1e-3, 65536.0, 64.0, UNKNOWN_CONTEXT)


def hosted_prior(tpot_s: float, max_concurrency: int,
                 max_model_len: int | None = None) -> Prior:
    """A hosted API's "prior": a fixed TPOT at any load (``step_base_s``; no per-token or
    prefill cost: the provider's fleet is not ours to model), its cap as the batch, and
    room for that many long requests. The router reads its expected TTFT from the
    ``hosted_ttft_s`` column (``routing/estimate.py``); the learned ``k_tpot``/``k_ttft``
    correct both as for any endpoint."""
    context = float(max_model_len or UNKNOWN_CONTEXT)
    return Prior(step_base_s=tpot_s, step_per_ctx_token_s=0.0, prefill_s_per_token=0.0,
                 kv_capacity_tokens=float(max_concurrency) * min(context, 131072.0),
                 max_batch=float(max_concurrency), max_model_len=context, profile="hosted")


def endpoint_prior(accelerator: str, served_model: str, tp: int = 1, stack: str = "stock",
                   time_scale: float = 1.0, max_model_len: int | None = None,
                   profile_name: str | None = None) -> Prior:
    gpu = GPUS.get(accelerator)
    if gpu is None:
        return replace(UNKNOWN_PRIOR, max_model_len=float(max_model_len or UNKNOWN_CONTEXT))
    profile = (MODEL_PROFILES[profile_name] if profile_name in MODEL_PROFILES
               else known_profile(served_model) or UNKNOWN_MODEL_PROFILE)
    base = step_seconds(gpu, profile, StepLoad(1, 0.0, 0.0), tp, stack)
    scale = efficiency_scale(gpu, profile, stack)
    bandwidth = scale * gpu.eta_bw.get(stack) * gpu.hbm_tb_s * 1e12
    flops = scale * gpu.eta_fl.get(stack) * gpu.peak_flops(profile.bytes_per_weight)
    return Prior(
        step_base_s=base * time_scale,
        step_per_ctx_token_s=profile.kv_bytes_per_token / (tp * bandwidth) * time_scale,
        prefill_s_per_token=2 * profile.active_params / (tp * flops) * time_scale,
        kv_capacity_tokens=float(max(kv_capacity_tokens(gpu, profile, tp),
                                     MIN_KV_TOKENS if profile is UNKNOWN_MODEL_PROFILE else 0)),
        max_batch=float(MAX_NUM_SEQS),
        max_model_len=float(max_model_len or profile.max_model_len or UNKNOWN_CONTEXT),
        profile=profile.name,
    )


def static_columns(endpoints: Sequence[Endpoint], priors: Sequence[Prior]) -> FloatArray:
    """The live fleet's static matrix (``STATIC_COLUMNS`` x endpoints, read-only): each
    endpoint's prior, and the columns its description gives (its price)."""
    by_endpoint = _endpoint_columns(endpoints)
    static = np.array([by_endpoint[name] if name in by_endpoint else
                       [getattr(p, name) for p in priors] for name in STATIC_COLUMNS],
                      dtype=float).reshape(len(STATIC_COLUMNS), len(endpoints))
    static.setflags(write=False)
    return static


def _endpoint_columns(endpoints: Sequence[Endpoint]) -> dict[str, list[float]]:
    """The static columns an endpoint's description gives (its price), not its prior."""
    hosted = [ep.hosted for ep in endpoints]
    return {
        "usd_per_s": [ep.usd_per_s for ep in endpoints],
        "per_token": [0.0 if h is None else 1.0 for h in hosted],
        "usd_per_input_token": [0.0 if h is None else h.price.input_usd_per_mtok / 1e6
                                for h in hosted],
        "usd_per_output_token": [0.0 if h is None else h.price.output_usd_per_mtok / 1e6
                                 for h in hosted],
        "hosted_ttft_s": [0.0 if h is None else h.ttft_s for h in hosted],
    }
