"""Model profiles: what the performance model needs to know about a served model.

One row per model shape (parameters, precision, layers, KV heads, context). A served name
maps to a profile by ``known_profile`` ("70b" in it -> the 70B FP8 profile, "8b" -> 8B, a
profile's own name -> that profile); the router's prior for a name it does not know is
``UNKNOWN_MODEL_PROFILE`` (conservative: see there), and the engine's own report replaces
the capacity part once it is read. ``profile_for_served_name`` (the emulator's and the
planner's choice for a name: the known profile, else 8B) is what an emulated engine runs.

May touch: nothing but the standard library (pure data). Must not touch: I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


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


# A served name the catalog does not know: the per-token costs of the largest catalog model
# (its weights, FLOPs and KV bytes per token; with a bf16 KV cache, the larger of the two
# precisions), so the router under- rather than over-promises until it has learned the
# endpoint. Its context is not guessed (``max_model_len`` 0 = unknown): the engine reports
# its own at the first contact, and a guessed short context would turn requests the engine
# accepts into 400s.
_LARGEST = max(MODEL_PROFILES.values(), key=lambda p: (p.weight_bytes, p.kv_bytes_per_token))
UNKNOWN_MODEL_PROFILE = ModelProfile(
    name="unknown-conservative", params=_LARGEST.params, active_params=_LARGEST.active_params,
    bytes_per_weight=_LARGEST.bytes_per_weight, layers=_LARGEST.layers,
    kv_heads=_LARGEST.kv_heads, head_dim=_LARGEST.head_dim, d_model=_LARGEST.d_model,
    kv_bytes_per_elem=max(p.kv_bytes_per_elem for p in MODEL_PROFILES.values()),
    max_model_len=0)


def known_profile(name: str) -> ModelProfile | None:
    """The catalog profile a served model name names, or None when the catalog cannot tell:
    a profile's own name, else "70b" in it -> 70B FP8, "8b" -> 8B."""
    lowered = name.lower()
    if lowered in MODEL_PROFILES:
        return MODEL_PROFILES[lowered]
    if re.search(r"(?<![\d.])70b", lowered):
        return MODEL_PROFILES[DEFAULT_LARGE_PROFILE]
    if re.search(r"(?<![\d.])8b", lowered):
        return MODEL_PROFILES[DEFAULT_SMALL_PROFILE]
    return None


def profile_for_served_name(name: str) -> ModelProfile:
    """What an emulated engine serving ``name`` runs: the known profile, else 8B."""
    return known_profile(name) or MODEL_PROFILES[DEFAULT_SMALL_PROFILE]
