"""The routing pipeline (llm-d's endpoint picker is the model) and the strategy presets.

``Pipeline.route(request, snapshot)`` is pure: builtin prefilters (serves the model, not
``not_ready``, breaker allows, fresh) -> estimates (``estimate.py``) -> for a LoRA
adapter, the adapter stage (``adapters.py``: where it is loaded, else where it may be) ->
the policy's filters -> weighted scorers, each in [0,1] -> a picker that puts the best
``max_attempts`` survivors first (the attempt and retry order). Each stage works on whole
columns (numpy, or a compiled loop) and keeps its mask, so why an endpoint was dropped is
only worked out when someone asks (``Decision``).

Strategy presets and the SLO modes are data in ``strategies.py``. A model served by more
than ``SHORTLIST_FROM`` endpoints is decided over a shortlist of them (``shortlist.py``),
and over all of them when none of the shortlist is eligible.

May touch: numpy, routing plugins and types. Must not touch: I/O, asyncio, clocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fleetgate.routing.adapters import STAGE as ADAPTER_STAGE
from fleetgate.routing.adapters import adapter_stage, is_adapter
from fleetgate.routing.estimate import Estimates, Slo
from fleetgate.routing.plugins import Bound, ScoringInput
from fleetgate.routing.plugins.base import normalise_min_over
from fleetgate.routing.shortlist import SHORTLIST_FROM, Shortlist
from fleetgate.routing.strategies import SloMode
from fleetgate.routing.types import PREFILTER, Decision, RoutingRequest, Snapshot


@dataclass
class Pipeline:
    name: str
    picker: Any  # has .order(rank, k) -> the k best positions, best first
    filters: list[Bound] = field(default_factory=list)
    scorers: list[Bound] = field(default_factory=list)
    slo: Slo = field(default_factory=Slo)
    slo_mode: SloMode = "ignore"
    max_attempts: int = 3
    seed: int | None = None  # the shortlist's shuffles
    _weights: list[float] = field(init=False, repr=False)  # scorer weights over their sum
    _shortlist: Shortlist = field(init=False, repr=False)

    def __post_init__(self) -> None:
        weight = sum(s.weight for s in self.scorers)
        self._weights = [s.weight / weight for s in self.scorers] if weight > 0 else []
        self._shortlist = Shortlist(self.seed)
        self._sticky = any(s.name == "affinity" for s in self.scorers)
        self._sampling = getattr(self.picker, "sampling", False)
        self._cycles = getattr(self.picker, "cycles", False)

    def route(self, req: RoutingRequest, snap: Snapshot) -> Decision:
        idx = snap.by_model.get((req.model, req.api))
        if idx is None or not len(idx):
            return Decision(self.name, req.model, "no endpoint serves the model", snap.endpoints)
        if len(idx) <= SHORTLIST_FROM:
            return self._route(req, snap, idx)
        short = self._shortlist.pick(snap, req, idx, self._sticky, self._sampling, self._cycles)
        decision = self._route(req, snap, short)
        if not len(decision.order):  # nothing eligible in view: look at every endpoint
            decision = self._route(req, snap, idx)
        if len(decision.order):
            self._shortlist.chose(req, int(decision.idx[decision.order[0]]))
        return decision

    def _route(self, req: RoutingRequest, snap: Snapshot, idx: Any) -> Decision:
        est = Estimates(snap, idx, req, self.slo)
        alive, left = est.prefilter()
        count = len(idx)
        stages = [] if left == count else [(PREFILTER, alive)]
        adapter, load = None, False
        if snap.adapters is not None and is_adapter(snap, req.model, idx):
            adapter = req.model
            keep, load = adapter_stage(snap, adapter, idx, alive)
            stages.append((ADAPTER_STAGE, keep))
            alive = alive & keep
            left = int(np.count_nonzero(alive))
        inp = ScoringInput(snap, idx, req, est, alive)
        for flt in self.filters:
            if not left:
                break
            keep = flt(inp)
            if keep is None:
                continue
            stages.append((flt.label, keep))
            alive = inp.mask = alive & keep
            left = int(np.count_nonzero(alive))
        if not left:
            limit = context_limit(req, est.column("max_model_len"))
            return Decision(self.name, req.model, "no eligible endpoint" if limit is None else
                            "the request exceeds every endpoint's context", snap.endpoints, idx,
                            stages=tuple(stages), estimates=est, alive=alive,
                            context_limit=limit, adapter=adapter)
        scores = {s.name: s(inp) for s in self.scorers}
        total, reason, over = self._total(scores, est, alive, left)
        rank = total if left == count else np.where(alive, total, -np.inf)
        order = self.picker.order(rank, min(self.max_attempts, left))
        return Decision(self.name, req.model, reason, snap.endpoints, idx, order, total, scores,
                        est, tuple(stages), alive, over, adapter=adapter, load_adapter=load)

    def _total(self, scores: dict[str, Any], est: Estimates, alive: Any,
               left: int) -> tuple[Any, str, bool]:
        """The weighted score, in [0,1]; with an SLO preference (``strategies.py``), in [0,4]:
        the endpoints predicted to meet the SLO by score, then the self-hosted ones that fail
        only their prefill share (``estimate.py`` ``over_share``: within the SLO on average,
        a risk to its tail) by score, then a hosted API that meets the SLO (overflow: it
        takes only what self-hosted capacity cannot), then the rest fastest-first."""
        if not self._weights:
            total = np.zeros(len(alive))
        elif len(self.scorers) == 1:
            total = np.asarray(scores[self.scorers[0].name], dtype=np.float64)
        else:
            total = scores[self.scorers[0].name] * self._weights[0]
            for s, w in zip(self.scorers[1:], self._weights[1:], strict=True):
                total += scores[s.name] * w
        if self.slo_mode == "ignore":
            return total, f"{self.name}: best weighted score", False
        meets = est.meets_slo & alive
        meeting = int(np.count_nonzero(meets))
        if meeting == left:
            return total, "meets the SLO: best score (cheapest)", False
        fastest = normalise_min_over(est.e2e_s, alive)
        over_share = (est.over_share > 0) & alive
        if not np.any(over_share):
            if not meeting:
                return fastest, "no endpoint is predicted to meet the SLO: fastest first", True
            return np.where(meets, 1.0 + total, fastest * 0.999), \
                "cheapest predicted to meet the SLO; the rest fastest-first", False
        hosted = est.column("per_token") > 0
        tiered = np.where(meets & ~hosted, 3.0 + total,
                          np.where(over_share, 2.0 + total,
                                   np.where(meets, 1.0 + total, fastest * 0.999)))
        return tiered, ("cheapest predicted to meet the SLO; then those over their prefill "
                        "share, then a hosted API's overflow; the rest fastest-first"), False


def context_limit(req: RoutingRequest, contexts: Any) -> int | None:
    """The largest of ``contexts`` when ``req`` fits none of them, else None.

    A request needs its prompt plus ``max_tokens``; without ``max_tokens`` the engines
    generate into whatever room is left, so it needs the prompt plus one token (vLLM and
    SGLang refuse a prompt as long as the context)."""
    largest = float(np.max(contexts)) if len(contexts) else 0.0
    if req.prompt_tokens_estimate + (req.max_tokens or 1) <= largest:
        return None
    return int(largest)
