"""Per-endpoint circuit breaker and health state machine; time is always passed in.

Breaker: ``closed`` -> ``open`` after ``failure_threshold`` consecutive failures; after
``cooldown_s`` it lets exactly one probe request through (``half_open``); that request's
success closes it, its failure re-opens it for another cooldown. A probe that ends without a
verdict (a 4xx, the client leaving) frees the half-open slot (``on_no_verdict``): the next
request is the probe, so an endpoint is never shut out for good by a probe that said nothing.

What counts (the rule; the gateway's proxy decides which kind a failure is, ``gateway/proxy/
outcome.py``, docs/engines.md "Request validation and the breaker"): a breaker trips on what
the *engine* does, never on what one caller's requests can make it do.

* engine failures (``on_failure(now)``, no source): refused connections (``trip``: open at
  once), timeouts, HTTP 429/502/503/504, in-band 503s, streams that break mid-way. Each counts.
* suspect failures (``on_failure(now, source)``): an engine 5xx answer (or a dropped answer)
  to a request that may itself be the cause. The proxy first tries it once more elsewhere;
  failing the same way there makes it a *poison request*, counted against no breaker at all.
  Otherwise it counts once per ``source`` (the tenant; "" for an open gateway's callers) in a
  failure run: one tenant, however many requests it shapes, adds at most one to
  ``consecutive_failures`` (``failure_threshold`` >= 2 then needs several tenants, or an
  engine failure). A success ends the run (``blamed`` is cleared).
* 4xx answers and cancelled requests: no verdict (``on_no_verdict``).

Health: ``pending`` until the first probe answers; ``ready`` after a successful probe;
``not_ready`` after ``fails_to_not_ready`` failed probes in a row, or at once on a refused
connection (unambiguous). One successful probe makes it ``ready`` again.

May touch: nothing but its own state. Must not read a clock (callers pass ``now``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from fleetgate.routing.types import Health

BreakerState = Literal["closed", "open", "half_open"]
MAX_BLAMED = 64  # sources remembered per failure run (beyond: each new one still counts)


@dataclass(slots=True)
class CircuitBreaker:
    failure_threshold: int = 5
    cooldown_s: float = 5.0
    state: BreakerState = "closed"
    consecutive_failures: int = 0
    opened_at: float = 0.0
    probe_in_flight: bool = False
    blamed: set[str] = field(default_factory=set)  # sources of this run's suspect failures

    def allows(self, now: float) -> bool:
        """Whether routing may pick this endpoint now (no state change)."""
        if self.state == "closed":
            return True
        if self.state == "open":
            return now - self.opened_at >= self.cooldown_s
        return not self.probe_in_flight

    def on_dispatch(self, now: float) -> None:
        if self.state == "open" and now - self.opened_at >= self.cooldown_s:
            self.state = "half_open"
        if self.state == "half_open":
            self.probe_in_flight = True

    def on_success(self) -> None:
        self.state, self.consecutive_failures, self.probe_in_flight = "closed", 0, False
        self.blamed.clear()

    def on_no_verdict(self) -> None:
        """A request ended saying nothing about the engine (a 4xx, a cancelled request):
        a half-open breaker lets the next request through as its probe."""
        self.probe_in_flight = False

    def trip(self, now: float) -> None:
        """Open at once (a refused connection needs no second opinion)."""
        self.consecutive_failures = max(self.consecutive_failures, self.failure_threshold)
        self.state, self.opened_at, self.probe_in_flight = "open", now, False

    def on_failure(self, now: float, source: str | None = None) -> bool:
        """An engine failure (``source`` None), or a suspect one from ``source`` (the
        tenant): a source already blamed in this failure run adds nothing (False)."""
        self.probe_in_flight = False
        if source is not None:
            if source in self.blamed:
                return False
            if len(self.blamed) < MAX_BLAMED:
                self.blamed.add(source)
        self.consecutive_failures += 1
        if self.state == "half_open" or self.consecutive_failures >= self.failure_threshold:
            self.state, self.opened_at = "open", now
        return True


@dataclass(slots=True)
class HealthTracker:
    fails_to_not_ready: int = 2
    state: Health = "pending"
    failed_probes: int = 0
    detail: str = ""

    def on_probe(self, ok: bool, detail: str) -> bool:
        """Record a probe; True when the state changed."""
        before = self.state
        self.detail = detail
        if ok:
            self.state, self.failed_probes = "ready", 0
        else:
            self.failed_probes += 1
            if self.failed_probes >= self.fails_to_not_ready:
                self.state = "not_ready"
        return self.state != before

    def on_refused(self, detail: str) -> bool:
        before = self.state
        self.state, self.detail = "not_ready", detail
        self.failed_probes = max(self.failed_probes, self.fails_to_not_ready)
        return self.state != before
