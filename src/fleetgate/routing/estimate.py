"""Per-candidate predictions for one request: TTFT, TPOT, SLO capacity and $/Mtok.

One compiled pass over the candidate endpoints, run the first time a filter, scorer or
the explainer asks for any estimate, so a round-robin decision never pays for it. With the
prior of ``prior.py`` corrected by the learned ``k_tpot``/``k_ttft``:

    n      = prompt tokens (estimate) less what the candidate's cache probably holds of the
             prompt (its leading chunks in the prefix index, ``state/prefix.py``), in every
             prefill term below; g = max_tokens (256 when absent), C = prompt + g/2
    active = max(in_flight + peers' in_flight, running + queued)   (ours are exact, the
             other replicas' one sync interval old, the engine's one scrape old; kept
             current by ``LiveFleet``)
    B_max  = floor(min(max_batch, kv_capacity_tokens / (n + g)))  (KV memory limits the
             running batch; counted at full length, so admitted requests are never preempted)
    rho    = min(prefill_tokens_per_s * prefill_per_token, 0.9)   (the share of the engine's
             time spent on the prompts it was sent lately: chunked prefill shares every step
             with the decodes, so decode steps come 1 / (1 - rho) times slower)
    tpot   = k_tpot * (step_base + step_per_ctx_token * C * min(active + 1, B_max)) / (1 - rho)
    wait   = floor(active / B_max) * tpot * g   (a request beyond the running batch waits, at
             worst, for whole generations to free a slot: the running requests may all have
             started together; = ceil(max(0, active + 1 - B_max) / B_max) for whole counts)
    ttft   = k_ttft * (step_base + prefill_per_token * n * (1 + queued) + wait)
             + tpot * n * (1 + queued) / PREFILL_STEP_TOKENS   (the queued prompts are
             prefilled in chunks of a step's token budget, each step also running the
             decodes: a burst of 20 long prompts on one replica took a third longer than
             their prefill alone, and its last ones missed a TTFT SLO predicted met)
    n_typ, g_typ = the mean prompt and answer of the requests the gateway sent lately
             (``prompt_tokens_mean``, ``output_tokens_mean``, one value each for the fleet; n
             and DEFAULT_MAX_TOKENS before any: one request's own answer, 8 tokens or 2,000,
             is no guess of a workload, and the price ranking of a cold fleet would follow
             it): capacity and price are the endpoint's on this workload, not on this one
             request
    per_seq = step_per_ctx_token * (n_typ + g_typ/2) + prefill_per_token * n_typ / g_typ  (one
             running request costs a step in steady state: its KV read, and its prompt's
             prefill spread over its output tokens: an endpoint that runs B requests at TPOT t
             takes in B/(t*g) prompts a second, so rho is not free at capacity)
    stall  = prefill_per_token * n_typ / max(g_short - 1, 1)   (g_short: the 2nd percentile
             of answers, ``output_tokens_p2``; g before any)
    B_slo  = the largest batch at which the short answers still meet the TPOT SLO when one
             typical prompt's prefill lands in their life: (0.8*slo_tpot/k_tpot - step_base -
             stall) / per_seq, clipped to [0, B_max]  (B_max without a TPOT SLO). The SLO is
             judged per request, and a short answer lives a few steps: one of them carrying
             another request's prefill is most of its TPOT, so the tail of the answers, not
             their mean, sets the capacity (a 99% target cannot give up the shortest 2%).
             When not even one request fits beside the stall, no batch size protects that
             tail and the stall is left out (capacity by the mean, rather than a fleet that
             turns everyone away). At least 1 when tpot(1) meets the SLO. Then
             B_slo_prior = that, the catalog prior's guess. Then the learned capacity of the
             endpoint's class (``slo_limit``, ``state/slo_capacity.py``: the largest load
             whose requests were seen to meet the SLO, one bin above the loads seen so far
             until misses are seen to rise, the knee ``slo_knee``) replaces it: B_slo =
             slo_limit at a knee, else max(slo_limit, B_slo_prior) but at most
             LEARNED_GROWTH x B_slo_prior (the prior stands until the class's own latency
             shows where it stops; past it, the model grows one load bin at a time and no
             further than half again: the tail it guards is rare, and a bin judged good on
             a few hundred requests is weak evidence), clipped to [1, B_max]
    usd_per_mtok = usd_per_s * 1e6 * k_tpot * (step_base + per_seq * B_slo) / B_slo  (replica
             $/s over the tokens/s it sustains at the SLO; infinite when it cannot meet the
             SLO at all): what a token costs at capacity, the average price
    marginal_usd = usd_per_s * (k_tpot * g * slow * step_per_ctx_token * C       (its KV reads)
                               + k_ttft * prefill_per_token * n                  (its prefill)
                               + k_tpot * g * step_base / min(active + 1, B_slo))
             the replica time *this* request takes where it goes, priced: its KV reads and
             its prefill, and its share of the steps' fixed part: on an idle replica the
             whole steps, on a busy one a share of slightly longer steps. The cost scorer
             (``plugins/cost.py``) fills busy replicas by it, up to their SLO capacity, and
             opens an idle one only when none has room, the one cheapest per token at
             capacity (``usd_per_mtok``), so whole replicas stay idle for a scaler
    share  = (recent_prefill_tokens_per_s x exp(-(now - prefill_at) / RECENT_PREFILL_TAU_S)
              + n / RECENT_PREFILL_TAU_S) * prefill_per_token   (the share of the last second
             the endpoint spends prefilling, this prompt included: the recent rate decayed
             to the decision's instant)
    meets_slo = tpot <= 0.8 * slo_tpot and ttft <= 0.8 * slo_ttft and active + 1 <= B_slo
             and (no TPOT SLO or share <= MAX_SLO_PREFILL_SHARE)
             (20% headroom: the predictions are averages, the SLO is judged per request.
             The prefill share bounds the TPOT tail: a short answer whose few steps share
             one with a long prompt's prefill chunk misses a TPOT SLO however light the
             batch, and the more prompts one replica takes, the likelier that step is. With
             the request's marginal price packing busy replicas, their prefill share is what
             gave way first: 98.4-98.9% within the SLO on the shipped and a ten-replica fleet
             without the bound. The share is read over about one second, a short answer's
             life, not over the ten seconds of ``rho``: a ten-second average lets a burst in
             and then refuses the replica long after it; 0.7 of one second against 0.4 of ten
             held 99% wherever least_loaded does on the whole scenario matrix (and on 13 of its
             cells at a second seed) and cost less in 23 of its 26 cells; BENCHMARKS.md,
             issue 22)
    over_share = 1 when the request meets every other condition of meets_slo and fails only
             the prefill share (self-hosted endpoints only): the pipeline ranks those after
             the endpoints that meet the SLO and before a hosted API's overflow
             (``pipeline.py``)
    can_take = the same without the prefill share, and with the prior's B_slo stretched to
             what the learned capacity may grow to (LEARNED_GROWTH x) while nothing is
             learned: 1 when this request would still be predicted within the SLO there
             (what admission control waits for: the prior's guess steers where requests go;
             a cold fleet waits only past what the learned capacity could reach). The
             prefill share guards a tail of a percent or two: worth steering by, not worth
             a 429 (with it, goodput at 2x the small fleet's capacity fell from 57.8 to
             53.5 requests/s; without it, 71.4). Its TPOT counts the other running
             requests at min(C, C_typ) each, C_typ = ``context_tokens_mean`` +
             g_typ / 2 (the workload's whole prompts, cached prefix included: what a step's
             KV read counts), not at this request's C as the steering's tpot does. A long
             prompt among short ones is steered away from a full replica (counted at its
             own C, the others make a slow step), and admitted where it fits by what the
             step will read: counted at its own C, the cost router shed 1,970 requests of a
             plan-chosen 5 x MI355X/SGLang fleet (94.5% within the SLO, round_robin 100%);
             counted this way, 6 (99.59%); no autoscaled bill of the matrix rose by more
             than 0.2% (BENCHMARKS.md, issue 22). Counting the others at C_typ for steering
             as well made autoscaled bills up to 31% dearer: long prompts then packed into
             busy replicas

A hosted API priced per token (``per_token`` 1: ``engine: openai`` with ``price_per_mtok``)
has no replica time to model or pay for: tpot = k_tpot x its expected TPOT, ttft = k_ttft x
its expected TTFT at any load, B_slo = B_max = its ``max_concurrency``, usd_per_mtok = its
output price plus its input price x n_typ / g_typ, marginal_usd = n x input price + g x
output price (what this request will be charged), meets_slo = can_take = timely and
active + 1 <= max_concurrency, over_share = 0. The cost scorer ranks it after every
self-hosted endpoint (``plugins/cost.py``), and the pipeline after the self-hosted ones that
fail only the prefill share, so it takes only what self-hosted capacity cannot within the SLO.

The loop (numba) costs ~10 ns a candidate; as whole-column numpy operations the same
formulas took ~60 calls whose fixed cost dominated a decision at any fleet size
(BENCHMARKS.md, "Routing decision time").

May touch: numpy and routing types. Must not touch: I/O, clocks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from fleetgate.routing.compiled import compiled
from fleetgate.routing.types import (
    CHUNK_TOKENS,
    HEALTH_CODES,
    LIVE_ROW,
    STATIC_ROW,
    BoolArray,
    FloatArray,
    IntArray,
    RoutingRequest,
    Snapshot,
)

DEFAULT_MAX_TOKENS = 256
SLO_HEADROOM = 0.8
MAX_PREFILL_SHARE = 0.9
PREFILL_STEP_TOKENS = 8192.0  # a step's token budget: vLLM's and SGLang's defaults
LEARNED_GROWTH = 1.5
MAX_SLO_PREFILL_SHARE = 0.7  # of the last second (RECENT_PREFILL_TAU_S)
PREFILL_TAU_S = 10.0  # state/live.py's time constant of prefill_tokens_per_s
RECENT_PREFILL_TAU_S = 1.0  # and of recent_prefill_tokens_per_s
NAMES = ("ttft_s", "tpot_s", "e2e_s", "usd_per_mtok", "marginal_usd", "slo_capacity",
         "active", "load", "meets_slo", "kv_headroom_tokens", "fits_context", "prefill_s",
         "can_take", "over_share")


T = TypeVar("T")


class lazy(Generic[T]):
    """``functools.cached_property`` without its lock (3.11 takes an RLock per first read)."""

    def __init__(self, fn: Callable[[Any], T]) -> None:
        self.fn = fn
        self.name = fn.__name__

    def __get__(self, obj: Any, owner: type | None = None) -> T:
        value = self.fn(obj)
        obj.__dict__[self.name] = value  # later reads hit the instance dict directly
        return value


@dataclass(frozen=True, slots=True)
class Slo:
    ttft_s: float | None = None
    tpot_s: float | None = None


# The snapshot rows the kernel reads, passed in (never baked into numba's on-disk cache).
_LIVE_IN = np.array([LIVE_ROW[name] for name in (
    "active", "queued", "kv_usage", "k_tpot", "k_ttft", "prefill_tokens_per_s", "slo_limit",
    "slo_knee", "prompt_tokens_mean", "output_tokens_mean", "output_tokens_p2",
    "recent_prefill_tokens_per_s", "prefill_at", "context_tokens_mean")],
    dtype=np.intp)
_STATIC_IN = np.array([STATIC_ROW[name] for name in (
    "step_base_s", "step_per_ctx_token_s", "prefill_s_per_token", "kv_capacity_tokens",
    "max_batch", "usd_per_s", "per_token", "usd_per_input_token", "usd_per_output_token",
    "hosted_ttft_s")], dtype=np.intp)
_BASE, _PER_CTX, _PREFILL, _KV_CAP, _MAX_BATCH = (STATIC_ROW[name] for name in (
    "step_base_s", "step_per_ctx_token_s", "prefill_s_per_token", "kv_capacity_tokens",
    "max_batch"))
_NO_HITS = np.zeros(0)
_USABLE_IN = np.array([LIVE_ROW["usable_from"], LIVE_ROW["stale_at"]], dtype=np.intp)
# The rows the kernel writes, in order.
KERNEL_ROWS = ("b_max", "tpot_s", "ttft_s", "e2e_s", "slo_capacity", "usd_per_mtok", "load",
               "kv_headroom_tokens", "can_take", "marginal_usd", "over_share")


@compiled
def _batch_limit(max_batch: float, kv_capacity_tokens: float, full: float) -> float:
    """B_max: the running batch KV memory allows at full length (at least 1)."""
    return max(np.floor(min(max_batch, kv_capacity_tokens / full)), 1.0)


@compiled
def _prefill_slowdown(prefill_tokens_per_s: float, prefill_s_per_token: float) -> float:
    """1 / (1 - rho): how much slower decode steps come while prompts share the steps."""
    rate = prefill_tokens_per_s if prefill_tokens_per_s > 0 else 0.0  # NaN -> 0
    return 1.0 / (1.0 - min(rate * prefill_s_per_token, MAX_PREFILL_SHARE))


def prior_tpot(static: FloatArray, i: int, prompt_tokens: float, output_tokens: float,
               batch: float, prefill_tokens_per_s: float) -> float:
    """The uncorrected prior's TPOT for endpoint ``i`` at ``batch`` running requests: what
    the learned ``k_tpot`` is measured against (``state/learning.py``)."""
    col = static[:, i]
    full = prompt_tokens + output_tokens
    b_max = _batch_limit(col[_MAX_BATCH], col[_KV_CAP], full)
    ctx = prompt_tokens + output_tokens / 2
    step = col[_BASE] + col[_PER_CTX] * ctx * min(max(batch, 1.0), b_max)
    return float(step * _prefill_slowdown(prefill_tokens_per_s, col[_PREFILL]))


@compiled
def _kernel(live: FloatArray, static: FloatArray, live_in: IntArray, static_in: IntArray,
            idx: IntArray, rows: IntArray, n_sent: float, g: float, hits: FloatArray,
            tpot_limit: float, ttft_limit: float, now: float, out: FloatArray,
            meets: BoolArray) -> None:
    """The module docstring's formulas for candidates ``idx``, one pass (compiled by numba):
    candidate j's static column is ``idx[j]``, its live one ``rows[j]``.

    Limits are the SLO times the headroom, +inf without that SLO (then not compared, so an
    unknown prediction does not fail an SLO nobody set).
    """
    (active_r, queued_r, kv_usage_r, k_tpot_r, k_ttft_r, prefill_rate_r, limit_r, knee_r,
     typ_n_r, typ_g_r, short_r, recent_r, prefill_at_r, typ_ctx_r) = live_in
    base_r, per_ctx_r, prefill_r, kv_cap_r, max_batch_r, usd_r = static_in[:6]
    ctx = n_sent + g / 2
    full = n_sent + g
    for j in range(idx.shape[0]):
        i, r = idx[j], rows[j]
        if static[static_in[6], i] > 0:  # a hosted API priced per token
            _hosted(live, static, live_in, static_in, i, r, j, n_sent, g, tpot_limit,
                    ttft_limit, out, meets)
            continue
        n = max(n_sent - hits[j], 1.0) if hits.shape[0] else n_sent  # what it must prefill
        slow = _prefill_slowdown(live[prefill_rate_r, r], static[prefill_r, i])
        active, k_tpot = live[active_r, r], live[k_tpot_r, r]
        base, ctx_cost, cap = static[base_r, i], static[per_ctx_r, i] * ctx, static[kv_cap_r, i]
        b_max = _batch_limit(static[max_batch_r, i], cap, full)
        tpot = k_tpot * slow * (base + ctx_cost * min(active + 1.0, b_max))
        wait = np.floor(active / b_max) * tpot * g
        prefill = static[prefill_r, i] * n * (live[queued_r, r] + 1.0)
        steps = n * (live[queued_r, r] + 1.0) / PREFILL_STEP_TOKENS  # that share decodes' steps
        ttft = live[k_ttft_r, r] * (base + prefill + wait) + steps * tpot
        typical = live[typ_n_r, r] if live[typ_n_r, r] > 0 else n  # NaN: nothing sent yet
        answer = live[typ_g_r, r] if live[typ_g_r, r] > 0 else DEFAULT_MAX_TOKENS
        short = live[short_r, r] if live[short_r, r] > 0 else g
        per_seq = (static[per_ctx_r, i] * (typical + answer / 2)
                   + static[prefill_r, i] * typical / answer)
        batch = b_max
        if tpot_limit < np.inf:
            stall = static[prefill_r, i] * typical / max(short - 1.0, 1.0)
            room = tpot_limit / k_tpot - base
            if room - stall >= per_seq:  # else no batch protects the tail: mind the mean
                room -= stall
            batch = min(max(np.floor(room / per_seq), 0.0), b_max)
            if batch < 1.0 and k_tpot * (base + ctx_cost) <= tpot_limit:
                batch = 1.0  # it meets the SLO alone: one at a time
        limit = live[limit_r, r]
        learned = limit > 0 and (tpot_limit < np.inf or ttft_limit < np.inf)
        if learned:  # the class's measured capacity (nothing to a policy without an SLO)
            limit = min(max(np.floor(limit), 1.0), b_max)
            batch = (limit if live[knee_r, r] > 0
                     else min(max(limit, batch), batch * LEARNED_GROWTH))
        rate = live[recent_r, r] if live[recent_r, r] > 0 else 0.0
        since = live[prefill_at_r, r] - now
        if since < 0:
            rate *= np.exp(since / RECENT_PREFILL_TAU_S)  # decayed to this instant
        share = (rate + n / RECENT_PREFILL_TAU_S) * static[prefill_r, i]  # with this prompt
        over_share = tpot_limit < np.inf and share > MAX_SLO_PREFILL_SHARE
        within = active + 1.0 <= batch
        usage = live[kv_usage_r, r]
        if np.isnan(usage):
            usage = min(active * ctx / cap, 1.0)
        out[0, j] = b_max
        out[1, j] = tpot
        out[2, j] = ttft
        out[3, j] = ttft + tpot * (g - 1)
        out[4, j] = batch
        usd = static[usd_r, i]
        out[5, j] = (usd * 1e6 * k_tpot * (base + per_seq * batch) / batch
                     if batch > 0 else np.inf)  # $/s over tokens/s at the SLO batch
        out[6, j] = active / max(batch, 1.0)
        out[7, j] = (1.0 - usage) * cap
        timely = ((tpot_limit == np.inf or tpot <= tpot_limit)
                  and (ttft_limit == np.inf or ttft <= ttft_limit))
        meets[j] = within and timely and not over_share
        out[10, j] = 1.0 if within and timely and over_share else 0.0
        room = batch if learned else LEARNED_GROWTH * batch  # cold: what the prior may grow to
        if not timely and tpot_limit < np.inf and live[typ_ctx_r, r] > 0 \
                and live[typ_g_r, r] > 0:  # the others at the workload's context, if smaller
            others = min(live[typ_ctx_r, r] + live[typ_g_r, r] / 2, ctx)
            typical_tpot = k_tpot * slow * (base + ctx_cost + static[per_ctx_r, i] * others
                                            * (min(active + 1.0, b_max) - 1.0))
            timely = typical_tpot <= tpot_limit and (ttft_limit == np.inf or ttft <= ttft_limit)
        out[8, j] = 1.0 if timely and active + 1.0 <= room else 0.0
        if batch > 0:
            fixed = k_tpot * g * base / min(active + 1.0, batch)
            out[9, j] = usd * (k_tpot * g * slow * ctx_cost
                               + live[k_ttft_r, r] * static[prefill_r, i] * n + fixed)
        else:
            out[9, j] = np.inf


@compiled
def _hosted(live: FloatArray, static: FloatArray, live_in: IntArray, static_in: IntArray,
            i: int, r: int, j: int, n: float, g: float, tpot_limit: float,
            ttft_limit: float, out: FloatArray, meets: BoolArray) -> None:
    """The kernel's rows for a hosted API (the module docstring's last paragraph)."""
    active, cap = live[live_in[0], r], static[static_in[4], i]
    tpot = live[live_in[3], r] * static[static_in[0], i]
    ttft = live[live_in[4], r] * static[static_in[9], i]
    usd_in, usd_out = static[static_in[7], i], static[static_in[8], i]
    typical = live[live_in[8], r] if live[live_in[8], r] > 0 else n
    answer = live[live_in[9], r] if live[live_in[9], r] > 0 else DEFAULT_MAX_TOKENS
    timely = ((tpot_limit == np.inf or tpot <= tpot_limit)
              and (ttft_limit == np.inf or ttft <= ttft_limit))
    room = active + 1.0 <= cap
    out[0, j] = cap
    out[1, j] = tpot
    out[2, j] = ttft
    out[3, j] = ttft + tpot * (g - 1)
    out[4, j] = cap
    out[5, j] = 1e6 * (usd_out + usd_in * typical / answer)
    out[6, j] = active / cap
    out[7, j] = max(cap - active, 0.0) * (n + g)
    out[8, j] = 1.0 if timely and room else 0.0
    out[9, j] = usd_in * n + usd_out * g
    out[10, j] = 0.0
    meets[j] = timely and room


@compiled
def _usable(live: FloatArray, rows: IntArray, idx: IntArray, now: float, out: BoolArray) -> int:
    """out[j] = usable_from <= now <= stale_at for candidate j; returns how many are."""
    count = 0
    for j in range(idx.shape[0]):
        out[j] = live[rows[0], idx[j]] <= now <= live[rows[1], idx[j]]
        count += out[j]
    return count


class _KernelRow:
    """An ``Estimates`` attribute that reads one row of the (lazily run) kernel's output."""

    def __init__(self, name: str) -> None:
        self.row = KERNEL_ROWS.index(name)

    def __get__(self, obj: Estimates, owner: type | None = None) -> FloatArray:
        return obj._kernel_out[0][self.row]


