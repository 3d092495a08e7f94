"""One upstream attempt: measures it and reports the outcome to the live state and observers.

The gateway's own measurements feed routing: TTFT at the first frame that carries output
(``apis.py`` says which, per API), TPOT as the time between the first and last token over
the tokens in between, end-to-end time; for a non-streamed answer only the whole time is
known, so TPOT is (e2e - predicted TTFT) / (tokens - 1). Each measurement is also compared
with the router's prediction for this request, which is how the prior learns.

Exactly one of ``finished`` / ``failed`` / ``cancelled`` takes effect per attempt.

May touch: state (the live fleet), the observer seam. Must not touch: HTTP.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleetgate.gateway.proxy.observer import AttemptObserver, AttemptResult
from fleetgate.routing import Endpoint
from fleetgate.state.live import LiveFleet

if TYPE_CHECKING:
    from fleetgate.gateway.proxy.service import Exchange


@dataclass(slots=True)
class Attempt:
    live: LiveFleet
    i: int  # the endpoint's position in the live fleet
    ep: Endpoint
    served: str  # the model name the engine serves
    clock: Callable[[], float]
    t0: float
    predicted_ttft_s: float | None
    predicted_tpot_s: float | None
    observer: AttemptObserver
    in_flight_at_start: float = 1.0
    first_at: float | None = None
    ended: bool = False

    @classmethod
    def start(cls, ex: Exchange, position: int, number: int) -> Attempt:
        """Dispatch to the candidate at ``position`` of the decision (attempt ``number``)."""
        fleet, decision = ex.gen.fleet, ex.entry.decision
        i = int(decision.idx[position])
        ep = fleet.endpoints[i]
        served = ep.models[ex.req.routing.model]
        now = fleet.clock()
        fleet.live.on_dispatch(i, now)
        return cls(fleet.live, i, ep, served, fleet.clock, now,
                   decision.estimate("ttft_s", position), decision.estimate("tpot_s", position),
                   ex.obs.attempt(ep, served, number), fleet.live.value(i, "in_flight"))

    def first_token(self) -> None:
        self.first_at = self.clock()
        ttft = self.first_at - self.t0
        self.live.on_first_token(self.i, ttft, self.predicted_ttft_s)
        self.observer.first_token(ttft)

    def finished(self, usage: dict[str, Any] | None, status: int = 200) -> None:
        if not self._end():
            return
        now = self.clock()
        tokens = int((usage or {}).get("completion_tokens") or 0)
        if self.first_at is None:  # non-streamed: only the whole time is known
            self.live.on_first_token(self.i, None, None)
            start = self.t0 + (self.predicted_ttft_s or 0.0)
        else:
            start = self.first_at
        tpot = (now - start) / (tokens - 1) if tokens > 1 and now > start else None
        concurrency = (self.in_flight_at_start + self.live.value(self.i, "in_flight")) / 2
        self.live.on_finish(self.i, now, tokens, now - self.t0, tpot, self.predicted_tpot_s)
        ttft = None if self.first_at is None else self.first_at - self.t0
        self.observer.finished(AttemptResult(status, usage, ttft, now - self.t0,
                                             max(1.0, concurrency)))

    def failed(self, status: int, error: str, counts_against_engine: bool = True) -> None:
        if self._end():
            self.live.on_failure(self.i, self.clock(), counts_against_engine)
            self.observer.failed(status, error)

    def cancelled(self) -> None:
        if self._end():
            self.live.on_cancel(self.i)
            self.observer.cancelled()

    def refused(self) -> None:
        """The engine refused the connection: not ready, its breaker opens at once."""
        self.live.on_refused(self.i, self.clock(), "connect refused (relay)")

    def _end(self) -> bool:
        first = not self.ended
        self.ended = True
        return first
