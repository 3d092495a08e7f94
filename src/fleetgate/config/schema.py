"""The fleet configuration schema: pools, policies, routes (DESIGN.md §1); auth is in
``auth.py``.

Every model forbids unknown keys, so a typo fails loudly with its YAML path instead of being
ignored. Values that matter have no silent defaults. Vendor and runtime follow from the
accelerator (``catalog.gpus.ACCELERATORS``), so a config cannot say "mi300x on cuda".
Accelerator and engine names are checked against the catalog's keys, so a new GPU or
engine is one catalog row. Strategy, picker, filter and scorer names are routing's
business: ``routing.build_router`` checks them with their YAML paths (``fleetgate check``
runs it too).

May touch: pydantic, the catalog. Must not import any other fleetgate package.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qs, urlsplit

from pydantic import (
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from fleetgate.catalog.engines import API_NAMES, ENGINES
from fleetgate.catalog.gpus import ACCELERATORS
from fleetgate.config.auth import AuthConfig
from fleetgate.config.strict import Strict as _Strict

EMULATED_ENGINES = tuple(name for name, spec in ENGINES.items() if spec.emulated)
EMULATED_QUERY_KEYS = {"profile", "speed", "stack", "tp", "max_queued_requests"}

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")


def _check_name(value: str) -> str:
    if not _NAME.match(value):
        raise ValueError("must be 1-63 chars of lowercase letters, digits, '.', '_' or '-'")
    return value


def _check_endpoint(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme in ("http", "https"):
        if not parts.hostname:
            raise ValueError(f"{url!r} has no host")
        return url.rstrip("/")
    if parts.scheme == "emulated":
        if parts.netloc not in EMULATED_ENGINES:
            raise ValueError(f"{url!r}: emulated engine must be one of {EMULATED_ENGINES}")
        gpu = parts.path.strip("/")
        if gpu not in ACCELERATORS or gpu == "cpu":
            gpus = sorted(a for a in ACCELERATORS if a != "cpu")
            raise ValueError(f"{url!r}: emulated GPU must be one of {gpus}")
        unknown = set(parse_qs(parts.query)) - EMULATED_QUERY_KEYS
        if unknown:
            raise ValueError(f"{url!r}: unknown options {sorted(unknown)}")
        return url
    raise ValueError(f"{url!r}: scheme must be http, https or emulated")


def _one_of(value: str, known: Any, what: str) -> str:
    if value not in known:
        raise ValueError(f"unknown {what} {value!r}; known: {', '.join(sorted(known))}")
    return value


class AutoscaleConfig(_Strict):
    """Replica autoscaling of a pool (``fleetgate.scaling``): ``simulate`` scales its
    simulated replicas, ``serve`` publishes the desired count (and starts and stops the
    replicas of an ``emulated://`` pool itself)."""

    min_replicas: int = Field(default=1, ge=0)
    max_replicas: int = Field(ge=1)
    target_utilization: float = Field(default=0.7, gt=0, le=1)
    cold_start_s: float = Field(default=60.0, ge=0)
    scale_down_delay_s: float = Field(default=60.0, ge=0, description=(
        "a pool shrinks only to the highest desire of this many seconds (stabilisation)"))

    @model_validator(mode="after")
    def _bounds(self) -> AutoscaleConfig:
        if self.min_replicas > self.max_replicas:
            raise ValueError("min_replicas must be <= max_replicas")
        return self


class TokenPriceConfig(_Strict):
    """A hosted API's price in $ per million tokens (``catalog.pricing.TokenPrice``)."""

    input: float = Field(ge=0)
    output: float = Field(ge=0)


HOSTED_ACCELERATOR = "hosted"  # what a per-token pool's ``accelerator`` says when omitted
HOSTED_TTFT_MS = 600.0  # a hosted API's expected TTFT and TPOT when the pool does not say
HOSTED_TPOT_MS = 20.0


class ExpectedLatency(_Strict):
    """What a hosted API's answers take: the router's prediction for the pool (corrected by
    what it measures, as every endpoint's) and the simulator's latency distribution."""

    ttft_ms: float = Field(default=HOSTED_TTFT_MS, gt=0)
    tpot_ms: float = Field(default=HOSTED_TPOT_MS, gt=0)


def _per_token(info: ValidationInfo) -> bool | None:
    """Whether the pool being validated is priced per token; None when its
    ``price_per_mtok`` failed validation (its own error says why: no second one here)."""
    if "price_per_mtok" not in info.data:
        return None
    return info.data["price_per_mtok"] is not None


DEFAULT_MAX_ADAPTERS = 1  # vLLM's --max-loras default: one adapter on an endpoint at once


class AdapterConfig(_Strict):
    """A LoRA adapter a pool serves as a model of its own (docs/lora.md). ``name`` is the
    public name and the name the engine serves it under; ``base``, the public model it
    adapts (default: the pool's only model); ``path``, where an engine loads it from
    (``lora_path``: needed for run-time loading); ``preload``, whether the engines start
    with it (vLLM ``--lora-modules``, SGLang ``--lora-paths``; default: unless the pool
    loads adapters at run time and it has a path)."""

    name: str
    base: str | None = None
    path: str | None = Field(default=None, min_length=1)
    preload: bool | None = None

    @field_validator("name")
    @classmethod
    def _adapter_name(cls, value: str) -> str:
        if not value or len(value) > 128 or any(c in value for c in " :/\t\n"):
            raise ValueError("must be 1-128 chars without spaces, ':' or '/'")
        return value


def _adapter(value: Any) -> Any:
    return {"name": value} if isinstance(value, str) else value


class PoolConfig(_Strict):
    """Replicas of one engine on one GPU type at one price, or a hosted OpenAI-compatible
    API priced per token (``price_per_mtok``, ``engine: openai``, ``max_concurrency``)."""

    name: str
    engine: str
    price_per_mtok: TokenPriceConfig | None = None
    accelerator: str = Field(default=None, validate_default=True)
    gpus_per_replica: int = Field(default=1, ge=1, le=64)
    # per-token pools: 0.0 (validated so that exactly one of the two prices is given)
    price_per_gpu_hour: float = Field(default=None, ge=0, validate_default=True)
    max_concurrency: int | None = Field(default=None, ge=1, validate_default=True,
                                        description="a per-token pool's cap on requests")
    expected_latency: ExpectedLatency | None = Field(default=None, validate_default=True)
    endpoints: list[str] = Field(min_length=1)
    models: dict[str, str] = Field(min_length=1, description="public name -> served name")
    labels: dict[str, str] = Field(default_factory=dict)
    max_model_len: int | None = Field(default=None, ge=1)
    api_key: str | None = Field(default=None, min_length=1, repr=False, description=(
        "sent upstream as Authorization: Bearer (a hosted API's key, a vLLM started with "
        "--api-key); write it as ${ENV_VAR}, never the key itself"))
    apis: list[str] | None = Field(default=None, min_length=1,
                                   description="APIs the engine serves (default per engine)")
    autoscale: AutoscaleConfig | None = None
    # LoRA adapters (docs/lora.md): the adapters the pool's engines serve or may load, the
    # most one endpoint holds at once, and whether the gateway loads (and unloads) them at
    # run time; ``discover_adapters``: also route the adapters the engines' /v1/models list
    adapters: list[AdapterConfig] = Field(default_factory=list)
    max_adapters: int = Field(default=DEFAULT_MAX_ADAPTERS, ge=1, le=1024)
    load_adapters: bool = False
    discover_adapters: bool = False

    _name = field_validator("name")(_check_name)

    @field_validator("adapters", mode="before")
    @classmethod
    def _adapter_names(cls, value: Any) -> Any:
        return [_adapter(v) for v in value] if isinstance(value, list) else value

    @model_validator(mode="after")
    def _adapters_valid(self) -> PoolConfig:
        names = [a.name for a in self.adapters]
        for j, adapter in enumerate(self.adapters):
            where = f"adapters[{j}]"
            if adapter.name in names[:j]:
                raise ValueError(f"{where}.name: {adapter.name!r} is listed twice")
            if adapter.name in self.models:
                raise ValueError(f"{where}.name: {adapter.name!r} is also a model of the pool")
            if adapter.base is not None and adapter.base not in self.models:
                raise ValueError(f"{where}.base: {adapter.base!r} is not a model of the pool "
                                 f"(models: {', '.join(self.models)})")
            if adapter.base is None and len(self.models) > 1:
                raise ValueError(f"{where}.base: required when the pool serves more than one "
                                 f"model ({', '.join(self.models)})")
        if self.per_token and (self.adapters or self.load_adapters):
            raise ValueError("adapters: a pool priced per token is a hosted API: it serves "
                             "no LoRA adapters of ours")
        return self

    def adapter_base(self, adapter: AdapterConfig) -> str:
        """The public model ``adapter`` adapts."""
        return adapter.base or next(iter(self.models))

    def adapter_preloaded(self, adapter: AdapterConfig) -> bool:
        """Whether the pool's engines start with ``adapter`` loaded."""
        if adapter.preload is not None:
            return adapter.preload
        return not self.load_adapters or adapter.path is None  # no path: only from the start

    @field_validator("engine")
    @classmethod
    def _engine(cls, value: str) -> str:
        return _one_of(value, ENGINES, "engine")

    @field_validator("price_per_mtok")
    @classmethod
    def _token_priced(cls, value: TokenPriceConfig | None,
                      info: ValidationInfo) -> TokenPriceConfig | None:
        if value is not None and info.data.get("engine", "openai") != "openai":
            raise ValueError("only a hosted OpenAI-compatible API (engine: openai) is priced "
                             "per token; a vllm or sglang pool says price_per_gpu_hour")
        return value

    @field_validator("accelerator", mode="before")
    @classmethod
    def _accelerator(cls, value: Any, info: ValidationInfo) -> Any:
        per_token = _per_token(info)
        if value is None:
            if per_token is not False:  # a per-token pool, or its price is invalid already
                return HOSTED_ACCELERATOR
            raise ValueError("Field required")
        if value == HOSTED_ACCELERATOR and per_token:
            return value
        return _one_of(value, ACCELERATORS, "accelerator") if isinstance(value, str) else value

    @field_validator("price_per_gpu_hour", mode="before")
    @classmethod
    def _one_price(cls, value: Any, info: ValidationInfo) -> Any:
        per_token = _per_token(info)
        if value is None:
            if per_token is not False:
                return 0.0
            raise ValueError("Field required (or price_per_mtok: {input, output} for a hosted "
                             "engine: openai pool)")
        if per_token:
            raise ValueError("a pool has one price: price_per_gpu_hour or price_per_mtok, "
                             "not both")
        return value

    @field_validator("max_concurrency", mode="before")
    @classmethod
    def _cap(cls, value: Any, info: ValidationInfo) -> Any:
        per_token = _per_token(info)
        if value is None and per_token:
            raise ValueError("required for a pool priced per token (the hosted API's cap on "
                             "requests at once: the router sends no more)")
        if value is not None and per_token is False:
            raise ValueError("only for a pool priced per token (price_per_mtok); a "
                             "self-hosted pool's capacity is learned")
        return value

    @field_validator("expected_latency", mode="before")
    @classmethod
    def _latency(cls, value: Any, info: ValidationInfo) -> Any:
        per_token = _per_token(info)
        if value is not None and per_token is False:
            raise ValueError("only for a pool priced per token (price_per_mtok); a "
                             "self-hosted pool's latency comes from its GPU and model")
        return ({} if per_token else None) if value is None else value

    @field_validator("autoscale")
    @classmethod
    def _not_scaled(cls, value: AutoscaleConfig | None,
                    info: ValidationInfo) -> AutoscaleConfig | None:
        if value is not None and info.data.get("price_per_mtok") is not None:
            raise ValueError("a pool priced per token is a hosted API: nothing to scale")
        return value

    @property
    def per_token(self) -> bool:
        """A hosted API priced per token (no replicas to pay for or scale)."""
        return self.price_per_mtok is not None

    @field_validator("apis")
    @classmethod
    def _apis(cls, value: list[str] | None) -> list[str] | None:
        for api in value or []:
            _one_of(api, API_NAMES, "api")
        return value

    @property
    def served_apis(self) -> tuple[str, ...]:
        return tuple(self.apis) if self.apis else ENGINES[self.engine].apis

    @field_validator("endpoints")
    @classmethod
    def _endpoints(cls, value: list[str]) -> list[str]:
        checked = [_check_endpoint(v) for v in value]
        if len(set(checked)) != len(checked):
            raise ValueError("endpoints must be unique")
        return checked

    @model_validator(mode="after")
    def _within_ceiling(self) -> PoolConfig:
        if self.autoscale is not None and len(self.endpoints) > self.autoscale.max_replicas:
            raise ValueError(f"{len(self.endpoints)} endpoints but autoscale.max_replicas is "
                             f"{self.autoscale.max_replicas}")
        return self

    @property
    def vendor(self) -> str:
        return ACCELERATORS.get(self.accelerator, (HOSTED_ACCELERATOR,))[0]

    @property
    def runtime(self) -> str:
        return ACCELERATORS.get(self.accelerator, ("", HOSTED_ACCELERATOR))[1]

    @property
    def price_per_replica_hour(self) -> float:
        return self.price_per_gpu_hour * self.gpus_per_replica


class SloConfig(_Strict):
    ttft_ms: float | None = Field(default=None, gt=0)
    tpot_ms: float | None = Field(default=None, gt=0)


class ScorerRef(_Strict):
    """A weighted scorer in a custom policy; ``params`` are validated by the plugin registry."""

    name: str
    weight: float = Field(default=1.0, ge=0)
    params: dict[str, Any] = Field(default_factory=dict)


class FilterRef(_Strict):
    name: str
    params: dict[str, Any] = Field(default_factory=dict)


class ShadowConfig(_Strict):
    """Mirror a share of a policy's requests to a candidate pool (gateway/proxy/shadow.py)."""

    pool: str
    fraction: float = Field(default=0.1, gt=0, le=1)
    max_usd_per_hour: float = Field(default=5.0, gt=0)


FIRST_BYTE_SLO_FACTOR = 3.0
FIRST_BYTE_FLOOR_S = 2.0


class PolicyConfig(_Strict):
    strategy: str = Field(description="a routing strategy (routing/strategies.py)")
    slo: SloConfig = Field(default_factory=SloConfig)
    max_usd_per_mtok: float | None = Field(default=None, gt=0)
    filters: list[FilterRef] = Field(default_factory=list)
    scorers: list[ScorerRef] = Field(default_factory=list)
    picker: str | None = None
    max_attempts: int = Field(default=3, ge=1, le=10)
    # no first byte within this long: the engine is taken for hung, the request is retried
    # elsewhere and the failure counts against its breaker (default: 3x the TTFT SLO)
    first_byte_timeout_ms: float | None = Field(default=None, gt=0)
    shadow: ShadowConfig | None = None
    # a chat/completions stream whose engine fails after the first byte continues on the
    # next endpoint, stitched into the same stream (gateway/proxy/stream.py)
    resume_streams: bool = True

    @property
    def first_byte_timeout_s(self) -> float | None:
        if self.first_byte_timeout_ms is not None:
            return self.first_byte_timeout_ms / 1000
        if self.slo.ttft_ms is not None:
            return max(FIRST_BYTE_FLOOR_S, FIRST_BYTE_SLO_FACTOR * self.slo.ttft_ms / 1000)
        return None


class RouteMatch(_Strict):
    model: str | None = None
    header: dict[str, str] = Field(default_factory=dict)
    tenant: str | None = None


class RouteConfig(_Strict):
    match: RouteMatch
    policy: str
    # models tried in order when ``match.model`` cannot be served (every endpoint refused
    # it before the first byte, no capacity within the SLO, or its context is too small):
    # gateway/proxy/fallback.py; a fallback's own route's fallbacks follow its list
    fallbacks: list[str] = Field(default_factory=list)


class FleetConfig(_Strict):
    pools: list[PoolConfig] = Field(min_length=1)
    policies: dict[str, PolicyConfig] = Field(
        default_factory=lambda: {"round_robin": PolicyConfig(strategy="round_robin")}
    )
    routes: list[RouteConfig] = Field(default_factory=list)
    default_policy: str = "round_robin"
    auth: AuthConfig | None = None

    @model_validator(mode="after")
    def _cross_references(self) -> FleetConfig:
        names = [p.name for p in self.pools]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"pools: names must be unique; repeated: {dupes}")
        seen: dict[str, str] = {}
        for i, pool in enumerate(self.pools):
            for j, url in enumerate(pool.endpoints):
                if url in seen and not url.startswith("emulated:"):
                    raise ValueError(f"pools[{i}].endpoints[{j}]: {url} is also in {seen[url]!r}")
                seen[url] = pool.name
        if self.default_policy not in self.policies:
            raise ValueError(f"default_policy: {self.default_policy!r} is not in policies")
        for name, policy in self.policies.items():
            if policy.shadow is not None and policy.shadow.pool not in names:
                raise ValueError(f"policies.{name}.shadow.pool: {policy.shadow.pool!r} is not "
                                 f"a pool (pools: {', '.join(names)})")
        for i, route in enumerate(self.routes):
            if route.policy not in self.policies:
                raise ValueError(f"routes[{i}].policy: {route.policy!r} is not in policies")
        _check_fallbacks(self.routes, set(self.public_models()))
        _check_adapters(self.pools, set(self.public_models()))
        return self

    def public_models(self) -> list[str]:
        return sorted({m for p in self.pools for m in p.models})

    def adapter_parents(self) -> dict[str, str]:
        """Every declared LoRA adapter -> the public model it adapts."""
        return {a.name: p.adapter_base(a) for p in self.pools for a in p.adapters}


