"""A hosted API priced per token in virtual time: a fixed latency distribution, no batch.

A pool with ``price_per_mtok`` (``engine: openai``) stands for someone else's fleet: what
its answers take does not depend on what we send it, up to its ``max_concurrency``. Each
request here gets its own TTFT and TPOT, drawn from lognormal distributions whose medians
are the pool's ``expected_latency`` (``ttft_ms``, ``tpot_ms``; 600 ms and 20 ms when the
pool does not say, ``config.schema.HOSTED_TTFT_MS``/``HOSTED_TPOT_MS``) with log-standard
deviations ``TTFT_SIGMA`` (0.25: p99 ~1.8x the median, as hosted APIs' first tokens
spread) and ``TPOT_SIGMA`` (0.1). A request beyond the cap is refused, as a provider's 429
(``full``: the gateway tries the next candidate). The draws come from a generator seeded
by the endpoint's id, so one fleet and one workload give the same run, byte for byte.

The same interface as ``SimReplica`` (``add``, ``advance``, ``next_time``, ``gauges``,
faults), plus ``hosted`` (True: it exports no ``/metrics``, as ``engine: openai``
servers; the collector only probes it) and ``full``.

May touch: numpy, the emulator's token events. Must not touch: routing, live state, clocks.
"""

from __future__ import annotations

import heapq
import itertools
import zlib

import numpy as np

from fleetgate.emulator.perfmodel import TokenEvent
from fleetgate.routing import Endpoint
from fleetgate.sim.replica import Gauges

TTFT_SIGMA = 0.25
TPOT_SIGMA = 0.1
NO_KV_LIMIT = 10**12  # the provider's memory is not ours to run out of


class HostedReplica:
    hosted = True

    def __init__(self, endpoint: Endpoint) -> None:
        terms = endpoint.hosted
        if terms is None:
            raise ValueError(f"{endpoint.id} is not a hosted API priced per token")
        self.ttft_s, self.tpot_s, self.cap = terms.ttft_s, terms.tpot_s, terms.max_concurrency
        self._rng = np.random.default_rng(zlib.crc32(endpoint.id.encode()))
        self._events: list[tuple[float, int, str, int, bool]] = []
        self._seq = itertools.count()
        self._running: set[str] = set()
        self._generated = 0
        self.slow = 1.0
        self.speed = 1.0
        self.up = True

    @property
    def next_time(self) -> float | None:
        return self._events[0][0] if self._events else None

    @property
    def kv_capacity_tokens(self) -> int:
        return NO_KV_LIMIT

    @property
    def full(self) -> bool:
        """At its cap: a new request is refused (the provider's 429)."""
        return len(self._running) >= self.cap

    def add(self, key: str, prompt_tokens: int, max_tokens: int, now: float,
            block_hashes: tuple[int, ...] = (), adapter: str | None = None) -> bool:
        """Start a request at ``now``; True when ``next_time`` changed (a hosted pool
        serves no adapters of ours: ``adapter`` is never set)."""
        before = self.next_time
        ttft = self.ttft_s * self.slow * float(self._rng.lognormal(0.0, TTFT_SIGMA))
        tpot = self.tpot_s * self.slow * float(self._rng.lognormal(0.0, TPOT_SIGMA))
        tokens = max(1, max_tokens)
        self._running.add(key)
        self._push(now + ttft, key, 0, tokens == 1)
        if tokens > 1:
            self._push(now + ttft + tpot * (tokens - 1), key, tokens - 1, True)
        return self.next_time != before

    def advance(self) -> list[TokenEvent]:
        """The token events due at ``next_time``."""
        if not self._events:
            return []
        due = self._events[0][0]
        out = []
        while self._events and self._events[0][0] <= due:
            _, _, key, index, finished = heapq.heappop(self._events)
            out.append(TokenEvent(key, index, finished))
            if finished:
                self._running.discard(key)
                self._generated += index + 1
        return out

    def gauges(self, now: float) -> Gauges:
        return Gauges(0, len(self._running), 0.0, self._generated)

    def set_slow(self, factor: float, now: float) -> bool:
        """Requests from now on take ``factor`` times as long (those running keep theirs)."""
        self.slow = factor
        return False

    def go_down(self) -> None:
        """Lose every request; refuse new ones until ``come_up``."""
        self._events.clear()
        self._running.clear()
        self.up = False

    def come_up(self) -> None:
        self.up = True

    def _push(self, t: float, key: str, index: int, finished: bool) -> None:
        heapq.heappush(self._events, (t, next(self._seq), key, index, finished))
