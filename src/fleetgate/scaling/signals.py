"""What the scaler sees of a fleet: each pool's replicas (as slots of the live fleet), its
load and each replica's SLO capacity, read from ``LiveFleet`` the same way in ``simulate``
and ``serve``. Load and capacity are rates, in requests per second.

A pool's replicas are *slots*: endpoint indices of the live fleet. An autoscaled pool whose
replicas fleetgate starts itself (the simulator's, and ``emulated://`` ones in ``serve``)
has ``max_replicas`` slots, each ``off``, ``starting`` (billed, not routed to until its cold
start is over), ``ready`` or ``draining`` (no new requests; billed until its last request
ends). The replicas of any other pool come and go outside fleetgate (Kubernetes, ``fleetgate
worker``): a slot is ready while its health is, and the scaler only publishes what it wants.

Load: the requests per second every gateway replica sent the pool's endpoints over the
last ~10 s (``LiveFleet.request_rates``, and the peers' through ``state/sync.py``). Not the
requests in flight, as before: a router that packs a replica makes each request stay longer
there, so the same arrivals were more requests in flight, and the scaler bought replicas for
the packing (the cost router's bill was 1.03-1.44x least_loaded's on the matrix's
autoscaled cells; BENCHMARKS.md, issue 23). A rate is the same whatever the router does.

Capacity: the requests per second one replica takes within the SLO, for a request of the
workload's typical shape (the prompt and answer means the gateway has seen, less what the
prefix caches hold), under the SLO the scaler is given; the median over the pool's slots.
That is the largest rate whose requests in flight (each staying as long as a request does at
that load: Little's law) fit the router's B_slo from the catalog prior as corrected by the
class's learned speed (``k_tpot``, ``k_ttft``: learned from every finished request's
latency), and, under a TPOT SLO, at most what the router's own prefill share bound lets in
at a steady rate (``STEADY_PREFILL_SHARE`` of a replica's time on prompts: the router bounds
the share of the last second at ``MAX_SLO_PREFILL_SHARE``, which a steady stream of prompts
cannot fill, as arrivals come in clumps), ``_capacity``. The estimates are read for an
idle replica (``IDLE_ROWS``): the load a rate makes is what the Little's-law loop models.
Read at the tick's load, a packed replica's queue entered its TTFT and its capacity fell
with the packing: on a random fleet (``bench/scenario_fuzz.py --autoscale``, case 15) the
B200 pool's swung between 6.6 and 40 requests/s from tick to tick under the cost router,
the scaler bought the dearest pool to its ceiling, the router left it idle, and cost's bill
was 1.12x least_loaded's; read idle, 0.62x (BENCHMARKS.md, issue 23). The steady share's
0.5 was chosen by measurement on the matrix's autoscaled cells (BENCHMARKS.md, issue 23: the
bill 15-19% lower than at 0.4, the SLO held; 0.6 and 0.7 no lower). Measured on the
scenario fleets before: with B_slo alone the scaler bought half the replicas the router
fills on 1,500-token prompts (amd-cheap at 60% load: 93.8% within the SLO; 99.1% with the
share bound); with the learned knee of ``state/slo_capacity.py`` in place of the prior's
B_slo, the H100 class's capacity swung
between 7 and 60 from one tick to the next under the cost router's packing and the bill
followed it (nvidia-cheap at 60%, 900 s: $10.46 against $6.26 with the prior, both 99.0%
within the SLO).

A hosted API priced per token (``price_per_mtok``) is neither scaled nor paid-for capacity:
its PoolState has no replicas, no capacity and no price, so it covers none of the demand;
the requests on it still count in its group's demand, so a burst it absorbs buys the
self-hosted replicas that take the load back once they are up.

May touch: state (LiveFleet), routing's estimates, config. Must not touch: I/O, clocks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from fleetgate.config.schema import AutoscaleConfig, FleetConfig
from fleetgate.routing import Endpoint, RoutingRequest
from fleetgate.routing.estimate import (
    DEFAULT_MAX_TOKENS,
    Estimates,
    Slo,
)
from fleetgate.routing.types import HEALTH_CODES, LIVE_ROW, FloatArray, IntArray, Snapshot
from fleetgate.scaling.scaler import PoolState
from fleetgate.state.live import LiveFleet
from fleetgate.state.slo_capacity import OUTCOME_TAU_S

OFF, STARTING, READY, DRAINING = 0, 1, 2, 3
DEFAULT_PROMPT_TOKENS = 1000  # a request shape before the gateway has seen any
STEADY_PREFILL_SHARE = 0.5  # of a replica's time on prompts, at a steady rate
MAX_STEADY_SHARE = 0.95  # without a TPOT SLO: prompts may take nearly all of it
_READY = HEALTH_CODES["ready"]
# The load rows, read as an idle replica's: ``running`` models the load of each rate itself.
IDLE_ROWS = ("active", "queued", "kv_usage", "prefill_tokens_per_s",
             "recent_prefill_tokens_per_s")


@dataclass
class ScaledPool:
    """One pool's slots and their states (``managed``: fleetgate starts and stops them)."""

    name: str
    models: frozenset[str]
    usd_per_replica_hour: float
    autoscale: AutoscaleConfig | None
    slots: tuple[int, ...]
    managed: bool
    state: dict[int, int] = field(default_factory=dict)
    per_token: bool = False  # a hosted API: its load is demand, never supply

    def in_state(self, state: int) -> list[int]:
        return [i for i in self.slots if self.state.get(i) == state]


