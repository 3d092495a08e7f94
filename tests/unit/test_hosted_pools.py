"""Hosted per-token pools (issue 25 item 3): config, the router's overflow, the ledger, the
scaler.

A hosted OpenAI-compatible API (``engine: openai``, ``price_per_mtok``, ``max_concurrency``)
is priced at its tokens, predicted at its expected latency, ranked after every self-hosted
endpoint that meets the SLO or fails only its prefill share, and before admission waits or
sheds, charged per token, and
neither scaled nor counted as paid-for capacity. Table-driven, in-process, no clocks.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import yaml

from fleetgate.config.loader import ConfigError, parse_config
from fleetgate.config.schema import FleetConfig
from fleetgate.gateway.costs import CostLedger, LedgerSnapshot, attempt_charge
from fleetgate.routing import RoutingRequest, build_router
from fleetgate.routing.estimate import PREFILL_TAU_S
from fleetgate.scaling import FleetScaler, observe, scaled_pools
from fleetgate.scaling.signals import scaling_slo
from fleetgate.state.admission import full, room
from fleetgate.state.fleet import fleet_endpoints, live_fleet
from fleetgate.state.live import LiveFleet

MODEL = "llama-3.1-8b"
HOSTED: dict[str, Any] = {
    "name": "hosted", "engine": "openai", "price_per_mtok": {"input": 0.15, "output": 0.60},
    "max_concurrency": 4, "expected_latency": {"ttft_ms": 400, "tpot_ms": 20},
    "endpoints": ["https://api.example.com"], "models": {MODEL: "provider/llama-3.1-8b"}}
OWN: dict[str, Any] = {
    "name": "own", "accelerator": "h100", "engine": "vllm", "price_per_gpu_hour": 2.0,
    "endpoints": ["http://10.0.0.1:8000"], "models": {MODEL: "meta-llama/Llama-3.1-8B"}}
POLICY = {"cheapest": {"strategy": "cost", "slo": {"ttft_ms": 1500, "tpot_ms": 80}}}


def config(*pools: dict[str, Any]) -> FleetConfig:
    text = yaml.safe_dump({"pools": list(pools), "policies": POLICY,
                           "default_policy": "cheapest"})
    return parse_config(text, "fleet.yaml", {})


def ready_fleet(cfg: FleetConfig) -> LiveFleet:
    live = live_fleet(fleet_endpoints(cfg))
    for i in range(len(live.endpoints)):
        live.on_probe(i, 0.0, True, "ok")
    return live


@pytest.mark.parametrize(("change", "error"), [
    ({"price_per_gpu_hour": 1.0}, "pools[1].price_per_gpu_hour: a pool has one price"),
    ({"price_per_mtok": None}, "pools[1].price_per_gpu_hour: Field required (or "
                               "price_per_mtok"),
    ({"engine": "vllm"}, "pools[1].price_per_mtok: only a hosted OpenAI-compatible API"),
    ({"max_concurrency": None}, "pools[1].max_concurrency: required for a pool priced per "
                                "token"),
    ({"price_per_mtok": {"input": -1, "output": 1}}, "pools[1].price_per_mtok.input: "),
    ({"autoscale": {"max_replicas": 2}}, "pools[1].autoscale: a pool priced per token"),
    ({"accelerator": "hosted", "price_per_mtok": None, "price_per_gpu_hour": 1.0,
      "max_concurrency": None, "expected_latency": None},
     "pools[1].accelerator: unknown accelerator 'hosted'"),
])
def test_a_bad_per_token_pool_is_refused_with_its_yaml_path(change: dict[str, Any],
                                                             error: str) -> None:
    pool = {k: v for k, v in {**HOSTED, **change}.items() if v is not None}
    with pytest.raises(ConfigError) as caught:
        config(OWN, pool)
    assert any(e.startswith(error) for e in caught.value.errors), caught.value.errors
    if error.startswith("pools[1].price_per_mtok"):  # an invalid price: no follow-up errors
        assert len(caught.value.errors) == 1, caught.value.errors


@pytest.mark.parametrize("key", ["max_concurrency", "expected_latency"])
def test_hosted_only_keys_are_refused_on_a_self_hosted_pool(key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        config({**OWN, key: HOSTED[key]})
    assert caught.value.errors[0].startswith(f"pools[0].{key}: only for a pool priced per "
                                             "token"), caught.value.errors


def test_a_per_token_pool_resolves() -> None:
    pool = config(OWN, HOSTED).pools[1]
    assert pool.per_token and pool.accelerator == "hosted" and pool.vendor == "hosted"
    assert pool.price_per_gpu_hour == 0.0 and pool.price_per_replica_hour == 0.0
    bare = config(OWN, {k: v for k, v in HOSTED.items() if k != "expected_latency"}).pools[1]
    assert bare.expected_latency is not None  # the documented defaults
    assert (bare.expected_latency.ttft_ms, bare.expected_latency.tpot_ms) == (600.0, 20.0)


def test_the_kernel_prices_a_hosted_api_at_its_tokens() -> None:
    cfg = config(OWN, HOSTED)
    live = ready_fleet(cfg)
    req = RoutingRequest(model=MODEL, max_tokens=200, prompt_chars=4 * 992)  # 1,000 tokens
    est = build_router(cfg).route(req, live.snapshot(1.0)).estimates
    assert est["marginal_usd"][1] == pytest.approx((1000 * 0.15 + 200 * 0.60) / 1e6)
    assert est["ttft_s"][1] == pytest.approx(0.4) and est["tpot_s"][1] == pytest.approx(0.02)
    assert est["e2e_s"][1] == pytest.approx(0.4 + 0.02 * 199)
    assert est["slo_capacity"][1] == 4 and est["can_take"][1] == 1
    # per output token on the workload's shape (no answer seen yet: DEFAULT_MAX_TOKENS)
    assert est["usd_per_mtok"][1] == pytest.approx(0.60 + 0.15 * 1000 / 256)
    assert est["prefill_s"][1] == pytest.approx(0.4)


def test_the_hosted_api_takes_only_what_self_hosted_capacity_cannot() -> None:
    cfg = config(OWN, HOSTED)
    live = ready_fleet(cfg)
    router = build_router(cfg)
    req = RoutingRequest(model=MODEL, max_tokens=256, prompt_chars=4000)
    first = router.route(req, live.snapshot(1.0))
    assert first.chosen is not None and first.chosen.pool == "own"  # idle and paid for
    capacity = int(first.estimates["slo_capacity"][0])
    for _ in range(capacity):  # the self-hosted replica at its SLO capacity, all answering
        live.on_dispatch(0, 1.0)
        live.on_first_token(0, 1.0, 0.1)
    over = router.route(req, live.snapshot(1.0))
    assert over.chosen is not None and over.chosen.pool == "hosted"
    assert not over.estimates["meets_slo"][0] and over.estimates["meets_slo"][1]
    assert not full(over)
    for _ in range(4):  # the hosted API at its cap: it takes no more
        live.on_dispatch(1, 1.0)
    capped = router.route(req, live.snapshot(1.0))
    assert not capped.estimates["meets_slo"][1] and capped.estimates["can_take"][1] == 0
    assert room(capped) == 1  # only what the cold self-hosted class may still grow to
    live.on_finish(0, 2.0, 256, 1.0, 0.02)  # a self-hosted slot frees: it goes first again
    again = router.route(req, live.snapshot(2.0))
    assert again.chosen is not None and again.chosen.pool == "own"


def test_a_cheaper_hosted_api_never_beats_an_idle_self_hosted_replica() -> None:
    cheap = {**HOSTED, "price_per_mtok": {"input": 0.0001, "output": 0.0001}}
    dear = {**OWN, "name": "dear", "price_per_gpu_hour": 50.0,
            "endpoints": ["http://10.0.0.2:8000"]}
    cfg = config(OWN, dear, cheap)
    decision = build_router(cfg).route(RoutingRequest(model=MODEL, max_tokens=64),
                                       ready_fleet(cfg).snapshot(1.0))
    order = [c.endpoint.pool for c in decision.ranked]
    assert order == ["own", "dear", "hosted"], decision.explain()


def test_a_replica_over_its_prefill_share_goes_before_the_hosted_api_and_recovers_in_time(
) -> None:
    """A burst of long prompts takes the self-hosted replica past its prefill share of the
    last second (``estimate.py``): it is still predicted within the SLO on average, so it
    ranks ahead of the hosted API's overflow, though after a replica within every bound; the
    share decays to the decision's instant, with no tick in between."""
    second = {**OWN, "name": "second", "price_per_gpu_hour": 9.0,
              "endpoints": ["http://10.0.0.2:8000"]}
    cfg = config(OWN, second, HOSTED)
    live = ready_fleet(cfg)
    router = build_router(cfg)
    req = RoutingRequest(model=MODEL, max_tokens=256, prompt_chars=4000)
    first = router.route(req, live.snapshot(1.0))
    assert first.chosen is not None and first.chosen.pool == "own"
    for _ in range(8):  # 8 x 4,000-token prompts within the second: well over the share
        live.on_dispatch(0, 1.0, prompt_tokens=4000)
    burst = router.route(req, live.snapshot(1.05))
    est = burst.estimates
    assert est.over_share[0] == 1 and not est["meets_slo"][0] and est["can_take"][0] == 1
    assert [c.endpoint.pool for c in burst.ranked] == ["second", "own", "hosted"], \
        burst.explain()
    live.on_dispatch(1, 1.05, prompt_tokens=40000)  # the second replica over its share too
    both = router.route(req, live.snapshot(1.06))
    assert [c.endpoint.pool for c in both.ranked] == ["own", "second", "hosted"], \
        both.explain()  # by score (cost) among those over their share, the API last
    later = router.route(req, live.snapshot(6.0))  # five seconds on, nothing else happened
    assert later.estimates.over_share[0] == 0 and later.estimates["meets_slo"][0]
    assert later.chosen is not None and later.chosen.pool == "own"


