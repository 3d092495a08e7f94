"""Static endpoint descriptions built from the config: who an endpoint is, not how it is doing.

An ``Endpoint`` is one engine replica: its pool, URL, engine kind, GPU type, price and the
models it serves (public name -> served name). Live state (health, load, latency) lives
elsewhere and refers to endpoints by ``id`` (``<pool>-<index>``).

May touch: config and the engine table. Must not touch: HTTP, routing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from fleetgate.backends.engines import ENGINES, EngineSpec
from fleetgate.config.schema import FleetConfig, PoolConfig


@dataclass(frozen=True, slots=True)
class Endpoint:
    id: str
    pool: str
    source: str  # as configured: http://... or emulated://ENGINE/GPU?...
    engine: EngineSpec
    accelerator: str
    vendor: str
    runtime: str
    gpus_per_replica: int
    price_per_gpu_hour: float
    models: Mapping[str, str]
    labels: Mapping[str, str] = field(default_factory=dict)
    max_model_len: int | None = None
    url: str = ""  # the HTTP base URL once known (emulated endpoints get theirs at start)

    @property
    def price_per_replica_hour(self) -> float:
        return self.price_per_gpu_hour * self.gpus_per_replica

    @property
    def is_emulated(self) -> bool:
        return self.source.startswith("emulated://")


def endpoints_of(pool: PoolConfig) -> list[Endpoint]:
    return [
        Endpoint(
            id=f"{pool.name}-{i}",
            pool=pool.name,
            source=src,
            engine=ENGINES[pool.engine],
            accelerator=pool.accelerator,
            vendor=pool.vendor,
            runtime=pool.runtime,
            gpus_per_replica=pool.gpus_per_replica,
            price_per_gpu_hour=pool.price_per_gpu_hour,
            models=dict(pool.models),
            labels=dict(pool.labels),
            max_model_len=pool.max_model_len,
            url="" if src.startswith("emulated://") else src,
        )
        for i, src in enumerate(pool.endpoints)
    ]


def fleet_endpoints(config: FleetConfig) -> list[Endpoint]:
    return [ep for pool in config.pools for ep in endpoints_of(pool)]
