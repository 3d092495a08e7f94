"""Prefix caching: the emulated engine's cache, the gateway's prefix index and the
``prefix_cache`` scorer (table-driven where it helps; no clocks, no sockets)."""

from __future__ import annotations

import numpy as np
import pytest
from routing_fixtures import make_fleet, pipeline, request

from fleetgate.catalog.gpus import GPUS
from fleetgate.catalog.models import MODEL_PROFILES
from fleetgate.config.schema import PolicyConfig
from fleetgate.emulator.metrics import EngineGauges
from fleetgate.emulator.metrics_sglang import SglangMetrics
from fleetgate.emulator.metrics_vllm import VllmMetrics
from fleetgate.emulator.parsing import CHARS_PER_TOKEN
from fleetgate.emulator.perfmodel import EngineSim
from fleetgate.emulator.prefixcache import (
    BLOCK_CHARS,
    BLOCK_TOKENS,
    PrefixCache,
    chat_text,
    text_block_hashes,
)
from fleetgate.routing.plugins import PluginError
from fleetgate.routing.plugins.prefix_cache import CHUNK_CHARS, CHUNK_TOKENS, chunk_hashes
from fleetgate.routing.policies import build_pipeline
from fleetgate.state.prefix import PrefixIndex

# -- the emulated engine's cache ----------------------------------------------------------


