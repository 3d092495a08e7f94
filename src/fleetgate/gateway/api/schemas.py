"""The gateway's HTTP contract as pydantic models: what ``/openapi.json`` documents.

Two kinds:

* **OpenAI request bodies** (chat, completions, responses, embeddings, messages): the
  fields the gateway reads and the common ones engines take, ``extra="allow"`` (anything
  else is forwarded untouched). They exist for the document only (schema-driven clients and
  fuzzers): the hot-path handlers read the raw body and never validate through them.
* **Admin and registration models**: typed answers of ``/admin/*`` (validated, off the hot
  path). Rows keep ``extra="allow"``: every live figure an endpoint has is reported, the
  typed fields are the stable contract.

May touch: pydantic. Must not touch: anything else.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


# -- OpenAI bodies (documentation only) -------------------------------------------------------
class StreamOptions(_Open):
    include_usage: bool | None = None


class ChatMessage(_Open):
    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(_Open):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    user: str | None = None


class CompletionRequest(_Open):
    model: str
    prompt: str | list[str] | list[int] | list[list[int]]
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    user: str | None = None


class ResponsesRequest(_Open):
    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    stream: bool | None = False
    max_output_tokens: int | None = Field(default=None, ge=1)
    user: str | None = None


class EmbeddingsRequest(_Open):
    model: str
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None


class AnthropicMessage(_Open):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class MessagesRequest(_Open):
    model: str
    messages: list[AnthropicMessage] = Field(min_length=1)
    max_tokens: int = Field(ge=1)
    system: str | list[dict[str, Any]] | None = None
    stream: bool | None = False


OPENAI_BODIES: dict[str, type[BaseModel]] = {
    "chat": ChatCompletionRequest, "completions": CompletionRequest,
    "responses": ResponsesRequest, "embeddings": EmbeddingsRequest,
    "messages": MessagesRequest,
}


# -- errors -----------------------------------------------------------------------------------
class ErrorBody(BaseModel):
    message: str
    type: str | None
    param: str | None
    code: str | int | None


class ErrorEnvelope(BaseModel):
    """Every error the gateway answers, OpenAI's envelope."""

    error: ErrorBody


# -- models, health -----------------------------------------------------------------------------
class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    root: str | None = None
    parent: str | None = None  # a LoRA adapter's base model (docs/lora.md); null otherwise


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Readiness(BaseModel):
    status: str
    endpoints_ready: int | None = None
    endpoints_total: int | None = None


class Version(BaseModel):
    version: str


# -- admin --------------------------------------------------------------------------------------
class EndpointRow(_Open):
    id: str
    pool: str
    url: str
    engine: str
    accelerator: str
    vendor: str
    price_per_gpu_hour: float
    gpus_per_replica: int
    models: dict[str, str]
    health: str
    breaker: str
    parked: bool = Field(default=False, description="kept out of routing by the fleet scaler "
                         "(its replica is off, starting or draining), whatever its health")
    in_flight: float | None = None
    queued: float | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None
    tokens_per_s: float | None = None
    usd_per_mtok: float | None = None
    tokens_per_usd: float | None = None
    kv_capacity_tokens: float | None = None
    max_batch: float | None = None
    max_model_len: float | None = None
    reported_capacity: dict[str, Any] | None = Field(
        default=None, description="what the engine reported about its capacity (null before "
        "the first read): kv_capacity_tokens, block_size, max_model_len, max_batch, "
        "architecture, kv_bytes_per_token, weight_bytes")
    prior_profile: str | None = None
    scraped_by: str | None = Field(
        default=None, description="the gateway replica whose visit (probe, scrape) the load "
        "and health shown are from, where replicas share the scraping; null when this one "
        "scrapes every endpoint itself")


class PoolRow(_Open):
    pool: str
    accelerator: str
    vendor: str
    engine: str
    gpus_per_replica: int
    price_per_gpu_hour: float
    endpoints: int
    ready: int
    routed: int = Field(description="ready and not parked by the scaler")
    parked: int = Field(description="slots the scaler stopped (autoscaled pools)")
    in_flight: float
    queued: float = Field(description="the engines' waiting requests, added up")
    breakers: list[str] = Field(description="the circuit breakers' states in the pool")
    tokens_per_s: float
    usd_per_hour: float
    usd_per_mtok: float | None = None
    tokens_per_usd: float | None = None


class EndpointsReport(BaseModel):
    endpoints: list[EndpointRow]
    total: int = Field(description="endpoint rows matching the query (all pages together)")
    next_offset: int | None = Field(description="the offset of the next page; null: the last")
    pools: list[PoolRow]
    store_degraded: bool
    replica: str | None
    peers: int
    registered: list[str]
    collector: dict[str, Any] | None = Field(
        default=None, description="this replica's share of the scraping: ticks, visits "
        "(endpoint probes/scrapes made), replicas sharing it, owned and backing_up (endpoints "
        "it scrapes, and those it takes over when their owner's rows stop), takeovers")


class DecisionsReport(BaseModel):
    decisions: list[dict[str, Any]] = Field(
        description="newest first: policy, model, reason, chosen, candidates (rank, endpoint, "
                    "pool, score, per-scorer scores, estimates), rejected, attempts")


class CostsReport(_Open):
    rule: str
    pools: list[dict[str, Any]]
    models: list[dict[str, Any]]
    tenants: list[dict[str, Any]]


class ReloadResult(BaseModel):
    status: Literal["reloaded"]
    pools: list[str]
    policies: list[str]
    models: list[str]


class RegistrationResult(BaseModel):
    id: str
    ttl_s: float
    new: bool


class DeregistrationResult(BaseModel):
    id: str
    removed: bool
