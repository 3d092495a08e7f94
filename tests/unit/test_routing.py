"""Table-driven tests of the routing pipeline: strategies, scorers, filters, pickers."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from routing_fixtures import FLEET, MODEL, chosen_pool, make_fleet, pipeline, request, serve

from fleetgate.config import parse_config
from fleetgate.routing import PolicyError, build_router


def test_cost_picks_cheapest_per_token_at_light_load() -> None:
    live = make_fleet()
    d = pipeline("cost", slo={"ttft_ms": 2000, "tpot_ms": 50}).route(request(), live.snapshot(1))
    # cold: every endpoint is priced at the SLO batch its prior sustains, not at its
    # slow-start concurrency limit (learning.py), where the cheapest per hour (MI300X,
    # $1.99) bought the most tokens: the cheapest per token wins, whatever it costs per hour
    usd = {live.endpoints[i].pool: float(d.estimates["usd_per_mtok"][k])
           for k, i in enumerate(d.idx)}
    assert chosen_pool(d) == min(usd, key=usd.__getitem__)
    assert chosen_pool(d) != min(FLEET, key=lambda row: row[4])[0]  # not the cheapest per hour
    costs = {c.endpoint.pool: c.scores["cost"] for c in d.ranked}
    assert costs[chosen_pool(d)] == max(costs.values()) == 0.5  # idle: opened by $/Mtok
    assert all(0 <= v <= 1 for v in costs.values())


def test_cost_fills_a_busy_replica_before_it_opens_an_idle_one() -> None:
    """Marginal cost: on a busy replica a request pays a share of steps that run anyway;
    an idle one would run them for it alone. The busy replica is filled up to its SLO
    capacity even when an idle one is cheaper per token; past it, the cheapest opens."""
    live = make_fleet()
    pipe = pipeline("cost", slo={"ttft_ms": 2000, "tpot_ms": 50})
    cold = pipe.route(request(), live.snapshot(1))
    usd = {live.endpoints[i].pool: float(cold.estimates["usd_per_mtok"][k])
           for k, i in enumerate(cold.idx)}
    dear = max(usd, key=usd.__getitem__)
    i = next(j for j, ep in enumerate(live.endpoints) if ep.pool == dear)
    live.on_dispatch(i, 1.0)
    busy = pipe.route(request(), live.snapshot(1))
    assert chosen_pool(busy) == dear
    m = {live.endpoints[j].pool: float(busy.estimates["marginal_usd"][k])
         for k, j in enumerate(busy.idx)}
    assert m[dear] < min(v for pool, v in m.items() if pool != dear)
    position = [int(j) for j in busy.idx].index(i)
    for _ in range(int(busy.estimate("slo_capacity", position) or 0)):
        live.on_dispatch(i, 1.0)
    full = pipe.route(request(), live.snapshot(1))
    assert chosen_pool(full) == chosen_pool(cold)  # the cheapest per token opens next


def test_cost_spills_to_next_cheapest_when_cheapest_is_past_its_slo_capacity() -> None:
    live = make_fleet()
    pipe = pipeline("cost", slo={"ttft_ms": 2000, "tpot_ms": 50})
    first = pipe.route(request(), live.snapshot(1))
    cheapest = first.chosen
    assert cheapest is not None
    capacity = int(first.estimate("slo_capacity"))
    for _ in range(capacity + 1):
        live.on_dispatch(live.index[cheapest.id], 1.0)
    d = pipe.route(request(), live.snapshot(1))
    assert d.chosen is not None and d.chosen.id != cheapest.id
    assert d.estimate("meets_slo") == 1.0
    assert "SLO" in d.reason


def test_cost_falls_back_to_fastest_when_nobody_meets_the_slo() -> None:
    live = make_fleet()
    d = pipeline("cost", slo={"tpot_ms": 0.5}).route(request(), live.snapshot(1))
    assert "fastest" in d.reason
    e2e = {c.endpoint.pool: d.estimates["e2e_s"][k] for k, c in enumerate(
        [d.candidate(k) for k in range(len(d.idx))])}
    assert chosen_pool(d) == min(e2e, key=e2e.get)


def test_max_usd_per_mtok_filters_expensive_endpoints() -> None:
    live = make_fleet()
    d0 = pipeline("cost").route(request(), live.snapshot(1))
    cheapest = d0.estimate("usd_per_mtok")
    assert cheapest is not None
    d = pipeline("cost", max_usd_per_mtok=cheapest * 1.001).route(request(), live.snapshot(1))
    assert [c.endpoint.pool for c in d.ranked] == [chosen_pool(d0)]
    assert set(d.rejected.values()) == {"filter max_cost"}


def test_latency_prefers_fastest_and_moves_off_a_slowed_endpoint() -> None:
    live = make_fleet()
    pipe = pipeline("latency")
    fastest = chosen_pool(pipe.route(request(), live.snapshot(1)))
    i = live.index[f"{fastest}-0"]
    for t in range(20):  # it answers 5x slower than the prior: the correction learns it
        serve(live, i, 1.0 + t, slower=5.0)
    assert live.value(i, "k_tpot") > 3
    assert chosen_pool(pipe.route(request(), live.snapshot(2))) != fastest


@pytest.mark.parametrize(("strategy", "loaded", "expect_not"), [
    ("least_loaded", "mi300x-sglang", "mi300x-sglang"),
    ("power_of_two", None, None),
])
def test_load_strategies(strategy: str, loaded: str | None, expect_not: str | None) -> None:
    live = make_fleet()
    if loaded:
        for _ in range(50):
            live.on_dispatch(live.index[f"{loaded}-0"], 1.0)
    pipe = pipeline(strategy)
    picks = Counter(chosen_pool(pipe.route(request(), live.snapshot(1))) for _ in range(40))
    if expect_not:
        assert expect_not not in picks
    else:
        assert len(picks) >= 2  # power of two spreads


def test_round_robin_rotates_over_all() -> None:
    live = make_fleet()
    pipe = pipeline("round_robin")
    picks = [chosen_pool(pipe.route(request(), live.snapshot(1))) for _ in range(8)]
    assert Counter(picks) == Counter({p: 2 for p in set(picks)}) and len(set(picks)) == 4


def test_affinity_is_sticky_per_session_and_spreads_sessions() -> None:
    live = make_fleet()
    pipe = pipeline("affinity")
    for user in ("alice", "bob", "carol"):
        picks = {chosen_pool(pipe.route(request(user=user), live.snapshot(1))) for _ in range(5)}
        assert len(picks) == 1
    header_pick = {chosen_pool(pipe.route(request(headers={"x-session-id": f"s{i}"}),
                                          live.snapshot(1))) for i in range(40)}
    assert len(header_pick) >= 3


@pytest.mark.parametrize(("params", "expected"), [
    ({"vendors": ["amd"]}, {"mi300x-sglang", "mi355x-vllm"}),
    ({"accelerators": ["h100", "h200"]}, {"h100-vllm", "h200-sglang"}),
    ({"pools": ["h200-sglang"]}, {"h200-sglang"}),
    ({"engines": ["vllm"]}, {"mi355x-vllm", "h100-vllm"}),
    ({"labels": {"tier": "gold"}}, {"h100-vllm"}),
])
def test_select_filter(params: dict, expected: set[str]) -> None:
    live = make_fleet(labels={"h100-vllm": {"tier": "gold"}})
    pipe = pipeline("latency", filters=[{"name": "select", "params": params}])
    d = pipe.route(request(), live.snapshot(1))
    assert {c.endpoint.pool for c in d.ranked} == expected


def test_max_queue_and_context_fit_filters() -> None:
    live = make_fleet()
    for _ in range(3):
        live.on_dispatch(live.index["h100-vllm-0"], 1.0)
    d = pipeline("latency", filters=[{"name": "max_queue", "params": {"max": 2}}]).route(
        request(), live.snapshot(1))
    assert "h100-vllm" not in {c.endpoint.pool for c in d.ranked}
    d = pipeline("latency").route(request(prompt_chars=40000, max_tokens=8000), live.snapshot(1))
    assert not len(d.order) and set(d.rejected.values()) == {"filter context_fit"}


def test_builtin_prefilters_health_breaker_and_staleness() -> None:
    live = make_fleet()
    live.on_refused(live.index["h100-vllm-0"], 1.0, "refused")
    for _ in range(3):
        live.on_dispatch(live.index["h200-sglang-0"], 1.0)
        live.on_failure(live.index["h200-sglang-0"], 1.0)
    d = pipeline("latency").route(request(), live.snapshot(2.0))
    assert d.rejected == {"h100-vllm-0": "not ready", "h200-sglang-0": "breaker open"}
    d = pipeline("latency").route(request(), live.snapshot(100.0))  # no contact for 100 s
    assert set(d.rejected.values()) >= {"state stale"}


def test_unknown_model_and_weighted_scores_in_unit_range() -> None:
    live = make_fleet()
    assert pipeline("latency").route(request(model="nope"), live.snapshot(1)).chosen is None
    pipe = pipeline("weighted", scorers=[{"name": "cost", "weight": 2},
                                         {"name": "kv_headroom", "weight": 1},
                                         {"name": "slo"}, {"name": "queue"}])
    d = pipe.route(request(), live.snapshot(1))
    assert d.total is not None and np.all((d.total >= 0) & (d.total <= 1))
    for c in d.ranked:
        assert set(c.scores) == {"cost", "kv_headroom", "slo", "queue"}


@pytest.mark.parametrize(("policy", "error"), [
    ("{strategy: weighted, scorers: [{name: nope}]}", "policies.p.scorers[0].name"),
    ("{strategy: latency, filters: [{name: max_queue, params: {max: -1}}]}",
     "policies.p.filters[0].params.max"),
    ("{strategy: latency, filters: [{name: select, params: {colour: red}}]}",
     "policies.p.filters[0].params.colour"),
])
def test_bad_plugin_params_fail_with_yaml_path(policy: str, error: str) -> None:
    text = ("pools: [{name: a, accelerator: h100, engine: vllm, price_per_gpu_hour: 1, "
            "endpoints: ['http://x:1'], models: {m: m}}]\n"
            f"policies: {{p: {policy}}}\ndefault_policy: p\n")
    with pytest.raises(PolicyError) as info:
        build_router(parse_config(text, "t", {}))
    assert any(e.startswith(error) for e in info.value.errors), info.value.errors


def test_policy_selection_header_routes_default() -> None:
    text = ("pools: [{name: a, accelerator: h100, engine: vllm, price_per_gpu_hour: 1, "
            f"endpoints: ['http://x:1'], models: {{{MODEL}: m}}}}]\n"
            "policies: {cheap: {strategy: cost}, fast: {strategy: latency}, "
            "rr: {strategy: round_robin}}\n"
            "routes: [{match: {header: {x-priority: high}}, policy: fast}, "
            "{match: {tenant: t1}, policy: rr}]\n"
            "default_policy: cheap\n")
    router = build_router(parse_config(text, "t", {}))
    assert router.policy_for(request()) == "cheap"
    assert router.policy_for(request(headers={"x-priority": "high"})) == "fast"
    assert router.policy_for(request(tenant="t1")) == "rr"
    assert router.policy_for(request(policy="rr", headers={"x-priority": "high"})) == "rr"


def test_the_decision_log_bounds_the_candidates_it_keeps() -> None:
    from fleetgate.gateway.decisions import DecisionLog

    small = make_fleet()
    big = make_fleet([(f"p{i}", "h100", "nvidia", "vllm", 2.0) for i in range(40)])
    log = DecisionLog(size=10, max_candidates=100)
    pipe = pipeline("latency")
    for _ in range(12):
        log.record("r", pipe.route(request(), small.snapshot(1)))  # 4 candidates each
    assert len(log) == 10  # the count bounds it
    for _ in range(3):
        log.record("r", pipe.route(request(), big.snapshot(1)))  # 40 each
    assert len(log) == 2  # the newest that fit in 100 candidates: two of 40
    assert len(log.latest(1, candidates=1)[0]["candidates"]) == 1


def test_tpot_is_learned_against_the_whole_prompt_a_cached_prefix_included() -> None:
    """A cached prefix is not prefilled again, but its KV is read at every step: the TPOT
    prior the learned k_tpot is measured against counts the whole prompt, as the router's
    prediction does. Counted without the cached part, a busy engine that decodes exactly as
    the prior says taught k_tpot far above 1, and admission shed what it could serve."""
    from fleetgate.routing.estimate import prior_tpot
    from fleetgate.routing.plugins.prefix_cache import chunk_hashes

    live = make_fleet()
    prompt = "system prompt " * 2000
    hashes = chunk_hashes(prompt)
    tokens = request(prompt_chars=len(prompt)).prompt_tokens_estimate
    i = 0
    for _ in range(40):  # a busy replica: the KV read is most of a step
        live.on_dispatch(i, 1.0, prompt_tokens=tokens, prefix_hashes=hashes)
    sample = live.on_dispatch(i, 1.0, prompt_tokens=tokens, prefix_hashes=hashes)
    assert sample.prompt_tokens == tokens  # the prefix was cached there: not prefilled
    batch = (sample.active + live.value(i, "active")) / 2  # as on_finish counts it
    measured = prior_tpot(live.snapshot(1.0).static, i, tokens, 100, batch, 0.0)
    for t in (2.0, 3.0, 4.0):
        live.on_finish(i, t, 100, 1.0, measured, sample)
    assert live.value(i, "k_tpot") == pytest.approx(1.0, abs=0.1)


def test_a_cached_prefix_lowers_the_marginal_cost_and_the_ttft_where_it_is_cached() -> None:
    """What an endpoint's cache holds of the prompt is not prefilled again: its marginal $
    and its TTFT are predicted without it, so the cost router sends a long shared prefix
    back where it was cached when the price allows."""
    from fleetgate.routing.plugins.prefix_cache import chunk_hashes

    live = make_fleet()
    pipe = pipeline("cost", slo={"ttft_ms": 2000, "tpot_ms": 50})
    prompt = "system prompt " * 2000
    hashes = chunk_hashes(prompt)
    req = request(prompt_chars=len(prompt), prefix_hashes=hashes)
    cold = pipe.route(req, live.snapshot(1))
    i = next(j for j, ep in enumerate(live.endpoints) if ep.pool != chosen_pool(cold))
    live.on_dispatch(i, 1.0, prefix_hashes=hashes)
    live.on_finish(i, 1.0, 10, 1.0, 0.01)
    warm = pipe.route(req, live.snapshot(1))
    k_cold = [int(j) for j in cold.idx].index(i)
    k_warm = [int(j) for j in warm.idx].index(i)
    assert warm.estimates["ttft_s"][k_warm] < 0.5 * cold.estimates["ttft_s"][k_cold]
    saved = cold.estimates["marginal_usd"][k_cold] - warm.estimates["marginal_usd"][k_warm]
    prefill = live.endpoints[i].usd_per_s * live.column("prefill_s_per_token")[i]
    assert saved == pytest.approx(prefill * 64 * len(hashes), rel=0.05)  # every chunk cached
