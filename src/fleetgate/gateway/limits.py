"""Per-key limits and per-tenant budgets, enforced across replicas through the limit store.

Before routing, ``admit`` checks, for the caller's key: requests per minute (a sliding
60 s window, check-and-add in one atomic store step), tokens per minute, concurrent
requests (a semaphore whose holds expire after ``HOLD_TTL_S`` if a replica dies), and the
tenant's $ budget for the day / month. Over any limit: 429 in the OpenAI envelope with
``Retry-After``; what an admission had reserved before a later check refused it is given
back.

Tokens and $ are reserved at admission and settled when the request ends (checking what
was used so far and charging at the end let a burst through: 200 concurrent requests
against tpm 300 used 19x it), each in one atomic store step:

- tpm: the request reserves its prompt (``RoutingRequest.prompt_tokens_estimate``, ~4
  characters a token, times ``PromptScale``: the most, lately, that the engines' own count
  of a model's prompts came to over that estimate, so chat templates are reserved too) plus
  its output cap (``max_tokens`` or the API's equivalent; without
  one, ``UNCAPPED_OUTPUT_TOKENS``: reserving the whole context left, vLLM's default cap,
  would let one such request hold a key's whole minute), at most the limit itself (so a
  request never waits for room that cannot come), when ``used + reservation <= tpm``. At the
  end the reservation is replaced by the usage's ``total_tokens`` (streams included). An
  unsettled reservation leaves the window after 60 s, like any entry.
- $: the request reserves its worst-case charge (``worst_case_usd``: by the cost rule, alone
  on the priciest replica serving its model, the prior's time for its prompt and output
  cap), while the tenant's spend plus the live reservations is below the budget; at the end
  the charges of its finished attempts are added and the reservation dropped. A reservation
  never settled expires after ``RESERVATION_TTL_S``.

So a burst passes a tpm or $ limit by at most the last request admitted (and by what a
request used beyond its reservation: a prompt the ~4-characters count underestimated, an
answer past ``UNCAPPED_OUTPUT_TOKENS``). Every admitted request settles exactly once, on
``end`` (success, error, shed, cancelled, client gone, upstream failure); a request ended
without usage (a stream the client left) settles at what is known: nothing.

The store is Redis when ``FLEETGATE_REDIS_URL`` is set (limits hold across replicas) and
in-memory otherwise; while Redis is down the failover store answers from memory (limits
become per-replica) and ``degraded`` says so.

``LimitsObserver`` settles each admitted request through the observer seam: tokens and
spend summed over its finished attempts, settled with the concurrency hold when it ends.

Rate-limit headers (OpenAI's names and formats, ``rate_headers``): an answer to a key with
an rpm or tpm limit carries ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` for
the limits it has, from what admission counted (``Counted``: the window's total as the
store answered, no extra store call): remaining = the limit less the window's total,
this request included (a whole answer: its usage in place of its reservation, as the settle
will make it; a stream: its reservation, the headers going out before its usage is known);
reset = a duration (``openai_duration``: ``1s``, ``6m0s``, ``20ms``) until the window has
forgotten everything counted so far: for requests 60 s from admission (this request is
its newest entry, bar concurrent ones), for tokens 60 s (its usage enters the window when
it ends). On a 429 the refused limit's reset is the time until the request would fit (what
``retry-after`` rounds up); an rpm refusal reads the tpm window once (a pure check) so the
429 carries both.

May touch: the limit store, the auth principal, the observer seam, a fleet snapshot (read
only). Must not touch: HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from fleetgate.catalog.pricing import charge_usd
from fleetgate.gateway.auth import Principal
from fleetgate.gateway.errors import RateLimited
from fleetgate.gateway.proxy.observer import (
    NOOP_REQUEST,
    AttemptObserver,
    AttemptResult,
    RequestObserver,
)
from fleetgate.gateway.proxy.request import ProxyRequest
from fleetgate.routing import Decision, Endpoint, RoutingRequest
from fleetgate.routing.estimate import prior_tpot
from fleetgate.routing.types import STATIC_ROW, Snapshot
from fleetgate.state.store import LimitStore, StoreUnavailable

log = logging.getLogger("fleetgate.limits")

MINUTE = 60.0
HOLD_TTL_S = 900.0
RESERVATION_TTL_S = 900.0  # a dead replica's $ reservations are given back after this
UNCAPPED_OUTPUT_TOKENS = 4096  # what a request without an output cap reserves (module doc)
DAY_TTL_S, MONTH_TTL_S = 2 * 86400.0, 62 * 86400.0


def attempt_cost_usd(endpoint: Endpoint, result: AttemptResult) -> float:
    """The attempt's share of its replica's GPU time (docs/observability.md): replica $/s
    times the seconds it ran, divided by the requests sharing the replica meanwhile; on a
    hosted API priced per token, its tokens."""
    usage = result.usage or {}
    return endpoint.charge_usd(result.e2e_s, result.mean_concurrency,
                               int(usage.get("prompt_tokens") or 0),
                               int(usage.get("completion_tokens") or 0))


class PromptScale:
    """Per model: how much the engines' prompt counts exceed ``prompt_tokens_estimate``.

    The upper envelope of the ratios seen (a higher one is taken at once, a lower one moves
    it 2% of the way), at least 1 and at most 4; 1 before any answer. Learned per process
    from the usage of the limited keys' answers."""

    def __init__(self) -> None:
        self._scale: dict[str, float] = {}

    def tokens(self, routing: RoutingRequest) -> float:
        return math.ceil(routing.prompt_tokens_estimate * self._scale.get(routing.model, 1.0))

    def observe(self, model: str, estimate: int, prompt_tokens: int) -> None:
        if estimate <= 0 or prompt_tokens <= 0:
            return
        ratio = min(max(prompt_tokens / estimate, 1.0), 4.0)
        scale = self._scale.get(model, 1.0)
        self._scale[model] = ratio if ratio > scale else scale + (ratio - scale) * 0.02


