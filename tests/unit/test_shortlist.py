"""The shortlist a decision looks at when a model has thousands of endpoints
(``routing/shortlist.py``): what it always holds, that it covers the fleet, that it keeps a
session's endpoint, a prompt's cache and a decision's estimates, and the fallback."""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import replace

from routing_fixtures import MODEL, SERVED, pipeline, request

from fleetgate.routing import Endpoint
from fleetgate.routing.plugins.prefix_cache import chunk_hashes
from fleetgate.routing.shortlist import SHORTLIST_FROM, SHORTLIST_SIZE
from fleetgate.state.live import LiveFleet
from fleetgate.state.prior import endpoint_prior

# (pool, accelerator, $/GPU-hr, replicas): a big dear pool, a middle one, a small cheap one
POOLS = [("h100", "h100", 2.95, 2300), ("h200", "h200", 3.60, 380), ("mi300x", "mi300x", 1.20, 20)]


def big_fleet(seed: int = 3, loaded: bool = True) -> LiveFleet:
    infos, priors = [], []
    for pool, acc, price, count in POOLS:
        for n in range(count):
            infos.append(Endpoint(f"{pool}-{n}", pool, f"http://{pool}-{n}", "vllm", acc,
                                  "nvidia", {MODEL: SERVED}, {}, price))
            priors.append(endpoint_prior(acc, SERVED))
    live = LiveFleet(infos, priors)
    rng = random.Random(seed)
    for i in range(len(infos)):
        live.on_probe(i, 0.0, True, "200")
        if loaded:
            live.on_scrape(i, 0.0, rng.randint(0, 4), 0, rng.random() * 0.5, 1e6, None)
    return live


def test_the_shortlist_holds_every_pool_in_proportion_and_covers_the_fleet() -> None:
    live = big_fleet()
    assert len(live.endpoints) > SHORTLIST_FROM and live.snapshot(1.0).shared
    pipe = pipeline("least_loaded")
    seen: set[int] = set()
    n = len(live.endpoints)
    for _ in range(math.ceil(n / SHORTLIST_SIZE) + 1):
        d = pipe.route(request(), live.snapshot(1.0))
        idx = d.idx.tolist()
        assert len(idx) == len(set(idx)) <= SHORTLIST_SIZE + 64  # windows and a few others
        pools = [live.endpoints[i].pool for i in idx]
        assert pools.count("mi300x") == 20  # a small pool is looked at whole
        for pool, _, _, count in POOLS[:2]:  # the others at least in proportion
            assert pools.count(pool) >= math.ceil(SHORTLIST_SIZE * count / n)
        seen.update(idx)
    assert len(seen) == n  # every endpoint looked at within ceil(n / size) + 1 decisions


def test_round_robin_takes_every_endpoint_in_turn() -> None:
    live = big_fleet()
    pipe = pipeline("round_robin")
    n = len(live.endpoints)
    counts = Counter(pipe.route(request(), live.snapshot(1.0)).chosen.id for _ in range(3 * n))
    assert len(counts) == n  # each one...
    assert max(counts.values()) - min(counts.values()) <= 3  # ...about as often as the others


def test_power_of_two_draws_from_a_fair_sample() -> None:
    live = big_fleet(loaded=False)  # all alike: no candidate is better than another
    pipe = pipeline("power_of_two")
    chosen = [pipe.route(request(), live.snapshot(1.0)).chosen.id for _ in range(400)]
    assert len(set(chosen)) > 300  # no recent winner drawn again and again


def test_cost_finds_the_small_cheap_pool_and_keeps_filling_its_replica() -> None:
    live = big_fleet()
    pipe = pipeline("cost", slo={"ttft_ms": 2000, "tpot_ms": 60})
    full = live.snapshot(1.0).by_model[(MODEL, "chat")]
    first = pipe.route(request(), live.snapshot(1.0))
    every = pipe._route(request(), live.snapshot(1.0), full)  # the same, over all endpoints
    assert first.chosen.pool == every.chosen.pool == "mi300x"
    chosen = live.index[first.chosen.id]
    live.on_dispatch(chosen, 1.0)
    d = pipe.route(request(), live.snapshot(1.0))
    assert chosen in d.idx.tolist()  # the replica being filled stays in view


def test_a_session_keeps_its_endpoint_as_without_a_shortlist() -> None:
    live = big_fleet()
    pipe = pipeline("affinity")
    full = live.snapshot(1.0).by_model[(MODEL, "chat")]
    for n in range(40):
        req = request(user=f"session-{n}")
        short = pipe.route(req, live.snapshot(1.0)).chosen
        assert short == pipe._route(req, live.snapshot(1.0), full).chosen
        assert pipe.route(req, live.snapshot(1.0)).chosen == short  # windows moved; it did not
    req = request(user="session-7")
    first = pipe.route(req, live.snapshot(1.0)).chosen
    live.set_health(live.index[first.id], 1.0, "not_ready", "503")  # it leaves: the next
    after = pipe.route(req, live.snapshot(2.0)).chosen
    assert after != first
    assert after == pipe._route(req, live.snapshot(2.0), full).chosen


def test_where_the_prompt_was_sent_is_always_in_view() -> None:
    live = big_fleet()
    prompt = "You are a careful assistant. " * 200
    req = request(prompt_chars=len(prompt), prefix_hashes=chunk_hashes(prompt))
    holder = live.index["h100-1234"]
    live.prefix.record(holder, req.prefix_hashes)
    pipe = pipeline("least_loaded")
    for _ in range(5):
        d = pipe.route(req, live.snapshot(1.0))
        k = d.idx.tolist().index(holder)
        assert d.estimates.prefix_chunks[k] == len(req.prefix_hashes)


def test_nothing_eligible_in_view_falls_back_to_every_endpoint() -> None:
    live = big_fleet(loaded=False)
    keep = live.index["h200-17"]
    for i in range(len(live.endpoints)):
        if i != keep:
            live.set_health(i, 1.0, "not_ready", "503")
    d = pipeline("least_loaded").route(request(), live.snapshot(2.0))
    assert d.chosen is not None and d.chosen.id == "h200-17"


def test_a_decision_on_shared_rows_keeps_the_instant_it_was_made_at() -> None:
    live = big_fleet()
    snap = live.snapshot(1.0)
    copy = replace(snap, live=snap.live.copy(), shared=False)  # the same instant, copied
    d = pipeline("round_robin").route(request(), snap)  # round robin: no estimate run yet
    i, k = live.index[d.chosen.id], int(d.order[0])
    before = live.value(i, "active")
    for _ in range(30):
        live.on_dispatch(i, 1.0)
    assert live.value(i, "active") == before + 30 and snap.live[0, i] == before + 30
    assert d.estimates.active[k] == before
    alone = pipeline("round_robin")._route(request(), copy, d.idx).estimates
    for name in ("ttft_s", "tpot_s", "usd_per_mtok", "marginal_usd", "slo_capacity"):
        assert d.estimate(name) == alone.at(name, k)
    assert d.explain(1)["candidates"][0]["estimates"]["active"] == before
