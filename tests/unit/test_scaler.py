"""The fleet scaler (``fleetgate.scaling``): allocation across pools, floors paid for first,
the cheapest $ per unit of SLO capacity grown first, hysteresis, grouping by model; demand
as a rate (what the replicas were sent and what admission refused), never as the requests in
flight that a packing router inflates."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest

from fleetgate.config.loader import parse_config
from fleetgate.config.schema import AutoscaleConfig
from fleetgate.routing.estimate import PREFILL_TAU_S
from fleetgate.scaling import (
    FleetScaler,
    PoolState,
    Target,
    allocate,
    observe,
    scaled_pools,
    signals,
)
from fleetgate.scaling.scaler import DEMAND_WINDOW_S, groups
from fleetgate.scaling.signals import ScaledPool, scaling_slo
from fleetgate.state.admission import REFUSED_TAU_S, Refused
from fleetgate.state.fleet import fleet_endpoints, live_fleet
from fleetgate.state.live import LiveFleet


def pool(name: str, usd: float, capacity: float, *, ready: int = 1, load: float = 0.0,
         lo: int = 1, hi: int = 8, target: float = 1.0, models: str = "m", delay: float = 60.0,
         scaled: bool = True, starting: int = 0,
         outcomes: tuple[float, float] = (0.0, 0.0), active: float = 0.0) -> PoolState:
    spec = AutoscaleConfig(min_replicas=lo, max_replicas=hi, target_utilization=target,
                           scale_down_delay_s=delay) if scaled else None
    return PoolState(name, frozenset(models.split(",")), usd, capacity, load, ready,
                     starting, autoscale=spec, outcomes=outcomes, active=active)


@pytest.mark.parametrize(("demand", "expected"), [
    (0.0, {"cheap": 1, "dear": 1}),      # the floors
    (20.0, {"cheap": 1, "dear": 1}),     # fits the floors (10 + 10)
    (35.0, {"cheap": 3, "dear": 1}),     # the rest on the cheaper $ per capacity
    (101.0, {"cheap": 8, "dear": 3}),    # cheap at its ceiling, then the dear one
    (1000.0, {"cheap": 8, "dear": 8}),   # beyond every ceiling: every ceiling
])
def test_allocate_fills_the_cheapest_capacity_first(demand: float,
                                                   expected: dict[str, int]) -> None:
    pools = [pool("dear", 4.0, 10.0), pool("cheap", 2.0, 10.0)]
    want, reason = allocate(pools, demand)
    assert want == expected
    assert reason


def test_fixed_pools_are_paid_for_and_used_first() -> None:
    fixed = pool("fixed", 9.0, 10.0, ready=3, scaled=False)
    want, _ = allocate([fixed, pool("cheap", 2.0, 10.0, lo=0)], 30.0)
    assert want == {"cheap": 0}
    want, _ = allocate([fixed, pool("cheap", 2.0, 10.0, lo=0)], 31.0)
    assert want == {"cheap": 1}


def test_the_last_partial_replica_goes_where_one_covers_it_cheapest() -> None:
    # big: $4 for 40 (0.10 $/unit), small: $1.5 for 10 (0.15 $/unit): 45 = one big + 5 more,
    # and 5 is covered by one small replica for $1.5 rather than a second big one for $4
    pools = [pool("big", 4.0, 40.0, lo=0), pool("small", 1.5, 10.0, lo=0)]
    want, _ = allocate(pools, 45.0)
    assert want == {"big": 1, "small": 1}
    want, _ = allocate(pools, 75.0)  # 35 past one big: a second big (4) beats 4 small (6)
    assert want == {"big": 2, "small": 0}


def test_target_utilization_leaves_headroom() -> None:
    want, _ = allocate([pool("p", 1.0, 10.0, target=0.5, lo=0)], 12.0)
    assert want == {"p": 3}  # 5 a replica


def test_pools_group_by_shared_models() -> None:
    a, b, c = pool("a", 1, 1, models="x"), pool("b", 1, 1, models="y"), \
        pool("c", 1, 1, models="x,y")
    assert [[p.name for p in g] for g in groups([a, b])] == [["a"], ["b"]]
    assert [[p.name for p in g] for g in groups([a, b, c])] == [["a", "b", "c"]]


def test_up_at_once_down_after_the_delay_one_replica_a_tick() -> None:
    scaler = FleetScaler()
    busy = pool("p", 1.0, 10.0, ready=1, load=50.0, delay=60.0)
    assert scaler.tick(0.0, [busy])["p"].desired == 5
    t = DEMAND_WINDOW_S + 1  # the burst fills the whole demand window
    assert scaler.tick(t, [busy])["p"].desired == 5
    quiet = pool("p", 1.0, 10.0, ready=5, load=0.0, delay=60.0)
    held = [scaler.tick(t + k * 5, [quiet])["p"] for k in range(1, 13)]
    assert all(x.desired == 5 for x in held[:8])  # the last desire of 5 is < 60 s old
    late = [scaler.tick(t + 100 + k * 5, [pool("p", 1.0, 10.0, ready=n, delay=60.0)])["p"]
            for k, n in enumerate((5, 4, 3, 2, 1))]
    assert [x.desired for x in late] == [4, 3, 2, 1, 1]  # one a tick, to the floor
    assert "after 60 s lower" in late[0].reason


def test_waiting_requests_count_once_for_their_group() -> None:
    scaler = FleetScaler()
    out = scaler.tick(0.0, [pool("p", 1.0, 10.0, lo=0, ready=0),
                            pool("q", 1.0, 10.0, lo=0, ready=0, models="other")],
                      {"m": 25.0 * DEMAND_WINDOW_S})  # 25 req/s to serve them in the window
    assert out["p"].desired == 3 and out["q"].desired == 0


def test_waiting_requests_count_as_the_rate_they_would_make_running() -> None:
    """A closed-loop burst is sent only as fast as the fleet serves it: 10 req/s with 20
    running (2 s each) and 10 more waiting is 15 req/s of demand, not 10.5."""
    out = FleetScaler().tick(0.0, [pool("p", 1.0, 10.0, lo=0, load=10.0, active=20.0)],
                             {"m": 10.0})
    assert out["p"].desired == 2 and "demand 15.0 req/s" in out["p"].reason


def test_starting_replicas_count_as_supply_and_the_bill_is_reported() -> None:
    scaler = FleetScaler()
    booting = pool("p", 2.0, 10.0, ready=1, starting=2, load=30.0)
    target = scaler.tick(0.0, [booting])["p"]
    assert target.desired == 3 and target.current == 3  # nothing more to start
    assert target.usd_per_hour == pytest.approx(6.0)
    assert target.usd_per_hour_at_desired == pytest.approx(6.0)


FLEET = """
pools:
  - {name: h100, accelerator: h100, engine: vllm, price_per_gpu_hour: 2.0,
     endpoints: ["http://10.0.0.1:8000", "http://10.0.0.2:8000"],
     models: {m: meta-llama/Llama-3.1-8B-Instruct},
     autoscale: {min_replicas: 1, max_replicas: 8}}
