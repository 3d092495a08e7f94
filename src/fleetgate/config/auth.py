"""The fleet configuration's ``auth:`` section: admin keys and API keys, each with its
tenant, the models and policies it may use, its limits, priority and fair-queuing weight
(DESIGN.md §1; enforced by ``gateway/auth.py`` and ``gateway/limits.py``).

May touch: pydantic. Must not import any other fleetgate package but config.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from fleetgate.config.strict import Strict


class KeyLimits(Strict):
    rpm: int | None = Field(default=None, ge=1)
    tpm: int | None = Field(default=None, ge=1)
    concurrency: int | None = Field(default=None, ge=1)
    usd_per_day: float | None = Field(default=None, gt=0)
    usd_per_month: float | None = Field(default=None, gt=0)


class ApiKeyConfig(Strict):
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


class AuthConfig(Strict):
    admin_keys: list[str] = Field(default_factory=list)
    keys: list[ApiKeyConfig] = Field(default_factory=list)
