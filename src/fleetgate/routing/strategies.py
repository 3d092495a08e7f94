"""The strategy presets: ONE row per strategy a policy may name.

A row says which scorers (with weights) and which picker the strategy uses, whether a
policy must bring its own scorers, and its SLO mode. ``slo_mode="prefer"`` ranks the
endpoints predicted to meet the policy's SLO first (by their weighted score), then the
others fastest-first, the fastest leading when none meets it: "the cheapest endpoint that
meets the SLO, spilling to the next cheapest as load grows" (the ``cost`` strategy).
``"ignore"`` just ranks by the weighted score. Each row is overridable by a policy's own
``scorers`` / ``picker``. Adding a strategy is one row here (plus a plugin file in
``plugins/`` if it needs a new scorer).

| strategy | scorers (weight) | picker | SLO |
|---|---|---|---|
| cost | cost (1) | max_score | prefer |
| latency | latency (1) | max_score | ignore |
| least_loaded | queue (1), kv_headroom (0.25) | max_score | ignore |
| round_robin | none | round_robin | ignore |
| power_of_two | queue (1) | power_of_two | ignore |
| affinity | affinity (1), queue (0.2) | max_score | ignore |
| weighted | the policy's own (required) | max_score | ignore |

May touch: nothing (data). Must not touch: I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

SloMode = Literal["prefer", "ignore"]


@dataclass(frozen=True, slots=True)
class Strategy:
    scorers: tuple[tuple[str, float], ...]
    picker: str = "max_score"
    slo_mode: SloMode = "ignore"
    needs_scorers: bool = False


STRATEGIES: dict[str, Strategy] = {
    "cost": Strategy((("cost", 1.0),), slo_mode="prefer"),
    "latency": Strategy((("latency", 1.0),)),
    "least_loaded": Strategy((("queue", 1.0), ("kv_headroom", 0.25))),
    "round_robin": Strategy((), picker="round_robin"),
    "power_of_two": Strategy((("queue", 1.0),), picker="power_of_two"),
    "affinity": Strategy((("affinity", 1.0), ("queue", 0.2))),
    "weighted": Strategy((), needs_scorers=True),
}
