"""The compiled routing kernels against plain-Python references of their documented formulas.

``estimate.py``'s docstring is the specification; ``reference`` below re-derives every
estimate one endpoint at a time from it, and random fleets (every GPU type, random load,
learned corrections, unknown KV usage, health and breaker states) must agree with the
numba kernel to rounding. The same for the state ``LiveFleet`` keeps current as events
arrive (``active``, ``usable_from``, ``stale_at``), the pickers' top-k, the normalisations
and rendezvous affinity.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

import numpy as np
import pytest
from routing_fixtures import MODEL, SERVED, make_fleet, pipeline, request

from fleetgate.routing import Endpoint, RoutingRequest
from fleetgate.routing.estimate import DEFAULT_MAX_TOKENS, SLO_HEADROOM, Estimates, Slo
from fleetgate.routing.plugins.base import normalise_max_over, normalise_min_over
from fleetgate.routing.plugins.pickers import (
    MaxScore,
    PowerOfTwo,
    RoundRobin,
    WeightedRandom,
    top_k,
)
from fleetgate.routing.types import HEALTH_CODES
from fleetgate.state.live import LiveFleet
from fleetgate.state.prior import endpoint_prior

GPUS = ["mi300x", "mi325x", "mi355x", "h100", "h200", "b200", "cpu-test-box"]


def random_fleet(rng: random.Random, n: int) -> LiveFleet:
    infos, priors = [], []
    for i in range(n):
        gpu = rng.choice(GPUS)
        models = {MODEL: SERVED} if i == 0 or rng.random() < 0.8 else {"other": "other"}
        infos.append(Endpoint(f"{gpu}-{i}", f"{gpu}-pool", f"http://e{i}", "vllm", gpu,
                                  "amd", models, {}, rng.choice([0.0, 1.99, 3.6, 6.0])))
        priors.append(endpoint_prior(gpu, SERVED, max_model_len=rng.choice([None, 2048])))
    live = LiveFleet(infos, priors, breaker_threshold=2, breaker_cooldown_s=5.0)
    for i in range(n):
        roll = rng.random()
        if roll < 0.8:
            live.on_probe(i, 0.0, True, "200")
        elif roll < 0.9:
            live.on_refused(i, 0.5, "refused")
        if rng.random() < 0.7:
            live.on_scrape(i, rng.choice([0.0, 4.0]), rng.randint(0, 30),
                           rng.choice([None, rng.randint(0, 300)]),
                           rng.choice([None, rng.random()]), 1e6, None)
        for _ in range(rng.randint(0, 300)):
            live.on_dispatch(i, 1.0)
        if rng.random() < 0.5:
            sample = live.on_dispatch(i, 1.0, 0.1 * rng.random() + 0.01, rng.randint(1, 4000))
            live.on_first_token(i, 1.0, 0.3, sample)
            live.on_finish(i, 1.0 + rng.random(), 50, 2.0, 0.03 * rng.random() + 0.001,
                           sample)
        if rng.random() < 0.1:
            live.on_failure(i, 1.0)
            live.on_failure(i, 1.0)
        live.on_peers(i, rng.choice([0, 0, 7]), rng.choice([0.0, 0.0, 30.0]))
        live.slo_capacity.limit[i] = rng.choice([np.nan, 0.5, 3.0, 50.0])  # as if learned
        live.slo_capacity.knee[i] = rng.choice([0.0, 1.0])
    return live


def reference(live: LiveFleet, i: int, req: RoutingRequest, slo: Slo,
              now: float) -> dict[str, float]:
    """estimate.py's docstring, one endpoint at a time, in plain floats, from the raw state."""
    col = lambda name: float(live.column(name)[i])  # noqa: E731
    n, g = float(req.prompt_tokens_estimate), float(req.max_tokens or DEFAULT_MAX_TOKENS)
    ctx = n + g / 2
    active = max(col("in_flight") + col("peer_in_flight"),
                 col("running") + col("queued") if not math.isnan(col("running")) else -1.0)
    b_max = max(math.floor(min(col("max_batch"), col("kv_capacity_tokens") / (n + g))), 1.0)

    base, prefill, k = col("step_base_s"), col("prefill_s_per_token"), col("k_tpot")
    rate = col("prefill_tokens_per_s")
    slow = 1 / (1 - min((0.0 if math.isnan(rate) else rate) * prefill, 0.9))
    tpot = k * slow * (base + col("step_per_ctx_token_s") * ctx * min(active + 1, b_max))
    wait = math.ceil(max(0.0, active + 1 - b_max) / b_max) * tpot * g
    ttft = col("k_ttft") * (base + prefill * n * (1 + col("queued")) + wait) \
        + tpot * n * (1 + col("queued")) / 8192
    typical = col("prompt_tokens_mean") if col("prompt_tokens_mean") > 0 else n
    answer = col("output_tokens_mean") if col("output_tokens_mean") > 0 else DEFAULT_MAX_TOKENS
    per_seq = col("step_per_ctx_token_s") * (typical + answer / 2) + prefill * typical / answer
    if slo.tpot_s is None:
        b_slo = b_max
    else:
        short = col("output_tokens_p2") if col("output_tokens_p2") > 0 else g
        stall = prefill * typical / max(short - 1, 1)
        room = SLO_HEADROOM * slo.tpot_s / k - base
        fit = (room - stall if room - stall >= per_seq else room) / per_seq
        b_slo = min(max(math.floor(fit), 0.0), b_max)
        alone = k * (base + col("step_per_ctx_token_s") * ctx)
        if b_slo < 1 and alone <= SLO_HEADROOM * slo.tpot_s:
            b_slo = 1.0
    learned = col("slo_limit") > 0 and (slo.tpot_s is not None or slo.ttft_s is not None)
    if learned:  # the class's capacity: at a knee as it is, else the prior's up to 1.5x
        limit = min(max(math.floor(col("slo_limit")), 1.0), b_max)
        b_slo = limit if col("slo_knee") > 0 else min(max(limit, b_slo), 1.5 * b_slo)
    usd = col("usd_per_s") * 1e6 * k * (base + per_seq * b_slo) / b_slo if b_slo > 0 \
        else math.inf
    marginal = col("usd_per_s") * (
        k * g * slow * col("step_per_ctx_token_s") * ctx + col("k_ttft") * prefill * n
        + k * g * base / min(active + 1, b_slo)) if b_slo > 0 else math.inf
    recent = col("recent_prefill_tokens_per_s") * math.exp(min(col("prefill_at") - now, 0.0))
    share = (recent + n / 1.0) * prefill  # of the last second, decayed to the decision
    usage = col("kv_usage")
    if math.isnan(usage):
        usage = min(active * ctx / col("kv_capacity_tokens"), 1.0)
    within = active + 1 <= b_slo
    over_share = slo.tpot_s is not None and share > 0.7
    timely = (slo.tpot_s is None or tpot <= SLO_HEADROOM * slo.tpot_s) and (
        slo.ttft_s is None or ttft <= SLO_HEADROOM * slo.ttft_s)
    meets = within and timely and not over_share
    over = within and timely and over_share
    known = col("context_tokens_mean") > 0 and col("output_tokens_mean") > 0
    if not timely and slo.tpot_s is not None and known:  # admission: others at min(C, C_typ)
        others = min(col("context_tokens_mean") + col("output_tokens_mean") / 2, ctx)
        typical_tpot = k * slow * (base + col("step_per_ctx_token_s")
                                   * (ctx + others * (min(active + 1, b_max) - 1)))
        timely = typical_tpot <= SLO_HEADROOM * slo.tpot_s and (
            slo.ttft_s is None or ttft <= SLO_HEADROOM * slo.ttft_s)
    return {"active": active, "tpot_s": tpot, "ttft_s": ttft, "e2e_s": ttft + tpot * (g - 1),
            "slo_capacity": b_slo, "usd_per_mtok": usd, "marginal_usd": marginal,
            "can_take": float(timely and active + 1 <= (b_slo if learned else 1.5 * b_slo)),
            "load": active / max(b_slo, 1.0),
            "meets_slo": float(meets), "over_share": float(over),
            "kv_headroom_tokens": (1 - usage) * col(
                "kv_capacity_tokens"), "fits_context": float(col("max_model_len") >= n + g)}


