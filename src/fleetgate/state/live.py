"""Live endpoint state: the gateway's own measurements plus scraped engine load, per endpoint.

``LiveFleet`` is written by the gateway (dispatch, first token, finish, failure, scrape,
probe) and read by the router through ``snapshot(now)``, an immutable copy. Every method
takes ``now`` from the caller, so tests drive it with a fake clock.

What it keeps, per endpoint:
- ``in_flight``: requests this gateway dispatched and has not seen finish (instant, exact).
- ``queued``: the engine's waiting queue from the last scrape plus requests dispatched since
  (scrapes are seconds stale; our own dispatches are not).
- ``running``, ``kv_usage``: last scrape. Unknown (NaN) when the engine exports no metrics or
  the scrape is stale, never 0.
- ``prefill_tokens_per_s``, ``recent_prefill_tokens_per_s``, ``requests_per_s``: prompt
  tokens and requests this gateway sent the endpoint per second, as exponentially decaying
  counts over ~10 s (``PREFILL_TAU_S``) and ~1 s (``RECENT_PREFILL_TAU_S``), up to date at
  ``prefill_at``: the prompts' share of the engine's time (``routing/estimate.py``, the
  router's prefill share bound) and, with the peers' ``peer_requests_per_s``
  (``sync.py``), the scaler's demand (``fleetgate.scaling``); ``prompt_tokens_mean`` (what
  was prefilled), ``context_tokens_mean`` (whole prompts, cached prefix included),
  ``output_tokens_mean`` and ``output_tokens_p2`` (the 2nd percentile of answers): the
  workload's request shape, one value each for the whole fleet.
- EWMAs (alpha 0.2) of TTFT, TPOT (time per output token after the first), end-to-end
  latency, error rate, and the engine's output tokens/s (from counter deltas between
  scrapes); a window of the last 256 TTFT/TPOT samples for percentiles.
- ``k_ttft``/``k_tpot``: learned corrections of the physics prior (``learning.py``: from
  pairs of measured and uncorrected predicted values, bounded in rate, relaxing toward the
  prior when an endpoint gets no traffic).
- the breaker (``block_until``: routing skips it until then) and the health state.
- ``parked``: a replica the scaler keeps out of routing whatever its health (starting, not
  yet past its cold start; draining; or not provisioned at all: ``fleetgate.scaling``).
- the rows a decision reads for every candidate, kept current as their inputs change (one
  scalar update per event instead of a vector operation over the fleet per request):
  ``active``, ``usable_from`` and ``stale_at`` (``types.Snapshot``).

Capacity is normalised across GPU types by the prior: KV headroom is in tokens
(``(1 - kv_usage) * kv_capacity_tokens``), not a percentage of 80 GB vs 288 GB.

May touch: numpy, routing types, breaker/health. Must not touch: I/O, asyncio, clocks.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from fleetgate.routing.estimate import PREFILL_TAU_S, RECENT_PREFILL_TAU_S, prior_tpot
from fleetgate.routing.shortlist import SHORTLIST_FROM
from fleetgate.routing.types import (
    HEALTH_CODES,
    LIVE_COLUMNS,
    LIVE_ROW,
    ROUTED_COLUMNS,
    STATIC_ROW,
    Endpoint,
    FloatArray,
    Snapshot,
)
from fleetgate.state.adapters import AdapterTable
from fleetgate.state.breaker import CircuitBreaker, HealthTracker
from fleetgate.state.learning import NO_SAMPLE, Corrections, Sample
from fleetgate.state.prefix import CHUNK_TOKENS, PrefixIndex
from fleetgate.state.prior import Prior, static_columns
from fleetgate.state.slo_capacity import SloCapacity

ALPHA = 0.2
WORKLOAD_ALPHA = 0.002  # request lengths are heavy-tailed: average over ~500
QUANTILE_STEP = 0.05
_ROW = LIVE_ROW
_ROUTED = len(ROUTED_COLUMNS)
_IN_FLIGHT, _PEER_IN_FLIGHT = _ROW["in_flight"], _ROW["peer_in_flight"]
_RUNNING, _QUEUED, _ACTIVE = _ROW["running"], _ROW["queued"], _ROW["active"]
_HEALTH, _BLOCK, _PEER_BLOCK = _ROW["health"], _ROW["block_until"], _ROW["peer_block_until"]
_CONTACT, _USABLE_FROM, _STALE_AT = _ROW["last_contact"], _ROW["usable_from"], _ROW["stale_at"]
_PREFILL_RATE, _RECENT_RATE, _PREFILL_AT, _REQUEST_RATE = (
    _ROW[name] for name in ("prefill_tokens_per_s", "recent_prefill_tokens_per_s", "prefill_at",
                            "requests_per_s"))
_NOT_READY, _PENDING = HEALTH_CODES["not_ready"], HEALTH_CODES["pending"]
# What a new generation takes over from the old one for an endpoint at the same URL: what
# the engine is doing and how it has behaved. The corrections of the prior only carry over
# when the prior is the same (same GPU, model, TP, speed).
_CARRIED = ("queued", "running", "kv_usage", "ttft_s", "tpot_s", "tokens_per_s", "health",
            "block_until", "last_contact", "error_rate", "peer_in_flight", "peer_block_until")
_PRIOR_ROWS = [STATIC_ROW[name] for name in ("step_base_s", "step_per_ctx_token_s",
                                             "prefill_s_per_token")]


@dataclass(slots=True)
class EndpointStats:
    """Per-endpoint scalars that do not need to be columns."""

    breaker: CircuitBreaker
    health: HealthTracker = field(default_factory=HealthTracker)
    dispatched_since_scrape: int = 0
    scraped_waiting: float = math.nan
    last_scrape_at: float = -math.inf
    last_gen_total: float = math.nan
    e2e_s: float = math.nan
    requests: int = 0
    failures: int = 0
    output_tokens: int = 0
    ttft_window: deque[float] = field(default_factory=lambda: deque(maxlen=256))
    tpot_window: deque[float] = field(default_factory=lambda: deque(maxlen=256))


class LiveFleet:
    def __init__(self, endpoints: Sequence[Endpoint], priors: Sequence[Prior],
                 breaker_threshold: int = 5, breaker_cooldown_s: float = 5.0,
                 stale_after_s: float = 10.0) -> None:
        self.endpoints = tuple(endpoints)
        self.index = {ep.id: i for i, ep in enumerate(self.endpoints)}
        n = len(self.endpoints)
        self._live = np.full((len(LIVE_COLUMNS), n), np.nan)
        for name in ("in_flight", "queued", "health", "block_until", "error_rate",
                     "prefill_tokens_per_s", "recent_prefill_tokens_per_s",
                     "peer_in_flight", "peer_block_until", "active", "usable_from",
                     "requests_per_s", "peer_requests_per_s"):
            self._live[_ROW[name]] = 0.0
        self._live[_ROW["k_tpot"]] = self._live[_ROW["k_ttft"]] = 1.0
        self._live[_PREFILL_AT] = -np.inf
        self._live[_ROW["last_contact"]] = -np.inf
        self._live[_STALE_AT] = np.inf  # pending: never stale before the first contact
        self._static = static_columns(self.endpoints, priors)
        self.prefix = PrefixIndex(self.endpoints, self._static[STATIC_ROW["kv_capacity_tokens"]])
        self.adapters = AdapterTable(self.endpoints)  # who holds which LoRA adapter
        self._seen = {"prompt_tokens_mean": 0, "context_tokens_mean": 0,
                      "output_tokens_mean": 0}
        self.k_ttft = Corrections(self._live[_ROW["k_ttft"]])
        self.k_tpot = Corrections(self._live[_ROW["k_tpot"]])
        same = [tuple(self._static[_PRIOR_ROWS, i]) for i in range(n)]
        first: dict[tuple[float, ...], int] = {}
        classes = [first.setdefault(key, i) for i, key in enumerate(same)]
        self.slo_capacity = SloCapacity(self._live[_ROW["slo_limit"]],
                                        self._live[_ROW["slo_knee"]], classes)
        self.stale_after_s = stale_after_s
        self.parked = np.zeros(n, dtype=bool)
        self.stats = [EndpointStats(CircuitBreaker(breaker_threshold, breaker_cooldown_s))
                      for _ in self.endpoints]
        served = sorted({(m, api) for ep in self.endpoints for m in ep.models
                         for api in ep.served_apis})
        self._by_model = {key: np.array([i for i, ep in enumerate(self.endpoints)
                                         if key[0] in ep.models and key[1] in ep.served_apis],
                                        dtype=np.intp) for key in served}

    # -- reading -------------------------------------------------------------------------
    def snapshot(self, now: float) -> Snapshot:
        shared = len(self.endpoints) > SHORTLIST_FROM  # Snapshot.shared: no copy of 1 MB+
        live = self._live[:_ROUTED] if shared else self._live[:_ROUTED].copy()
        live.setflags(write=False)  # no plugin can change what a decision was made on
        return Snapshot(self.endpoints, self._by_model, live, self._static, now, self.prefix,
                        self.adapters.view(), shared)

    def column(self, name: str) -> Any:
        """A copy of one live or static column now (for metrics and tests)."""
        row = _ROW.get(name)
        return (self._live[row] if row is not None else self._static[STATIC_ROW[name]]).copy()

    def value(self, i: int, name: str) -> float:
        return float(self._live[_ROW[name], i])

    def static_value(self, i: int, name: str) -> float:
        return float(self._static[STATIC_ROW[name], i])

    def request_rates(self, now: float) -> FloatArray:
        """Requests per second this gateway sent each endpoint (``requests_per_s``), decayed
        to ``now``."""
        since = np.minimum(self._live[_PREFILL_AT] - now, 0.0)
        return self._live[_REQUEST_RATE] * np.exp(since / PREFILL_TAU_S)

    def ready_count(self) -> int:
        return int(np.count_nonzero(self._live[_ROW["health"]] == HEALTH_CODES["ready"]))

    def inherit(self, old: LiveFleet, now: float) -> int:
        """Take over what ``old`` (the previous config's fleet) knew about the endpoints that
        are still here, matched by URL: health, breaker, scraped load, measured rates and
        (same prior only) the learned corrections, so a reload or a worker joining does not
        make the router forget. In-flight counts stay with ``old``: its requests finish
        there, and the engine's scraped running + queued stands for them until the next
        scrape. Returns how many endpoints carried over."""
        self.prefix.inherit(old.prefix)
        by_url = {ep.url: j for j, ep in enumerate(old.endpoints)}
        carried = 0
        for i, ep in enumerate(self.endpoints):
            j = by_url.get(ep.url)
            if j is None:
                continue
            rows = [_ROW[name] for name in _CARRIED]
            self._live[rows, i] = old._live[rows, j]
            if np.array_equal(old._static[_PRIOR_ROWS, j], self._static[_PRIOR_ROWS, i]):
                self.k_ttft.carry(i, old.k_ttft, j)
                self.k_tpot.carry(i, old.k_tpot, j)
                self.slo_capacity.carry(i, old.slo_capacity, j)
            was = old.stats[j]
            breaker = CircuitBreaker(self.stats[i].breaker.failure_threshold,
                                     self.stats[i].breaker.cooldown_s, was.breaker.state,
                                     was.breaker.consecutive_failures, was.breaker.opened_at)
            if breaker.state == "half_open":  # its probe request belongs to the old fleet
                breaker.state, breaker.opened_at = "open", now - breaker.cooldown_s
            if breaker.state == "open":
                self._live[_BLOCK, i] = breaker.opened_at + breaker.cooldown_s
            self.stats[i] = replace(
                was, breaker=breaker, dispatched_since_scrape=0,
                health=replace(was.health),
                ttft_window=deque(was.ttft_window, maxlen=was.ttft_window.maxlen),
                tpot_window=deque(was.tpot_window, maxlen=was.tpot_window.maxlen))
            self._derive_active(i)
            self._derive_usable(i)
            carried += 1
        return carried

    # -- the gateway's own measurements ------------------------------------------------
    def on_dispatch(self, i: int, now: float, predicted_ttft_s: float | None = None,
                    prompt_tokens: int = 0,
                    slo_limits: tuple[float, float] = (math.inf, math.inf),
                    prefix_hashes: Sequence[int] = ()) -> Sample:
        """A request goes to endpoint ``i``; returns what its measurements are judged
        against when it ends (``learning.Sample``). The prefix index records its prompt;
        what the endpoint's cache already holds of it is not counted as prefill work, but
        the sample keeps the whole prompt: its KV is read at every step, cached or not,
        as the router's TPOT prediction counts it (``routing/estimate.py``)."""
        whole = prompt_tokens
        cached = self.prefix.record(i, prefix_hashes) * CHUNK_TOKENS
        prompt_tokens = max(0, prompt_tokens - cached)
        self._live[_ROW["in_flight"], i] += 1
        self._live[_ROW["queued"], i] += 1
        st = self.stats[i]
        st.dispatched_since_scrape += 1
        st.requests += 1
        st.breaker.on_dispatch(now)
        self._decay_prefill(i, now)
        self._live[_PREFILL_RATE, i] += prompt_tokens / PREFILL_TAU_S
        self._live[_RECENT_RATE, i] += prompt_tokens / RECENT_PREFILL_TAU_S
        self._live[_REQUEST_RATE, i] += 1.0 / PREFILL_TAU_S
        if prompt_tokens:  # the workload's, not the endpoint's: the router's choices bias those
            self._workload_mean("prompt_tokens_mean", prompt_tokens)
        if whole:
            self._workload_mean("context_tokens_mean", whole)
        if st.breaker.state == "half_open":
            self._live[_ROW["block_until"], i] = np.inf  # one probe request at a time
            self._derive_usable(i)
        self._derive_active(i)
        k_ttft = self._live[_ROW["k_ttft"], i]
        prior_ttft = math.nan if predicted_ttft_s is None else predicted_ttft_s / k_ttft
        return Sample(prior_ttft, whole, float(self._live[_ACTIVE, i]), *slo_limits)

    def on_first_token(self, i: int, now: float, ttft_s: float | None,
                       sample: Sample = NO_SAMPLE) -> None:
        """The engine started answering (``ttft_s`` None: a non-streamed answer arrived)."""
        self._live[_ROW["queued"], i] = max(0.0, self._live[_ROW["queued"], i] - 1)
        self._derive_active(i)
        if ttft_s is None:
            return
        self._ewma("ttft_s", i, ttft_s)
        self.stats[i].ttft_window.append(ttft_s)
        self.k_ttft.learn(i, now, ttft_s, sample.prior_ttft_s)

    def on_finish(self, i: int, now: float, output_tokens: int, e2e_s: float,
                  tpot_s: float | None, sample: Sample = NO_SAMPLE,
                  ttft_s: float | None = None) -> None:
        """A request ended well (whole answer relayed)."""
        met = sample.met(ttft_s, tpot_s)
        if met is not None:
            self.slo_capacity.result(i, now, sample.active,
                                     (sample.ttft_limit_s, sample.tpot_limit_s), met, ttft_s,
                                     tpot_s)
        if tpot_s is not None and sample is not NO_SAMPLE:
            batch = (sample.active + self._live[_ACTIVE, i]) / 2  # both counts include it
            prior = prior_tpot(self._static, i, sample.prompt_tokens, output_tokens, batch,
                               self._live[_ROW["prefill_tokens_per_s"], i])
            self.k_tpot.learn(i, now, tpot_s, prior)
        self._release(i)
        if output_tokens > 0:
            self._workload_mean("output_tokens_mean", output_tokens)
            self._workload_low_quantile("output_tokens_p2", output_tokens)
        st = self.stats[i]
        st.output_tokens += output_tokens
        st.e2e_s = e2e_s if math.isnan(st.e2e_s) else st.e2e_s + ALPHA * (e2e_s - st.e2e_s)
        if tpot_s is not None:
            self._ewma("tpot_s", i, tpot_s)
            st.tpot_window.append(tpot_s)
        self._ewma("error_rate", i, 0.0)
        self._live[_ROW["last_contact"], i] = now
        st.breaker.on_success()
        self._live[_ROW["block_until"], i] = 0.0
        self._derive_usable(i)

    def on_failure(self, i: int, now: float, counts_against_engine: bool = True) -> None:
        """A request failed (before or after its first byte); the in-flight slot is freed."""
        self._release(i)
        st = self.stats[i]
        st.failures += 1
        if not counts_against_engine:
            self._no_verdict(i)
            return
        self.on_blame(i, now)

    def on_blame(self, i: int, now: float, source: str | None = None) -> None:
        """The breaker's verdict on a failure: the engine's (``source`` None), or a suspect
        one from ``source`` whose slot was already freed (``state/breaker.py``)."""
        st = self.stats[i]
        if not st.breaker.on_failure(now, source):
            return  # the same tenant again: neither the breaker nor the error rate moves
        self._ewma("error_rate", i, 1.0)
        if st.breaker.state == "open":
            self._live[_ROW["block_until"], i] = st.breaker.opened_at + st.breaker.cooldown_s
            self._derive_usable(i)

    def on_cancel(self, i: int) -> None:
        """The client went away: free the slot, learn nothing."""
        self._release(i)
        self._no_verdict(i)

    def _no_verdict(self, i: int) -> None:
        """A request ended without judging the engine: a half-open breaker's probe slot is
        free again (else the endpoint would stay excluded until a reload)."""
        breaker = self.stats[i].breaker
        breaker.on_no_verdict()
        if breaker.state == "half_open" and self._live[_BLOCK, i] == np.inf:
            self._live[_BLOCK, i] = 0.0
            self._derive_usable(i)

    def on_refused(self, i: int, now: float, detail: str) -> None:
        """The engine refused a connection: not ready, and its breaker opens at once."""
        st = self.stats[i]
        if st.health.on_refused(detail):
            self._live[_ROW["health"], i] = HEALTH_CODES["not_ready"]
        st.breaker.trip(now)
        self._live[_ROW["block_until"], i] = now + st.breaker.cooldown_s
        self._derive_usable(i)

    # -- background signals ------------------------------------------------------------
    def park(self, i: int, parked: bool) -> None:
        """Keep endpoint ``i`` out of routing (the scaler's: not started, starting,
        draining), or let it back in; its requests in flight finish either way."""
        self.parked[i] = parked
        self._derive_usable(i)

    def on_probe(self, i: int, now: float, ok: bool, detail: str) -> bool:
        changed = self.stats[i].health.on_probe(ok, detail)
        self._live[_ROW["health"], i] = HEALTH_CODES[self.stats[i].health.state]
        if ok:
            self._live[_ROW["last_contact"], i] = now
        self._derive_usable(i)
        return changed

    def set_health(self, i: int, now: float, state: str, detail: str) -> bool:
        """Endpoint ``i``'s health as another gateway replica's probe found it
        (``state/shard.py``); True when the state changed."""
        health = self.stats[i].health
        if state not in HEALTH_CODES or state == "pending":
            return False
        changed = health.state != state
        health.state, health.detail = state, detail
        health.failed_probes = 0 if state == "ready" else health.fails_to_not_ready
        self._live[_ROW["health"], i] = HEALTH_CODES[state]
        if state == "ready":
            self._live[_ROW["last_contact"], i] = max(self._live[_ROW["last_contact"], i], now)
        self._derive_usable(i)
        return changed

    def on_scrape(self, i: int, now: float, waiting: float | None, running: float | None,
                  kv_usage: float | None, gen_tokens_total: float | None,
                  gen_throughput: float | None) -> None:
        st = self.stats[i]
        elapsed = now - st.last_scrape_at
        rate = gen_throughput
        if rate is None and gen_tokens_total is not None and not math.isnan(st.last_gen_total):
            delta = gen_tokens_total - st.last_gen_total
            rate = delta / elapsed if elapsed > 0 and delta >= 0 else None
        if rate is not None and rate > 0:
            self._ewma("tokens_per_s", i, rate)
        st.last_gen_total = math.nan if gen_tokens_total is None else gen_tokens_total
        st.last_scrape_at = now
        st.dispatched_since_scrape = 0
        st.scraped_waiting = math.nan if waiting is None else waiting
        self._live[_ROW["queued"], i] = 0.0 if waiting is None else waiting
        self._live[_ROW["running"], i] = np.nan if running is None else running
        self._live[_ROW["kv_usage"], i] = np.nan if kv_usage is None else kv_usage
        self._live[_ROW["last_contact"], i] = now
        self._derive_active(i)
        self._derive_usable(i)

    def on_peers(self, i: int, in_flight: float, block_until: float,
                 requests_per_s: float = 0.0) -> None:
        """The other gateway replicas' in-flight requests, breaker and request rate (at
        their last publish) on this endpoint."""
        self._live[_ROW["peer_in_flight"], i] = in_flight
        self._live[_ROW["peer_requests_per_s"], i] = requests_per_s
        self._live[_ROW["peer_block_until"], i] = block_until
        self._derive_active(i)
        self._derive_usable(i)

    def tick(self, now: float) -> None:
        """The collector's period: forget stale scrapes, relax idle corrections."""
        self.expire_scrapes(now)
        for i in range(len(self.endpoints)):
            self._decay_prefill(i, now)
        self.k_ttft.relax(now)
        self.k_tpot.relax(now)
        self.slo_capacity.update(now)

    def on_capacity(self, i: int, kv_capacity_tokens: float | None = None,
                    max_batch: float | None = None, max_model_len: float | None = None) -> bool:
        """What the engine reports about its capacity (read at the first contact and after a
        restart) replaces the prior's guess in endpoint ``i``'s static columns; ``None`` (or
        a non-positive value) keeps a column. Copy on write: the static matrix is shared by
        every snapshot taken so far, which keep the one their decision was made on. Returns
        whether anything changed."""
        reported = (("kv_capacity_tokens", kv_capacity_tokens), ("max_batch", max_batch),
                    ("max_model_len", max_model_len))
        changes = [(STATIC_ROW[name], float(value)) for name, value in reported
                   if value is not None and value > 0
                   and self._static[STATIC_ROW[name], i] != float(value)]
        if not changes:
            return False
        static = self._static.copy()
        for row, value in changes:
            static[row, i] = value
        static.setflags(write=False)
        self._static = static
        self.prefix.resize(i, static[STATIC_ROW["kv_capacity_tokens"], i])
        return True

    def expire_scrapes(self, now: float) -> None:
        """Forget scraped load older than ``stale_after_s`` (unknown, not zero)."""
        for i, st in enumerate(self.stats):
            if now - st.last_scrape_at > self.stale_after_s and st.last_scrape_at > -math.inf:
                self._live[_ROW["running"], i] = self._live[_ROW["kv_usage"], i] = np.nan
                self._live[_ROW["queued"], i] = self._live[_ROW["in_flight"], i]
                self._derive_active(i)

    # -- helpers -------------------------------------------------------------------------
    def _release(self, i: int) -> None:
        self._live[_ROW["in_flight"], i] = max(0.0, self._live[_ROW["in_flight"], i] - 1)
        self._derive_active(i)

    def _workload_mean(self, name: str, value: float) -> None:
        """One fleet-wide EWMA (every endpoint's column): a plain mean of the first
        1 / WORKLOAD_ALPHA values, so the first request does not stand for the workload."""
        self._seen[name] += 1
        row = self._live[_ROW[name]]
        old = float(row[0])
        old = 0.0 if old != old else old  # NaN: none yet (a float compare: no numpy call)
        row.fill(old + max(WORKLOAD_ALPHA, 1 / self._seen[name]) * (value - old))

    def _workload_low_quantile(self, name: str, value: float, q: float = 0.02) -> None:
        """A running ``q``-quantile (stochastic approximation, steps relative to the value):
        down by QUANTILE_STEP when a value falls below it, up by q/(1-q) of that otherwise,
        so it rests where a share q of the values lies below."""
        row = self._live[_ROW[name]]
        old = float(row[0])
        if old != old:  # NaN: the first value
            row.fill(value)
            return
        step = QUANTILE_STEP * old
        row.fill(max(1.0, old - step if value < old else old + step * q / (1 - q)))

    def _decay_prefill(self, i: int, now: float) -> None:
        col = self._live[:, i]
        since = col[_PREFILL_AT] - now
        if since < 0:
            col[_PREFILL_RATE] *= math.exp(since / PREFILL_TAU_S)
            col[_RECENT_RATE] *= math.exp(since / RECENT_PREFILL_TAU_S)
            col[_REQUEST_RATE] *= math.exp(since / PREFILL_TAU_S)
            col[_PREFILL_AT] = now

    def _derive_active(self, i: int) -> None:
        """active = max(ours + peers', the engine's running + queued); NaN running -> ours."""
        col = self._live[:, i]
        ours = col[_IN_FLIGHT] + col[_PEER_IN_FLIGHT]
        engine = col[_RUNNING] + col[_QUEUED]
        col[_ACTIVE] = engine if engine > ours else ours

    def _derive_usable(self, i: int) -> None:
        col = self._live[:, i]
        health = col[_HEALTH]
        col[_USABLE_FROM] = (np.inf if health == _NOT_READY or self.parked[i]
                             else max(col[_BLOCK], col[_PEER_BLOCK]))
        col[_STALE_AT] = np.inf if health == _PENDING else col[_CONTACT] + self.stale_after_s

    def _ewma(self, name: str, i: int, value: float) -> None:
        row = _ROW[name]
        old = float(self._live[row, i])
        self._live[row, i] = value if old != old else old + ALPHA * (value - old)
