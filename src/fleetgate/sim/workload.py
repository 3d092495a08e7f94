"""The workload file (DESIGN.md §1) that ``simulate`` and ``plan`` read, validated by pydantic.

```yaml
duration_s: 600
slo: {ttft_ms: 1500, tpot_ms: 80}
arrivals: {process: poisson, rate_per_s: 40}    # bursty: cv (gamma gaps); diurnal: period_s,
                                                # amplitude; or {trace: requests.jsonl}
requests:
  model: llama-3.1-8b
  input_tokens: {dist: lognormal, mean: 900, max: 8000}
  output_tokens: {dist: exponential, mean: 250, max: 2000}
  stream: true
  max_tokens: exact          # what the client sends: exact (= the output length, as benchmark
                             # clients do), none (the router assumes 256), or a number (a cap)
  prefix: {groups: 16, tokens: 2000}
tenants: [{name: team-a, share: 0.7}, {name: batch, share: 0.3, priority: low}]
priorities: {high: 0.1, normal: 0.9}   # for requests whose tenant sets no priority
faults:
  - {at_s: 120, endpoint: h100-vllm-0, down_for_s: 30}   # refuses connections, loses its work
  - {at_s: 200, pool: mi300x-sglang, slow: 2.0, for_s: 60}   # steps take 2x as long
```

Length distributions: ``fixed`` (``value``, or ``mean``), ``uniform`` (``min``..``max``),
``lognormal`` (``mean`` and ``cv``, default 1), ``exponential`` (``mean``); every draw is
rounded and clipped to [``min`` (default 1), ``max``], so a clipped distribution's mean is a
little below ``mean``. Every model forbids unknown keys (a typo fails loudly, with its path).

May touch: pydantic, yaml, the file system (read). Must not touch: the simulator or router.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

Priority = Literal["high", "normal", "low"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Slo(_Strict):
    ttft_ms: float = Field(gt=0)
    tpot_ms: float = Field(gt=0)


class Arrivals(_Strict):
    """How requests arrive: a process with a mean rate, or a recorded trace."""

    process: Literal["poisson", "bursty", "diurnal"] | None = None
    rate_per_s: float | None = Field(default=None, gt=0)
    cv: float = Field(default=2.0, gt=0, description="bursty: coefficient of variation of gaps")
    period_s: float = Field(default=86400.0, gt=0, description="diurnal: one cycle")
    amplitude: float = Field(default=0.5, ge=0, le=1, description="diurnal: +-share of rate")
    phase_s: float = Field(default=0.0, description="diurnal: where in the cycle t=0 falls")
    trace: str | None = None
    speedup: float = Field(default=1.0, gt=0, description="trace: replay this many times faster")

    @model_validator(mode="after")
    def _one_source(self) -> Arrivals:
        if (self.trace is None) == (self.process is None):
            raise ValueError("give exactly one of 'process' (with rate_per_s) or 'trace'")
        if self.process is not None and self.rate_per_s is None:
            raise ValueError(f"process {self.process!r} needs rate_per_s")
        return self


class Lengths(_Strict):
    dist: Literal["fixed", "uniform", "lognormal", "exponential"]
    value: int | None = Field(default=None, ge=1)
    mean: float | None = Field(default=None, gt=0)
    cv: float = Field(default=1.0, gt=0)
    min: int = Field(default=1, ge=1)
    max: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _params(self) -> Lengths:
        if self.dist == "fixed" and self.value is None and self.mean is None:
            raise ValueError("dist 'fixed' needs 'value'")
        if self.dist == "uniform" and self.max is None:
            raise ValueError("dist 'uniform' needs 'max' (and optionally 'min')")
        if self.dist in ("lognormal", "exponential") and self.mean is None:
            raise ValueError(f"dist {self.dist!r} needs 'mean'")
        if self.max is not None and self.max < self.min:
            raise ValueError("'max' must be >= 'min'")
        return self

    @property
    def nominal_mean(self) -> float:
        """The mean the parameters name (before clipping)."""
        if self.dist == "fixed":
            return float(self.value or self.mean or 1)
        if self.dist == "uniform":
            return (self.min + float(self.max or self.min)) / 2
        return float(self.mean or 1)


class Prefix(_Strict):
    groups: int = Field(ge=1)
    tokens: int = Field(ge=1)


class AdapterShare(_Strict):
    """A LoRA adapter of ``requests.model`` that a share of the requests name as their model
    (the fleet's pools declare it: docs/lora.md)."""

    name: str
    share: float = Field(gt=0, le=1)


class Requests(_Strict):
    model: str
    input_tokens: Lengths
    output_tokens: Lengths
    stream: bool = True
    max_tokens: Literal["exact", "none"] | int = "exact"
    prefix: Prefix | None = None
    adapters: list[AdapterShare] = Field(default_factory=list)

    @model_validator(mode="after")
    def _shares(self) -> Requests:
        names = [a.name for a in self.adapters]
        if len(set(names)) != len(names) or self.model in names:
            raise ValueError("adapters: each adapter once, and not the base model")
        if sum(a.share for a in self.adapters) > 1 + 1e-9:
            raise ValueError("adapters: the shares add up to more than 1")
        return self


class Tenant(_Strict):
    name: str
    share: float = Field(gt=0)
    priority: Priority | None = None


class Fault(_Strict):
    """One injected fault: an endpoint (or every endpoint of a pool) down, or slowed down."""

    at_s: float = Field(ge=0)
    endpoint: str | None = None
    pool: str | None = None
    down_for_s: float | None = Field(default=None, gt=0)
    slow: float | None = Field(default=None, gt=0, description="step-time multiplier")
    for_s: float | None = Field(default=None, gt=0, description="how long the slow-down lasts")

    @model_validator(mode="after")
    def _what_and_where(self) -> Fault:
        if (self.endpoint is None) == (self.pool is None):
            raise ValueError("name exactly one of 'endpoint' or 'pool'")
        if (self.down_for_s is None) == (self.slow is None):
            raise ValueError("give exactly one of 'down_for_s' or 'slow'")
        return self


class Workload(_Strict):
    duration_s: float | None = Field(default=None, gt=0)  # None: 600 s, or a trace's span
    slo: Slo
    arrivals: Arrivals
    requests: Requests | None = None  # required with a process; optional with a trace
    tenants: list[Tenant] = Field(default_factory=list)
    priorities: dict[Priority, float] = Field(default_factory=dict)
    faults: list[Fault] = Field(default_factory=list)
    source_dir: str = Field(default=".", exclude=True)  # where a relative trace path starts

    @model_validator(mode="after")
    def _requests_for_process(self) -> Workload:
        if self.arrivals.process is not None and self.requests is None:
            raise ValueError("requests: required with an arrival process")
        return self

    def trace_path(self) -> Path | None:
        if self.arrivals.trace is None:
            return None
        path = Path(self.arrivals.trace)
        return path if path.is_absolute() else Path(self.source_dir) / path


class WorkloadError(ValueError):
    """A workload file that cannot be used; one ``path: message`` line per problem."""

    def __init__(self, source: str, errors: list[str]) -> None:
        super().__init__(f"{source}: " + "; ".join(errors))
        self.errors = errors


def load_workload(path: str | Path) -> Workload:
    source = str(path)
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise WorkloadError(source, [f"(file): {exc}"]) from None
    if not isinstance(raw, dict):
        raise WorkloadError(source, ["(root): must be a mapping"])
    raw["source_dir"] = str(Path(path).resolve().parent)
    try:
        return Workload.model_validate(raw)
    except ValidationError as exc:
        raise WorkloadError(source, [_where(e["loc"]) + ": " + str(e["msg"]).removeprefix(
            "Value error, ") for e in exc.errors()]) from None


def _where(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(root)"
