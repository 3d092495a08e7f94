"""Builders for routing unit tests: a LiveFleet of named endpoints with a fake clock."""

from __future__ import annotations

from fleetgate.config.schema import PolicyConfig
from fleetgate.routing import Endpoint, RoutingRequest
from fleetgate.routing.estimate import prior_tpot
from fleetgate.routing.policies import build_pipeline
from fleetgate.state.live import LiveFleet
from fleetgate.state.prior import endpoint_prior

MODEL = "llama-3.1-8b"
SERVED = "meta-llama/Llama-3.1-8B-Instruct"

# (pool, accelerator, vendor, engine, $/GPU-hr)
FLEET = [
    ("mi300x-sglang", "mi300x", "amd", "sglang", 1.99),
    ("mi355x-vllm", "mi355x", "amd", "vllm", 2.90),
    ("h100-vllm", "h100", "nvidia", "vllm", 2.95),
    ("h200-sglang", "h200", "nvidia", "sglang", 3.60),
]


def make_fleet(rows: list[tuple[str, str, str, str, float]] | None = None,
               labels: dict[str, dict[str, str]] | None = None, ready: bool = True) -> LiveFleet:
    infos, priors = [], []
    for pool, acc, vendor, engine, price in rows or FLEET:
        infos.append(Endpoint(f"{pool}-0", pool, f"http://{pool}", engine, acc, vendor,
                                  {MODEL: SERVED}, (labels or {}).get(pool, {}), price))
        priors.append(endpoint_prior(acc, SERVED))
    live = LiveFleet(infos, priors, breaker_threshold=3, breaker_cooldown_s=5.0)
    if ready:
        for i in range(len(infos)):
            live.on_probe(i, 0.0, True, "200")
    return live


def pipeline(strategy: str, seed: int = 7, **kw: object):  # type: ignore[no-untyped-def]
    return build_pipeline(strategy, PolicyConfig.model_validate({"strategy": strategy, **kw}),
                          seed=seed)


def request(**kw: object) -> RoutingRequest:
    base: dict[str, object] = {"model": MODEL, "prompt_chars": 2000, "max_tokens": 128}
    base.update(kw)
    return RoutingRequest(**base)  # type: ignore[arg-type]


def chosen_pool(decision) -> str:  # type: ignore[no-untyped-def]
    assert decision.chosen is not None, decision.reason
    return str(decision.chosen.pool)


def serve(live: LiveFleet, i: int, now: float, slower: float, prompt: int = 500,
          tokens: int = 100) -> None:
    """One request on endpoint ``i`` dispatched and finished at ``now``, its TPOT ``slower``
    times what the uncorrected prior predicts for it."""
    sample = live.on_dispatch(i, now, 0.1, prompt)
    batch = live.value(i, "active")
    tpot = slower * prior_tpot(live.snapshot(now).static, i, prompt, tokens, batch,
                               live.value(i, "prefill_tokens_per_s"))
    live.on_first_token(i, now, None)  # a non-streamed answer arrived
    live.on_finish(i, now, tokens, tpot * tokens, tpot, sample)
