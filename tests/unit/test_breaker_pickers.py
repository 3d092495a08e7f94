"""Table-driven tests: circuit breaker, health state machine, pickers, live-state learning."""

from __future__ import annotations

import numpy as np
import pytest
from routing_fixtures import make_fleet, serve

from fleetgate.routing.plugins.pickers import MaxScore, PowerOfTwo, RoundRobin, WeightedRandom
from fleetgate.state.breaker import CircuitBreaker, HealthTracker

# (events, expected state, allows at t=now) ; events: ("f", t) failure, ("s",) success,
# ("d", t) dispatch
BREAKER_CASES = [
    ([("f", 0), ("f", 1)], "closed", (2, True)),
    ([("f", 0), ("f", 1), ("f", 2)], "open", (3, False)),
    ([("f", 0), ("f", 1), ("f", 2)], "open", (7, True)),  # cooldown over: one probe allowed
    ([("f", 0), ("f", 1), ("f", 2), ("d", 7)], "half_open", (7, False)),  # probe in flight
    ([("f", 0), ("f", 1), ("f", 2), ("d", 7), ("s",)], "closed", (7, True)),
    ([("f", 0), ("f", 1), ("f", 2), ("d", 7), ("f", 8)], "open", (9, False)),
    ([("f", 0), ("f", 1), ("f", 2), ("d", 7), ("f", 8)], "open", (13, True)),
    ([("f", 0), ("f", 1), ("s",), ("f", 2)], "closed", (3, True)),  # success resets the count
]


@pytest.mark.parametrize(("events", "state", "check"), BREAKER_CASES)
def test_breaker(events: list[tuple], state: str, check: tuple[float, bool]) -> None:
    b = CircuitBreaker(failure_threshold=3, cooldown_s=5)
    for ev in events:
        if ev[0] == "f":
            b.on_failure(ev[1])
        elif ev[0] == "d":
            b.on_dispatch(ev[1])
        else:
            b.on_success()
    assert b.state == state
    assert b.allows(check[0]) is check[1]


HEALTH_CASES = [
    ([], "pending"),
    ([True], "ready"),
    ([False], "pending"),
    ([False, False], "not_ready"),
    ([True, False], "ready"),
    ([True, False, False], "not_ready"),
    ([True, False, False, True], "ready"),
    (["refused"], "not_ready"),
    (["refused", True], "ready"),
]


@pytest.mark.parametrize(("probes", "state"), HEALTH_CASES)
def test_health_state_machine(probes: list, state: str) -> None:
    h = HealthTracker(fails_to_not_ready=2)
    for p in probes:
        if p == "refused":
            h.on_refused("connect refused")
        else:
            h.on_probe(p, "200" if p else "503")
    assert h.state == state


def test_max_score_orders_and_breaks_ties_randomly() -> None:
    total = np.array([0.2, 0.9, 0.9, 0.5])
    firsts = {int(MaxScore(seed=s).order(total, 5)[0]) for s in range(20)}
    assert firsts == {1, 2}
    assert list(MaxScore(seed=0).order(total, 4)[2:]) == [3, 0]
    assert len(MaxScore(seed=0).order(total, 2)) == 2


@pytest.mark.parametrize("picker", [WeightedRandom(seed=1), PowerOfTwo(seed=1), RoundRobin()])
def test_pickers_return_a_permutation(picker: object) -> None:
    total = np.array([0.1, 0.7, 0.4, 0.9, 0.0])
    for _ in range(10):
        order = picker.order(total, 5)  # type: ignore[attr-defined]
        assert sorted(order.tolist()) == list(range(5))


def test_weighted_random_favours_high_scores() -> None:
    picker = WeightedRandom(seed=3)
    total = np.array([0.05, 0.95])
    firsts = [int(picker.order(total, 5)[0]) for _ in range(200)]
    assert firsts.count(1) > 150


def test_power_of_two_puts_the_better_of_two_first() -> None:
    picker = PowerOfTwo(seed=5)
    total = np.array([0.1, 0.2, 0.3, 0.4])
    for _ in range(20):
        order = picker.order(total, 5)
        assert total[order[0]] >= total[order[1]]


