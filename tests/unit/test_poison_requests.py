"""Issue 24 item 1 in-process: what one request's content causes counts against no breaker.

A real ``ProxyService`` over a real ``Fleet`` and router with ``FakeBackend`` engines (no
sockets), the breaker state machine alone, and the gateway's field checks.
"""

from __future__ import annotations

from typing import Any

import pytest

from fleetgate.backends.fake import Answer, FakeBackend, Refuse
from fleetgate.backends.relay import Timeouts
from fleetgate.config import FleetConfig
from fleetgate.gateway.api.parse import routing_request
from fleetgate.gateway.decisions import DecisionLog
from fleetgate.gateway.errors import BadRequest, UpstreamFailed
from fleetgate.gateway.proxy.apis import APIS
from fleetgate.gateway.proxy.request import ProxyRequest
from fleetgate.gateway.proxy.service import Generation, ProxyService
from fleetgate.routing import RoutingRequest, build_router
from fleetgate.state.breaker import CircuitBreaker
from fleetgate.state.fleet import Fleet

FAST, SLOW = "http://h200:8000", "http://h100:8000"
MODEL, SERVED = "llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct"
CRASH = b"Internal Server Error"  # what an engine's unhandled exception answers
OK = b'{"model":"%s","choices":[],"usage":{"completion_tokens":2}}' % SERVED.encode()


def service(backend: FakeBackend, engines: tuple[str, str] = ("vllm", "vllm"),
            attempts: int = 3) -> tuple[ProxyService, Fleet]:
    rows = (("h200", "h200", 3.6, FAST, engines[0]), ("h100", "h100", 2.9, SLOW, engines[1]))
    pools = [{"name": name, "accelerator": gpu, "engine": engine, "price_per_gpu_hour": price,
              "endpoints": [url], "models": {MODEL: SERVED}}
             for name, gpu, price, url, engine in rows]
    config = FleetConfig.model_validate({"pools": pools, "default_policy": "fast",
                                         "policies": {"fast": {"strategy": "latency"}}})
    fleet = Fleet(config, http=None)  # type: ignore[arg-type]  # never started: no I/O
    for i in range(len(fleet.endpoints)):
        fleet.live.on_probe(i, fleet.clock(), True, "200")
    gen = Generation(fleet, build_router(config), {"fast": attempts}, {"fast": None})
    return ProxyService(lambda: gen, backend, Timeouts(), DecisionLog()), fleet


def request(tenant: str | None = "noisy", **body: Any) -> ProxyRequest:
    routing = RoutingRequest(MODEL, api="chat", stream=False, max_tokens=2, prompt_chars=1,
                             tenant=tenant)
    return ProxyRequest(APIS["chat"], routing, {"model": MODEL, **body}, "rid", False)


def breakers(fleet: Fleet) -> list[tuple[str, int]]:
    return [(s.breaker.state, s.breaker.consecutive_failures) for s in fleet.live.stats]


async def test_poison_requests_from_one_tenant_open_no_breaker() -> None:
    """The issue's reproduction: every engine answers 500 to the request's content. Before
    the fix each 500 counted against the endpoint that answered it: 15 such requests opened
    both breakers of a two-pool fleet. Now the second endpoint failing the same way marks
    it poison: 502 to the client, nothing counted, however many are sent."""
    backend = FakeBackend({FAST: [Answer(500, CRASH)], SLOW: [Answer(500, CRASH)]})
    proxy, fleet = service(backend)
    for _ in range(40):
        with pytest.raises(UpstreamFailed) as caught:
            await proxy.handle(request(tools=5))
        assert caught.value.code == "upstream_request_failed"
        assert breakers(fleet) == [("closed", 0), ("closed", 0)]
    assert len(backend.calls) == 80  # one second opinion each, no third try
    entry = proxy.decisions.latest(1)[0]
    assert entry["attempts"][-1].get("poison") is True


async def test_an_engine_that_fails_what_its_twin_serves_still_trips() -> None:
    """The same engine and model answer the same request elsewhere: the 500s are the
    engine's, whoever sends them; its breaker opens at the threshold."""
    backend = FakeBackend({FAST: [Answer(500, CRASH)], SLOW: [Answer(200, OK)]})
    proxy, fleet = service(backend)
    for n in range(1, 6):
        response = await proxy.handle(request())
        assert response.status_code == 200 and response.headers["x-fleetgate-pool"] == "h100"
        assert fleet.live.stats[0].breaker.consecutive_failures == n
    assert fleet.live.stats[0].breaker.state == "open"


