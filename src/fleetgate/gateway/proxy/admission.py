"""Waiting for capacity in the live gateway: ``state.admission`` with asyncio futures.

``ProxyService`` calls ``wait`` for a normal or low request when every endpoint serving its
model is at its SLO capacity (``state.admission.room`` is 0), or when others already wait
for that (model, API) (a newcomer does not overtake them). ``wait`` returns when the request
may go (route again and dispatch), or raises ``Overloaded`` (429 with ``Retry-After``) when
its predicted wait does not fit its TTFT budget or its deadline passes. Each attempt's end
calls ``released`` for its (model, API), which lets as many waiters go as the router has
room for (a released waiter dispatches a moment later, so the ones released together are
counted against the room). ``refused`` counts what is shed, and what ``ProxyService`` finds
no endpoint for, per model: demand the fleet scaler adds (``refused_by_model``).

May touch: asyncio, state.admission, routing types. Must not touch: HTTP.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from fleetgate.gateway.errors import Overloaded
from fleetgate.routing import Decision, RoutingRequest
from fleetgate.state.admission import AdmissionQueue, Refused, drain_and_budget, retry_after_s

Key = tuple[str, str]  # (model, API)


@dataclass(slots=True)
class _Waiter:
    routing: RoutingRequest
    future: asyncio.Future[None]


class FlowControl:
    def __init__(self, room: Callable[[RoutingRequest], int | None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._room = room
        self._clock = clock
        self._queues: dict[Key, AdmissionQueue[_Waiter]] = {}
        self.waited: Counter[str] = Counter()  # by priority: requests that queued
        self.shed: Counter[str] = Counter()  # by priority: 429s
        self.refused = Refused()

    def waiting(self, key: Key) -> int:
        queue = self._queues.get(key)
        return len(queue) if queue is not None else 0

    def waiting_by_model(self) -> dict[str, float]:
        """Requests waiting for a slot, per public model (the scaler counts them as demand)."""
        out: dict[str, float] = {}
        for (model, _), queue in self._queues.items():
            out[model] = out.get(model, 0.0) + len(queue)
        return out

    def refuse(self, model: str) -> None:
        """A request for ``model`` found no capacity (shed, or no endpoint could take it)."""
        self.refused.add(model, self._clock())

    def refused_by_model(self) -> dict[str, float]:
        """Requests refused for want of capacity per second, per public model, recently."""
        return self.refused.per_s(self._clock())

    async def wait(self, routing: RoutingRequest, priority: str, weight: float,
                   decision: Decision) -> None:
        key = (routing.model, routing.api)
        queue = self._queues.setdefault(key, AdmissionQueue())
        drain, budget = drain_and_budget(decision)
        may, wait = queue.admit(priority, drain, budget)
        if not may:
            raise self._shed(routing.model, priority, wait, "its predicted wait for a slot is "
                             "longer than the policy's TTFT SLO allows")
        loop = asyncio.get_running_loop()
        waiter = _Waiter(routing, loop.create_future())
        ticket = queue.push(waiter, priority, routing.tenant or "", weight,
                            deadline=loop.time() + budget)
        self.waited[priority] += 1
        self.released(key)  # there may be room already (a newcomer behind others)
        try:
            await asyncio.wait_for(asyncio.shield(waiter.future), timeout=budget)
        except TimeoutError:
            raise self._shed(routing.model, priority, wait,
                             "no slot freed within the policy's TTFT SLO") from None
        finally:
            queue.cancel(ticket)

    def released(self, key: Key) -> None:
        """A request on ``key`` ended (or one joined the queue): let the next one go if the
        router has room for it now."""
        queue = self._queues.get(key)
        head = queue.peek() if queue is not None else None
        if queue is None or head is None:
            return
        free = self._room(head.routing)
        for _ in range(len(queue) if free is None else free):
            waiter = queue.pop()
            if waiter is None:
                return
            if not waiter.future.done():
                waiter.future.set_result(None)

    def _shed(self, model: str, priority: str, wait_s: float, why: str) -> Overloaded:
        self.shed[priority] += 1
        self.refuse(model)
        return Overloaded(f"every endpoint serving this model is past its SLO capacity and "
                          f"{why}: {priority}-priority request shed, retry later",
                          headers={"retry-after": str(retry_after_s(wait_s))})