policies: {c: {strategy: cost, slo: {ttft_ms: 1500, tpot_ms: 80}}}
default_policy: c
"""


@pytest.mark.parametrize("stay_s", [0.0, 30.0])
def test_demand_is_the_rate_sent_not_the_requests_in_flight(stay_s: float) -> None:
    """100 requests over 10 s on one replica: whether they ended at once or all still run
    (a router that packs a replica makes each stay longer), the scaler sees one demand."""
    cfg = parse_config(FLEET, "fleet.yaml", {})
    live = live_fleet(fleet_endpoints(cfg))
    for i in range(2):
        live.on_probe(i, 0.0, True, "ok")
    for k in range(100):
        t = k * 0.1
        sample = live.on_dispatch(0, t, 0.1, 1000)
        if t + stay_s <= 10.0:
            live.on_finish(0, t + stay_s, 200, stay_s, 0.02, sample)
    pools = scaled_pools(cfg, live.endpoints, {"h100"})
    (state,) = observe(live, pools, scaling_slo(cfg), 10.0)
    sent = sum(math.exp(-(10.0 - k * 0.1) / PREFILL_TAU_S) for k in range(100)) / PREFILL_TAU_S
    assert state.load == pytest.approx(sent)  # ~6.3 req/s: 10 req/s through a 10 s EWMA
    assert 0 < state.capacity < math.inf  # req/s one replica runs within the SLO


def test_refused_requests_count_as_demand_and_fade() -> None:
    refused = Refused()
    for k in range(100):  # 10 req/s shed for 10 s
        refused.add("m", k * 0.1)
    rate = refused.per_s(10.0)["m"]
    assert rate == pytest.approx(10 * (1 - math.exp(-10.0 / REFUSED_TAU_S)), rel=0.05)
    assert refused.per_s(10.0 + 3 * REFUSED_TAU_S)["m"] < 0.06 * rate
    scaler = FleetScaler()
    out = scaler.tick(10.0, [pool("p", 1.0, 1.0, lo=0, ready=0)], refused=refused.per_s(10.0))
    assert out["p"].desired == math.ceil(rate)  # one replica a request per second
    other = scaler.tick(10.0, [pool("q", 1.0, 1.0, lo=0, ready=0, models="x")],
                        refused=refused.per_s(10.0))
    assert other["q"].desired == 0  # another model's refusals are not its demand


def _warm_fleet(prompt_tokens: int) -> tuple[Any, LiveFleet, list[ScaledPool]]:
    """FLEET's two H100 replicas, ready, after 50 requests of ``prompt_tokens`` and 300-token
    answers (the workload's shape, as the scaler reads it), and its scaled pools."""
    cfg = parse_config(FLEET, "fleet.yaml", {})
    live = live_fleet(fleet_endpoints(cfg))
    for i in range(2):
        live.on_probe(i, 0.0, True, "ok")
    for k in range(50):
        sample = live.on_dispatch(k % 2, 0.1 * k, 0.1, prompt_tokens)
        live.on_finish(k % 2, 0.1 * k, 300, 5.0, 0.02, sample)
    return cfg, live, scaled_pools(cfg, live.endpoints, {"h100"})


def test_a_replica_takes_no_fewer_requests_per_second_where_prompts_may_take_more_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The capacity is self-consistent: a rate that B_slo caps is not charged the slowdown
    of a prefill share it does not reach (with a fixed slowdown, 0.6 gave less than 0.5)."""
    cfg, live, pools = _warm_fleet(6000)  # 6,000-token prompts, 300-token answers
    caps = []
    for share in (0.3, 0.4, 0.5, 0.6, 0.7, 0.8):
        monkeypatch.setattr(signals, "STEADY_PREFILL_SHARE", share)
        (state,) = observe(live, pools, scaling_slo(cfg), 5.0)
        caps.append(state.capacity)
    assert all(b >= a * (1 - 1e-9) for a, b in itertools.pairwise(caps)), caps
    assert caps[0] < caps[-1], caps  # the share binds at 0.3, B_slo from 0.4


def test_a_replicas_capacity_is_not_what_the_tick_leaves_of_it() -> None:
    """A packed replica's queue is the load the capacity is for, not a loss of it: read at
    the tick's load, its TTFT counted the queue and the capacity fell with the packing (the
    cost router's B200 swung between 6.6 and 40 requests/s, and the scaler bought the
    dearest pool instead)."""
    cfg, live, pools = _warm_fleet(1500)  # 1,500-token prompts, 300-token answers
    (idle,) = observe(live, pools, scaling_slo(cfg), 5.0)
    for k in range(400):  # both replicas packed far past their batch, prompts pouring in
        live.on_dispatch(k % 2, 5.0, 0.1, 1500)
    (packed,) = observe(live, pools, scaling_slo(cfg), 5.0)
    assert packed.active > 300 and idle.capacity > 0
    assert packed.capacity == pytest.approx(idle.capacity)


def test_the_packing_follows_how_the_group_holds_its_slo() -> None:
    """A group that holds its SLO with room to spare is packed up to its replicas' whole
    capacity; one that misses over the budget goes back to its target utilization."""
    scaler = FleetScaler()
    desired = 8

    def tick(k: int, judged: float, missed: float) -> Target:
        nonlocal desired
        state = pool("p", 1.0, 10.0, ready=desired, load=40.0, target=0.5, delay=0.0,
                     outcomes=(judged, missed))
        target = scaler.tick(5.0 * k, [state])["p"]
        desired = target.desired
        return target

    assert tick(0, 600.0, 0.0).desired == 8  # 40 req/s at 5 a replica
    for k in range(1, 200):  # 600 results a minute, none missed
        held = tick(k, 600.0, 0.0)
    assert scaler.packing[frozenset({"m"})][0] == pytest.approx(2.0)  # 1 / target: all of it
    assert held.desired == 4 and held.packing == pytest.approx(2.0)
    assert "filled to 2.00x the target utilization" in held.reason
    for k in range(200, 230):  # 2% missed: back to the target, never below it
        missed = tick(k, 600.0, 12.0)
    assert scaler.packing[frozenset({"m"})][0] == 1.0 and missed.desired == 8
    few = FleetScaler()
    few.tick(0.0, [pool("p", 1.0, 10.0, outcomes=(60.0, 0.0))])  # 60 results: too few
    assert few.packing[frozenset({"m"})][0] == 1.0


def test_the_reason_speaks_of_the_demand_itself_whatever_the_packing() -> None:
    want, why = allocate([pool("p", 1.0, 10.0, lo=2, target=0.5)], 12.0, pack=2.0)
    assert want == {"p": 2}  # 10 a replica at twice its target utilization
    assert why == "demand 12.0 req/s fits the paid-for capacity 20.0"