@pytest.mark.parametrize("seed", range(12))
def test_kernel_matches_the_documented_formulas(seed: int) -> None:
    rng = random.Random(seed)
    live = random_fleet(rng, rng.choice([1, 5, 40]))
    now = rng.choice([1.0, 1.5, 20.0])  # the recent prefill rate decays to the decision
    snap = live.snapshot(now)
    idx = snap.by_model[(MODEL, "chat")]
    for slo in (Slo(), Slo(ttft_s=1.5), Slo(tpot_s=0.03), Slo(ttft_s=0.5, tpot_s=0.004),
                Slo(tpot_s=1.0)):
        req = RoutingRequest(model=MODEL, prompt_chars=rng.choice([0, 900, 20000]),
                             max_tokens=rng.choice([None, 1, 300, 6000]))
        got = Estimates(snap, idx, req, slo).as_dict()
        for k, i in enumerate(idx):
            want = reference(live, int(i), req, slo, now)
            for name, value in want.items():
                assert got[name][k] == pytest.approx(value, rel=1e-9), (name, int(i), slo)


def test_prefilter_matches_health_breakers_and_staleness() -> None:
    rng = random.Random(3)
    live = random_fleet(rng, 60)
    for now in (0.2, 1.0, 8.0, 20.0, 40.0):
        snap = live.snapshot(now)
        idx = np.arange(len(snap.endpoints))
        ok, count = Estimates(snap, idx, request(), Slo()).prefilter()
        health, contact = live.column("health"), live.column("last_contact")
        block = np.fmax(live.column("block_until"), live.column("peer_block_until"))
        want = ((health != HEALTH_CODES["not_ready"]) & (block <= now)
                & ((contact >= now - live.stale_after_s) | (health == HEALTH_CODES["pending"])))
        assert ok.tolist() == want.tolist() and count == int(want.sum())


