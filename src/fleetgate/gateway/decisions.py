"""The decision log: the last routing decisions, explainable on demand.

Each entry keeps the ``Decision`` (arrays, cheap to keep) plus the request id, the time, the
replica that routed it (its replica id, as in ``/admin/endpoints``), the outcome of the
attempts and, where a model fallback happened, both ends of it (``fallback`` on the
fallback model's decision, ``fell_back_to`` on the one it replaced: one request, several
entries); ``explain`` renders the candidates' per-scorer scores and
estimates only when ``/admin/decisions`` asks. The log keeps the last ``size`` decisions,
or fewer when their candidates add up to more than ``max_candidates`` (a decision keeps
~150 bytes per candidate: 1,000 decisions over 1,000 endpoints would hold 150 MB).
``/admin/decisions?candidates=K`` lists only each decision's best K candidates (a decision
over 1,000 endpoints is ~300 KB of JSON in full).

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
    replica: str | None = None
    # a fallback model's decision: why (asked, from, reason, error; gateway/proxy/fallback.py)
    fallback: dict[str, str] | None = None
    fell_back_to: str | None = None  # this model could not serve it: the model tried next

    def explain(self, candidates: int | None = None) -> dict[str, Any]:
        out = self.decision.explain(candidates)
        chosen = self.decision.chosen
        out.update({
            "at": self.at, "request_id": self.request_id, "replica": self.replica,
            "attempts": self.attempts,
            "estimated_usd_per_mtok": self.decision.estimate("usd_per_mtok"),
            "estimated_ttft_s": self.decision.estimate("ttft_s"),
            "estimated_tpot_s": self.decision.estimate("tpot_s"),
            "chosen_pool": chosen.pool if chosen else None,
            "fallback": self.fallback, "fell_back_to": self.fell_back_to,
        })
        return out


class DecisionLog:
    def __init__(self, size: int = 1000, max_candidates: int = 100_000,
                 replica: str | None = None) -> None:
        self.replica = replica
        self._entries: deque[DecisionEntry] = deque()
        self._size, self._max_candidates = size, max_candidates
        self._candidates = 0

    def record(self, request_id: str, decision: Decision) -> DecisionEntry:
        entry = DecisionEntry(time.time(), request_id, decision, replica=self.replica)
        self._entries.append(entry)
        self._candidates += len(decision.idx)
        while len(self._entries) > 1 and (len(self._entries) > self._size
                                          or self._candidates > self._max_candidates):
            self._candidates -= len(self._entries.popleft().decision.idx)
        return entry

    def __len__(self) -> int:
        return len(self._entries)

    def latest(self, limit: int, candidates: int | None = None) -> list[dict[str, Any]]:
        """The newest ``limit`` decisions, each with its best ``candidates`` (all if None)."""
        return [e.explain(candidates) for e in list(self._entries)[-limit:][::-1]]
