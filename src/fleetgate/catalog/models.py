"""Model profiles: what the performance model needs to know about a served model.

One row per model shape (parameters, precision, layers, KV heads, context). A served name
maps to a profile by ``profile_for_served_name`` ("70b" in it -> the 70B FP8 profile, else
8B) until the engine reports the real shape.

May touch: nothing but the standard library (pure data). Must not touch: I/O.
"""

from __future__ import annotations

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


def profile_for_served_name(name: str) -> ModelProfile:
    """The default profile for a served model name: "70b" in it -> 70B FP8, else 8B."""
    key = DEFAULT_LARGE_PROFILE if "70b" in name.lower() else DEFAULT_SMALL_PROFILE
    return MODEL_PROFILES[key]
