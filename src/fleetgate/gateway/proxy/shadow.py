"""Shadow traffic: mirror a share of a policy's requests to a candidate pool, and compare.

A policy with ``shadow: {pool, fraction, max_usd_per_hour}`` sends a copy of about
``fraction`` of its requests to the least loaded usable endpoint of ``pool``, in the
background: the client is answered by the serving pool only and never waits on the copy;
the copy is read to its end and thrown away; it is not charged to the tenant nor counted in
its limits; a failing, down or hung candidate changes nothing for clients (every error is
caught and counted, and the copy has the policy's first-byte deadline and the read
timeout). Mirroring stops while the copies' spend over the last hour is at the cap.

For each (candidate pool, serving pool) the gateway keeps the candidate's TTFT, TPOT,
tokens and $ and the same figures of the serving pool for the same requests: that is
``GET /admin/shadow`` ("on your traffic, pool X would have served at TTFT p95 ... against
pool Y's"). The copies go through the live state (the candidate's in-flight count and
learned corrections see them) but not through the router, the limits or the ledger.

It is an ``Observer`` of the request path: ``routed`` decides and starts the copy, the
serving attempt's ``finished`` records the serving side.

May touch: backends (relay), catalog pricing, the SSE helpers, state. Must not touch: the
ledger, limits, HTTP serving.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from fleetgate.backends.relay import Backend, Timeouts, UpstreamError
from fleetgate.backends.sse import SSEFramer, frame_data
from fleetgate.catalog.pricing import charge_usd
from fleetgate.gateway.proxy.observer import (
    NOOP_ATTEMPT,
    NOOP_REQUEST,
    AttemptObserver,
    AttemptResult,
    RequestObserver,
)
from fleetgate.gateway.proxy.request import ProxyRequest
from fleetgate.routing import Decision, Endpoint
from fleetgate.routing.types import HEALTH_CODES

if TYPE_CHECKING:
    from fleetgate.gateway.proxy.service import Generation

log = logging.getLogger("fleetgate.shadow")
WINDOW = 1024  # samples kept per side for percentiles
HOUR_S = 3600.0


@dataclass(slots=True)
class Side:
    """One pool's figures on the mirrored requests."""

    requests: int = 0
    tokens: int = 0
    usd: float = 0.0
    ttft_s: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    tpot_s: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))

    def add(self, ttft_s: float | None, tpot_s: float | None, tokens: int, usd: float) -> None:
        self.requests += 1
        self.tokens += tokens
        self.usd += usd
        if ttft_s is not None:
            self.ttft_s.append(ttft_s)
        if tpot_s is not None:
            self.tpot_s.append(tpot_s)

    def as_json(self) -> dict[str, Any]:
        return {"requests": self.requests, "output_tokens": self.tokens,
                "usd": round(self.usd, 9), "ttft_ms": _pcts(self.ttft_s),
                "tpot_ms": _pcts(self.tpot_s),
                "usd_per_mtok": round(self.usd / self.tokens * 1e6, 6) if self.tokens else None}


@dataclass(slots=True)
class Pairing:
    pool: str
    serving_pool: str
    mirrored: int = 0
    failed: int = 0
    skipped_budget: int = 0
    candidate: Side = field(default_factory=Side)
    serving: Side = field(default_factory=Side)

    def as_json(self) -> dict[str, Any]:
        mine = self.candidate.as_json()
        return {"pool": self.pool, "serving_pool": self.serving_pool,
                "mirrored": self.mirrored, "failed": self.failed,
                "skipped_budget": self.skipped_budget, **mine,
                "serving": self.serving.as_json()}


