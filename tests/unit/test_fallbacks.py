"""Model fallbacks (issue 25 item 4): the config's checks, the chain a request walks, and the
proxy trying the next model when the asked one cannot serve the request.

The proxy tests run a real ``ProxyService`` over a real ``Fleet`` and router with
``FakeBackend`` standing in for the engines (no sockets), as ``test_proxy.py`` does: three
pools, one model each; a request for ``a`` falls back to ``b``, then ``c``.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from starlette.responses import StreamingResponse

from fleetgate.backends.fake import Answer, FakeBackend, Refuse
from fleetgate.backends.relay import Timeouts
from fleetgate.config import ConfigError, FleetConfig, parse_config
from fleetgate.gateway.decisions import DecisionLog
from fleetgate.gateway.errors import ContextLengthExceeded, NoCapacity
from fleetgate.gateway.proxy.apis import APIS
from fleetgate.gateway.proxy.request import ProxyRequest
from fleetgate.gateway.proxy.service import Generation, ProxyService
from fleetgate.gateway.telemetry import names as n
from fleetgate.gateway.telemetry.routespan import decision_attributes
from fleetgate.routing import RoutingRequest, build_router
from fleetgate.routing.policies import FallbackRoutes
from fleetgate.state.fleet import Fleet

URL = {"a": "http://a:8000", "b": "http://b:8000", "c": "http://c:8000"}
SERVED = {m: f"org/{m.upper()}-served" for m in URL}
DONE = b"data: [DONE]\n\n"


# -- the config --------------------------------------------------------------------------
def _yaml(routes: str) -> str:
    pools = "".join(
        f"  - {{name: p{m}, accelerator: h100, engine: vllm, price_per_gpu_hour: 2, "
        f"endpoints: ['{URL[m]}'], models: {{{m}: {SERVED[m]}}}}}\n" for m in URL)
    return f"pools:\n{pools}policies: {{p: {{strategy: latency}}}}\ndefault_policy: p\n" \
           f"routes:\n{routes}"


def test_a_config_with_fallbacks_loads() -> None:
    config = parse_config(_yaml("  - {match: {model: a}, policy: p, fallbacks: [b, c]}\n"
                                "  - {match: {model: b}, policy: p, fallbacks: [c]}\n"), "t", {})
    assert config.routes[0].fallbacks == ["b", "c"]


@pytest.mark.parametrize(("routes", "expected"), [
    ("  - {match: {model: a}, policy: p, fallbacks: [zzz]}\n",
     "routes[0].fallbacks[0]: 'zzz' is not a model any pool serves"),
    ("  - {match: {model: a}, policy: p, fallbacks: [b]}\n"
     "  - {match: {model: b}, policy: p, fallbacks: [a]}\n",
     "routes[1].fallbacks[0]: fallback loop a -> b -> a"),
    ("  - {match: {model: a}, policy: p, fallbacks: [b]}\n"
     "  - {match: {model: b}, policy: p, fallbacks: [c]}\n"
     "  - {match: {model: c, tenant: t}, policy: p, fallbacks: [a]}\n",
     "routes[2].fallbacks[0]: fallback loop a -> b -> c -> a"),
    ("  - {match: {model: a}, policy: p, fallbacks: [a]}\n",
     "routes[0].fallbacks[0]: fallback loop a -> a"),
    ("  - {match: {model: a}, policy: p, fallbacks: [b, b]}\n",
     "routes[0].fallbacks[1]: 'b' is listed twice"),
    ("  - {match: {tenant: t}, policy: p, fallbacks: [b]}\n",
     "routes[0].fallbacks: a route with fallbacks must match a model"),
    ("  - {match: {model: a}, policy: p, fallbacks: b}\n", "routes[0].fallbacks: "),
])
def test_bad_fallbacks_fail_with_their_yaml_path(routes: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(_yaml(routes), "t.yaml", {})
    assert any(expected in e for e in info.value.errors), info.value.errors


# -- the chain ---------------------------------------------------------------------------
def _routes(*rows: dict[str, Any]) -> FallbackRoutes:
    return FallbackRoutes.from_config(FleetConfig.model_validate(
        {**_config_dict(), "routes": list(rows)}))


def _config_dict() -> dict[str, Any]:
    return {"pools": [{"name": f"p{m}", "accelerator": "h100", "engine": "vllm",
                       "price_per_gpu_hour": 2, "endpoints": [URL[m]],
                       "models": {m: SERVED[m]}} for m in URL],
            "policies": {"p": {"strategy": "latency"}}, "default_policy": "p"}


def _chain(routes: FallbackRoutes, model: str = "a", allowed: set[str] | None = None,
           **request: Any) -> list[str]:
    return list(routes.chain(RoutingRequest(model, **request),
                             lambda m: allowed is None or m in allowed))


def test_the_chain_is_the_list_then_each_fallbacks_own_without_repeats() -> None:
    routes = _routes({"match": {"model": "a"}, "policy": "p", "fallbacks": ["b", "c"]},
                     {"match": {"model": "b"}, "policy": "p", "fallbacks": ["c"]})
    assert _chain(routes) == ["b", "c"]
    assert _chain(routes, "b") == ["c"]
    assert _chain(routes, "c") == []


def test_the_chain_follows_a_fallbacks_own_route() -> None:
    routes = _routes({"match": {"model": "a"}, "policy": "p", "fallbacks": ["b"]},
                     {"match": {"model": "b"}, "policy": "p", "fallbacks": ["c"]})
    assert _chain(routes) == ["b", "c"]


def test_models_the_caller_may_not_use_are_skipped() -> None:
    routes = _routes({"match": {"model": "a"}, "policy": "p", "fallbacks": ["b"]},
                     {"match": {"model": "b"}, "policy": "p", "fallbacks": ["c"]})
    assert _chain(routes, allowed={"a", "c"}) == ["c"]  # b's own fallbacks still follow
    assert _chain(routes, allowed={"a"}) == []


def test_the_first_matching_route_gives_the_fallbacks() -> None:
    routes = _routes(
        {"match": {"model": "a", "header": {"x-tier": "free"}}, "policy": "p"},
        {"match": {"model": "a"}, "policy": "p", "fallbacks": ["b"]})
    assert _chain(routes, headers={"x-tier": "free"}) == []
    assert _chain(routes, headers={"x-tier": "paid"}) == ["b"]
    assert _chain(routes, policy="p") == ["b"]  # x-fleetgate-policy picks no fallbacks
    assert _routes({"match": {"model": "a"}, "policy": "p"}).routes == ()  # none: no table


# -- the proxy ---------------------------------------------------------------------------
def service(backend: FakeBackend, fallbacks: tuple[str, ...] = ("b", "c"),
            max_model_len: int | None = None) -> tuple[ProxyService, Fleet]:
    config = FleetConfig.model_validate({
        **_config_dict(),
        "routes": [{"match": {"model": "a"}, "policy": "p", "fallbacks": list(fallbacks)}]})
    if max_model_len is not None:
        pools = [p.model_copy(update={"max_model_len": max_model_len})
                 if p.name == "pa" else p for p in config.pools]
        config = config.model_copy(update={"pools": pools})
    fleet = Fleet(config, http=None)  # type: ignore[arg-type]  # never started: no I/O
    for i in range(len(fleet.endpoints)):
        fleet.live.on_probe(i, fleet.clock(), True, "200")
    gen = Generation(fleet, build_router(config), {"p": 3}, {"p": None},
                     fallbacks=FallbackRoutes.from_config(config))
    return ProxyService(lambda: gen, backend, Timeouts(), DecisionLog()), fleet


def request(stream: bool = False, prompt_chars: int = 20,
            allowed: frozenset[str] | None = None) -> ProxyRequest:
    routing = RoutingRequest("a", stream=stream, max_tokens=16, prompt_chars=prompt_chars)
    return ProxyRequest(APIS["chat"], routing, {"model": "a", "stream": stream}, "rid",
                        allowed_models=allowed)


def whole(model: str) -> Answer:
    return Answer(200, b'{"model":"%s","choices":[{"message":{"content":"hi"}}],"usage":'
                       b'{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}'
                  % SERVED[model].encode())


def chunk(model: str) -> bytes:
    return b'data: {"id":"x","model":"%s","choices":[{"delta":{"content":"hi"}}]}\n\n' % \
        SERVED[model].encode()


async def body_of(response: Any) -> bytes:
    if isinstance(response, StreamingResponse):
        return b"".join([c async for c in response.body_iterator])  # type: ignore[misc]
    return bytes(response.body)


async def test_every_endpoint_refusing_falls_back_to_the_next_model() -> None:
    backend = FakeBackend({URL["a"]: [Refuse("connect")], URL["b"]: [whole("b")]})
    proxy, _ = service(backend)
    response = await proxy.handle(request())
    assert response.headers["x-fleetgate-model"] == "b"
    assert response.headers["x-fleetgate-pool"] == "pb"
    assert orjson.loads(await body_of(response))["model"] == "b"  # b's served name rewritten
    assert backend.calls[1][1]["model"] == SERVED["b"]  # the body's model: b's served name
    fell_back, asked = proxy.decisions.latest(2)
    assert (asked["model"], asked["fell_back_to"], asked["fallback"]) == ("a", "b", None)
    assert [a["status"] for a in asked["attempts"]] == [502]
    assert fell_back["model"] == "b" and fell_back["fallback"]["reason"] == "refused"
    assert fell_back["fallback"]["asked"] == fell_back["fallback"]["from"] == "a"


async def test_a_model_without_an_available_endpoint_falls_back() -> None:
    proxy, fleet = service(FakeBackend({URL["b"]: [whole("b")]}))
    fleet.live.on_refused(0, fleet.clock(), "connect refused")  # its breaker opens
    response = await proxy.handle(request())
    assert response.headers["x-fleetgate-model"] == "b"
    assert proxy.decisions.latest(1)[0]["fallback"]["reason"] == "unavailable"


async def test_a_context_too_small_falls_back_to_a_model_it_fits() -> None:
    backend = FakeBackend({URL["b"]: [whole("b")]})
    proxy, _ = service(backend, max_model_len=64)
    response = await proxy.handle(request(prompt_chars=2000))
    assert response.headers["x-fleetgate-model"] == "b"
    fallback = proxy.decisions.latest(1)[0]["fallback"]
    assert fallback["reason"] == "context_window"
    assert "maximum context length is 64 tokens" in fallback["error"]
    assert [c[0] for c in backend.calls] == [URL["b"] + "/v1/chat/completions"]


async def test_without_fallbacks_the_asked_models_error_is_unchanged() -> None:
    proxy, _ = service(FakeBackend({}), fallbacks=(), max_model_len=64)
    with pytest.raises(ContextLengthExceeded) as info:
        await proxy.handle(request(prompt_chars=2000))
    assert "no model could serve it" not in info.value.message


async def test_a_fallback_the_key_may_not_use_is_skipped() -> None:
    backend = FakeBackend({URL["a"]: [Answer(503, b"{}")], URL["c"]: [whole("c")]})
    proxy, _ = service(backend)
    response = await proxy.handle(request(allowed=frozenset({"a", "c"})))
    assert response.headers["x-fleetgate-model"] == "c"
    assert [c[0].split("/v1")[0] for c in backend.calls] == [URL["a"], URL["c"]]


async def test_a_key_limited_to_the_asked_model_gets_its_error() -> None:
    backend = FakeBackend({URL["a"]: [Answer(503, b"{}")]})
    proxy, _ = service(backend)
    with pytest.raises(NoCapacity) as info:
        await proxy.handle(request(allowed=frozenset({"a"})))
    assert "no model could serve it" not in info.value.message
    assert len(backend.calls) == 1


async def test_when_no_model_can_serve_the_last_error_names_each() -> None:
    backend = FakeBackend({URL["a"]: [Answer(503, b"{}")], URL["c"]: [Refuse("timeout")]})
    proxy, fleet = service(backend)
    fleet.live.on_refused(1, fleet.clock(), "down")  # b: unavailable
    with pytest.raises(Exception) as info:
        await proxy.handle(request())
    assert getattr(info.value, "status", None) == 504  # c's, the last tried
    assert "'a': refused, 'b': unavailable, 'c': refused" in str(info.value)


async def test_an_engines_client_error_never_falls_back() -> None:
    body = b'{"object":"error","message":"bad","type":"BadRequestError","code":400}'
    backend = FakeBackend({URL["a"]: [Answer(400, body)], URL["b"]: [whole("b")]})
    proxy, _ = service(backend)
    response = await proxy.handle(request())
    assert response.status_code == 400 and "x-fleetgate-model" not in response.headers
    assert len(backend.calls) == 1


async def test_a_refused_stream_falls_back_before_its_first_byte() -> None:
    backend = FakeBackend({URL["a"]: [Answer(503, b"{}")],
                           URL["b"]: [Answer(200, chunks=(chunk("b"), DONE))]})
    proxy, _ = service(backend)
    response = await proxy.handle(request(stream=True))
    assert response.headers["x-fleetgate-model"] == "b"
    assert await body_of(response) == chunk("b").replace(SERVED["b"].encode(), b"b") + DONE
    assert backend.calls[1][1]["model"] == SERVED["b"]


async def test_after_the_first_byte_there_is_no_fallback() -> None:
    """A stream that breaks mid-way may resume on the model's next endpoint (there is none
    here), never on another model."""
    backend = FakeBackend({URL["a"]: [Answer(200, chunks=(chunk("a"),), cut="protocol")],
                           URL["b"]: [whole("b")]})
    proxy, _ = service(backend)
    response = await proxy.handle(request(stream=True))
    assert "x-fleetgate-model" not in response.headers
    out = await body_of(response)
    assert b'"error"' in out and out.endswith(DONE)
    assert [c[0].split("/v1")[0] for c in backend.calls] == [URL["a"]]


async def test_the_route_span_names_the_model_and_the_fallback() -> None:
    backend = FakeBackend({URL["a"]: [Refuse("connect")], URL["b"]: [whole("b")]})
    proxy, _ = service(backend)
    req = request()
    await proxy.handle(req)
    assert req.fallback is not None
    entry = proxy.decisions._entries[-1]  # the fallback model's decision
    attrs = decision_attributes(entry.decision, 16, req.fallback)
    assert attrs[n.ROUTE_MODEL] == "b"
    assert (attrs[n.ROUTE_FALLBACK_ASKED], attrs[n.ROUTE_FALLBACK_FROM],
            attrs[n.ROUTE_FALLBACK_REASON]) == ("a", "a", "refused")
    plain = decision_attributes(proxy.decisions._entries[0].decision, 16)
    assert plain[n.ROUTE_MODEL] == "a" and n.ROUTE_FALLBACK_REASON not in plain