def test_block_hashes_are_chained_over_full_blocks_only() -> None:
    a = text_block_hashes("x" * (3 * BLOCK_CHARS + 10))
    b = text_block_hashes("x" * (3 * BLOCK_CHARS) + "y" * 10)
    c = text_block_hashes("z" + "x" * (3 * BLOCK_CHARS - 1))
    assert len(a) == 3 and a == b  # the partial block is not hashed
    assert not set(a) & set(c)  # a different first block changes every later hash
    assert len(set(text_block_hashes("x" * 4 * BLOCK_CHARS))) == 4  # same text, other position
    assert BLOCK_CHARS == BLOCK_TOKENS * CHARS_PER_TOKEN
    assert chat_text([{"role": "system", "content": "s"}, {"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]) == \
        "<|system|>s<|user|>ab"


def test_cache_lru_keeps_held_blocks_and_evicts_the_tail_of_a_prompt_first() -> None:
    cache = PrefixCache()
    cache.hold((1, 2, 3))
    cache.trim(0)  # held blocks are never evicted
    assert cache.lookup((1, 2, 3, 4)) == 3
    cache.release((1, 2, 3))
    cache.hold((7, 8))
    cache.release((7, 8))  # most recent: 8, then 7, then 1, 2, 3 (head last)
    cache.trim(4)
    assert cache.lookup((1, 2, 3)) == 2  # block 3, the least recently used tail, went first
    cache.trim(2)
    assert cache.lookup((1,)) == 0 and cache.lookup((7, 8)) == 2
    assert len(cache) == 2


def _engine() -> EngineSim:
    return EngineSim(GPUS["h100"], MODEL_PROFILES["llama-3.1-8b"])


def _first_tokens(sim: EngineSim) -> tuple[dict[str, int], float]:
    """Run to completion; cached tokens per request and the engine time it took."""
    cached, elapsed = {}, 0.0
    while (duration := sim.next_step_duration()) is not None:
        elapsed += duration
        for ev in sim.step():
            if ev.index == 0:
                cached[ev.request_id] = ev.cached_tokens
    return cached, elapsed


def test_a_cached_prefix_skips_its_prefill() -> None:
    prefix = text_block_hashes("p" * 3000 * CHARS_PER_TOKEN)
    cold, warm = _engine(), _engine()
    warm.add("first", 3000, 1, prefix)
    _first_tokens(warm)
    for sim in (cold, warm):
        sim.add("second", 3000, 1, prefix)
    (cold_cached, cold_s), (warm_cached, warm_s) = _first_tokens(cold), _first_tokens(warm)
    assert cold_cached == {"second": 0}
    assert warm_cached == {"second": 187 * BLOCK_TOKENS}  # whole blocks: 2,992 tokens
    assert warm_s < cold_s / 10
    warm.add("exact", 187 * BLOCK_TOKENS, 1, prefix)
    assert _first_tokens(warm)[0] == {"exact": 2991}  # the last token is always computed
    c = warm.counters()
    assert (c.prefix_queries_total, c.prefix_hits_total) == (6000 + 2992, 2992 + 2991)


def test_no_hashes_is_exactly_the_old_behaviour() -> None:
    runs = []
    for hashes in ((), text_block_hashes("q" * 4000)):
        sim = _engine()
        for k in range(3):
            sim.add(f"r{k}", 1000, 20, () if k == 0 else hashes if k == 2 else ())
        runs.append(_first_tokens(sim))
    assert runs[0][0] == {"r0": 0, "r1": 0, "r2": 0}
    assert runs[0] == runs[1]  # a first sighting is a miss: same steps, same times


def test_cache_is_bounded_by_free_kv_and_held_blocks_survive() -> None:
    sim = _engine()
    blocks = sim.kv_capacity_tokens // BLOCK_TOKENS
    for k in range(4):  # prompts of a third of the cache each: they cannot all stay cached
        tokens = sim.kv_capacity_tokens // 3
        sim.add(f"r{k}", tokens, 1, tuple(range(k * blocks, k * blocks + tokens // BLOCK_TOKENS)))
        _first_tokens(sim)
        assert len(sim.prefix_cache) <= blocks
    sim.add("again0", sim.kv_capacity_tokens // 3, 1, tuple(range(blocks // 3)))
    assert _first_tokens(sim)[0] == {"again0": 0}  # the oldest prompt was evicted
    last = 3 * blocks
    sim.add("again3", sim.kv_capacity_tokens // 3, 1, tuple(range(last, last + blocks // 3)))
    assert _first_tokens(sim)[0]["again3"] > 0  # the newest one is still there


def test_engine_metrics_report_queries_hits_and_hit_rate() -> None:
    gauges = EngineGauges(running=0, waiting=0, kv_usage=0.0, kv_used_tokens=0,
                          kv_capacity_tokens=1000, gen_throughput=0.0, preemptions_total=0,
                          prefix_queries_total=400, prefix_hits_total=100)
    vllm = VllmMetrics("m", 4096).render("", gauges)[0].decode()
    assert 'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 400.0' in vllm
    assert 'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 100.0' in vllm
    sglang = SglangMetrics("m", 1, 4096)
    sglang.render("", gauges)
    later = EngineGauges(**{**gauges.__dict__, "prefix_queries_total": 600,
                            "prefix_hits_total": 250})
    text = sglang.render("", later)[0].decode()
    line = next(s for s in text.splitlines() if s.startswith("sglang:cache_hit_rate{"))
    assert float(line.split()[-1]) == pytest.approx(150 / 200)  # since the last scrape


# -- the gateway's prefix index -----------------------------------------------------------


def test_chunk_hashes_are_chained_and_cheap_to_compare() -> None:
    text = "a" * (2 * CHUNK_CHARS) + "b" * CHUNK_CHARS
    h = chunk_hashes(text)
    assert len(h) == 3 and chunk_hashes(text + "tail") == h
    assert chunk_hashes("c" + text[1:])[1:] != h[1:]
    assert chunk_hashes("short") == ()


def _index(capacity_chunks: list[int]) -> PrefixIndex:
    fleet = make_fleet()
    return PrefixIndex(fleet.endpoints[:len(capacity_chunks)],
                       [c * 64.0 for c in capacity_chunks])


@pytest.mark.parametrize(("sent", "query", "expected"), [
    ({0: (1, 2, 3)}, (1, 2, 3, 4), [3, 0, 0]),
    ({0: (1, 2, 3), 1: (1, 2)}, (1, 2, 3), [3, 2, 0]),
    ({0: (1, 2, 3), 2: (1, 9)}, (1, 2), [2, 0, 1]),
    ({1: (5, 6)}, (1, 2), [0, 0, 0]),
    ({0: (1, 2)}, (), [0, 0, 0]),
])
def test_index_matches_leading_chunks_per_endpoint(sent: dict, query: tuple,
                                                   expected: list[int]) -> None:
    index = _index([100, 100, 100])
    for i, hashes in sent.items():
        index.record(i, hashes)
    assert index.matched(query, 3).tolist() == expected


def test_index_lru_is_bounded_by_kv_capacity_and_keeps_prompt_heads() -> None:
    index = _index([4, 100])
    index.record(0, (1, 2, 3))
    index.record(0, (10, 11, 12))  # 6 chunks into room for 4: the oldest tails go first
    assert index.size(0) == 4
    assert index.matched((10, 11, 12), 2).tolist() == [3, 0]
    assert index.matched((1, 2, 3), 2).tolist() == [1, 0]  # its head outlived its tail
    index.record(0, (1, 2, 3))  # sent again: most recent
    assert index.matched((1, 2, 3), 2).tolist() == [3, 0]


def test_index_carries_over_a_reload_by_url() -> None:
    old = _index([100, 100])
    old.record(1, (1, 2))
    fleet = make_fleet()
    new = PrefixIndex(fleet.endpoints[1::-1], [6400.0, 6400.0])  # same endpoints, swapped
    new.inherit(old)
    assert new.matched((1, 2), 2).tolist() == [2, 0]


# -- the scorer ---------------------------------------------------------------------------


def _prefix_policy(**params: object):  # type: ignore[no-untyped-def]
    return pipeline("weighted", scorers=[{"name": "queue", "weight": 1},
                                         {"name": "prefix_cache", "weight": 2,
                                          "params": params}])


def test_scorer_follows_the_cached_prefix_and_scores_the_matched_fraction() -> None:
    live = make_fleet()
    hashes = (11, 12, 13, 14)
    live.prefix.record(2, hashes)
    live.prefix.record(1, hashes[:1])
    decision = _prefix_policy().route(request(prefix_hashes=hashes), live.snapshot(1.0))
    assert decision.chosen is not None and decision.chosen.pool == "h100-vllm"
    scores = {c.endpoint.pool: c.scores["prefix_cache"] for c in decision.ranked}
    assert scores == {"mi300x-sglang": 0.0, "mi355x-vllm": 0.25, "h100-vllm": 1.0,
                      "h200-sglang": 0.0}
    plain = _prefix_policy().route(request(), live.snapshot(1.0))  # no hashes: all 0
    assert all(c.scores["prefix_cache"] == 0.0 for c in plain.ranked)


def test_affinity_yields_to_load_past_the_balance_threshold() -> None:
    live = make_fleet()
    hashes = (21, 22)
    live.prefix.record(2, hashes)
    for _ in range(20):
        live.on_dispatch(2, 1.0)  # h100 has 20 requests, the others none
    snap = live.snapshot(1.0)
    hot = _prefix_policy(balance_abs=8, balance_rel=1.5).route(request(prefix_hashes=hashes), snap)
    assert hot.chosen is not None and hot.chosen.pool != "h100-vllm"
    assert {c.endpoint.pool: c.scores["prefix_cache"] for c in hot.ranked}["h100-vllm"] == 0.0
    lax = _prefix_policy(balance_abs=50).route(request(prefix_hashes=hashes), snap)
    assert lax.chosen is not None and lax.chosen.pool == "h100-vllm"


def test_prefix_cache_params_are_validated_at_config_load() -> None:
    policy = PolicyConfig.model_validate({"strategy": "weighted", "scorers": [
        {"name": "prefix_cache", "params": {"balance_rel": 0.5}}]})
    with pytest.raises(PluginError, match=r"scorers\[0\]\.params\.balance_rel"):
        build_pipeline("p", policy)


def test_dispatch_hook_arrays_stay_aligned_with_the_snapshot() -> None:
    live = make_fleet()
    snap = live.snapshot(0.0)
    assert snap.prefix is live.prefix
    assert np.array_equal(snap.prefix.matched((1,), len(snap.endpoints)),
                          np.zeros(len(snap.endpoints)))


def test_the_index_follows_the_capacity_an_engine_reports() -> None:
    live = make_fleet()
    live.prefix.record(0, list(range(100)))
    assert live.prefix.size(0) == 100
    live.on_capacity(0, kv_capacity_tokens=10 * CHUNK_TOKENS)
    assert live.prefix.size(0) == 10