class ShadowMirror:
    """The ``Observer`` that mirrors; ``report()`` is ``GET /admin/shadow``."""

    def __init__(self, generation: Callable[[], Generation], backend: Backend,
                 timeouts: Timeouts, clock: Callable[[], float], seed: int | None = None) -> None:
        self._generation, self._backend, self._timeouts = generation, backend, timeouts
        self._clock = clock
        self._rng = random.Random(seed)
        self._pairs: dict[tuple[str, str], Pairing] = {}
        self._spend: dict[str, deque[tuple[float, float]]] = {}  # pool -> (time, usd)
        self._tasks: set[asyncio.Task[None]] = set()

    def request(self, req: ProxyRequest) -> RequestObserver:
        if not self._generation().shadow:  # no policy mirrors: nothing to watch
            return NOOP_REQUEST
        return _ShadowRequest(self, req)

    def report(self) -> dict[str, Any]:
        return {"candidates": [p.as_json() for p in self._pairs.values()]}

    async def drain(self) -> None:
        """Wait for the copies in flight (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    # -- deciding and sending --------------------------------------------------------------
    def _start(self, req: ProxyRequest, decision: Decision) -> _Copy | None:
        gen = self._generation()
        cfg = gen.shadow.get(decision.policy)
        if cfg is None or self._rng.random() >= cfg.fraction or decision.chosen is None:
            return None
        if decision.chosen.pool == cfg.pool:
            return None  # it is being served there already
        pairing = self._pair(cfg.pool, decision.chosen.pool)
        if self._hour_spend(cfg.pool) >= cfg.max_usd_per_hour:
            pairing.skipped_budget += 1
            return None
        target = _least_loaded(gen, cfg.pool, req)
        if target is None:
            pairing.failed += 1
            return None
        copy = _Copy(pairing, gen.first_byte_s.get(decision.policy))
        task = asyncio.get_running_loop().create_task(self._send(gen, target, req, copy))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return copy

    async def _send(self, gen: Generation, i: int, req: ProxyRequest, copy: _Copy) -> None:
        fleet, ep = gen.fleet, gen.fleet.endpoints[i]
        pairing = copy.pairing
        live, t0 = fleet.live, self._clock()
        live.on_dispatch(i, t0)
        pairing.mirrored += 1
        try:
            ttft, tokens = await self._exchange(ep, req, copy.first_byte_s)
        except Exception as exc:  # anything: a shadow never affects a client
            live.on_failure(i, self._clock())
            pairing.failed += 1
            log.info("shadow copy to %s failed: %s", ep.id, exc)
            return
        now = self._clock()
        e2e = now - t0
        concurrency = max(1.0, live.value(i, "in_flight"))
        live.on_first_token(i, now, None)
        live.on_finish(i, now, tokens, e2e, None)
        usd = charge_usd(ep.usd_per_s, e2e, concurrency)
        tpot = (e2e - ttft) / (tokens - 1) if ttft is not None and tokens > 1 else None
        pairing.candidate.add(ttft, tpot, tokens, usd)
        self._spend.setdefault(pairing.pool, deque()).append((now, usd))

    async def _exchange(self, ep: Endpoint, req: ProxyRequest,
                        first_byte_s: float | None) -> tuple[float | None, int]:
        """Send the copy, read it to the end; (TTFT or None, output tokens). A stream must
        show its first token within ``first_byte_s``; the rest, and a whole answer, are
        bounded by the relay's read timeout."""
        body = dict(req.body)
        body["model"] = ep.models[req.routing.model]
        if req.routing.stream and req.api.asks_usage:
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        t0 = self._clock()
        async with asyncio.timeout(first_byte_s if req.routing.stream else None) as deadline:
            resp = await self._backend.post(ep.url + req.path, orjson.dumps(body),
                                            {"content-type": "application/json",
                                             **ep.auth_headers},
                                            self._timeouts)
            try:
                if resp.status != 200:
                    await resp.read()
                    raise UpstreamError("protocol", f"HTTP {resp.status}")
                if not req.routing.stream:
                    usage = req.api.usage(orjson.loads(await resp.read()).get("usage"))
                    return None, (usage or {}).get("completion_tokens", 0)
                framer, ttft, usage = SSEFramer(), None, None
                async for chunk in resp.chunks():
                    for frame in framer.feed(chunk):
                        data = frame_data(frame)
                        if data is None:
                            continue
                        if ttft is None and (req.api.output_marker is None
                                             or req.api.output_marker in data):
                            ttft = self._clock() - t0
                            deadline.reschedule(None)  # the first byte came: no deadline
                        if b'"usage"' in data and b'"usage":null' not in data:
                            usage = req.api.stream_usage(data, usage)
                return ttft, (usage or {}).get("completion_tokens", 0)
            finally:
                resp.close()

    def _pair(self, pool: str, serving: str) -> Pairing:
        key = (pool, serving)
        pairing = self._pairs.get(key)
        if pairing is None:
            pairing = self._pairs[key] = Pairing(pool, serving)
        return pairing

    def _hour_spend(self, pool: str) -> float:
        spent = self._spend.get(pool)
        if not spent:
            return 0.0
        cutoff = self._clock() - HOUR_S
        while spent and spent[0][0] < cutoff:
            spent.popleft()
        return sum(usd for _, usd in spent)


