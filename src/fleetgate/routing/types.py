"""The values the router works on: a request's routing facts, a fleet snapshot, a decision.

A ``Snapshot`` is columnar: per-endpoint numbers live in numpy arrays indexed like
``Snapshot.endpoints``, so scoring 1,000 endpoints is a handful of vector operations rather
than 1,000 Python loops (decision time is a product requirement: BENCHMARKS.md). The arrays
are copies: a snapshot never changes after it is taken. A ``Decision`` keeps every
candidate's per-scorer scores, so any choice can be explained later (admin API, traces).

May touch: numpy, dataclasses. Must not touch: HTTP, asyncio, clocks, the gateway.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

from fleetgate.catalog.engines import ENGINES, EngineSpec
from fleetgate.catalog.pricing import TokenPrice, charge_usd, usd_per_second

Health = Literal["pending", "ready", "not_ready"]
HEALTH_CODES: dict[Health, int] = {"pending": 0, "ready": 1, "not_ready": 2}
FloatArray = npt.NDArray[np.float64]
# A prompt is hashed in chunks of CHUNK_CHARS characters (~CHUNK_TOKENS tokens at 4 a token)
# for the prefix index and the prefix_cache scorer (plugins/prefix_cache.py)
CHUNK_TOKENS = 64
CHUNK_CHARS = CHUNK_TOKENS * 4
IntArray = npt.NDArray[np.intp]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class RoutingRequest:
    """What routing needs to know about a request; the body itself is never parsed further."""

    model: str
    api: str = "chat"  # catalog.engines.API_NAMES: which endpoints can serve it
    stream: bool = False
    max_tokens: int | None = None
    prompt_chars: int = 0
    headers: Mapping[str, str] = field(default_factory=dict)
    user: str | None = None
    tenant: str | None = None
    policy: str | None = None  # asked for by name (x-fleetgate-policy)
    # chained hashes of the prompt's fixed-size chunks (plugins/prefix_cache.py), for the
    # prefix_cache scorer and the prefix index; () when the prompt is shorter than one chunk
    prefix_hashes: tuple[int, ...] = ()

    @property
    def prompt_tokens_estimate(self) -> int:
        """~4 characters a token plus chat-template overhead (the engines count exactly)."""
        return self.prompt_chars // 4 + 8

    @property
    def session_key(self) -> str | None:
        return self.headers.get("x-session-id") or self.headers.get("x-fleetgate-session") \
            or self.user


@dataclass(frozen=True, slots=True)
class HostedTerms:
    """What a hosted API (a pool priced per token) promises: its price, its cap on requests
    at once, and the TTFT and TPOT its answers are expected to take."""

    price: TokenPrice
    max_concurrency: int
    ttft_s: float
    tpot_s: float


@dataclass(frozen=True, slots=True)
class Adapter:
    """A LoRA adapter an endpoint serves or may load (its pool's ``adapters``): routed as a
    model of its own, ``name``, over the public model ``base``; ``path`` is where the engine
    loads it from (None: it cannot be loaded at run time); ``preload``: the engine starts
    with it."""

    name: str
    base: str
    path: str | None = None
    preload: bool = True


@dataclass(frozen=True, slots=True)
class AdapterView:
    """Which endpoint holds which LoRA adapter, at one instant (``state/adapters.py`` keeps
    it; immutable: a change builds a new view). Arrays are indexed like the snapshot's
    endpoints. ``loaded``: adapter -> endpoints that have it loaded or are loading it (a
    load under way counts: requests for it wait for that load, never start another);
    ``loadable``: adapter -> endpoints whose pool may load it at run time (it has a path);
    ``count``: adapters each endpoint holds (loading ones included); ``limit``: the most it
    may hold (its pool's ``max_adapters``)."""

    loaded: Mapping[str, BoolArray]
    loadable: Mapping[str, BoolArray]
    count: IntArray
    limit: IntArray

    def holds(self, adapter: str, i: int) -> bool:
        mask = self.loaded.get(adapter)
        return bool(mask is not None and mask[i])


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One engine replica, as the config (or a worker's registration) describes it: who it
    is, not how it is doing. Live state refers to it by position; ``id`` is ``<pool>-<n>``.
    """

    id: str
    pool: str
    url: str  # the HTTP base URL once known (emulated endpoints get theirs at start)
    engine: str  # a catalog.engines key
    accelerator: str
    vendor: str
    models: Mapping[str, str]  # public -> served
    labels: Mapping[str, str] = field(default_factory=dict)
    price_per_gpu_hour: float = 0.0
    gpus_per_replica: int = 1
    source: str = ""  # as configured: http://... or emulated://ENGINE/GPU?...
    runtime: str = ""
    max_model_len: int | None = None
    apis: tuple[str, ...] = ()  # what it serves (catalog.engines.API_NAMES); () = the engine's
    hosted: HostedTerms | None = None  # a hosted API priced per token (no replica to pay)
    api_key: str | None = field(default=None, repr=False)  # the pool's upstream key
    # LoRA adapters (each also in ``models``: public name -> the name the engine serves it
    # under), the most it holds at once, and whether the gateway may load them at run time
    adapters: Mapping[str, Adapter] = field(default_factory=dict)
    max_adapters: int = 0
    load_adapters: bool = False

    @property
    def auth_headers(self) -> dict[str, str]:
        """What every request to the engine carries to be let in (its pool's ``api_key``)."""
        return {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    @property
    def spec(self) -> EngineSpec:
        return ENGINES[self.engine]

    @property
    def served_apis(self) -> tuple[str, ...]:
        return self.apis or ENGINES[self.engine].apis

    @property
    def price_per_replica_hour(self) -> float:
        return self.price_per_gpu_hour * self.gpus_per_replica

    @property
    def usd_per_s(self) -> float:
        return usd_per_second(self.price_per_gpu_hour, self.gpus_per_replica)

    def charge_usd(self, e2e_s: float, concurrency: float, input_tokens: float = 0.0,
                   output_tokens: float = 0.0) -> float:
        """What one attempt here is charged (``catalog.pricing``): its share of the replica's
        time, or, on a hosted API, its tokens."""
        if self.hosted is not None:
            return self.hosted.price.charge_usd(input_tokens, output_tokens)
        return charge_usd(self.usd_per_s, e2e_s, concurrency)

    @property
    def is_emulated(self) -> bool:
        return self.source.startswith("emulated://")


class PrefixLookup(Protocol):
    """Which endpoints were recently sent which prompt prefixes (``state/prefix.py``)."""

    def matched(self, hashes: Sequence[int], count: int) -> FloatArray:
        """Per endpoint (``count`` of them, in snapshot order): how many leading ``hashes``
        it holds."""
        ...

    def matched_at(self, hashes: Sequence[int], idx: IntArray) -> FloatArray:
        """``matched`` for the endpoints ``idx`` only, aligned with them."""
        ...

    def holders(self, hashes: Sequence[int], limit: int) -> list[int]:
        """Up to ``limit`` endpoints holding the most leading ``hashes``, deepest first."""
        ...


# The live rows a decision reads (and a snapshot copies), then the ones it does not.
ROUTED_COLUMNS = ("active", "queued", "kv_usage", "k_tpot", "k_ttft", "prefill_tokens_per_s",
                  "recent_prefill_tokens_per_s", "prefill_at", "slo_limit", "slo_knee",
                  "prompt_tokens_mean", "context_tokens_mean", "output_tokens_mean",
                  "output_tokens_p2", "health", "usable_from", "stale_at")
LIVE_COLUMNS = (
    *ROUTED_COLUMNS, "in_flight", "running", "ttft_s", "tpot_s", "tokens_per_s", "block_until",
    "last_contact", "error_rate", "peer_in_flight", "peer_block_until", "requests_per_s",
    "peer_requests_per_s")
STATIC_COLUMNS = ("step_base_s", "step_per_ctx_token_s", "prefill_s_per_token",
                  "kv_capacity_tokens", "max_batch", "max_model_len", "usd_per_s",
                  "per_token", "usd_per_input_token", "usd_per_output_token", "hosted_ttft_s")
LIVE_ROW = {name: i for i, name in enumerate(LIVE_COLUMNS)}
STATIC_ROW = {name: i for i, name in enumerate(STATIC_COLUMNS)}


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The fleet at one instant, as the router reads it. Columns are indexed like ``endpoints``.

    ``live`` (a copy, one row per ROUTED_COLUMNS name; NaN = unknown): ``active`` (requests
    on the endpoint: max(this gateway's in-flight + the other replicas', the engine's running
    + queued)), ``queued`` (engine waiting queue from the last scrape plus dispatches since),
    ``kv_usage`` (0..1), ``k_tpot``/``k_ttft`` (learned corrections of the prior),
    ``prefill_tokens_per_s`` (prompt tokens dispatched to it per second, recently: over
    ~10 s), ``recent_prefill_tokens_per_s`` (the same over ~1 s) and ``prefill_at`` (when
    both were last decayed),
    ``slo_limit`` (how many requests it runs within the SLO, learned by its class:
    ``state/slo_capacity.py``; NaN: none yet), ``slo_knee`` (1: that capacity is where
    misses were seen to rise, 0: only the loads seen so far),
    ``prompt_tokens_mean`` / ``output_tokens_mean`` (the workload's: EWMAs over every request
    the gateway sent and saw finish, one value for the fleet; NaN: none yet; the prompt's
    without what the endpoint's cache held, the prefill work), ``context_tokens_mean`` (the
    same over whole prompts, cached prefix included: what a running request's KV reads
    count),
    ``output_tokens_p2`` (the 2nd percentile of answers, likewise), ``health``
    (HEALTH_CODES), ``usable_from`` (when the breakers, ours and the peers', let requests
    through again; +inf while not ready) and ``stale_at`` (when the state goes stale; +inf
    while pending). ``LiveFleet`` keeps the derived ones current as events arrive, so a
    decision never recomputes them over the fleet, and copies only these rows (the copy is
    a fixed cost of every decision). The other live columns (in-flight, running, measured
    EWMAs, breaker times, peers) are read from ``LiveFleet.column``. ``static`` (read-only,
    one row per STATIC_COLUMNS name): the performance prior and the replica's $/s; for a
    hosted API priced per token, ``per_token`` 1, its prices per token and its expected
    TTFT (``hosted_ttft_s``; its prior: ``state/prior.py`` ``hosted_prior``), 0 elsewhere.
    ``prefix``: a reference to the live prefix index, not a copy (copying it per decision
    would cost more than the decision); only the ``prefix_cache`` scorer reads it, within
    the synchronous decision, so the decision still sees one consistent state.
    """

    endpoints: tuple[Endpoint, ...]
    by_model: Mapping[tuple[str, str], IntArray]  # (model, api) -> endpoints serving it
    live: FloatArray
    static: FloatArray
    taken_at: float = 0.0
    prefix: PrefixLookup | None = None  # the live prefix index, read only (see the class doc)
    adapters: AdapterView | None = None  # who holds which LoRA adapter (None: no adapters)
    # ``live`` is the fleet's own rows (read-only), not a copy: in a fleet of thousands the
    # copy would cost more than the decision; the estimates copy their candidates' rows
    # (``routing/estimate.py``), so a decision still keeps what it was made on
    shared: bool = False

    def col(self, name: str) -> Any:
        row = LIVE_ROW.get(name)
        if row is None:
            return self.static[STATIC_ROW[name]]
        if row >= len(self.live):
            raise KeyError(f"{name!r} is not in a snapshot (ROUTED_COLUMNS); "
                           "read LiveFleet.column")
        return self.live[row]


@dataclass(frozen=True, slots=True)
class Candidate:
    endpoint: Endpoint
    score: float
    scores: Mapping[str, float] = field(default_factory=dict)


PREFILTER = "prefilter"  # the builtin stage; its reasons are read from the estimates


@dataclass(frozen=True, slots=True)
class Decision:
    """The router's answer: candidate endpoints best-first (the tail is the retry order).

    Candidates are ``endpoints[idx[k]]``; ``order`` lists k best-first; ``total``, every
    array in ``scores`` (scorer name -> score in [0,1]) and in ``estimates`` (ttft_s,
    tpot_s, usd_per_mtok, ...) are aligned with ``idx``. ``stages`` keeps, per filtering
    stage, the mask of candidates it kept. Nothing is materialised per candidate until
    asked (``rejected``, ``ranked``, ``explain``): a decision over 1,000 endpoints stays cheap.
    """

    policy: str
    model: str
    reason: str
    endpoints: tuple[Endpoint, ...] = ()
    idx: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.intp))
    order: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.intp))
    total: FloatArray | None = None
    scores: Mapping[str, FloatArray] = field(default_factory=dict)
    estimates: Any = None  # routing.estimate.Estimates (lazy): est["ttft_s"] etc.
    stages: tuple[tuple[str, BoolArray], ...] = ()  # (PREFILTER or "filter <name>", kept)
    alive: BoolArray | None = None  # candidates that passed every filter
    over_capacity: bool = False  # the policy has an SLO and no candidate can meet it now
    # The request fits the context of no endpoint serving the model, healthy or not (a client
    # error, not a lack of capacity): the largest context there is. None: it fits one.
    context_limit: int | None = None
    # The model is a LoRA adapter (routing/adapters.py): its name, and whether the ranked
    # endpoints have yet to load it (none had it loaded)
    adapter: str | None = None
    load_adapter: bool = False

    @property
    def rejected_count(self) -> int:
        """How many candidates a stage filtered out (without naming them)."""
        return 0 if self.alive is None else len(self.idx) - int(np.count_nonzero(self.alive))

    @property
    def rejected(self) -> dict[str, str]:
        """Endpoint id -> why it was filtered out (the first stage that dropped it)."""
        out: dict[str, str] = {}
        kept = np.ones(len(self.idx), dtype=bool)
        for why, keep in self.stages:
            for k in np.flatnonzero(kept & ~keep):
                i = int(self.idx[k])
                out[self.endpoints[i].id] = (self.estimates.unusable_reason(int(k))
                                             if why == PREFILTER and self.estimates else why)
            kept &= keep
        return out

    @property
    def ranked(self) -> tuple[Candidate, ...]:
        """Every eligible candidate: the picker's order first, then the rest by score."""
        return tuple(self.candidate(int(k)) for k in self.full_order())

    def full_order(self) -> list[int]:
        head = [int(k) for k in self.order]
        if self.total is None or self.alive is None:
            return head
        rest = [int(k) for k in np.argsort(-self.total, kind="stable")
                if self.alive[k] and int(k) not in head]
        return head + rest

    def ranked_endpoints(self, limit: int) -> list[Endpoint]:
        return [self.endpoints[self.idx[k]] for k in self.order[:limit]]

    def attempts(self, limit: int) -> list[tuple[int, Endpoint]]:
        """The first ``limit`` candidates to try: (candidate position, endpoint)."""
        return [(int(k), self.endpoints[self.idx[k]]) for k in self.order[:limit]]

    @property
    def chosen(self) -> Endpoint | None:
        return self.endpoints[self.idx[self.order[0]]] if len(self.order) else None

    def candidate(self, k: int) -> Candidate:
        total = float(self.total[k]) if self.total is not None else 0.0
        return Candidate(self.endpoints[self.idx[k]], total,
                         {name: float(v[k]) for name, v in self.scores.items()})

    def slo_limits(self, position: int) -> tuple[float, float]:
        """(TTFT, TPOT) limits the attempt at ``position`` is judged by when it ends: the
        policy's SLO if that endpoint was predicted to meet it, else (inf, inf): not judged."""
        est = self.estimates
        if est is None or not est.at("meets_slo", position):
            return math.inf, math.inf
        return (math.inf if est.slo.ttft_s is None else est.slo.ttft_s,
                math.inf if est.slo.tpot_s is None else est.slo.tpot_s)

    def estimate(self, name: str, position: int | None = None) -> float | None:
        """An estimate for the chosen candidate (or the one at ``position``); None if unknown."""
        if self.estimates is None or not len(self.order):
            return None
        k = int(self.order[0]) if position is None else position
        value = self.estimates.at(name, k)
        return None if math.isnan(value) or math.isinf(value) else value

    def explain(self, limit: int | None = None) -> dict[str, Any]:
        """Every candidate with every score and estimate, best first (for /admin/decisions)."""
        rows = []
        estimates = self.estimates.as_dict() if self.estimates is not None else {}
        for rank, k in enumerate(self.full_order()[:limit]):
            c = self.candidate(k)
            rows.append({
                "rank": rank, "endpoint": c.endpoint.id, "pool": c.endpoint.pool,
                "accelerator": c.endpoint.accelerator, "score": _num(c.score),
                "scores": {name: _num(v) for name, v in c.scores.items()},
                "estimates": {name: _num(float(v[k])) for name, v in estimates.items()},
            })
        chosen = self.chosen
        out: dict[str, Any] = {
            "policy": self.policy, "model": self.model, "reason": self.reason,
            "chosen": chosen.id if chosen else None, "candidates": rows,
            "rejected": dict(self.rejected)}
        if self.adapter is not None:  # a LoRA adapter: whether the chosen one loads it first
            out["adapter"] = {"name": self.adapter, "load": self.load_adapter}
        return out


def finite_or_none(value: float) -> float | None:
    """A number for JSON: NaN and infinities (unknown, unreachable) become null."""
    return None if math.isnan(value) or math.isinf(value) else round(value, 6)


_num = finite_or_none
