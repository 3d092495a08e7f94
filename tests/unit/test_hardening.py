"""Issue 15 (hardening), the defects that can be shown without a socket: the breaker's
half-open slot, the bounded JSON decode, the ``x-request-id`` policy."""

from __future__ import annotations

import pytest

from fleetgate.config import FleetConfig
from fleetgate.gateway.api.parse import MAX_JSON_DEPTH, decode_json, request_id_of
from fleetgate.gateway.errors import BadRequest
from fleetgate.state.fleet import Fleet
from fleetgate.state.live import LiveFleet

MODEL, SERVED = "llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct"


def _fleet() -> Fleet:
    config = FleetConfig.model_validate({"pools": [{
        "name": "h100", "accelerator": "h100", "engine": "vllm", "price_per_gpu_hour": 2.9,
        "endpoints": ["http://h100:8000"], "models": {MODEL: SERVED}}]})
    fleet = Fleet(config, http=None)  # type: ignore[arg-type]  # never started: no I/O
    fleet.live.on_probe(0, 0.0, True, "200")
    return fleet


def _routable(live: LiveFleet, now: float) -> bool:
    """What the router reads (``usable_from``) and what the breaker says agree: it may go."""
    usable = bool(live.snapshot(now).col("usable_from")[0] <= now)
    assert usable == live.stats[0].breaker.allows(now)
    return usable


@pytest.mark.parametrize("ending", ["client_error", "cancel"])
def test_defect_1_a_half_open_trial_without_a_verdict_releases_the_slot(ending: str) -> None:
    """The one trial request after the cooldown ends with a 4xx (not the engine's fault) or
    the client leaves: the endpoint must get another trial, not stay excluded for good."""
    live = _fleet().live
    live.on_refused(0, 0.0, "refused")  # open at once
    cooldown = live.stats[0].breaker.cooldown_s
    now = cooldown + 1.0
    live.on_probe(0, now, True, "200")  # the engine is back
    assert _routable(live, now)  # cooldown over: one trial may go
    live.on_dispatch(0, now)
    assert live.stats[0].breaker.state == "half_open"
    assert not _routable(live, now)  # the trial is in flight
    if ending == "client_error":
        live.on_failure(0, now + 0.1, counts_against_engine=False)
    else:
        live.on_cancel(0)
    assert live.stats[0].breaker.state != "closed"  # no verdict: not closed either
    assert _routable(live, now + 0.2)  # but a new trial may go
    live.on_dispatch(0, now + 0.2)
    live.on_finish(0, now + 0.3, 4, 0.1, None)
    assert live.stats[0].breaker.state == "closed"


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 255, 600, 1024, 5000])
def test_defect_4_deep_json_is_a_400(depth: int) -> None:
    raw = b'{"model":"m","x":' + b"[" * depth + b"]" * depth + b"}"
    with pytest.raises(BadRequest, match="nested"):
        decode_json(raw)


def test_defect_4_json_at_the_depth_limit_is_accepted() -> None:
    depth = MAX_JSON_DEPTH - 1  # the object itself is one level
    raw = b'{"x":' + b"[" * depth + b"]" * depth + b"}"
    assert decode_json(raw)["x"] is not None


def test_defect_4_shallow_bodies_with_many_brackets_are_accepted() -> None:
    """Counting brackets only decides whether to walk the body: brackets inside strings,
    or many containers side by side, are no depth."""
    in_text = b'{"model":"m","messages":[{"role":"user","content":"' + b"[{" * 500 + b'"}]}'
    assert decode_json(in_text)["model"] == "m"
    wide = b'{"model":"m","x":[' + b",".join([b'{"a":[1]}'] * 300) + b"]}"
    assert len(decode_json(wide)["x"]) == 300


@pytest.mark.parametrize(("given", "kept"), [
    ("abc-123_DEF.x:y", True),
    ("a" * 128, True),
    ("a" * 129, False),
    ("a" * 1_000_000, False),
    ("r\u00e9sum\u00e9", False),  # non-ASCII: would be garbled upstream
    ("has space", False),
    ('quote"d', False),
    ("", False),
    (None, False),
])
def test_defect_7_request_id_policy(given: str | None, kept: bool) -> None:
    rid = request_id_of(given)
    if kept:
        assert rid == given
    else:
        assert rid != given and 0 < len(rid) <= 128 and rid.isascii() and rid.isalnum()
