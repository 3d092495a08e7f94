"""Process settings from the environment (one knob, one place; routing lives in the YAML).

| variable | default | meaning |
|---|---|---|
| FLEETGATE_CONFIG | embedded default | fleet config file |
| FLEETGATE_HOST / FLEETGATE_PORT | 127.0.0.1 / 8080 | listen address |
| FLEETGATE_MAX_BODY_BYTES | 8388608 | request body limit (413 beyond) |
| FLEETGATE_HEALTH_INTERVAL_S | 1.0 | health probe and /metrics scrape interval |
| FLEETGATE_STALE_AFTER_S | 10 | an endpoint silent this long is not routed to |
| FLEETGATE_CONNECT_TIMEOUT_S | 3 | upstream TCP connect |
| FLEETGATE_READ_TIMEOUT_S | 120 | upstream first byte and idle gap between chunks |
| FLEETGATE_TOTAL_TIMEOUT_S | 600 | whole upstream exchange |
| FLEETGATE_LOG_LEVEL | info | python log level |
| FLEETGATE_REDIS_URL | unset (in-memory) | shared state for several replicas: load, limits, spend |
| FLEETGATE_REDIS_PREFIX | fleetgate: | key prefix (several fleets on one Redis) |
| FLEETGATE_SYNC_INTERVAL_S | 0.5 | how often replicas exchange per-endpoint load |
| FLEETGATE_REQUEST_LOG | stderr | one JSON line per request: stderr, stdout or off |
| FLEETGATE_HEADER_TIMEOUT_S | 10 | a request's headers must arrive within this (slowloris) |
| FLEETGATE_BODY_TIMEOUT_S | 30 | a request's body must arrive within this (408 beyond) |
| FLEETGATE_SHUTDOWN_TIMEOUT_S | 30 | on shutdown, streams still open then end with an error |
| FLEETGATE_WORKERS | 1 | worker processes of ``fleetgate serve`` (``--workers``) |
| FLEETGATE_SCALE_INTERVAL_S | 5 | how often the fleet scaler ticks (``autoscale:`` pools) |

``serve --workers N`` sets three more for its workers (``gateway/processes.py``):
``FLEETGATE_STORE_SOCKET`` (the supervisor's stores, when no Redis is set),
``FLEETGATE_SHARED_EMULATORS`` (JSON: the emulated engines it runs, by key, to their URLs)
and ``FLEETGATE_REUSE_PORT`` (each worker listens on the port with SO_REUSEPORT).

Tracing is configured by the standard ``OTEL_*`` variables (``gateway/telemetry/tracing.py``).

May touch: os.environ, pydantic. Must not touch: anything else.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    config_path: Path | None = None
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    health_interval_s: float = Field(default=1.0, gt=0)
    stale_after_s: float = Field(default=10.0, gt=0)
    connect_timeout_s: float = Field(default=3.0, gt=0)
    read_timeout_s: float = Field(default=120.0, gt=0)
    total_timeout_s: float = Field(default=600.0, gt=0)
    log_level: str = "info"
    redis_url: str | None = None
    redis_prefix: str = "fleetgate:"
    sync_interval_s: float = Field(default=0.5, gt=0)
    request_log: Literal["stderr", "stdout", "off"] = "stderr"
    header_timeout_s: float = Field(default=10.0, gt=0)
    body_timeout_s: float = Field(default=30.0, gt=0)
    shutdown_timeout_s: float = Field(default=30.0, gt=0)
    workers: int = Field(default=1, ge=1, le=256)
    scale_interval_s: float = Field(default=5.0, gt=0)
    store_socket: str | None = None
    shared_emulators: dict[str, str] = Field(default_factory=dict)
    reuse_port: bool = False

    @field_validator("shared_emulators", mode="before")
    @classmethod
    def _json(cls, value: object) -> object:
        return json.loads(value) if isinstance(value, str) else value

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        for name in cls.model_fields:
            key = f"FLEETGATE_{name.upper()}"
            if name == "config_path":
                key = "FLEETGATE_CONFIG"
            if env.get(key):
                values[name] = env[key]
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls.model_validate(values)
