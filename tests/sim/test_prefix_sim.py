"""Prefix caching in the simulator: shared prefixes hash alike for the engines and the
router, and the ``prefix_cache`` scorer keeps a group where its prefix is cached, so first
tokens come sooner (virtual time: deterministic, not a wall-clock assert)."""

from __future__ import annotations

from sim_fixtures import SLO, fleet, pool, workload

from fleetgate.sim.arrivals import generate
from fleetgate.sim.prefixes import SimPrefixes
from fleetgate.sim.run import simulate

PREFIX_POLICIES = {
    "least_loaded": {"strategy": "least_loaded"},
    "prefix": {"strategy": "weighted", "slo": SLO, "scorers": [
        {"name": "queue", "weight": 1}, {"name": "prefix_cache", "weight": 2}]},
}


def _workload(groups: int, tokens: int, rate: float = 12.0,  # type: ignore[no-untyped-def]
              duration: float = 60.0):
    return workload(rate=rate, duration=duration, requests={
        "model": "llama-3.1-8b", "input_tokens": {"dist": "fixed", "value": 100},
        "output_tokens": {"dist": "fixed", "value": 20},
        "prefix": {"groups": groups, "tokens": tokens}})


def test_requests_of_a_group_share_prefix_hashes_and_nothing_else() -> None:
    reqs = generate(_workload(groups=3, tokens=1000), seed=1)
    hashes = SimPrefixes(reqs)
    by_group: dict[int, list[int]] = {}
    for r in range(len(reqs)):
        by_group.setdefault(int(reqs.prefix_group[r]), []).append(r)
    a, b = by_group[0][:2]
    other = by_group[1][0]
    ea, eb = hashes.engine_blocks(a), hashes.engine_blocks(b)
    assert len(ea) == (1000 + 100) // 16
    assert ea[:62] == eb[:62] and not set(ea[62:]) & set(eb)  # 1000 // 16 shared blocks
    assert not set(hashes.engine_blocks(other)) & set(ea)
    assert hashes.routing_chunks(a)[:15] == hashes.routing_chunks(b)[:15]  # 1000 // 64


def test_the_prefix_scorer_lowers_ttft_on_a_prefix_heavy_workload() -> None:
    # Two H100 replicas (~420k KV tokens each): 200 prefixes of 3,000 tokens (600k) do not
    # fit in one replica's cache, but do in the pair's when each group stays on one replica.
    config = fleet(pool("h100", "emulated://vllm/h100", 2), policies=PREFIX_POLICIES)
    report = simulate(config, _workload(groups=200, tokens=3000, rate=8.0, duration=120),
                      None, None, seed=2).as_json()["policies"]
    plain, prefix = report["least_loaded"], report["prefix"]
    assert prefix["ttft_ms"]["p50"] < plain["ttft_ms"]["p50"] * 0.5, (plain, prefix)
    assert prefix["usd_per_mtok"] <= plain["usd_per_mtok"], (plain, prefix)