def test_derived_rows_follow_every_event() -> None:
    rng = random.Random(11)
    live = random_fleet(rng, 8)
    events = ["dispatch", "first", "finish", "failure", "cancel", "refused", "probe_ok",
              "probe_bad", "scrape", "scrape_blank", "peers", "expire"]
    now = 1.0
    for _ in range(600):
        now += rng.random()
        i = rng.randrange(8)
        event = rng.choice(events)
        if event == "dispatch":
            live.on_dispatch(i, now)
        elif event == "first":
            live.on_first_token(i, now, 0.2, live.on_dispatch(i, now, 0.1, 100))
        elif event == "finish":
            live.on_finish(i, now, 10, 1.0, 0.02, live.on_dispatch(i, now, 0.1, 100))
        elif event == "failure":
            live.on_failure(i, now)
        elif event == "cancel":
            live.on_cancel(i)
        elif event == "refused":
            live.on_refused(i, now, "refused")
        elif event in ("probe_ok", "probe_bad"):
            live.on_probe(i, now, event == "probe_ok", "200")
        elif event == "scrape":
            live.on_scrape(i, now, rng.randint(0, 9), rng.randint(0, 9), rng.random(), None, 5.0)
        elif event == "scrape_blank":
            live.on_scrape(i, now, None, None, None, None, None)
        elif event == "peers":
            live.on_peers(i, rng.randint(0, 5), rng.choice([0.0, now + 3]))
        else:
            live.tick(now + 30)
        snap, col = live.snapshot(now), live.column
        running = np.nan_to_num(col("running"), nan=-1.0)
        active = np.fmax(col("in_flight") + col("peer_in_flight"),
                         np.where(running < 0, -1.0, running + col("queued")))
        assert snap.col("active").tolist() == active.tolist(), event
        health = col("health")
        usable_from = np.where(health == HEALTH_CODES["not_ready"], np.inf,
                               np.fmax(col("block_until"), col("peer_block_until")))
        stale_at = np.where(health == HEALTH_CODES["pending"], np.inf,
                            col("last_contact") + live.stale_after_s)
        assert snap.col("usable_from").tolist() == usable_from.tolist(), event
        assert snap.col("stale_at").tolist() == stale_at.tolist(), event


def test_top_k_is_argsort_with_ties_by_position() -> None:
    rng = np.random.default_rng(5)
    for _ in range(200):
        n = int(rng.integers(1, 40))
        values = rng.integers(0, 5, n).astype(float)  # many ties
        values[rng.random(n) < 0.2] = -np.inf
        k = int(rng.integers(1, 12))
        want = np.argsort(-values, kind="stable")[:k]
        assert top_k(values, k).tolist() == want.tolist()
        jitter = rng.random(n) * 1e-9
        assert top_k(values, k, jitter).tolist() == np.argsort(
            -(values + jitter), kind="stable")[:k].tolist()