def test_the_ledger_charges_a_hosted_api_per_token() -> None:
    cfg = config(OWN, HOSTED)
    hosted = fleet_endpoints(cfg)[1]
    charge = attempt_charge(hosted, 30.0, 4.0, 2000, 500)
    assert charge.usd == pytest.approx((2000 * 0.15 + 500 * 0.60) / 1e6)
    assert charge.replica_seconds == charge.gpu_seconds == 0.0
    assert attempt_charge(hosted, 30.0, 4.0).usd == 0.0  # failed: no usage, no charge
    ledger = CostLedger(clock=lambda: 10.0)
    ledger.tally(hosted, MODEL, "t").add_attempt(charge, True, 2000, 500)
    row = ledger.report()["pools"][0]
    assert row["price_per_mtok"] == {"input": 0.15, "output": 0.60}
    assert row["usd"] == pytest.approx(charge.usd) and row["gpu_hours"] == 0.0
    again = LedgerSnapshot.decode(ledger.snapshot().encode())
    assert again.pools["hosted"] == ledger.snapshot().pools["hosted"]


def test_the_scaler_counts_hosted_load_as_demand_never_as_capacity() -> None:
    own = {**OWN, "endpoints": ["emulated://vllm/h100"],
           "autoscale": {"min_replicas": 1, "max_replicas": 4, "cold_start_s": 60}}
    cfg = config(own, HOSTED)
    endpoints = fleet_endpoints(cfg)
    live = ready_fleet(cfg)
    pools = scaled_pools(cfg, endpoints, {"own"})
    hosted_slots = [i for i, ep in enumerate(endpoints) if ep.pool == "hosted"]
    for _ in range(400):
        live.on_dispatch(hosted_slots[0], 1.0)
    states = {s.name: s for s in observe(live, pools, scaling_slo(cfg), 1.0)}
    assert states["hosted"].capacity == 0 and states["hosted"].ready == 0
    assert states["hosted"].usd_per_replica_hour == 0 and states["hosted"].autoscale is None
    assert states["hosted"].load == pytest.approx(400 / PREFILL_TAU_S)  # requests per second
    quiet = FleetScaler().tick(1.0, [states["own"]])["own"]
    busy = FleetScaler().tick(1.0, list(states.values()))["own"]
    assert busy.desired > quiet.desired and set(FleetScaler().tick(
        1.0, list(states.values()))) == {"own"}  # a target for the scaled pool only
    assert np.isfinite(states["own"].capacity)
