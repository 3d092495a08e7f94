"""The proxy path in-process: failover, in-band error frames, cut streams, every API's framing.

A real ``ProxyService`` over a real ``Fleet`` and router, with ``FakeBackend`` standing in
for the engines (no sockets): the H200 endpoint is predicted faster, so the ``latency``
policy tries it first and the H100 second.
"""

from __future__ import annotations

import re
from typing import Any

import orjson
import pytest
from starlette.responses import StreamingResponse

from fleetgate.backends.fake import Answer, FakeBackend, Refuse
from fleetgate.backends.relay import Timeouts
from fleetgate.config import FleetConfig
from fleetgate.gateway.decisions import DecisionLog
from fleetgate.gateway.errors import NoCapacity, UpstreamFailed, UpstreamTimeout
from fleetgate.gateway.proxy.apis import APIS
from fleetgate.gateway.proxy.request import ProxyRequest
from fleetgate.gateway.proxy.service import Generation, ProxyService
from fleetgate.routing import RoutingRequest, build_router
from fleetgate.state.fleet import Fleet

FAST, SLOW = "http://h200:8000", "http://h100:8000"
MODEL, SERVED = "llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct"
CHUNK = b'data: {"id":"c","model":"%s","choices":[{"delta":{"content":"hi"}}]}\n\n' % \
    SERVED.encode()
USAGE = (b'data: {"id":"c","model":"m","choices":[],"usage":{"prompt_tokens":3,'
         b'"completion_tokens":2,"total_tokens":5}}\n\n')
DONE = b"data: [DONE]\n\n"


def service(backend: FakeBackend, first_byte_s: float | None = None, resume: bool = True,
            **pool: Any) -> tuple[ProxyService, Fleet]:
    rows = (("h200", "h200", 3.6, FAST), ("h100", "h100", 2.9, SLOW))
    pools = [{"name": name, "accelerator": gpu, "engine": "vllm", "price_per_gpu_hour": price,
              "endpoints": [url], "models": {MODEL: SERVED}, **pool}
             for name, gpu, price, url in rows]
    config = FleetConfig.model_validate({"pools": pools, "default_policy": "fast",
                                         "policies": {"fast": {"strategy": "latency"}}})
    fleet = Fleet(config, http=None)  # type: ignore[arg-type]  # never started: no I/O
    for i in range(len(fleet.endpoints)):
        fleet.live.on_probe(i, fleet.clock(), True, "200")
    gen = Generation(fleet, build_router(config), {"fast": 3}, {"fast": first_byte_s},
                     resume={"fast": resume})
    return ProxyService(lambda: gen, backend, Timeouts(), DecisionLog()), fleet


def request(api: str = "chat", stream: bool = False, wants_usage: bool = False,
            **body: Any) -> ProxyRequest:
    routing = RoutingRequest(MODEL, api=api, stream=stream, max_tokens=16, prompt_chars=20)
    return ProxyRequest(APIS[api], routing, {"model": MODEL, "stream": stream, **body}, "rid",
                        wants_usage)


async def body_of(response: Any) -> bytes:
    if isinstance(response, StreamingResponse):
        return b"".join([chunk async for chunk in response.body_iterator])  # type: ignore[misc]
    return bytes(response.body)


async def test_a_refused_connection_fails_over_and_opens_the_breaker() -> None:
    backend = FakeBackend({FAST: [Refuse("connect")],
                           SLOW: [Answer(200, b'{"model":"%s","choices":[],"usage":{}}'
                                          % SERVED.encode())]})
    proxy, fleet = service(backend)
    response = await proxy.handle(request())
    assert response.headers["x-fleetgate-endpoint"] == "h100-0"
    assert orjson.loads(await body_of(response))["model"] == MODEL  # served name rewritten
    assert [c[0] for c in backend.calls] == [FAST + "/v1/chat/completions",
                                             SLOW + "/v1/chat/completions"]
    assert fleet.live.stats[0].breaker.state == "open"
    entry = proxy.decisions.latest(1)[0]
    assert [a["status"] for a in entry["attempts"]] == [502, 200]


async def test_an_in_band_queue_full_frame_is_retried_elsewhere() -> None:
    full = b'data: {"error":{"message":"queue full","type":"x","code":503}}\n\n'
    backend = FakeBackend({FAST: [Answer(200, chunks=(full,))],
                           SLOW: [Answer(200, chunks=(CHUNK, USAGE, DONE))]})
    proxy, _ = service(backend)
    response = await proxy.handle(request(stream=True))
    assert response.headers["x-fleetgate-endpoint"] == "h100-0"
    assert await body_of(response) == CHUNK.replace(SERVED.encode(), MODEL.encode()) + DONE
    sent = backend.calls[1][1]
    assert sent["stream_options"] == {"include_usage": True} and sent["model"] == SERVED