@pytest.mark.parametrize(("values", "mask", "lowest", "highest"), [
    ([2.0, 4.0, 8.0], [1, 1, 1], [1.0, 0.5, 0.25], [0.25, 0.5, 1.0]),
    ([2.0, 4.0, 8.0], [0, 1, 1], [0.0, 1.0, 0.5], [0.0, 0.5, 1.0]),  # masked: 0, not the best
    ([0.0, 4.0, 0.0, 8.0], [1, 1, 1, 1], [1.0, 0.5, 1.0, 0.25],  # free ones win, the paid
     [0.0, 0.5, 0.0, 1.0]),                                     # keep their order below
    ([math.inf, 4.0, math.nan], [1, 1, 1], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]),
    ([math.inf, math.inf], [1, 1], [0.0, 0.0], [0.0, 0.0]),  # nobody can: all 0
    ([-1.0, 3.0], [1, 1], [0.0, 1.0], [0.0, 1.0]),  # negative: unusable
])
def test_normalisations(values: list[float], mask: list[int], lowest: list[float],
                        highest: list[float]) -> None:
    v, m = np.array(values), np.array(mask, dtype=bool)
    assert normalise_min_over(v, m).tolist() == pytest.approx(lowest)
    assert normalise_max_over(v, m).tolist() == pytest.approx(highest)


def test_pickers_never_pick_filtered_candidates() -> None:
    rank = np.array([-np.inf, 0.3, -np.inf, 0.9, -np.inf, 0.5, -np.inf])
    p2, rr = PowerOfTwo(seed=2), RoundRobin()
    seen_rr = set()
    for _ in range(50):
        order = p2.order(rank, 3).tolist()
        assert sorted(order) == [1, 3, 5]
        first = rr.order(rank, 2).tolist()
        assert set(first) <= {1, 3, 5} and len(set(first)) == 2
        seen_rr.add(first[0])
    assert seen_rr == {1, 3, 5}
    assert p2.order(np.array([-np.inf, 0.2, 0.1]), 2).tolist() == [1, 2]


def test_affinity_moves_only_the_sessions_of_an_unusable_endpoint() -> None:
    live = make_fleet()
    pipe = pipeline("affinity")
    users = [f"user-{u}" for u in range(60)]
    before = {u: pipe.route(request(user=u), live.snapshot(1)).chosen for u in users}
    assert len({ep.id for ep in before.values() if ep}) == 4  # sessions spread over all
    gone = live.index["h100-vllm-0"]
    live.on_refused(gone, 1.0, "refused")
    after = {u: pipe.route(request(user=u), live.snapshot(1)).chosen for u in users}
    for u in users:
        assert after[u] is not None and after[u].id != "h100-vllm-0"
        if before[u].id != "h100-vllm-0":  # type: ignore[union-attr]
            assert after[u] == before[u]  # nobody else moved


def test_select_filter_is_recomputed_for_a_new_fleet() -> None:
    pipe = pipeline("latency", filters=[{"name": "select", "params": {"vendors": ["nvidia"]}}])
    first = pipe.route(request(), make_fleet().snapshot(1))
    assert {c.endpoint.vendor for c in first.ranked} == {"nvidia"}
    relabelled = make_fleet([("x", "mi300x", "nvidia", "vllm", 1.0),
                             ("y", "h100", "amd", "vllm", 1.0)])
    second = pipe.route(request(), relabelled.snapshot(1))
    assert [c.endpoint.pool for c in second.ranked] == ["x"]


def test_b_max_is_exact_when_the_kv_cache_holds_a_whole_number_of_requests() -> None:
    prior = endpoint_prior("mi325x", SERVED)
    for whole in (49, 52505):  # n + g; 49 * (1/49) < 1 in floating point
        batches = range(1, 256)
        infos = [Endpoint(f"e{q}", "p", f"http://e{q}", "vllm", "mi325x", "amd",
                              {MODEL: SERVED}, {}, 1.0) for q in batches]
        live = LiveFleet(infos, [replace(prior, kv_capacity_tokens=float(whole * q))
                                 for q in batches])
        snap = live.snapshot(0.0)
        req = RoutingRequest(model=MODEL, prompt_chars=0, max_tokens=whole - 8)
        idx = snap.by_model[(MODEL, "chat")]
        assert Estimates(snap, idx, req, Slo()).b_max.tolist() == list(batches)