class Estimates:
    """Lazily computed predictions, aligned with the candidate indices ``idx``.

    The prefilter is one compiled call and the context check one numpy comparison; every
    estimate comes from one kernel call the first time any of them is read (round-robin
    decisions never pay for it). On a shared snapshot (the fleet's own rows, not a copy:
    ``Snapshot.shared``) the candidates' rows are copied first, so what is computed later
    (an estimate asked after the decision, an explanation) reads the decision's instant.
    """

    def __init__(self, snap: Snapshot, idx: IntArray, req: RoutingRequest, slo: Slo) -> None:
        self._snap, self._idx = snap, idx
        self._static = snap.static  # immutable (copied on write by LiveFleet)
        if snap.shared:
            self._live = np.take(snap.live, idx, axis=1)
            self._live.setflags(write=False)  # as a snapshot's (numba compiles per flavour)
            self._rows: IntArray = np.arange(len(idx))  # candidate -> its column in _live
        else:
            self._live, self._rows = snap.live, idx
        self._whole = len(idx) == len(snap.endpoints)
        self._aligned = self._whole or snap.shared  # _live's rows line up with idx
        self._now = snap.taken_at
        self._n = float(req.prompt_tokens_estimate)
        self._g = float(req.max_tokens or DEFAULT_MAX_TOKENS)
        self._hashes = req.prefix_hashes
        self.slo = slo
        self._one: dict[int, tuple[FloatArray, BoolArray]] = {}  # at(): one candidate's run

    def __getitem__(self, name: str) -> Any:
        if name not in NAMES:
            raise KeyError(name)
        return getattr(self, name)

    def as_dict(self) -> dict[str, FloatArray]:
        return {name: np.asarray(getattr(self, name), dtype=float) for name in NAMES}

    def at(self, name: str, k: int) -> float:
        """One candidate's estimate. When no plugin has needed the whole fleet's (round-robin),
        the kernel runs for that candidate alone: the gateway asks for the attempted
        endpoints' TTFT and TPOT to learn its corrections."""
        one_run = name in KERNEL_ROWS or name == "meets_slo"
        if not one_run or "_kernel_out" in self.__dict__:
            return float(self[name][k])
        one = self._one.get(k)
        if one is None:
            one = self._one[k] = self._run(slice(k, k + 1))
        return float(one[1][0] if name == "meets_slo" else one[0][KERNEL_ROWS.index(name), 0])

    def column(self, name: str) -> FloatArray:
        """A live or static column of the snapshot, aligned with the candidates."""
        row = LIVE_ROW.get(name)
        if row is None:
            col = self._static[STATIC_ROW[name]]
            return col if self._whole else col[self._idx]
        if row >= len(self._live):
            raise KeyError(f"{name!r} is not in a snapshot (ROUTED_COLUMNS); "
                           "read LiveFleet.column")
        return self._live[row] if self._aligned else self._live[row][self._rows]

    def prefilter(self) -> tuple[BoolArray, int]:
        """The builtin prefilter (ready or pending, breakers closed, state fresh): the mask of
        candidates that pass and how many do."""
        ok = np.empty(len(self._idx), dtype=bool)
        return ok, _usable(self._live, _USABLE_IN, self._rows, self._now, ok)

    def unusable_reason(self, k: int) -> str:
        """Why the builtin prefilter drops candidate ``k``."""
        if self.column("health")[k] == HEALTH_CODES["not_ready"]:
            return "not ready"
        if self.column("usable_from")[k] > self._now:
            return "breaker open"
        return "state stale"

    @lazy
    def fits_context(self) -> BoolArray:
        return self.column("max_model_len") >= self._n + self._g

    @lazy
    def prefill_s(self) -> FloatArray:
        """This prompt's prefill alone on an idle endpoint: k_ttft * (base + prefill * n);
        a hosted API's expected TTFT."""
        own = self.column("step_base_s") + self.column("prefill_s_per_token") * self._n
        hosted = self.column("hosted_ttft_s")
        return self.column("k_ttft") * np.where(hosted > 0, hosted, own)

    @lazy
    def active(self) -> FloatArray:
        return self.column("active")

    @lazy
    def _kernel_out(self) -> tuple[FloatArray, BoolArray]:
        return self._run(slice(None))

    def _run(self, positions: slice) -> tuple[FloatArray, BoolArray]:
        idx = self._idx[positions]
        out = np.empty((len(KERNEL_ROWS), len(idx)))
        meets = np.empty(len(idx), dtype=bool)
        tpot, ttft = self.slo.tpot_s, self.slo.ttft_s
        hits = self.prefix_chunks[positions] * CHUNK_TOKENS if self._hashes else _NO_HITS
        _kernel(self._live, self._static, _LIVE_IN, _STATIC_IN, idx, self._rows[positions],
                self._n, self._g, hits, np.inf if tpot is None else SLO_HEADROOM * tpot,
                np.inf if ttft is None else SLO_HEADROOM * ttft, self._now, out, meets)
        return out, meets

    @lazy
    def prefix_chunks(self) -> FloatArray:
        """Per candidate, how many of the prompt's leading chunks it was recently sent (the
        prefix index, ``state/prefix.py``): what its cache probably holds of this prompt."""
        index = self._snap.prefix
        if not self._hashes or index is None:
            return np.zeros(len(self._idx))
        return index.matched_at(self._hashes, self._idx)

    b_max = _KernelRow("b_max")
    tpot_s = _KernelRow("tpot_s")
    ttft_s = _KernelRow("ttft_s")
    e2e_s = _KernelRow("e2e_s")
    slo_capacity = _KernelRow("slo_capacity")
    usd_per_mtok = _KernelRow("usd_per_mtok")
    load = _KernelRow("load")
    kv_headroom_tokens = _KernelRow("kv_headroom_tokens")
    can_take = _KernelRow("can_take")
    marginal_usd = _KernelRow("marginal_usd")
    over_share = _KernelRow("over_share")

    @property
    def meets_slo(self) -> BoolArray:
        return self._kernel_out[1]


def _warm_up() -> None:
    """Compile (or load from numba's cache) now, not on the first request."""
    live = np.zeros((len(LIVE_ROW), 1))
    static = np.ones((len(STATIC_ROW), 1))
    for matrix in (live, static):  # read-only, as a snapshot's: numba compiles per flavour
        matrix.setflags(write=False)
    one = np.zeros(1, dtype=np.intp)
    for hits in (np.zeros(0), np.zeros(1)):
        _kernel(live, static, _LIVE_IN, _STATIC_IN, one, one, 1.0, 1.0, hits, 1.0, np.inf, 0.0,
                np.empty((len(KERNEL_ROWS), 1)), np.empty(1, dtype=bool))
    _usable(live, _USABLE_IN, one, 0.0, np.empty(1, dtype=bool))


_warm_up()