def _check_fallbacks(routes: list[RouteConfig], models: set[str]) -> None:
    """Every fallback names a served model, once, on a route that matches a model, and no
    chain of fallbacks leads back to a model it started from (a -> b -> a)."""
    graph: dict[str, list[tuple[str, str]]] = {}  # model -> (fallback, its YAML path)
    for i, route in enumerate(routes):
        if route.fallbacks and route.match.model is None:
            raise ValueError(f"routes[{i}].fallbacks: a route with fallbacks must match a "
                             f"model (match.model)")
        for j, model in enumerate(route.fallbacks):
            where = f"routes[{i}].fallbacks[{j}]"
            if model not in models:
                raise ValueError(f"{where}: {model!r} is not a model any pool serves "
                                 f"(models: {', '.join(sorted(models))})")
            if model in route.fallbacks[:j]:
                raise ValueError(f"{where}: {model!r} is listed twice")
            graph.setdefault(route.match.model or "", []).append((model, where))
    for start in graph:
        _no_loop(graph, [start], set())


def _no_loop(graph: dict[str, list[tuple[str, str]]], chain: list[str], done: set[str]) -> None:
    """Depth-first from ``chain[-1]``: a fallback back into ``chain`` is a loop."""
    for model, where in graph.get(chain[-1], []):
        if model in chain:
            loop = " -> ".join([*chain[chain.index(model):], model])
            raise ValueError(f"{where}: fallback loop {loop}")
        if model not in done:
            _no_loop(graph, [*chain, model], done)
            done.add(model)


def _check_adapters(pools: list[PoolConfig], models: set[str]) -> None:
    """An adapter's name is no pool's model, and the same adapter adapts the same model in
    every pool that declares it."""
    parents: dict[str, str] = {}
    for i, pool in enumerate(pools):
        for j, adapter in enumerate(pool.adapters):
            where = f"pools[{i}].adapters[{j}]"
            if adapter.name in models:
                raise ValueError(f"{where}.name: {adapter.name!r} is a model another pool "
                                 f"serves; an adapter needs a name of its own")
            base = pool.adapter_base(adapter)
            if parents.setdefault(adapter.name, base) != base:
                raise ValueError(f"{where}.base: {adapter.name!r} adapts "
                                 f"{parents[adapter.name]!r} in another pool, not {base!r}")