def test_pickers_asked_for_one_or_none() -> None:
    rank = np.array([0.2, 0.9, 0.5])
    assert top_k(rank, 0).tolist() == [] and top_k(rank, -1).tolist() == []
    for picker in (WeightedRandom(seed=1), PowerOfTwo(seed=1), RoundRobin(), MaxScore(seed=1)):
        for _ in range(50):
            assert len(picker.order(rank, 1)) == 1
    d = pipeline("least_loaded", picker="weighted_random", max_attempts=1).route(
        request(), make_fleet().snapshot(1))
    assert len(d.order) == 1


def test_a_snapshot_cannot_be_changed() -> None:
    snap = make_fleet().snapshot(1.0)
    with pytest.raises(ValueError):
        snap.live[0, 0] = 1.0
    with pytest.raises(ValueError):
        snap.col("queued")[0] = 1.0


def test_compiled_falls_back_to_memory_when_numba_cannot_cache(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import numba

    from fleetgate.routing import compiled as module

    real = numba.njit

    def njit(**options: object):  # type: ignore[no-untyped-def]
        if options.get("cache"):
            raise RuntimeError("cannot cache function 'f': no locator available for file 'x'")
        return real(**options)

    monkeypatch.setattr(module.numba, "njit", njit)

    def double(x: float) -> float:
        return x * 2

    assert module.compiled(double)(2.5) == 5.0


def test_a_long_prompt_among_short_ones_is_steered_away_but_admitted() -> None:
    """Steering counts every running request at this request's context; admission at the
    workload's (``context_tokens_mean``) where that is smaller: a 2,800-token prompt beside
    60 running 700-token ones is not predicted within a 30 ms TPOT there, but their step
    reads 700-token contexts, and it fits."""
    live = make_fleet([("mi355x-vllm", "mi355x", "amd", "vllm", 2.4)])
    for _ in range(20):  # the workload: 700-token prompts, 250-token answers
        sample = live.on_dispatch(0, 1.0, None, 700)
        live.on_finish(0, 2.0, 250, 1.0, 0.02, sample)
    for _ in range(60):
        live.on_dispatch(0, 2.0, None, 700)
    snap = live.snapshot(100.0)
    idx = snap.by_model[(MODEL, "chat")]

    def est(tokens: int, tpot_s: float) -> Estimates:
        req = RoutingRequest(model=MODEL, prompt_chars=4 * tokens, max_tokens=250)
        return Estimates(snap, idx, req, Slo(tpot_s=tpot_s))

    short, long = est(700, 0.03), est(2800, 0.03)
    assert short["meets_slo"][0] and short["can_take"][0] == 1
    assert long["tpot_s"][0] > SLO_HEADROOM * 0.03 and not long["meets_slo"][0]
    assert long["can_take"][0] == 1  # counted at its own context, it was refused (a 429)
    # where even the workload's contexts make too slow a step, it is refused
    assert short["tpot_s"][0] > SLO_HEADROOM * 0.02 and est(2800, 0.02)["can_take"][0] == 0


def test_one_candidates_estimate_matches_the_fleets() -> None:
    rng = random.Random(5)
    live = random_fleet(rng, 30)
    snap = live.snapshot(1.0)
    d = pipeline("round_robin", slo={"ttft_ms": 900, "tpot_ms": 30}).route(request(), snap)
    assert "_kernel_out" not in d.estimates.__dict__  # round-robin needed no estimate
    single = {(name, k): d.estimate(name, k) for name in ("ttft_s", "tpot_s", "usd_per_mtok")
              for k in d.order.tolist()}
    assert "_kernel_out" not in d.estimates.__dict__  # one candidate each, not the fleet
    full = Estimates(snap, d.idx, request(), Slo(0.9, 0.03))
    for (name, k), value in single.items():
        want = float(full[name][k])
        assert value == (want if math.isfinite(want) else None)


def test_rejected_count_matches_the_named_rejections() -> None:
    rng = random.Random(9)
    for _ in range(20):
        live = random_fleet(rng, 25)
        pipe = pipeline("latency", filters=[{"name": "max_queue", "params": {"max": 12}}])
        d = pipe.route(request(max_tokens=rng.choice([10, 5000])), live.snapshot(20.0))
        assert d.rejected_count == len(d.rejected)