async def test_a_500_only_one_engine_kind_gives_counts_once_per_tenant() -> None:
    """vLLM answers 500 to what SGLang serves: the request's content may be the cause, so one
    tenant adds at most one failure however many it sends; each other tenant adds one."""
    backend = FakeBackend({FAST: [Answer(500, CRASH)], SLOW: [Answer(200, OK)]})
    proxy, fleet = service(backend, engines=("vllm", "sglang"))
    for _ in range(30):
        assert (await proxy.handle(request("noisy"))).status_code == 200
    assert breakers(fleet)[0] == ("closed", 1)
    backend = FakeBackend({FAST: [Answer(500, CRASH)], SLOW: [Answer(200, OK)]})
    proxy, fleet = service(backend, engines=("vllm", "sglang"))  # nothing learned yet
    for n in range(5):
        await proxy.handle(request(f"t{n}"))
        assert backend.calls[2 * n][0].startswith(FAST)
    assert breakers(fleet)[0] == ("open", 5)


async def test_a_4xx_on_the_second_opinion_clears_the_first_500() -> None:
    backend = FakeBackend({FAST: [Answer(500, CRASH)],
                           SLOW: [Answer(400, b'{"object":"error","message":"bad tools",'
                                               b'"type":"BadRequestError","code":400}')]})
    proxy, fleet = service(backend)
    for _ in range(10):
        assert (await proxy.handle(request())).status_code == 400
    assert breakers(fleet) == [("closed", 0), ("closed", 0)]


async def test_a_500_with_no_second_opinion_counts_once_per_tenant() -> None:
    backend = FakeBackend({FAST: [Answer(500, CRASH)], SLOW: [Refuse("connect")]})
    proxy, fleet = service(backend, attempts=1)
    for _ in range(20):
        with pytest.raises(UpstreamFailed):
            await proxy.handle(request())
    assert breakers(fleet)[0] == ("closed", 1)


async def test_engine_failures_still_trip_whoever_sends_them() -> None:
    backend = FakeBackend({FAST: [Answer(503, b"{}")], SLOW: [Answer(200, OK)]})
    proxy, fleet = service(backend)
    for _ in range(5):
        await proxy.handle(request())
    assert fleet.live.stats[0].breaker.state == "open"


def test_breaker_counts_a_source_once_per_failure_run() -> None:
    breaker = CircuitBreaker(failure_threshold=3)
    for _ in range(100):
        breaker.on_failure(1.0, "noisy")
    assert (breaker.state, breaker.consecutive_failures) == ("closed", 1)
    breaker.on_failure(1.0, "other")
    breaker.on_failure(1.0)  # the engine's own failure always counts
    assert breaker.state == "open"
    breaker.on_success()
    assert breaker.blamed == set()
    breaker.on_failure(2.0, "noisy")  # a new run: counted again, once
    assert breaker.consecutive_failures == 1


BASE = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}


@pytest.mark.parametrize(("api", "extra", "param"), [
    ("chat", {"tools": 5}, "tools"),
    ("chat", {"tools": -1}, "tools"),
    ("chat", {"tools": True}, "tools"),
    ("chat", {"tools": []}, "tools"),
    ("chat", {"tools": [{"type": "function", "function": {"name": 5}}]},
     "tools[0].function.name"),
    ("messages", {"tools": 5}, "tools"),
    ("chat", {"temperature": "hot"}, "temperature"),
    ("chat", {"temperature": 9}, "temperature"),
    ("chat", {"n": 1000}, "n"),
    ("chat", {"n": "2"}, "n"),
    ("chat", {"tool_choice": 5}, "tool_choice"),
    ("chat", {"response_format": 5}, "response_format"),
    ("chat", {"response_format": {"type": "yaml"}}, "response_format.type"),
    ("chat", {"stop": 5}, "stop"),
    ("chat", {"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ("chat", {"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ("chat", {"messages": [{"role": "user", "content": [{"type": 1}]}]},
     "messages[0].content[0]"),
    ("chat", {"messages": [{"role": "", "content": "x"}]}, "messages[0].role"),
    ("messages", {"messages": [{"role": "root", "content": "x"}]}, "messages[0].role"),
    ("messages", {"system": 5}, "system"),
    ("responses", {"input": "x", "tools": 5}, "tools"),
    ("completions", {"prompt": "x", "logprobs": "many"}, "logprobs"),
    ("embeddings", {"input": "x", "encoding_format": "hex"}, "encoding_format"),
])
def test_the_gateway_names_a_wrong_typed_field(api: str, extra: dict[str, Any],
                                               param: str) -> None:
    """Each value the issue found forwarded to engines (and more) is a 400 naming it."""
    body = {**BASE, **extra}
    if api in ("completions", "embeddings", "responses"):
        body.pop("messages")
    if api == "embeddings":
        body.pop("max_tokens")
    with pytest.raises(BadRequest) as caught:
        routing_request(api, body, {})
    assert caught.value.param == param


@pytest.mark.parametrize("extra", [
    {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
     "tool_choice": "auto"},
    {"temperature": 0, "top_p": 1, "n": 2, "stop": ["\n"], "seed": 7},
    {"messages": [{"role": "root", "content": "x"}]},  # both engines take custom roles
    {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}},
    {"top_k": "engine extensions are the engine's business"},
    {"temperature": None, "tools": None},
])
def test_valid_fields_pass(extra: dict[str, Any]) -> None:
    routing_request("chat", {**BASE, **extra}, {})
