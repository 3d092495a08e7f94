"""Issue 25 item 1: OpenAI's rate-limit headers from the limiter's state, and their duration
format (Go's ``time.Duration``, as OpenAI writes ``x-ratelimit-reset-*``).

``LimitEnforcer`` over the in-memory store with an injected clock: no sockets, no sleeps.
"""

from __future__ import annotations

import asyncio
import math
import re
from typing import Any

import pytest

from fleetgate.config.auth import KeyLimits
from fleetgate.gateway.auth import Principal
from fleetgate.gateway.errors import RateLimited
from fleetgate.gateway.limits import LimitEnforcer, openai_duration
from fleetgate.routing import RoutingRequest
from fleetgate.state.store import MemoryLimits

T0 = 1_790_000_000.0
MODEL = "llama-3.1-8b"
# what OpenAI sends and its clients parse: [Nh][Nm]N[.fff]s, or Nms
DURATION = re.compile(r"^(?:\d+h)?(?:\d+m)?\d+(?:\.\d+)?s$|^\d+ms$")


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0s"), (-3, "0s"), (math.nan, "0s"), (0.0004, "0s"), (0.02, "20ms"), (0.5, "500ms"),
    (0.9994, "999ms"), (0.9996, "1s"), (1, "1s"), (1.5, "1.5s"), (8.64, "8.64s"),
    (59.999, "59.999s"), (60, "1m0s"), (61.25, "1m1.25s"), (360, "6m0s"),
    (3723, "1h2m3s"), (3600, "1h0m0s"), (86400, "24h0m0s"), (math.inf, "277777h46m40s"),
])
def test_openai_duration_is_gos_format(seconds: float, text: str) -> None:
    assert openai_duration(seconds) == text
    assert DURATION.match(text)


def principal(**limits: Any) -> Principal:
    return Principal("k", "team", limits=KeyLimits(**limits))


def routing(max_tokens: int = 16) -> RoutingRequest:
    return RoutingRequest(MODEL, max_tokens=max_tokens, prompt_chars=20)  # 13 + 16 reserved


async def drained(enforcer: LimitEnforcer) -> None:
    while enforcer._tasks:
        await asyncio.gather(*enforcer._tasks, return_exceptions=True)


async def test_headers_name_only_the_limits_a_key_has() -> None:
    clock = Clock()
    enforcer = LimitEnforcer(MemoryLimits(), clock=clock)
    only_rpm = await enforcer.admit(principal(rpm=5), routing())
    assert only_rpm is not None
    assert set(enforcer.rate_headers(only_rpm, final=True)) == {
        "x-ratelimit-limit-requests", "x-ratelimit-remaining-requests",
        "x-ratelimit-reset-requests"}
    only_tpm = await enforcer.admit(principal(tpm=100), routing())
    assert only_tpm is not None
    assert set(enforcer.rate_headers(only_tpm, final=True)) == {
        "x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"}
    concurrency = await enforcer.admit(principal(concurrency=2), routing())
    assert concurrency is not None and enforcer.rate_headers(concurrency, final=True) == {}


async def test_remaining_counts_down_and_the_usage_replaces_the_reservation() -> None:
    clock = Clock()
    enforcer = LimitEnforcer(MemoryLimits(), clock=clock)
    key = principal(rpm=3, tpm=100)
    first = await enforcer.admit(key, routing())
    assert first is not None
    clock.t += 0.25
    # a stream's start: its reservation (13 prompt + 16 output) counts
    assert enforcer.rate_headers(first, final=False) == {
        "x-ratelimit-limit-requests": "3", "x-ratelimit-remaining-requests": "2",
        "x-ratelimit-reset-requests": "59.75s",
        "x-ratelimit-limit-tokens": "100", "x-ratelimit-remaining-tokens": "71",
        "x-ratelimit-reset-tokens": "1m0s"}
    first.tokens = 12.0  # a whole answer: what it used, as the settle will count it
    final = enforcer.rate_headers(first, final=True)
    assert final["x-ratelimit-remaining-tokens"] == "88"
    await enforcer.settle(first)
    await drained(enforcer)
    second = await enforcer.admit(key, routing())
    assert second is not None
    second.tokens = 12.0
    after = enforcer.rate_headers(second, final=True)
    assert after["x-ratelimit-remaining-requests"] == "1"
    assert after["x-ratelimit-remaining-tokens"] == "76"  # 100 - 12 - 12


async def test_an_rpm_429_carries_retry_after_and_both_limits_headers() -> None:
    clock = Clock()
    enforcer = LimitEnforcer(MemoryLimits(), clock=clock)
    key = principal(rpm=2, tpm=1000)
    for _ in range(2):
        admission = await enforcer.admit(key, routing())
        assert admission is not None
        admission.tokens = 10.0
        await enforcer.settle(admission)
        clock.t += 10
    await drained(enforcer)
    with pytest.raises(RateLimited) as refused:
        await enforcer.admit(key, routing())
    h = refused.value.headers
    assert h["retry-after"] == "40"  # the first request leaves the window at T0 + 60
    assert h["x-ratelimit-remaining-requests"] == "0"
    assert h["x-ratelimit-reset-requests"] == "40s"
    assert h["x-ratelimit-limit-tokens"] == "1000"
    assert h["x-ratelimit-remaining-tokens"] == "980"
    assert DURATION.match(h["x-ratelimit-reset-tokens"])


async def test_a_tpm_429_says_when_the_request_fits() -> None:
    clock = Clock()
    enforcer = LimitEnforcer(MemoryLimits(), clock=clock)
    key = principal(rpm=100, tpm=30)
    held = await enforcer.admit(key, routing())  # reserves 29 of 30
    assert held is not None
    clock.t += 1.5
    with pytest.raises(RateLimited) as refused:
        await enforcer.admit(key, routing())
    h = refused.value.headers
    assert h["retry-after"] == "59"
    assert h["x-ratelimit-remaining-tokens"] == "1"
    assert h["x-ratelimit-reset-tokens"] == "58.5s"
    assert h["x-ratelimit-remaining-requests"] == "98"  # the refused request was counted