def scaled_pools(config: FleetConfig, endpoints: Sequence[Endpoint], managed: set[str],
                 initial: dict[str, int] | None = None) -> list[ScaledPool]:
    """The config's pools over ``endpoints`` (the fleet's, in order). Pools named in
    ``managed`` start with their first ``initial[name]`` slots ready (default: the
    configured endpoints, within the pool's floor and ceiling), the rest off."""
    out = []
    for pool in config.pools:
        slots = tuple(i for i, ep in enumerate(endpoints) if ep.pool == pool.name)
        scaled = ScaledPool(pool.name, frozenset(pool.models), pool.price_per_gpu_hour
                            * pool.gpus_per_replica, pool.autoscale, slots,
                            pool.name in managed and pool.autoscale is not None,
                            per_token=pool.per_token)
        if scaled.managed:
            spec = pool.autoscale
            assert spec is not None
            first = (initial or {}).get(pool.name, min(max(len(pool.endpoints),
                                                           spec.min_replicas),
                                                       spec.max_replicas))
            scaled.state = {i: READY if k < first else OFF for k, i in enumerate(slots)}
        out.append(scaled)
    return out


def observe(live: LiveFleet, pools: Sequence[ScaledPool], slo: Slo,
            now: float) -> list[PoolState]:
    """Each pool as the scaler sees it now (module docstring)."""
    snap = live.snapshot(now)
    rates = live.request_rates(now) + live.column("peer_requests_per_s")
    judged, missed = (rate * OUTCOME_TAU_S for rate in live.slo_capacity.outcomes(now))
    active, health = live.column("active"), live.column("health")
    request = _typical_request(live, pools)
    out = []
    for pool in pools:
        idx = np.array(pool.slots, dtype=np.intp)
        load = float(np.sum(rates[idx]))
        held = (float(np.sum(judged[idx])), float(np.sum(missed[idx])))
        running = float(np.nansum(active[idx]))
        if pool.per_token:
            out.append(PoolState(pool.name, pool.models, 0.0, 0.0, load, 0, outcomes=held,
                                 active=running))
            continue
        capacity = _capacity(live, snap, idx, request, slo) if len(idx) else 0.0
        if pool.managed:
            ready, starting, draining = (len(pool.in_state(s))
                                         for s in (READY, STARTING, DRAINING))
        else:
            ready, starting, draining = int(np.count_nonzero(health[idx] == _READY)), 0, 0
        out.append(PoolState(pool.name, pool.models, pool.usd_per_replica_hour,
                             capacity if math.isfinite(capacity) else 0.0, load, ready,
                             starting, draining, pool.autoscale, held, running))
    return out


def changes(pool: ScaledPool, desired: int, live: LiveFleet) -> tuple[list[int], list[int]]:
    """The slots to start and the slots to drain to bring ``pool`` to ``desired``: off ones
    started in order; a starting one drained first (it serves nothing yet), then the ready
    one with the fewest requests (it drains soonest)."""
    starting, ready = pool.in_state(STARTING), pool.in_state(READY)
    have = len(starting) + len(ready)
    if desired > have:
        return pool.in_state(OFF)[:desired - have], []
    if desired < have:
        active = live.column("active")
        order = starting[::-1] + sorted(ready, key=lambda i: (active[i], -i))
        return [], order[:have - desired]
    return [], []