async def test_a_stream_cut_after_the_first_byte_ends_with_an_error_event() -> None:
    """With ``resume_streams: false`` (test_stream_resume.py has the default)."""
    backend = FakeBackend({FAST: [Answer(200, chunks=(CHUNK,), cut="protocol")]})
    proxy, fleet = service(backend, resume=False)
    out = await body_of(await proxy.handle(request(stream=True)))
    frames = out.split(b"\n\n")
    assert orjson.loads(frames[1][6:])["error"]["code"] == 502
    assert out.endswith(DONE)
    assert fleet.live.stats[0].failures == 1 and len(backend.calls) == 1  # never retried


async def test_a_client_error_passes_through_without_retry() -> None:
    body = b'{"object":"error","message":"too long","type":"BadRequestError","code":400}'
    backend = FakeBackend({FAST: [Answer(400, body)], SLOW: [Answer(200, b"{}")]})
    proxy, fleet = service(backend)
    response = await proxy.handle(request())
    assert response.status_code == 400 and len(backend.calls) == 1
    assert orjson.loads(await body_of(response))["error"]["message"] == "too long"
    assert fleet.live.stats[0].breaker.consecutive_failures == 0  # not the engine's fault


@pytest.mark.parametrize(("answers", "error"), [
    ([Answer(503, b"{}")], NoCapacity),
    ([Refuse("timeout")], UpstreamTimeout),
])
async def test_when_every_attempt_fails_the_last_failure_picks_the_error(
        answers: list[Any], error: type[Exception]) -> None:
    proxy, _ = service(FakeBackend({FAST: list(answers), SLOW: list(answers)}))
    with pytest.raises(error):
        await proxy.handle(request())


RESPONSES_STREAM = (
    b'event: response.created\ndata: {"type":"response.created","response":{"model":"%s",'
    b'"usage":null}}\n\n' % SERVED.encode(),
    b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
    b'"delta":"hi"}\n\n',
    b'event: response.completed\ndata: {"type":"response.completed","response":{"model":'
    b'"%s","usage":{"input_tokens":7,"output_tokens":2,"total_tokens":9}}}\n\n'
    % SERVED.encode(),
)


async def test_a_responses_stream_ends_on_its_completed_event_with_usage() -> None:
    backend = FakeBackend({FAST: [Answer(200, chunks=RESPONSES_STREAM)]})
    proxy, fleet = service(backend)
    out = await body_of(await proxy.handle(request("responses", stream=True, input="hi")))
    assert out == b"".join(RESPONSES_STREAM).replace(SERVED.encode(), MODEL.encode())
    assert "stream_options" not in backend.calls[0][1]  # the Responses API has none
    assert fleet.live.stats[0].output_tokens == 2


async def test_a_cut_messages_stream_ends_with_an_anthropic_error_event() -> None:
    start = (b'event: message_start\ndata: {"type":"message_start","message":{"model":"m",'
             b'"usage":{"input_tokens":5,"output_tokens":0}}}\n\n')
    backend = FakeBackend({FAST: [Answer(200, chunks=(start,), cut="timeout")]})
    proxy, _ = service(backend)
    out = await body_of(await proxy.handle(request("messages", stream=True, max_tokens=8,
                                                   messages=[])))
    event = out.split(b"\n\n")[-2]
    assert event.startswith(b"event: error\ndata: ")
    assert orjson.loads(event.split(b"data: ")[1])["error"]["type"] == "api_error"


async def test_embeddings_usage_is_accounted_in_chat_terms() -> None:
    body = b'{"object":"list","data":[],"model":"m","usage":{"prompt_tokens":4,"total_tokens":4}}'
    proxy, _ = service(FakeBackend({FAST: [Answer(200, body)]}), apis=["embeddings"])
    assert APIS["embeddings"].usage(orjson.loads(body)["usage"]) == {
        "prompt_tokens": 4, "completion_tokens": 0, "total_tokens": 4}
    response = await proxy.handle(request("embeddings", input="hi"))
    assert response.status_code == 200


async def test_a_hung_engine_is_left_after_the_first_byte_deadline() -> None:
    """The fast endpoint accepts the stream and never sends a frame: after the policy's
    first-byte deadline the request goes to the next endpoint, and the hang counts against
    the hung one's breaker."""
    backend = FakeBackend({FAST: [Answer(200, chunks=(), hang=True)],
                           SLOW: [Answer(200, chunks=(CHUNK, USAGE, DONE))]})
    proxy, fleet = service(backend, first_byte_s=0.05)
    response = await proxy.handle(request(stream=True))
    assert response.headers["x-fleetgate-endpoint"] == "h100-0"
    assert b"hi" in await body_of(response)
    entry = proxy.decisions.latest(1)[0]
    assert [a["status"] for a in entry["attempts"]] == [504, 200]
    assert "headers (HTTP 200) and 0 bytes but no complete first frame" in \
        entry["attempts"][0]["error"]
    assert fleet.live.stats[0].breaker.consecutive_failures == 1
    assert fleet.live.value(0, "in_flight") == 0