def test_live_state_counts_and_scrapes() -> None:
    live = make_fleet()
    i = 0
    live.on_dispatch(i, 1.0)
    sample = live.on_dispatch(i, 1.0, predicted_ttft_s=0.1)
    snap = live.snapshot(1.0)
    assert live.column("in_flight")[i] == 2 and snap.col("queued")[i] == 2
    live.on_scrape(i, 2.0, waiting=5, running=3, kv_usage=0.5, gen_tokens_total=1000,
                   gen_throughput=None)
    live.on_scrape(i, 3.0, waiting=1, running=3, kv_usage=0.4, gen_tokens_total=1600,
                   gen_throughput=None)
    snap2 = live.snapshot(3.0)
    assert snap2.col("queued")[i] == 1 and live.column("running")[i] == 3
    assert live.column("tokens_per_s")[i] == pytest.approx(600)
    assert snap.col("queued")[i] == 2  # an earlier snapshot never changes
    live.on_first_token(i, 3.0, 0.2, sample)  # twice as slow as predicted
    assert live.value(i, "k_ttft") > 1.0
    live.expire_scrapes(100.0)
    assert np.isnan(live.column("running")[i])
    assert live.snapshot(100.0).col("active")[i] == 2  # our own in-flight requests remain
    with pytest.raises(KeyError):
        live.snapshot(100.0).col("running")  # not a routed column


def test_a_new_generation_inherits_live_state_by_url() -> None:
    old = make_fleet()  # breaker threshold 3, cooldown 5 s
    teach, tripped, probing, busy = (old.index[f"{p}-0"] for p in (
        "mi300x-sglang", "mi355x-vllm", "h100-vllm", "h200-sglang"))
    for t in range(20):  # answers 3x slower than the prior
        serve(old, teach, 1.0 + t, slower=3.0)
    for _ in range(3):
        old.on_dispatch(tripped, 6.0)
        old.on_failure(tripped, 6.0)
        old.on_dispatch(probing, 1.0)
        old.on_failure(probing, 1.0)
        serve(old, busy, 1.0 + _, slower=3.0)
    old.on_dispatch(probing, 7.0)  # half-open: its probe request is in the old generation
    for _ in range(4):
        old.on_dispatch(busy, 8.0)
    old.on_scrape(busy, 8.0, waiting=1, running=2, kv_usage=0.3, gen_tokens_total=500,
                  gen_throughput=None)
    assert old.stats[probing].breaker.state == "half_open"
    # h200 -> b200 behind the same URL: a new prior, so its corrections do not apply
    rows = [("mi300x-sglang", "mi300x", "amd", "sglang", 1.5),  # only the price changed
            ("mi355x-vllm", "mi355x", "amd", "vllm", 2.90),
            ("h100-vllm", "h100", "nvidia", "vllm", 2.95),
            ("h200-sglang", "b200", "nvidia", "sglang", 6.0),
            ("newcomer", "h100", "nvidia", "vllm", 2.95)]
    new = make_fleet(rows, ready=False)
    assert new.inherit(old, now=9.0) == 4
    assert new.value(teach, "k_tpot") == old.value(teach, "k_tpot") > 1.5
    assert new.stats[teach].requests == 20 and new.stats[teach].health.state == "ready"
    assert new.stats[tripped].breaker.state == "open"
    snap = new.snapshot(9.0)
    assert snap.col("usable_from")[tripped] == 6.0 + 5.0  # still cooling down
    assert new.stats[probing].breaker.state == "open"  # may probe again at once
    assert snap.col("usable_from")[probing] == 9.0
    assert new.column("in_flight")[busy] == 0  # those requests finish on the old fleet
    assert snap.col("active")[busy] == 3  # the engine's running + queued stands for them
    assert new.value(busy, "k_tpot") == 1.0 and old.value(busy, "k_tpot") > 1.5
    assert new.column("tpot_s")[busy] == old.column("tpot_s")[busy]
    newcomer = new.index["newcomer-0"]
    assert new.stats[newcomer].health.state == "pending" and new.stats[newcomer].requests == 0
    old.stats[teach].tpot_window.append(99.0)
    old.stats[teach].breaker.on_failure(10.0)
    assert 99.0 not in new.stats[teach].tpot_window  # copies, not shared
    assert new.stats[teach].breaker.consecutive_failures == 0