def output_reserve(routing: RoutingRequest) -> int:
    """The output tokens a request reserves: its cap, else ``UNCAPPED_OUTPUT_TOKENS``."""
    return UNCAPPED_OUTPUT_TOKENS if routing.max_tokens is None else max(0, routing.max_tokens)


def worst_case_usd(snap: Snapshot, routing: RoutingRequest, prompt_tokens: float) -> float:
    """The most the request can be charged: alone on the priciest replica serving its model
    (``charge_usd`` at concurrency 1, which bounds its share at any batch), for the prior's
    time (corrected by what was learned) to prefill its prompt and generate its output
    reserve. 0 when nothing serves the model (the request gets no answer to charge)."""
    idx = snap.by_model.get((routing.model, routing.api))
    if idx is None or not len(idx):
        return 0.0
    n, g = float(prompt_tokens), float(output_reserve(routing))
    static, worst = snap.static, 0.0
    k_tpot, k_ttft = snap.col("k_tpot"), snap.col("k_ttft")
    rate = snap.col("prefill_tokens_per_s")
    for i in (int(i) for i in idx):
        tpot = _factor(k_tpot[i]) * prior_tpot(static, i, n, g, 1.0, float(rate[i]))
        ttft = _factor(k_ttft[i]) * (static[STATIC_ROW["step_base_s"], i]
                                     + static[STATIC_ROW["prefill_s_per_token"], i] * n)
        usd = charge_usd(float(static[STATIC_ROW["usd_per_s"], i]),
                         float(ttft + tpot * max(g - 1.0, 0.0)), 1.0) + (
            n * static[STATIC_ROW["usd_per_input_token"], i]  # a hosted API's tokens
            + g * static[STATIC_ROW["usd_per_output_token"], i])
        worst = max(worst, usd if math.isfinite(usd) else 0.0)
    return worst


def _factor(k: float) -> float:
    return float(k) if k > 0 else 1.0  # NaN (nothing learned yet): the prior as it is


@dataclass(slots=True)
class Counted:
    """One sliding window as admission saw it (for the rate-limit headers)."""

    limit: int
    used: float  # the window's total after the check (this request's amount included if admitted)
    reserved: float = 0.0  # what this request put in it
    refused_for_s: float | None = None  # refused: the seconds until the request fits


@dataclass(slots=True)
class Admission:
    """What one admitted request holds: settled (or given back) exactly once."""

    principal: Principal
    at: float = 0.0  # when it was admitted (the limit store's clock)
    requests: Counted | None = None  # the rpm window (None: no rpm limit)
    token_window: Counted | None = None  # the tpm window (None: no tpm limit, or not reached)
    hold: str | None = None
    tpm_entry: str | None = None  # the tokens reserved in the tpm window
    spend_holds: list[tuple[str, str, float]] = field(default_factory=list)  # period, id, ttl
    settled_usd: float = 0.0  # the finished attempts' charges
    tokens: float = 0.0  # the finished attempts' total_tokens
    done: bool = False


