"""The decision log: the last N routing decisions, explainable on demand.

Each entry keeps the ``Decision`` (arrays, cheap to keep) plus the request id, the time and
the outcome of the attempts; ``explain`` renders every candidate's per-scorer scores and
estimates only when ``/admin/decisions`` asks.

May touch: routing types. Must not touch: HTTP.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from fleetgate.routing import Decision


@dataclass(slots=True)
class DecisionEntry:
    at: float
    request_id: str
    decision: Decision
    attempts: list[dict[str, Any]] = field(default_factory=list)

    def explain(self) -> dict[str, Any]:
        out = self.decision.explain()
        chosen = self.decision.chosen
        out.update({
            "at": self.at, "request_id": self.request_id, "attempts": self.attempts,
            "estimated_usd_per_mtok": self.decision.estimate("usd_per_mtok"),
            "estimated_ttft_s": self.decision.estimate("ttft_s"),
            "estimated_tpot_s": self.decision.estimate("tpot_s"),
            "chosen_pool": chosen.pool if chosen else None,
        })
        return out


class DecisionLog:
    def __init__(self, size: int = 1000) -> None:
        self._entries: deque[DecisionEntry] = deque(maxlen=size)

    def record(self, request_id: str, decision: Decision) -> DecisionEntry:
        entry = DecisionEntry(time.time(), request_id, decision)
        self._entries.append(entry)
        return entry

    def latest(self, limit: int) -> list[dict[str, Any]]:
        return [e.explain() for e in list(self._entries)[-limit:][::-1]]
