"""The plugin registry: one explicit table of filters, scorers and pickers.

A new routing idea is a new file here, named after its registry name, plus one line in the
table; the pipeline never changes. ``bind`` validates a plugin's typed params when a policy
is built (config load), so a bad policy fails loudly with its YAML path.

May touch: the plugin modules, pydantic. Must not touch: I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from fleetgate.routing.plugins import (
    affinity,
    context_fit,
    cost,
    kv_headroom,
    latency,
    max_cost,
    max_queue,
    meets_slo,
    pickers,
    prefix_cache,
    queue,
    select,
    slo,
)
from fleetgate.routing.plugins.base import FilterFn, NoParams, ScorerFn, ScoringInput


@dataclass(frozen=True, slots=True)
class Plugin:
    fn: Callable[..., Any]
    params: type[BaseModel]


FILTERS: dict[str, Plugin] = {
    "select": Plugin(select.select, select.SelectParams),
    "max_queue": Plugin(max_queue.max_queue, max_queue.MaxQueueParams),
    "context_fit": Plugin(context_fit.context_fit, NoParams),
    "meets_slo": Plugin(meets_slo.meets_slo, NoParams),
    "max_cost": Plugin(max_cost.max_cost, max_cost.MaxCostParams),
}
SCORERS: dict[str, Plugin] = {
    "cost": Plugin(cost.cost, NoParams),
    "latency": Plugin(latency.latency, NoParams),
    "slo": Plugin(slo.slo, NoParams),
    "queue": Plugin(queue.queue, NoParams),
    "kv_headroom": Plugin(kv_headroom.kv_headroom, NoParams),
    "affinity": Plugin(affinity.affinity, NoParams),
    "prefix_cache": Plugin(prefix_cache.prefix_cache, prefix_cache.PrefixCacheParams),
}
PICKERS: dict[str, type] = {
    "max_score": pickers.MaxScore,
    "weighted_random": pickers.WeightedRandom,
    "power_of_two": pickers.PowerOfTwo,
    "round_robin": pickers.RoundRobin,
}


class PluginError(ValueError):
    """A policy names an unknown plugin or gives it bad params; ``where`` is its path."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where


@dataclass(frozen=True, slots=True)
class Bound:
    """A plugin with validated params, ready to call."""

    name: str
    fn: Callable[[ScoringInput, Any], Any]
    params: BaseModel
    weight: float = 1.0

    def __call__(self, inp: ScoringInput) -> Any:
        return self.fn(inp, self.params)

    @property
    def label(self) -> str:
        return f"filter {self.name}"


def bind(table: dict[str, Plugin], kind: str, name: str, params: dict[str, Any], where: str,
         weight: float = 1.0) -> Bound:
    plugin = table.get(name)
    if plugin is None:
        raise PluginError(f"{where}.name", f"unknown {kind} {name!r}; known: {sorted(table)}")
    try:
        validated = plugin.params.model_validate(params)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise PluginError(f"{where}.params.{loc}" if loc else f"{where}.params",
                          str(first["msg"])) from None
    return Bound(name, plugin.fn, validated, weight)


__all__ = ["FILTERS", "PICKERS", "SCORERS", "Bound", "FilterFn", "PluginError", "ScorerFn",
           "ScoringInput", "bind"]