def _least_loaded(gen: Generation, pool: str, req: ProxyRequest) -> int | None:
    """The usable endpoint of ``pool`` serving the model with the fewest active requests."""
    fleet = gen.fleet
    live, now = fleet.live, fleet.clock()
    best, best_active = None, math.inf
    for i, ep in enumerate(fleet.endpoints):
        if ep.pool != pool or req.routing.model not in ep.models:
            continue
        if live.value(i, "health") == HEALTH_CODES["not_ready"] or \
                live.value(i, "usable_from") > now:
            continue
        active = live.value(i, "active")
        if active < best_active:
            best, best_active = i, active
    return best


class _Copy:
    """One mirrored request: where the serving side's figures go."""

    __slots__ = ("first_byte_s", "pairing")

    def __init__(self, pairing: Pairing, first_byte_s: float | None) -> None:
        self.pairing, self.first_byte_s = pairing, first_byte_s


class _ShadowRequest:
    def __init__(self, mirror: ShadowMirror, req: ProxyRequest) -> None:
        self._mirror, self._req = mirror, req
        self._copy: _Copy | None = None

    def routed(self, decision: Decision) -> None:
        try:
            self._copy = self._mirror._start(self._req, decision)
        except Exception:  # never let mirroring break the request path
            log.exception("shadow mirroring failed")

    def attempt(self, endpoint: Endpoint, served_model: str, number: int) -> AttemptObserver:
        if self._copy is None:
            return NOOP_ATTEMPT
        return _ServingAttempt(self._copy, endpoint)

    def end(self, status: int, error: str | None = None) -> None:
        pass


class _ServingAttempt:
    def __init__(self, copy: _Copy, endpoint: Endpoint) -> None:
        self._copy, self._ep = copy, endpoint

    def headers(self) -> dict[str, str]:
        return {}

    def first_token(self, ttft_s: float) -> None:
        pass

    def finished(self, result: AttemptResult) -> None:
        tokens = int((result.usage or {}).get("completion_tokens") or 0)
        ttft = result.ttft_s
        tpot = (result.e2e_s - ttft) / (tokens - 1) if ttft is not None and tokens > 1 else None
        usd = charge_usd(self._ep.usd_per_s, result.e2e_s, result.mean_concurrency)
        self._copy.pairing.serving.add(ttft, tpot, tokens, usd)

    def failed(self, status: int, error: str) -> None:
        pass

    def cancelled(self) -> None:
        pass


def _pcts(window: deque[float]) -> dict[str, float] | None:
    if not window:
        return None
    values = np.fromiter(window, dtype=float) * 1000
    return {f"p{q}": round(float(np.percentile(values, q)), 3) for q in (50, 95, 99)} | {
        "mean": round(float(values.mean()), 3)}
