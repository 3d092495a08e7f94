"""The fleet configuration schema: pools, policies, routes, auth (DESIGN.md §1).

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
from typing import Annotated, Any, Literal
from urllib.parse import parse_qs, urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fleetgate.catalog.engines import API_NAMES, ENGINES
from fleetgate.catalog.gpus import ACCELERATORS

EMULATED_ENGINES = tuple(name for name, spec in ENGINES.items() if spec.emulated)
EMULATED_QUERY_KEYS = {"profile", "speed", "stack", "tp", "max_queued_requests"}

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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
    """Replica autoscaling of a pool, for ``fleetgate simulate`` (the gateway ignores it)."""

    min_replicas: int = Field(default=1, ge=0)
    max_replicas: int = Field(ge=1)
    target_utilization: float = Field(default=0.7, gt=0, le=1)
    cold_start_s: float = Field(default=60.0, ge=0)

    @model_validator(mode="after")
    def _bounds(self) -> AutoscaleConfig:
        if self.min_replicas > self.max_replicas:
            raise ValueError("min_replicas must be <= max_replicas")
        return self


class PoolConfig(_Strict):
    """Replicas of one engine on one GPU type at one price."""

    name: str
    accelerator: str
    engine: str
    gpus_per_replica: int = Field(default=1, ge=1, le=64)
    price_per_gpu_hour: float = Field(ge=0)
    endpoints: list[str] = Field(min_length=1)
    models: dict[str, str] = Field(min_length=1, description="public name -> served name")
    labels: dict[str, str] = Field(default_factory=dict)
    max_model_len: int | None = Field(default=None, ge=1)
    apis: list[str] | None = Field(default=None, min_length=1,
                                   description="APIs the engine serves (default per engine)")
    autoscale: AutoscaleConfig | None = None

    _name = field_validator("name")(_check_name)

    @field_validator("accelerator")
    @classmethod
    def _accelerator(cls, value: str) -> str:
        return _one_of(value, ACCELERATORS, "accelerator")

    @field_validator("engine")
    @classmethod
    def _engine(cls, value: str) -> str:
        return _one_of(value, ENGINES, "engine")

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

    @property
    def vendor(self) -> str:
        return ACCELERATORS[self.accelerator][0]

    @property
    def runtime(self) -> str:
        return ACCELERATORS[self.accelerator][1]

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


class KeyLimits(_Strict):
    rpm: int | None = Field(default=None, ge=1)
    tpm: int | None = Field(default=None, ge=1)
    concurrency: int | None = Field(default=None, ge=1)
    usd_per_day: float | None = Field(default=None, gt=0)
    usd_per_month: float | None = Field(default=None, gt=0)


class ApiKeyConfig(_Strict):
    name: str
    key: str | None = None
    key_sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = None
    tenant: str
    models: list[str] | None = None
    policies: list[str] | None = None
    limits: KeyLimits = Field(default_factory=KeyLimits)
    # the key's class when the fleet is full (x-priority may only lower it) and its
    # tenant's share of the waiting line (weighted fair queuing)
    priority: Literal["high", "normal", "low"] = "normal"
    weight: float = Field(default=1.0, gt=0)

    @model_validator(mode="after")
    def _one_key(self) -> ApiKeyConfig:
        if (self.key is None) == (self.key_sha256 is None):
            raise ValueError("exactly one of 'key' or 'key_sha256' is required")
        if self.key is not None and len(self.key) < 16:
            raise ValueError("'key' must be at least 16 characters")
        return self


class AuthConfig(_Strict):
    admin_keys: list[str] = Field(default_factory=list)
    keys: list[ApiKeyConfig] = Field(default_factory=list)


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
        return self

    def public_models(self) -> list[str]:
        return sorted({m for p in self.pools for m in p.models})
