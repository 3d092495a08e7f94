"""What ``fleetgate plan`` may rent: (GPU x engine x stack x TP) rows at a price, and what one
replica of each sustains on the workload.

The price sheet (``--prices PRICES.yaml``, every key optional):

```yaml
prices: {mi300x: 1.99, mi355x: 2.90, h100: 2.49, h200: 3.60}   # $/GPU-hour; catalog mid
                                                               # price for a GPU not listed
engines: [vllm, sglang]          # default: both
stacks: [stock]                  # default: stock (upstream releases); add tuned to compare
tensor_parallel: [1, 2]          # default: the smallest TP whose KV cache holds one request
                                 # of max_model_len
```

A row that cannot hold the model (TP too small) is left out. Each row's capacity is
``capacity.replica_capacity`` of an emulated engine with exactly that configuration, on the
workload's own request mix and SLO, unless ``plan --capacities SWEEP.json`` measured it:
``load_capacities`` reads a ``fleetgate bench sweep --json`` result, and a pool there whose
(accelerator, engine, gpus_per_replica) is a row's takes the place of the estimate with its
``per_replica`` rate and tokens/s (the sweep should use the workload's lengths and SLO).

May touch: pydantic, yaml, the catalog, the emulator's config. Must not touch: routing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import orjson
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fleetgate.catalog.gpus import GPUS
from fleetgate.catalog.models import profile_for_served_name
from fleetgate.catalog.roofline import min_tensor_parallel
from fleetgate.emulator.config import EmulatorConfig
from fleetgate.sim.capacity import TARGET, Capacity, Mix, replica_capacities
from fleetgate.sim.parallel import Runner

EngineName = Literal["vllm", "sglang"]
StackName = Literal["stock", "tuned"]
_ENGINES: tuple[EngineName, ...] = ("vllm", "sglang")
_STACKS: tuple[StackName, ...] = ("stock",)


class PriceSheet(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    prices: dict[str, float] = Field(default_factory=dict)
    engines: list[EngineName] = Field(default_factory=lambda: list(_ENGINES))
    stacks: list[StackName] = Field(default_factory=lambda: list(_STACKS))
    tensor_parallel: list[int] | None = None

    def price(self, gpu: str) -> float:
        return self.prices.get(gpu, GPUS[gpu].default_price_per_gpu_hour)


def load_prices(path: str | Path | None) -> PriceSheet:
    if path is None:
        return PriceSheet()
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        sheet = PriceSheet.model_validate(raw)
    except (OSError, yaml.YAMLError, ValidationError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    unknown = sorted(set(sheet.prices) - set(GPUS))
    if unknown:
        raise ValueError(f"{path}: prices for unknown GPUs {unknown}; known: {sorted(GPUS)}")
    return sheet


@dataclass(frozen=True)
class Candidate:
    gpu: str
    engine: str
    stack: str
    tp: int
    price_per_gpu_hour: float
    capacity: Capacity

    @property
    def usd_per_hour(self) -> float:
        return self.price_per_gpu_hour * self.tp

    @property
    def vendor(self) -> str:
        return GPUS[self.gpu].vendor

    @property
    def name(self) -> str:
        parts = [self.gpu, self.engine]
        if self.stack != "stock":
            parts.append(self.stack)
        if self.tp > 1:
            parts.append(f"tp{self.tp}")
        return "-".join(parts)

    @property
    def source(self) -> str:
        query = [f"stack={self.stack}"] if self.stack != "stock" else []
        query += [f"tp={self.tp}"] if self.tp > 1 else []
        return f"emulated://{self.engine}/{self.gpu}" + ("?" + "&".join(query) if query else "")

    def with_price(self, price: float) -> Candidate:
        return Candidate(self.gpu, self.engine, self.stack, self.tp, price, self.capacity)


Measured = dict[tuple[str, str, int], Capacity]  # (gpu, engine, tp) -> one replica's


def load_capacities(path: str | Path) -> Measured:
    """Per-replica capacities from a ``bench sweep --json`` file, keyed like plan's rows."""
    try:
        data = orjson.loads(Path(path).read_bytes())
        out: Measured = {}
        for _name, pool in (data.get("pools") or {}).items():
            per = pool.get("per_replica")
            if not per or not pool.get("accelerator") or not pool.get("engine"):
                continue  # not a fleetgate pool, or nothing passed: keep the estimate
            key = (str(pool["accelerator"]), str(pool["engine"]),
                   int(pool.get("gpus_per_replica") or 1))
            cap = pool.get("capacity") or {}
            out[key] = Capacity(float(per["rate_per_s"]), float(per["tokens_per_s"]),
                                float(per.get("concurrency") or 0.0),
                                float(cap.get("slo_attainment") or 1.0))
    except (OSError, orjson.JSONDecodeError, AttributeError, KeyError, TypeError,
            ValueError) as exc:
        raise ValueError(f"{path}: not a `fleetgate bench sweep --json` result ({exc})") from None
    return out


def candidates(model: str, gpus: list[str], sheet: PriceSheet, mix: Mix, seed: int,
               measured: Measured | None = None, runner: Runner | None = None,
               ) -> list[Candidate]:
    """Every row of the sheet for ``gpus`` that holds ``model``, with its measured capacity
    (the searches run as ``runner``'s tasks, in parallel, when one is given)."""
    unknown = [g for g in gpus if g not in GPUS]
    if unknown:
        raise ValueError(f"unknown GPUs {unknown}; known: {sorted(GPUS)}")
    profile = profile_for_served_name(model)
    keys: list[tuple[str, str, str, int]] = []  # gpu, engine, stack, tp
    for gpu in gpus:
        try:
            least = min_tensor_parallel(GPUS[gpu], profile, profile.max_model_len)
        except ValueError:
            continue
        keys += [(gpu, engine, stack, tp)
                 for tp in sorted(t for t in (sheet.tensor_parallel or [least]) if t >= least)
                 for engine in sheet.engines for stack in sheet.stacks]
    known = measured or {}
    search = [k for k in keys if (k[0], k[1], k[3]) not in known]
    calls = [(EmulatorConfig.model_validate({"engine": engine, "gpu": gpu, "stack": stack,
                                             "served_models": [model], "tp": tp}),
              mix, seed, TARGET, 1.0) for gpu, engine, stack, tp in search]
    searched = dict(zip(search, replica_capacities(calls, runner), strict=True))
    rows = []
    for gpu, engine, stack, tp in keys:
        cap = known.get((gpu, engine, tp)) or searched[gpu, engine, stack, tp]
        if cap.rate_per_s > 0:
            rows.append(Candidate(gpu, engine, stack, tp, sheet.price(gpu), cap))
    return rows
