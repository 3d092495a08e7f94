"""Dynamic endpoints: workers register themselves (``fleetgate worker``) and keep a heartbeat.

A registration names a pool, an engine URL, the engine kind, the accelerator, the models
(public -> served) and its price. It joins the pool of that name (created when the config
has none), so it is routed, health-checked, scraped and charged like a configured
endpoint. Re-registering the same URL is the heartbeat: it only pushes the expiry back. A
registration whose heartbeat lapses (``ttl_s`` without one) is removed, as is one the
worker deletes on exit. Adding or removing an endpoint builds a new generation (the same
path as a config reload), so in-flight requests finish where they started.

Registrations live in the shared store (``SharedState.put_registration``: Redis when
``FLEETGATE_REDIS_URL`` is set, one record per engine URL with the registration's TTL,
refreshed by every heartbeat), so a worker registered at one replica is routed by every
replica: each replica's registration sync (``AppState.sync_registrations``, every sync
interval) reads the live registrations and rebuilds its generation when they changed.
The store lists them in the order they first registered, so every replica merges them into
the same endpoint ids (the replicas' load sync matches endpoints by id). While Redis is
down a replica keeps the registrations it knew and expires them by their own TTL.

May touch: config schema (to merge registrations into a fleet config). Must not touch: HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fleetgate.catalog.engines import ENGINES
from fleetgate.catalog.gpus import ACCELERATORS
from fleetgate.config.schema import FleetConfig, PoolConfig


class RegistrationBody(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    pool: str = Field(min_length=1, max_length=63)
    url: str
    engine: str = Field(description="a catalog engine: " + ", ".join(ENGINES))
    accelerator: str = Field(description="a catalog accelerator: " + ", ".join(ACCELERATORS))
    models: dict[str, str] = Field(min_length=1)
    price_per_gpu_hour: float = Field(ge=0)
    gpus_per_replica: int = Field(default=1, ge=1, le=64)
    ttl_s: float = Field(default=15.0, ge=1, le=3600)

    @field_validator("engine")
    @classmethod
    def _engine(cls, value: str) -> str:
        if value not in ENGINES:
            raise ValueError(f"unknown engine {value!r}; known: {', '.join(ENGINES)}")
        return value

    @field_validator("accelerator")
    @classmethod
    def _accelerator(cls, value: str) -> str:
        if value not in ACCELERATORS:
            raise ValueError(f"unknown accelerator {value!r}; known: {', '.join(ACCELERATORS)}")
        return value


@dataclass(slots=True)
class Registration:
    body: RegistrationBody
    expires_at: float


def encode(body: RegistrationBody) -> bytes:
    """The record kept in the shared store."""
    return body.model_dump_json().encode()


def decode(record: bytes) -> RegistrationBody:
    """Inverse of ``encode``; raises ``pydantic.ValidationError`` on a bad record."""
    return RegistrationBody.model_validate_json(record)


def merge(config: FleetConfig, registrations: list[Registration]) -> FleetConfig:
    """The config's fleet plus the registered endpoints (validated like a config file)."""
    pools = [p.model_dump() for p in config.pools]
    by_name = {p["name"]: p for p in pools}
    for reg in registrations:
        b = reg.body
        pool = by_name.get(b.pool)
        if pool is None:
            pool = PoolConfig(name=b.pool, accelerator=b.accelerator, engine=b.engine,
                              gpus_per_replica=b.gpus_per_replica,
                              price_per_gpu_hour=b.price_per_gpu_hour, endpoints=[b.url],
                              models=b.models).model_dump()
            pools.append(pool)
            by_name[b.pool] = pool
        elif b.url not in pool["endpoints"]:
            pool["endpoints"] = [*pool["endpoints"], b.url]
            pool["models"] = {**b.models, **pool["models"]}
    return FleetConfig.model_validate({**config.model_dump(), "pools": pools})


def endpoint_id(config: FleetConfig, url: str) -> str | None:
    for pool in config.pools:
        for i, candidate in enumerate(pool.endpoints):
            if candidate == url.rstrip("/"):
                return f"{pool.name}-{i}"
    return None