# -- issue 24: answers that are not the API's ----------------------------------------------
WHOLE = b'{"model":"%s","choices":[{"message":{"content":"hi"}}],"usage":{}}' % SERVED.encode()


@pytest.mark.parametrize("bad", [Answer(200, b"<html><body>oops</body></html>",
                                        content_type="text/html"),
                                 Answer(200, b"{}"), Answer(200, b'{"choices": ['),
                                 Answer(200, b'{"error":{"message":"nope"}}')])
async def test_a_whole_200_that_is_not_the_answer_is_retried_then_a_502(bad: Answer) -> None:
    """Before the fix: relayed as 200 (the streamed request got 502 for the same answer)."""
    backend = FakeBackend({FAST: [bad], SLOW: [Answer(200, WHOLE, content_type="text/plain")]})
    proxy, _ = service(backend)
    response = await proxy.handle(request())
    assert response.headers["x-fleetgate-endpoint"] == "h100-0"
    assert response.media_type == "application/json"  # whatever the engine called it
    entry = proxy.decisions.latest(1)[0]
    assert [a["status"] for a in entry["attempts"]] == [502, 200]
    assert "not the API's answer" in entry["attempts"][0]["error"]
    both = FakeBackend({FAST: [bad], SLOW: [bad]})
    proxy, _ = service(both)
    with pytest.raises(UpstreamFailed, match="not the API's answer"):
        await proxy.handle(request())


async def test_bytes_that_are_not_sse_are_dropped_from_a_stream() -> None:
    """Before the fix: garbage and ``data: {broken json`` reached the client in the 200."""
    noise = (b"\x00\xff garbage\n\n", b"data: {broken json\n\n",
             b'junk\ndata: {"choices":[]}\n\n')
    backend = FakeBackend({FAST: [Answer(200, chunks=(noise[0], CHUNK, *noise[1:], USAGE,
                                                      DONE))]})
    proxy, _ = service(backend)
    body = await body_of(await proxy.handle(request(stream=True)))
    frames = body.split(b"\n\n")[:-1]
    assert frames[-1] == b"data: [DONE]" and b"garbage" not in body and b"broken" not in body
    assert all(f.startswith(b"data: ") and orjson.loads(f[6:]) for f in frames[:-1])


async def test_a_stream_of_nothing_but_garbage_is_retried_elsewhere() -> None:
    backend = FakeBackend({FAST: [Answer(200, chunks=(b"<html>\n\n</html>\n\n",),
                                         content_type="text/html")],
                           SLOW: [Answer(200, chunks=(CHUNK, USAGE, DONE))]})
    proxy, _ = service(backend)
    response = await proxy.handle(request(stream=True))
    assert response.headers["x-fleetgate-endpoint"] == "h100-0"
    error = proxy.decisions.latest(1)[0]["attempts"][0]["error"]
    assert "ended before its first frame (text/html" in error


async def test_a_trickle_is_named_as_one() -> None:
    """Before the fix: "no first byte within ..." although bytes had come."""
    trickle = Answer(200, chunks=(b"da", b"ta"), hang=True)
    backend = FakeBackend({FAST: [trickle], SLOW: [trickle]})
    proxy, _ = service(backend, first_byte_s=0.05)
    with pytest.raises(UpstreamTimeout, match=re.escape(
            "sent headers (HTTP 200) and 4 bytes but no complete first frame within 0.1 s")):
        await proxy.handle(request(stream=True))


@pytest.mark.parametrize("key", [None, "sk-pool-key"])
async def test_a_pools_api_key_goes_upstream_and_nothing_else_does(key: str | None) -> None:
    """A pool with ``api_key`` (a hosted API, a vLLM with --api-key) sends it as a bearer
    token on every attempt; without one no Authorization header leaves the gateway (the
    client's key to the gateway is never forwarded)."""
    answer = Answer(200, b'{"id":"c","object":"chat.completion","choices":[]}')
    backend = FakeBackend({FAST: [answer], SLOW: [answer]})
    proxy, fleet = service(backend, **({"api_key": key} if key else {}))
    assert (await proxy.handle(request())).status_code == 200
    _, _, headers = backend.calls[0]
    assert headers.get("authorization") == (f"Bearer {key}" if key else None)
    assert key is None or key not in repr(fleet.endpoints[0])  # not in logs or reprs
    assert key is None or key not in repr(fleet.config.pools[0])


async def test_with_tracing_off_the_callers_trace_context_goes_on_as_it_came() -> None:
    backend = FakeBackend({FAST: [Answer(200, b'{"model":"%s","choices":[],"usage":{}}'
                                         % SERVED.encode())]})
    proxy, _ = service(backend)
    req = request()
    req.traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    req.tracestate = "congo=t61rcWkgMzE"
    await proxy.handle(req)
    sent = backend.calls[0][2]
    assert (sent["traceparent"], sent["tracestate"]) == (req.traceparent, req.tracestate)
