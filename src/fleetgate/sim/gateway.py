"""The gateway's request path in virtual time: route, dispatch, fail over, learn, charge.

Mirrors ``gateway/proxy/service.py`` (ProxyService) and ``gateway/proxy/attempt.py``
(Attempt) step for step, on the same ``LiveFleet`` and the same ``Router``:

1. the router decides from ``live.snapshot(now)`` (never anything the live gateway would
   not know: scraped load one scrape old, its own in-flight counts since);
2. admission as live (``state/admission.py``): when every endpoint is past its SLO
   capacity (or others already wait), a high-priority request goes at once, normal and low
   ones wait in the same bounded, fair queue, released one per ended request while the
   router has room, and shed (429) when their wait would not fit or their deadline passes;
   no candidate at all is a 503;
3. the candidates are tried in the decision's order, up to the policy's ``max_attempts``:
   ``on_dispatch`` with the decision's TTFT prediction for that candidate (its ``Sample``
   is what the measurements are learned against);
   a replica that is down refuses (``on_refused`` + ``on_failure``) and the next is tried;
   one that dies before the first token is retried on the next candidate, after it the
   request fails (the live gateway ends the stream with an error event);
4. first token: ``on_first_token(ttft, sample)`` (streamed; a non-streamed answer reports
   ``None`` at the end and TPOT is measured from the predicted TTFT, as live);
LoRA adapters (``requests.adapters`` in the workload): the same router sends a request
naming an adapter only where it is loaded, else to the cheapest endpoint with room, which
loads it first, as the live gateway's ``state/adapters.py`` does: the live state's adapter
table is marked at once (requests routed meanwhile follow it and wait for the same load),
the load takes ``ADAPTER_LOAD_S`` of virtual time, and the request joins the engine when it
is done (its TTFT includes the wait); the engine's perf model charges each adapter in a
step and holds a batch to ``max_loras`` adapters.

5. finish: ``on_finish`` with the measured TPOT and the sample, and the ledger's charge
   (``catalog.pricing``: replica $/s x e2e / mean in-flight at start and end; on a hosted
   API priced per token, its prompt and output tokens at the pool's prices, and a hosted
   API at its cap refuses as a provider's 429 does: the next candidate is tried).

May touch: routing, state.live, the replicas, outcomes. Must not touch: wall clocks, I/O.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from fleetgate.catalog.pricing import charge_usd, replica_seconds
from fleetgate.routing import Decision, Router, RoutingRequest
from fleetgate.sim.arrivals import PRIORITIES, RequestSet
from fleetgate.sim.hosted import HostedReplica
from fleetgate.sim.outcomes import BAD_REQUEST, FAILED, NO_CAPACITY, OK, SHED, Outcomes
from fleetgate.sim.prefixes import SimPrefixes
from fleetgate.sim.replica import SimReplica
from fleetgate.state.admission import AdmissionQueue, Refused, drain_and_budget, full
from fleetgate.state.learning import NO_SAMPLE, Sample
from fleetgate.state.live import LiveFleet

CHARS_PER_TOKEN = 4  # RoutingRequest.prompt_tokens_estimate = chars // 4 + 8
# Loading a LoRA adapter into an engine (reading a small adapter from local disk into GPU
# memory: well under a second for rank 16 on an 8B model; an assumption, not a measurement)
ADAPTER_LOAD_S = 0.5


class Flight:
    """One request between arrival and its end."""

    __slots__ = ("arrival", "attempts", "decision", "first_at", "i", "in_flight0", "next",
                 "pred_ttft", "r", "sample", "t0")

    def __init__(self, r: int, arrival: float, decision: Decision, attempts: int) -> None:
        self.r, self.arrival, self.decision = r, arrival, decision
        self.attempts = decision.attempts(attempts)
        self.next = 0
        self.i = -1
        self.t0 = arrival
        self.first_at: float | None = None
        self.pred_ttft: float | None = None
        self.sample: Sample = NO_SAMPLE
        self.in_flight0 = 1.0


Reschedule = Callable[[int], None]
CallAt = Callable[[float, Callable[[float], None]], None]


class SimGateway:
    def __init__(self, requests: RequestSet, router: Router, live: LiveFleet,
                 replicas: list[SimReplica | HostedReplica], max_attempts: dict[str, int],
                 policy: str,
                 reschedule: Reschedule, call_at: CallAt) -> None:
        self.req, self.router, self.live, self.replicas = requests, router, live, replicas
        self.out = Outcomes.empty(len(requests))
        self._max_attempts, self._policy, self._reschedule = max_attempts, policy, reschedule
        self._call_at = call_at
        self.queue: AdmissionQueue[int] = AdmissionQueue()  # one model per simulated fleet
        self.refused = Refused()  # shed or no endpoint, per model: the scaler's demand
        self._usd_per_s = [ep.usd_per_s for ep in live.endpoints]
        self._token_price = [ep.hosted.price if ep.hosted else None for ep in live.endpoints]
        self._gpus = [ep.gpus_per_replica for ep in live.endpoints]
        self.flights: dict[int, Flight] = {}
        self.on_endpoint: list[set[int]] = [set() for _ in live.endpoints]
        self.prefixes = SimPrefixes(requests)  # prompt hashes: router chunks, engine blocks
        self._adapter_loading: dict[tuple[int, str], float] = {}  # (endpoint, name) -> ready
        self.adapter_loads = 0

    def _routing_request(self, r: int) -> RoutingRequest:
        req = self.req
        priority = PRIORITIES[int(req.priority[r])]
        headers = {} if priority == "normal" else {"x-priority": priority}
        sent = int(req.max_tokens[r])
        return RoutingRequest(
            model=req.models[int(req.model[r])], stream=bool(req.stream[r]),
            max_tokens=sent or None,
            prompt_chars=CHARS_PER_TOKEN * max(0, int(req.prompt_tokens[r]) - 8),
            headers=headers, tenant=req.tenants[int(req.tenant[r])], policy=self._policy,
            prefix_hashes=self.prefixes.routing_chunks(r))

    # -- arrivals and attempts -------------------------------------------------------------
    def arrive(self, r: int, now: float) -> None:
        decision = self.router.route(self._routing_request(r), self.live.snapshot(now))
        if decision.context_limit is not None:  # over every context: the gateway's 400
            self._end(r, BAD_REQUEST, now)
            return
        priority = PRIORITIES[int(self.req.priority[r])]
        if priority != "high" and (full(decision) or len(self.queue)):
            self._wait(r, priority, decision, now)
            return
        self._go(r, decision, now)

    def _wait(self, r: int, priority: str, decision: Decision, now: float) -> None:
        drain, budget = drain_and_budget(decision)
        may, _ = self.queue.admit(priority, drain, budget)
        if not may:
            self._end(r, SHED, now)
            return
        ticket = self.queue.push(r, priority, int(self.req.tenant[r]), 1.0, now + budget)

        def expire(t: float) -> None:
            if self.queue.cancel(ticket):
                self._end(r, SHED, t)

        self._call_at(now + budget, expire)
        self._release(now)

    def _release(self, now: float) -> None:
        """A request ended (or one joined the queue): waiters go while there is room."""
        while (head := self.queue.peek()) is not None:
            decision = self.router.route(self._routing_request(head), self.live.snapshot(now))
            if full(decision):
                return
            self.queue.pop()
            self._go(head, decision, now)

    def _go(self, r: int, decision: Decision, now: float) -> None:
        if not len(decision.order):
            self._end(r, NO_CAPACITY, now)
            return
        flight = Flight(r, float(self.req.arrival_s[r]), decision,
                        self._max_attempts.get(decision.policy, 3))
        self.flights[r] = flight
        self._try_next(flight, now)

    def _try_next(self, flight: Flight, now: float) -> None:
        live, r = self.live, flight.r
        while flight.next < len(flight.attempts):
            position, ep = flight.attempts[flight.next]
            flight.next += 1
            i = live.index[ep.id]
            flight.pred_ttft = flight.decision.estimate("ttft_s", position)
            flight.sample = live.on_dispatch(i, now, flight.pred_ttft,
                                             int(self.req.prompt_tokens[r]),
                                             flight.decision.slo_limits(position),
                                             self.prefixes.routing_chunks(r))
            self.out.attempts[r] += 1
            flight.i, flight.t0, flight.first_at = i, now, None
            flight.in_flight0 = live.value(i, "in_flight")
            replica = self.replicas[i]
            if not replica.up:
                live.on_refused(i, now, "connect refused (relay)")
                live.on_failure(i, now)
                continue
            if replica.full:  # a hosted API over its cap: 429 before the first byte
                live.on_failure(i, now, counts_against_engine=False)
                continue
            prompt, output = int(self.req.prompt_tokens[r]), int(self.req.output_tokens[r])
            if prompt + output > replica.kv_capacity_tokens:  # the engine answers 400
                live.on_failure(i, now, counts_against_engine=False)
                self._end(r, BAD_REQUEST, now, i)
                return
            self.on_endpoint[i].add(r)
            adapter = flight.decision.adapter
            if adapter is not None and not live.adapters.holds(i, adapter):
                ready, number = self._load_adapter(i, adapter, now), flight.next
                self._call_at(ready, functools.partial(self._start_after_load, flight, number, i))
                return
            if adapter is not None:
                live.adapters.touch(i, adapter, now)
            if replica.add(str(r), prompt, output, now, self.prefixes.engine_blocks(r),
                           adapter):
                self._reschedule(i)
            return
        self._end(r, FAILED, now, flight.i)

    def _load_adapter(self, i: int, name: str, now: float) -> float:
        """When ``name`` is loaded on endpoint ``i``: the load under way, or one started now
        (one per endpoint and adapter, as the live gateway's single flight)."""
        key = (i, name)
        ready = self._adapter_loading.get(key)
        if ready is None:
            self.live.adapters.start_load(i, name)  # at the limit, its LRU adapter goes
            ready = self._adapter_loading[key] = now + ADAPTER_LOAD_S
            self.adapter_loads += 1

            def loaded(t: float) -> None:
                self._adapter_loading.pop(key, None)
                self.live.adapters.finish_load(i, name, self.replicas[i].up, t)

            self._call_at(ready, loaded)
        return ready

    def _start_after_load(self, flight: Flight, number: int, i: int, now: float) -> None:
        """The adapter is loaded: the request joins the engine (unless it moved on: the
        replica died meanwhile and it was retried elsewhere)."""
        r = flight.r
        if self.flights.get(r) is not flight or flight.next != number or flight.i != i:
            return
        replica = self.replicas[i]
        if not replica.up:
            self.on_endpoint[i].discard(r)
            self.live.on_failure(i, now)
            self._try_next(flight, now)
            return
        if replica.add(str(r), int(self.req.prompt_tokens[r]), int(self.req.output_tokens[r]),
                       now, self.prefixes.engine_blocks(r), flight.decision.adapter):
            self._reschedule(i)

    # -- engine events -------------------------------------------------------------------
    def first_token(self, r: int, now: float) -> None:
        flight = self.flights[r]
        flight.first_at = now
        self.out.ttft_s[r] = now - flight.arrival
        if self.req.stream[r]:
            self.live.on_first_token(flight.i, now, now - flight.t0, flight.sample)

    def finished(self, r: int, now: float) -> None:
        flight = self.flights[r]
        i, live = flight.i, self.live
        tokens = int(self.req.output_tokens[r])
        if self.req.stream[r] and flight.first_at is not None:
            start = flight.first_at
        else:
            live.on_first_token(i, now, None)
            start = flight.t0 + (flight.pred_ttft or 0.0)
        tpot = (now - start) / (tokens - 1) if tokens > 1 and now > start else None
        concurrency = (flight.in_flight0 + live.value(i, "in_flight")) / 2
        ttft = None if flight.first_at is None or not self.req.stream[r] else \
            flight.first_at - flight.t0
        live.on_finish(i, now, tokens, now - flight.t0, tpot, flight.sample, ttft)
        self._charge(r, i, now - flight.t0, concurrency, ok=True)
        out = self.out
        out.tokens[r] = tokens
        if tokens > 1 and flight.first_at is not None:
            out.tpot_s[r] = (now - flight.first_at) / (tokens - 1)
        self._end(r, OK, now, i)
        self._release(now)

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
            self._release(now)

    # -- bookkeeping ---------------------------------------------------------------------
    def _charge(self, r: int, i: int, e2e_s: float, concurrency: float, ok: bool) -> None:
        price = self._token_price[i]
        if price is not None:  # a hosted API: its tokens, nothing for a lost request
            usd = price.charge_usd(float(self.req.prompt_tokens[r]),
                                   float(self.req.output_tokens[r])) if ok else 0.0
            seconds = 0.0
        else:
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
        if status in (SHED, NO_CAPACITY):
            self.refused.add(self.req.models[int(self.req.model[r])], now)
        out = self.out
        out.status[r] = status
        out.e2e_s[r] = now - float(self.req.arrival_s[r])
        out.endpoint[r] = i
