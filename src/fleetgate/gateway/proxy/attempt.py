"""One upstream attempt: measures it and reports the outcome to the live state and observers.

The gateway's own measurements feed routing: TTFT at the first frame that carries output
(``apis.py`` says which, per API), TPOT as the time between the first and last token over
the tokens in between, end-to-end time; for a non-streamed answer only the whole time is
known, so TPOT is (e2e - predicted TTFT) / (tokens - 1). Each measurement is also compared
with the uncorrected prior for the conditions this request met (``state/learning.py``),
which is how the prior learns.

Exactly one of ``finished`` / ``failed`` / ``suspected`` / ``cancelled`` takes effect per
attempt. ``failed`` is the engine's failure (the breaker counts it); ``suspected`` a failure
this request may have caused (an engine 5xx): the slot is freed with no verdict, and the
service judges it later with ``blame`` once another endpoint has answered the same request
(``outcome.settle``; the rule is in ``state/breaker.py``).

May touch: state (the live fleet), the observer seam. Must not touch: HTTP.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleetgate.gateway.proxy.observer import AttemptObserver, AttemptResult
from fleetgate.routing import Endpoint
from fleetgate.state.learning import Sample
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
    sample: Sample
    observer: AttemptObserver
    released: Callable[[], None]  # after the live state has seen the end
    in_flight_at_start: float = 1.0
    predicted_e2e_s: float | None = None
    source: str = ""  # who sent the request (the tenant; "" on an open gateway)
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
        ttft = decision.estimate("ttft_s", position)
        routing = ex.req.routing
        sample = fleet.live.on_dispatch(i, now, ttft, routing.prompt_tokens_estimate,
                                        decision.slo_limits(position), routing.prefix_hashes)
        return cls(fleet.live, i, ep, served, fleet.clock, now, ttft, sample,
                   ex.obs.attempt(ep, served, number), ex.released,
                   fleet.live.value(i, "in_flight"), decision.estimate("e2e_s", position),
                   source=routing.tenant or "")

    def first_token(self) -> None:
        self.first_at = self.clock()
        ttft = self.first_at - self.t0
        self.live.on_first_token(self.i, self.first_at, ttft, self.sample)
        self.observer.first_token(ttft)

    def finished(self, usage: dict[str, Any] | None, status: int = 200,
                 billed: dict[str, Any] | None = None, migrated_after: int | None = None,
                 later: Callable[[Callable[[], None]], object] | None = None) -> None:
        """``usage``: what this engine did (the live state learns from it); ``billed``: what
        the observers account when it differs (a resumed stream's whole answer, continued
        after ``migrated_after`` tokens). ``later``: how to run the live state's learning
        and the slot's release after the answer is written (``loop.call_soon`` for a whole
        answer: ~19 us of the client's wait at low load); the observers are told at once,
        since the answer's cost header reads their charge."""
        if not self._end():
            return
        now = self.clock()
        tokens = int((usage or {}).get("completion_tokens") or 0)
        first_at = self.first_at
        start = self.t0 + (self.predicted_ttft_s or 0.0) if first_at is None else first_at
        tpot = (now - start) / (tokens - 1) if tokens > 1 and now > start else None
        concurrency = (self.in_flight_at_start + self.live.value(self.i, "in_flight")) / 2
        ttft = None if first_at is None else first_at - self.t0

        def learn() -> None:
            if first_at is None:  # non-streamed: only the whole time is known
                self.live.on_first_token(self.i, now, None)
            self.live.on_finish(self.i, now, tokens, now - self.t0, tpot, self.sample, ttft)
            self.released()

        if later is None:
            learn()
        else:
            later(learn)
        self.observer.finished(AttemptResult(status, billed or usage, ttft, now - self.t0,
                                             max(1.0, concurrency), migrated_after))

    def failed(self, status: int, error: str, counts_against_engine: bool = True) -> None:
        if self._end():
            self.live.on_failure(self.i, self.clock(), counts_against_engine)
            self.released()
            self.observer.failed(status, error)

    def suspected(self, status: int, error: str) -> None:
        """Failed in a way this request may have caused: freed now, judged by ``blame``."""
        if self._end():
            self.live.on_failure(self.i, self.clock(), counts_against_engine=False)
            self.released()
            self.observer.failed(status, error)

    def blame(self, engine_fault: bool) -> None:
        """The verdict on a ``suspected`` failure: the engine's (``engine_fault``: the same
        request succeeded on the same engine and model elsewhere), else once per source."""
        self.live.on_blame(self.i, self.clock(), None if engine_fault else self.source)

    def cancelled(self) -> None:
        if self._end():
            self.live.on_cancel(self.i)
            self.released()
            self.observer.cancelled()

    def refused(self) -> None:
        """The engine refused the connection: not ready, its breaker opens at once."""
        self.live.on_refused(self.i, self.clock(), "connect refused (relay)")

    def _end(self) -> bool:
        first = not self.ended
        self.ended = True
        return first
