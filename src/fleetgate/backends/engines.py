"""Engine differences as data: one row per engine kind (vLLM, SGLang, any OpenAI server).

Adapters never subclass per engine; they read this table (DESIGN.md §2). Facts come from
../shared/reference/engines.md (vLLM 0.33.0, SGLang 0.5.23):

- vLLM ``/health`` is cheap (engine alive); its port refuses connections while the model
  loads. SGLang ``/health`` runs a real 1-token generation (>= 1 s), so the cheap check is
  ``/ready``; ``/health`` is the deep check.
- vLLM answers 400 when ``stream_options`` comes with ``stream: false``; fleetgate adds
  ``include_usage`` only to streaming requests.
- vLLM removed the ``guided_*`` fields and silently ignores them (HTTP 200, unconstrained
  output!); fleetgate translates them to ``structured_outputs``.
- SGLang reports a full queue on a streaming request as HTTP 200 plus an SSE error frame;
  the relay must read the first frame before committing the response.
- Error bodies: vLLM nested ``{"error": {...}}``; SGLang flat ``{"object": "error", ...}``;
  both 401 bodies are ``{"error": "Unauthorized"}``.

May touch: nothing but data. Must not touch: HTTP, routing.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EngineSpec:
    name: str
    health_path: str  # cheap liveness/readiness probe
    deep_health_path: str  # a probe that exercises generation
    metrics_path: str | None
    in_band_stream_errors: bool  # errors may arrive as HTTP 200 + SSE error frame
    translate_guided_fields: bool  # guided_* -> structured_outputs
    owned_by: str | None  # /v1/models owned_by, for detection


ENGINES: dict[str, EngineSpec] = {
    "vllm": EngineSpec(
        name="vllm",
        health_path="/health",
        deep_health_path="/health",
        metrics_path="/metrics",
        in_band_stream_errors=False,
        translate_guided_fields=True,
        owned_by="vllm",
    ),
    "sglang": EngineSpec(
        name="sglang",
        health_path="/ready",
        deep_health_path="/health",
        metrics_path="/metrics",
        in_band_stream_errors=True,
        translate_guided_fields=False,
        owned_by="sglang",
    ),
    "openai": EngineSpec(
        name="openai",
        health_path="/v1/models",
        deep_health_path="/v1/models",
        metrics_path=None,
        in_band_stream_errors=True,
        translate_guided_fields=False,
        owned_by=None,
    ),
}

# vLLM's removed fields -> the key inside ``structured_outputs`` that replaces each.
GUIDED_FIELDS = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}


def translate_guided(body: dict[str, object]) -> None:
    """Move vLLM's removed ``guided_*`` fields into ``structured_outputs`` (in place)."""
    found = {GUIDED_FIELDS[k]: body.pop(k) for k in list(body) if k in GUIDED_FIELDS}
    body.pop("guided_decoding_backend", None)
    body.pop("guided_whitespace_pattern", None)
    if found and "structured_outputs" not in body:
        body["structured_outputs"] = found
