"""The gateway's request path in virtual time: route, dispatch, fail over, learn, charge.

Mirrors ``gateway/proxy/service.py`` (ProxyService) and ``gateway/proxy/attempt.py``
(Attempt) step for step, on the same ``LiveFleet`` and the same ``Router``:

1. the router decides from ``live.snapshot(now)`` (never anything the live gateway would
   not know: scraped load one scrape old, its own in-flight counts since);
2. ``x-priority: low`` requests are shed (429) when the decision says every endpoint is
   past its SLO capacity; no candidate at all is a 503;
3. the candidates are tried in the decision's order, up to the policy's ``max_attempts``:
   ``on_dispatch``, predictions of TTFT and TPOT taken from the decision for that candidate;
   a replica that is down refuses (``on_refused`` + ``on_failure``) and the next is tried;
   one that dies before the first token is retried on the next candidate, after it the
   request fails (the live gateway ends the stream with an error event);
4. first token: ``on_first_token(ttft, predicted)`` (streamed; a non-streamed answer reports
   ``None`` at the end and TPOT is measured from the predicted TTFT, as live);
5. finish: ``on_finish`` with the measured TPOT and its prediction, and the ledger's charge
   (``catalog.pricing``: replica $/s x e2e / mean in-flight at start and end).

May touch: routing, state.live, the replicas, outcomes. Must not touch: wall clocks, I/O.
"""

from __future__ import annotations

from collections.abc import Callable

from fleetgate.catalog.pricing import charge_usd, replica_seconds
from fleetgate.routing import Decision, Router, RoutingRequest
from fleetgate.sim.arrivals import PRIORITIES, RequestSet
from fleetgate.sim.outcomes import BAD_REQUEST, FAILED, NO_CAPACITY, OK, SHED, Outcomes
from fleetgate.sim.replica import SimReplica
from fleetgate.state.live import LiveFleet

LOW = PRIORITIES.index("low")
CHARS_PER_TOKEN = 4  # RoutingRequest.prompt_tokens_estimate = chars // 4 + 8


class Flight:
    """One request between arrival and its end."""

    __slots__ = ("arrival", "attempts", "decision", "first_at", "i", "in_flight0", "next",
                 "pred_tpot", "pred_ttft", "r", "t0")

    def __init__(self, r: int, arrival: float, decision: Decision, attempts: int) -> None:
        self.r, self.arrival, self.decision = r, arrival, decision
        self.attempts = decision.attempts(attempts)
        self.next = 0
        self.i = -1
        self.t0 = arrival
        self.first_at: float | None = None
        self.pred_ttft: float | None = None
        self.pred_tpot: float | None = None
        self.in_flight0 = 1.0


Reschedule = Callable[[int], None]