@dataclass(slots=True)
class LimitEnforcer:
    store: LimitStore
    clock: Callable[[], float] = time.time
    prompts: PromptScale = field(default_factory=PromptScale)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run a store update without holding up the response (errors are logged)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("limit bookkeeping failed: %s", task.exception())

    async def admit(self, principal: Principal, routing: RoutingRequest | None = None,
                    snapshot: Callable[[], Snapshot] | None = None) -> Admission | None:
        """Check every limit of the caller, reserving its tokens and $; None when it has no
        limits (nothing to settle). ``snapshot`` prices the $ reservation (none: 0)."""
        if principal.unlimited:
            return None
        lim, key, now = principal.limits, principal.name, self.clock()
        admission = Admission(principal, now)
        if lim.rpm is not None:
            verdict = await self.store.take(f"rpm:{key}", 1, lim.rpm, MINUTE, now)
            admission.requests = Counted(lim.rpm, verdict.used, 1.0 if verdict.allowed else 0.0,
                                         None if verdict.allowed else verdict.retry_after_s)
            if not verdict.allowed:
                limited = _limited(f"key {key!r} is over its {lim.rpm} requests/min",
                                   verdict.retry_after_s)
                if lim.tpm is not None:  # the 429 carries the tokens' headers too
                    with contextlib.suppress(StoreUnavailable):  # else: without them
                        tokens = await self.store.take(f"tpm:{key}", 0, lim.tpm, MINUTE, now)
                        admission.token_window = Counted(lim.tpm, tokens.used)
                limited.headers.update(self.rate_headers(admission, final=True))
                raise limited
        try:
            await self._reserve(admission, routing, snapshot, now)
        except BaseException as exc:
            self.spawn(self._give_back(admission, 0.0, 0.0))
            if isinstance(exc, RateLimited):
                exc.headers.update(self.rate_headers(admission, final=True))
            raise
        return admission

    def rate_headers(self, admission: Admission, final: bool) -> dict[str, str]:
        """OpenAI's rate-limit headers for the key's rpm and tpm limits (module doc).
        ``final``: the request's usage is known (a whole answer, an error): it replaces the
        reservation in the remaining tokens; else (a stream's start) the reservation counts."""
        out: dict[str, str] = {}
        req, tok = admission.requests, admission.token_window
        if req is not None:
            _dimension(out, "requests", req, MINUTE - (self.clock() - admission.at))
        if tok is not None:
            if final and tok.refused_for_s is None:
                tok = Counted(tok.limit, tok.used - tok.reserved + admission.tokens)
            _dimension(out, "tokens", tok, MINUTE if tok.used > 0 else 0.0)
        return out

    async def _reserve(self, admission: Admission, routing: RoutingRequest | None,
                       snapshot: Callable[[], Snapshot] | None, now: float) -> None:
        p = admission.principal
        lim, key = p.limits, p.name
        prompt = 0.0 if routing is None else self.prompts.tokens(routing)
        if lim.tpm is not None:
            want = lim.tpm if routing is None else min(prompt + output_reserve(routing),
                                                       lim.tpm)
            verdict = await self.store.take(f"tpm:{key}", want, lim.tpm, MINUTE, now)
            admission.token_window = Counted(lim.tpm, verdict.used,
                                             want if verdict.allowed else 0.0,
                                             None if verdict.allowed else verdict.retry_after_s)
            if not verdict.allowed:
                raise _limited(f"key {key!r} is over its {lim.tpm} tokens/min (this request "
                               f"reserves {want:g})", verdict.retry_after_s)
            admission.tpm_entry = verdict.entry
        caps = [(cap, period, ttl) for cap, period, ttl in (
            (lim.usd_per_day, _day(now), DAY_TTL_S), (lim.usd_per_month, _month(now),
                                                       MONTH_TTL_S)) if cap is not None]
        if caps:
            usd = worst_case_usd(snapshot(), routing, prompt) if snapshot and routing else 0.0
            for cap, period, ttl in caps:
                hold = await self.store.reserve_spend(f"usd:{p.tenant}", usd, period, cap,
                                                      RESERVATION_TTL_S, now)
                if hold is None:
                    spent = await self.store.spent(f"usd:{p.tenant}", period)
                    raise _limited(f"tenant {p.tenant!r} spent ${spent:.4f} of its ${cap:g} "
                                   f"budget for {period} (with the requests running)",
                                   _seconds_to_next(period, now))
                admission.spend_holds.append((period, hold, ttl))
        if lim.concurrency is not None:
            admission.hold = await self.store.acquire(f"conc:{key}", lim.concurrency,
                                                      HOLD_TTL_S, now)
            if admission.hold is None:
                raise _limited(f"key {key!r} already has {lim.concurrency} requests running", 1)

    async def settle(self, admission: Admission) -> None:
        """The request ended: its tokens and $ replace its reservations, its hold is freed.
        Exactly once per admission (a second call does nothing)."""
        if admission.done:
            return
        await self._give_back(admission, admission.tokens, admission.settled_usd)

    async def _give_back(self, admission: Admission, tokens: float, usd: float) -> None:
        if admission.done:
            return
        admission.done = True
        p, now = admission.principal, self.clock()
        if admission.tpm_entry is not None:
            await self.store.record(f"tpm:{p.name}", tokens, MINUTE, now, admission.tpm_entry)
        for period, hold, ttl in admission.spend_holds:
            await self.store.add_spend(f"usd:{p.tenant}", usd, period, ttl, hold)
        if admission.hold is not None:
            await self.store.release(f"conc:{p.name}", admission.hold)