def _capacity(live: LiveFleet, snap: Snapshot, idx: IntArray, request: RoutingRequest,
              slo: Slo) -> float:
    """One replica's SLO capacity in requests per second (module docstring), the median over
    the pool's slots: the largest rate ``r`` whose requests in flight ``c`` fit the router's
    B_slo, under a TPOT SLO at most ``STEADY_PREFILL_SHARE / (prefill time of a typical
    prompt)``. ``c = r x stay(c)`` (Little's law), a request staying ``TTFT + (g - 1) x
    TPOT(c)``: the prior's step at that batch, the learned correction, decode slowed by the
    prefill share that rate makes (``r x`` the prefill time). Self-consistent: a rate that
    B_slo caps is not charged the whole share's slowdown (a fixed share of 0.6 made the
    capacity smaller than at 0.5, BENCHMARKS.md, issue 23)."""
    rows = snap.live.copy()  # the prior's B_slo (corrected by k_tpot, k_ttft), not the knee
    rows[LIVE_ROW["slo_limit"]] = np.nan
    for name in IDLE_ROWS:  # a replica's capacity, not what is left of it at this instant
        rows[LIVE_ROW[name]] = 0.0
    est = Estimates(replace(snap, live=rows), idx, request, slo)
    caps = np.asarray(est["slo_capacity"], dtype=float)
    n, g = float(request.prompt_tokens_estimate), float(request.max_tokens or 1)
    col = est.column
    b_max = np.maximum(np.floor(np.minimum(col("max_batch"), col("kv_capacity_tokens") / (n + g))),
                       1.0)
    ttft = np.asarray(est["ttft_s"], dtype=float)
    prefill = np.maximum(col("prefill_s_per_token") * n, 1e-12)  # one typical prompt's
    decode_base = (g - 1) * col("k_tpot") * col("step_base_s")
    decode_ctx = (g - 1) * col("k_tpot") * col("step_per_ctx_token_s") * (n + g / 2)

    def running(rate: FloatArray) -> FloatArray:
        """Requests in flight at ``rate`` a second (closed form below ``b_max``)."""
        slow = 1.0 / (1.0 - rate * prefill)
        below = rate * (ttft + slow * decode_base) / np.maximum(
            1.0 - rate * slow * decode_ctx, 1e-12)
        full = rate * (ttft + slow * (decode_base + decode_ctx * b_max))
        return np.asarray(np.where((below > 0) & (below <= b_max), below, full))

    share = STEADY_PREFILL_SHARE if slo.tpot_s is not None else MAX_STEADY_SHARE
    top = share / prefill
    lo, hi = np.zeros_like(top), top
    for _ in range(40):  # bisection: c grows with the rate
        mid = (lo + hi) / 2
        fits = running(mid) <= caps
        lo, hi = np.where(fits, mid, lo), np.where(fits, hi, mid)
    return float(np.median(np.where(running(top) <= caps, top, lo)))


def _typical_request(live: LiveFleet, pools: Sequence[ScaledPool]) -> RoutingRequest:
    prompt = float(live.column("prompt_tokens_mean")[0]) if len(live.endpoints) else math.nan
    answer = float(live.column("output_tokens_mean")[0]) if len(live.endpoints) else math.nan
    prompt = prompt if prompt > 0 else DEFAULT_PROMPT_TOKENS
    answer = answer if answer > 0 else DEFAULT_MAX_TOKENS
    model = next(iter(pools[0].models)) if pools else ""
    return RoutingRequest(model=model, max_tokens=max(1, round(answer)),
                          prompt_chars=4 * max(0, round(prompt) - 8))


def scaling_slo(config: FleetConfig) -> Slo:
    """The SLO a replica's capacity is judged under: the default policy's, else the first
    policy's that has one (every policy of one fleet is scaled alike, so ``simulate``
    compares policies on the same scaler)."""
    for policy in (config.policies[config.default_policy], *config.policies.values()):
        if policy.slo.ttft_ms or policy.slo.tpot_ms:
            return Slo(ttft_s=policy.slo.ttft_ms / 1000 if policy.slo.ttft_ms else None,
                       tpot_s=policy.slo.tpot_ms / 1000 if policy.slo.tpot_ms else None)
    return Slo()