class SimGateway:
    def __init__(self, requests: RequestSet, router: Router, live: LiveFleet,
                 replicas: list[SimReplica], max_attempts: dict[str, int], policy: str,
                 reschedule: Reschedule) -> None:
        self.req, self.router, self.live, self.replicas = requests, router, live, replicas
        self.out = Outcomes.empty(len(requests))
        self._max_attempts, self._policy, self._reschedule = max_attempts, policy, reschedule
        self._usd_per_s = [ep.usd_per_s for ep in live.endpoints]
        self._gpus = [ep.gpus_per_replica for ep in live.endpoints]
        self.flights: dict[int, Flight] = {}
        self.on_endpoint: list[set[int]] = [set() for _ in live.endpoints]

    def _routing_request(self, r: int) -> RoutingRequest:
        req = self.req
        priority = PRIORITIES[int(req.priority[r])]
        headers = {} if priority == "normal" else {"x-priority": priority}
        sent = int(req.max_tokens[r])
        return RoutingRequest(
            model=req.models[int(req.model[r])], stream=bool(req.stream[r]),
            max_tokens=sent or None,
            prompt_chars=CHARS_PER_TOKEN * max(0, int(req.prompt_tokens[r]) - 8),
            headers=headers, tenant=req.tenants[int(req.tenant[r])], policy=self._policy)

    # -- arrivals and attempts -------------------------------------------------------------
    def arrive(self, r: int, now: float) -> None:
        decision = self.router.route(self._routing_request(r), self.live.snapshot(now))
        if decision.over_capacity and int(self.req.priority[r]) == LOW:
            self._end(r, SHED, now)
            return
        if not len(decision.order):
            self._end(r, NO_CAPACITY, now)
            return
        flight = Flight(r, now, decision, self._max_attempts.get(decision.policy, 3))
        self.flights[r] = flight
        self._try_next(flight, now)

    def _try_next(self, flight: Flight, now: float) -> None:
        live, r = self.live, flight.r
        while flight.next < len(flight.attempts):
            position, ep = flight.attempts[flight.next]
            flight.next += 1
            i = live.index[ep.id]
            live.on_dispatch(i, now)
            self.out.attempts[r] += 1
            flight.i, flight.t0, flight.first_at = i, now, None
            flight.pred_ttft = flight.decision.estimate("ttft_s", position)
            flight.pred_tpot = flight.decision.estimate("tpot_s", position)
            flight.in_flight0 = live.value(i, "in_flight")
            replica = self.replicas[i]
            if not replica.up:
                live.on_refused(i, now, "connect refused (relay)")
                live.on_failure(i, now)
                continue
            prompt, output = int(self.req.prompt_tokens[r]), int(self.req.output_tokens[r])
            if prompt + output > replica.kv_capacity_tokens:  # the engine answers 400
                live.on_failure(i, now, counts_against_engine=False)
                self._end(r, BAD_REQUEST, now, i)
                return
            self.on_endpoint[i].add(r)
            if replica.add(str(r), prompt, output, now):
                self._reschedule(i)
            return
        self._end(r, FAILED, now, flight.i)

    # -- engine events -------------------------------------------------------------------
    def first_token(self, r: int, now: float) -> None:
        flight = self.flights[r]
        flight.first_at = now
        self.out.ttft_s[r] = now - flight.arrival
        if self.req.stream[r]:
            self.live.on_first_token(flight.i, now - flight.t0, flight.pred_ttft)

    def finished(self, r: int, now: float) -> None:
        flight = self.flights[r]
        i, live = flight.i, self.live
        tokens = int(self.req.output_tokens[r])
        if self.req.stream[r] and flight.first_at is not None:
            start = flight.first_at
        else:
            live.on_first_token(i, None, None)
            start = flight.t0 + (flight.pred_ttft or 0.0)
        tpot = (now - start) / (tokens - 1) if tokens > 1 and now > start else None
        concurrency = (flight.in_flight0 + live.value(i, "in_flight")) / 2
        live.on_finish(i, now, tokens, now - flight.t0, tpot, flight.pred_tpot)
        self._charge(r, i, now - flight.t0, concurrency, ok=True)
        out = self.out
        out.tokens[r] = tokens
        if tokens > 1 and flight.first_at is not None:
            out.tpot_s[r] = (now - flight.first_at) / (tokens - 1)
        self._end(r, OK, now, i)

    def endpoint_died(self, i: int, now: float) -> None:
        """Replica ``i`` lost its requests: retry those without a first token elsewhere."""
        lost, self.on_endpoint[i] = sorted(self.on_endpoint[i]), set()
        for r in lost:
            flight = self.flights[r]
            concurrency = (flight.in_flight0 + self.live.value(i, "in_flight")) / 2
            self.live.on_failure(i, now)
            self._charge(r, i, now - flight.t0, concurrency, ok=False)
            if flight.first_at is None:
                self._try_next(flight, now)
            else:
                self._end(r, FAILED, now, i)

    # -- bookkeeping ---------------------------------------------------------------------
    def _charge(self, r: int, i: int, e2e_s: float, concurrency: float, ok: bool) -> None:
        usd = charge_usd(self._usd_per_s[i], e2e_s, concurrency)
        seconds = replica_seconds(e2e_s, concurrency)
        out = self.out
        out.usd[r] += usd
        out.replica_seconds[r] += seconds
        out.gpu_seconds[r] += seconds * self._gpus[i]
        if not ok:
            out.failed_usd[r] += usd

    def _end(self, r: int, status: int, now: float, i: int = -1) -> None:
        """Request ``r`` is over (``i``: where its last attempt ran, -1 for none)."""
        self.flights.pop(r, None)
        if i >= 0:
            self.on_endpoint[i].discard(r)
        out = self.out
        out.status[r] = status
        out.e2e_s[r] = now - float(self.req.arrival_s[r])
        out.endpoint[r] = i
