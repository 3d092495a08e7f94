"""Shadow traffic in-process: the client is answered by the serving pool only; the copy's
figures sit beside the serving pool's; the spend cap stops mirroring; a candidate that is
down or hangs changes nothing for clients. ``FakeBackend`` stands in for the engines."""

from __future__ import annotations

from typing import Any

import orjson

from fleetgate.backends.fake import Answer, FakeBackend, Refuse
from fleetgate.backends.relay import Timeouts
from fleetgate.config import FleetConfig
from fleetgate.config.schema import ShadowConfig
from fleetgate.gateway.decisions import DecisionLog
from fleetgate.gateway.proxy.apis import APIS
from fleetgate.gateway.proxy.request import ProxyRequest
from fleetgate.gateway.proxy.service import Generation, ProxyService
from fleetgate.gateway.proxy.shadow import ShadowMirror
from fleetgate.routing import RoutingRequest, build_router
from fleetgate.state.fleet import Fleet

SERVING, CANDIDATE = "http://h200:8000", "http://mi355x:8000"
MODEL, SERVED = "llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct"
CHUNK = b'data: {"id":"c","model":"%s","choices":[{"delta":{"content":"hi"}}]}\n\n' % \
    SERVED.encode()
USAGE = (b'data: {"id":"c","model":"m","choices":[],"usage":{"prompt_tokens":3,'
         b'"completion_tokens":4,"total_tokens":7}}\n\n')
STREAM = Answer(200, chunks=(CHUNK, CHUNK, USAGE, b"data: [DONE]\n\n"))
WHOLE = Answer(200, orjson.dumps({"model": SERVED, "choices": [], "usage": {
    "prompt_tokens": 3, "completion_tokens": 4}}))  # a non-streamed answer


def proxy(backend: FakeBackend, fraction: float = 1.0, cap: float = 5.0
          ) -> tuple[ProxyService, ShadowMirror, Fleet]:
    pools = [{"name": name, "accelerator": gpu, "engine": "vllm", "price_per_gpu_hour": price,
              "endpoints": [url], "models": {MODEL: SERVED}}
             for name, gpu, price, url in (("h200", "h200", 3.6, SERVING),
                                           ("mi355x", "mi355x", 2.9, CANDIDATE))]
    shadow = {"pool": "mi355x", "fraction": fraction, "max_usd_per_hour": cap}
    config = FleetConfig.model_validate({
        "pools": pools, "default_policy": "prod",
        "policies": {"prod": {"strategy": "latency", "shadow": shadow,
                              "filters": [{"name": "select", "params": {"pools": ["h200"]}}],
                              "first_byte_timeout_ms": 50}}})
    fleet = Fleet(config, http=None)  # type: ignore[arg-type]  # never started: no I/O
    for i in range(len(fleet.endpoints)):
        fleet.live.on_probe(i, fleet.clock(), True, "200")
    gen = Generation(fleet, build_router(config), {"prod": 3}, {"prod": 0.05},
                     {"prod": ShadowConfig.model_validate(shadow)})
    mirror = ShadowMirror(lambda: gen, backend, Timeouts(), fleet.clock, seed=1)
    return ProxyService(lambda: gen, backend, Timeouts(), DecisionLog(), mirror), mirror, fleet


def request(stream: bool = True) -> ProxyRequest:
    routing = RoutingRequest(MODEL, stream=stream, max_tokens=16, prompt_chars=20)
    return ProxyRequest(APIS["chat"], routing, {"model": MODEL, "stream": stream}, "rid")


async def client_call(service: ProxyService, stream: bool = True) -> tuple[str, bytes]:
    response = await service.handle(request(stream))
    body: Any = response
    data = b"".join([c async for c in body.body_iterator]) if stream else bytes(body.body)
    return response.headers["x-fleetgate-pool"], data


async def test_every_answer_comes_from_the_serving_pool_and_the_copy_is_compared() -> None:
    backend = FakeBackend({SERVING: [STREAM], CANDIDATE: [STREAM]})
    service, mirror, fleet = proxy(backend)
    for _ in range(6):
        pool, body = await client_call(service)
        assert pool == "h200" and body.count(b'"content":"hi"') == 2
    await mirror.drain()
    report = mirror.report()["candidates"]
    assert len(report) == 1
    row = report[0]
    assert (row["pool"], row["serving_pool"], row["mirrored"], row["failed"]) == \
        ("mi355x", "h200", 6, 0)
    assert row["requests"] == 6 and row["output_tokens"] == 24 and row["usd"] > 0
    assert row["ttft_ms"]["p50"] >= 0 and row["usd_per_mtok"] > 0
    assert row["serving"]["requests"] == 6 and row["serving"]["output_tokens"] == 24
    copies = [c for c in backend.calls if c[0].startswith(CANDIDATE)]
    assert len(copies) == 6 and copies[0][1]["model"] == SERVED
    assert copies[0][1]["stream_options"] == {"include_usage": True}
    assert fleet.live.value(1, "in_flight") == 0  # the copies went through the live state


async def test_the_spend_cap_stops_mirroring() -> None:
    backend = FakeBackend({SERVING: [STREAM], CANDIDATE: [STREAM]})
    service, mirror, _ = proxy(backend, cap=1e-12)
    for _ in range(4):
        await client_call(service)
        await mirror.drain()
    row = mirror.report()["candidates"][0]
    assert row["mirrored"] == 1 and row["skipped_budget"] == 3


async def test_a_down_or_hung_candidate_changes_nothing_for_clients() -> None:
    hung = Answer(200, chunks=(), hang=True)
    for candidate in ([Refuse("connect")], [hung], [Answer(500, b'{"error":"boom"}')]):
        backend = FakeBackend({SERVING: [STREAM, WHOLE], CANDIDATE: candidate})
        service, mirror, _ = proxy(backend)
        for stream in (True, False):  # STREAM answers the first, WHOLE the second
            pool, body = await client_call(service, stream)
            assert pool == "h200" and body
        await mirror.drain()  # the hung copy ends at the policy's first-byte deadline
        row = mirror.report()["candidates"][0]
        assert row["failed"] >= 1 and row["serving"]["requests"] == 2, (candidate, row)


async def test_a_fraction_mirrors_about_that_share() -> None:
    backend = FakeBackend({SERVING: [WHOLE], CANDIDATE: [STREAM]})
    service, mirror, _ = proxy(backend, fraction=0.5)
    for _ in range(200):
        await client_call(service, stream=False)
    await mirror.drain()
    assert 70 <= mirror.report()["candidates"][0]["mirrored"] <= 130