def _limited(message: str, retry_after_s: float) -> RateLimited:
    seconds = max(1, math.ceil(retry_after_s))
    return RateLimited(message, headers={"retry-after": str(seconds)})


def _dimension(out: dict[str, str], name: str, window: Counted, reset_s: float) -> None:
    if window.refused_for_s is not None:
        reset_s = window.refused_for_s
    out[f"x-ratelimit-limit-{name}"] = str(window.limit)
    out[f"x-ratelimit-remaining-{name}"] = str(max(0, math.floor(window.limit - window.used)))
    out[f"x-ratelimit-reset-{name}"] = openai_duration(reset_s)


def openai_duration(seconds: float) -> str:
    """A duration as OpenAI's ``x-ratelimit-reset-*`` headers write it (Go's
    ``time.Duration`` format, to the millisecond): ``"0s"``, ``"20ms"``, ``"1s"``,
    ``"1.5s"``, ``"6m0s"``, ``"1h2m3s"``. Negative or NaN: ``"0s"``."""
    ms = round(min(seconds, 1e9) * 1000) if seconds > 0 else 0  # NaN > 0 is False
    if ms == 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs, frac = divmod(rest, 1000)
    text = f"{secs}.{frac:03d}".rstrip("0") if frac else str(secs)
    text += "s"
    if hours:
        return f"{hours}h{minutes}m{text}"
    return f"{minutes}m{text}" if minutes else text


def _day(now: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(now))


def _month(now: float) -> str:
    return time.strftime("%Y-%m", time.gmtime(now))


def _seconds_to_next(period: str, now: float) -> float:
    if len(period) == 10:  # a day
        return 86400 - now % 86400
    return 86400.0  # a month: come back tomorrow at the latest to see


class LimitsObserver:
    """Settles admitted requests: tokens and spend of the finished attempts, on end."""

    def __init__(self, enforcer: LimitEnforcer) -> None:
        self._enforcer = enforcer

    def request(self, req: ProxyRequest) -> RequestObserver:
        if req.admission is None:  # a caller without limits: nothing to settle
            return NOOP_REQUEST
        return _Settle(self._enforcer, req.admission, req.routing)


@dataclass(slots=True)
class _Settle:
    enforcer: LimitEnforcer
    admission: Admission
    routing: RoutingRequest

    def routed(self, decision: Decision) -> None:
        pass

    def attempt(self, endpoint: Endpoint, served_model: str, number: int) -> AttemptObserver:
        return _SettleAttempt(self, endpoint)

    def end(self, status: int, error: str | None = None) -> None:
        self.enforcer.spawn(self.enforcer.settle(self.admission))


@dataclass(slots=True)
class _SettleAttempt:
    parent: _Settle
    endpoint: Endpoint

    def headers(self) -> dict[str, str]:
        return {}

    def first_token(self, ttft_s: float) -> None:
        pass

    def finished(self, result: AttemptResult) -> None:
        usage = result.usage or {}
        parent = self.parent
        admission, routing = parent.admission, parent.routing
        admission.tokens += float(usage.get("total_tokens") or 0)
        if result.migrated_after is None:  # a continuation's prompt holds the answer so far
            parent.enforcer.prompts.observe(routing.model, routing.prompt_tokens_estimate,
                                            int(usage.get("prompt_tokens") or 0))
        admission.settled_usd += attempt_cost_usd(self.endpoint, result)

    def failed(self, status: int, error: str) -> None:
        pass

    def cancelled(self) -> None:
        pass
