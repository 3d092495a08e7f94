"""Failure paths through a real gateway: endpoints down, retryable errors, client disconnects.

Each test starts its own emulated engines and gateway, so breaking them disturbs nobody.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from procs import PUBLIC_8B, SERVED_8B, Proc, pool, spawn_emulator, spawn_gateway, wait_for

MESSAGES = [{"role": "user", "content": "hello"}]
MODELS = {PUBLIC_8B: SERVED_8B}


@pytest.fixture()
def pair(tmp_path: Path) -> Iterator[tuple[Proc, Proc, Proc]]:
    """(vllm engine, sglang engine, gateway) for one test."""
    vllm = spawn_emulator("vllm", "h100", [SERVED_8B])
    sglang = spawn_emulator("sglang", "mi300x", [SERVED_8B])
    config = {"pools": [
        pool("h100-vllm", "h100", "vllm", 2.95, [vllm.url], MODELS),
        pool("mi300x-sglang", "mi300x", "sglang", 1.99, [sglang.url], MODELS),
    ]}
    gw = spawn_gateway(config, tmp_path)
    yield vllm, sglang, gw
    for p in (gw, vllm, sglang):
        p.stop()


def _faults(engine: Proc, **knobs: object) -> None:
    httpx.post(engine.url + "/emulator/faults", json=knobs).raise_for_status()


def _client(gw: Proc) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)


def test_retryable_status_fails_over_to_the_other_engine(pair: tuple[Proc, Proc, Proc]) -> None:
    vllm, _sglang, gw = pair
    _faults(vllm, fail_next=10, fail_status=503)
    for _ in range(4):
        raw = _client(gw).chat.completions.with_raw_response.create(
            model=PUBLIC_8B, messages=MESSAGES, max_tokens=2)
        assert raw.headers["x-fleetgate-pool"] == "mi300x-sglang"


def test_sglang_in_band_queue_full_is_retried(tmp_path: Path) -> None:
    """SGLang answers a full queue on a stream with HTTP 200 + an SSE error frame."""
    vllm = spawn_emulator("vllm", "h100", [SERVED_8B])
    sglang = spawn_emulator("sglang", "mi300x", [SERVED_8B], extra=["--max-queued-requests", "0"])
    gw = spawn_gateway({"pools": [
        pool("h100-vllm", "h100", "vllm", 2.95, [vllm.url], MODELS),
        pool("mi300x-sglang", "mi300x", "sglang", 1.99, [sglang.url], MODELS),
    ]}, tmp_path)
    try:
        _check_queue_full_retried(sglang, gw)
    finally:
        for p in (gw, vllm, sglang):
            p.stop()


def _check_queue_full_retried(sglang: Proc, gw: Proc) -> None:
    probe = httpx.post(sglang.url + "/v1/chat/completions", json={
        "model": SERVED_8B, "messages": MESSAGES, "stream": True, "max_tokens": 2})
    assert probe.status_code == 200 and "queue is full" in probe.text  # the engine's quirk
    for _ in range(4):
        raw = _client(gw).chat.completions.with_raw_response.create(
            model=PUBLIC_8B, messages=MESSAGES, max_tokens=2, stream=True)
        assert raw.headers["x-fleetgate-pool"] == "h100-vllm"
        assert list(raw.parse())


def test_every_endpoint_down_is_503_then_recovers(pair: tuple[Proc, Proc, Proc]) -> None:
    vllm, sglang, gw = pair
    vllm.kill()
    _faults(sglang, down=True)
    for _ in range(3):
        resp = httpx.post(gw.url + "/v1/chat/completions", json={
            "model": PUBLIC_8B, "messages": MESSAGES, "max_tokens": 2})
        assert resp.status_code == 503, resp.text
        assert resp.json()["error"]["type"] == "service_unavailable"
    assert httpx.get(gw.url + "/healthz").status_code == 200
    _faults(sglang, down=False)
    wait_for(lambda: httpx.get(gw.url + "/readyz").status_code == 200, timeout=10,
             what="the next health probe to bring the engine back")
    ok = _client(gw).chat.completions.create(model=PUBLIC_8B, messages=MESSAGES, max_tokens=2)
    assert ok.usage is not None and ok.usage.completion_tokens == 2


def test_client_disconnect_mid_stream_aborts_upstream(tmp_path: Path) -> None:
    engine = spawn_emulator("vllm", "h100", [SERVED_8B], speed=1.0)
    gw = spawn_gateway({"pools": [pool("h100-vllm", "h100", "vllm", 2.95, [engine.url],
                                       MODELS)]}, tmp_path)
    try:
        body = {"model": PUBLIC_8B, "messages": MESSAGES, "max_tokens": 2000, "stream": True}
        with httpx.stream("POST", gw.url + "/v1/chat/completions", json=body) as resp:
            lines = resp.iter_lines()
            for _ in range(5):
                next(lines)
            assert httpx.get(engine.url + "/emulator/state").json()["running"] == 1
        closed = time.monotonic()  # leaving the block closes the client connection
        wait_for(lambda: httpx.get(engine.url + "/emulator/state").json()["running"] == 0,
                 timeout=5, what="the engine to drop the abandoned request")
        print(f"engine dropped the request {(time.monotonic() - closed) * 1000:.0f} ms "
              "after the client left")
    finally:
        gw.stop()
        engine.stop()


def test_embedded_default_fleet_serves_a_chat(tmp_path: Path) -> None:
    """What `make run` starts: the embedded default, emulated engines started by the gateway."""
    from fleetgate.config import default_config_path

    gw = spawn_gateway(default_config_path(), tmp_path)
    try:
        client = _client(gw)
        resp = client.chat.completions.create(model=PUBLIC_8B, messages=MESSAGES, max_tokens=3)
        assert resp.choices[0].message.content and resp.model == PUBLIC_8B
        def pool(**headers: str) -> str:
            return client.chat.completions.with_raw_response.create(
                model=PUBLIC_8B, messages=MESSAGES, max_tokens=1,
                extra_headers=headers).headers["x-fleetgate-pool"]

        spread = {pool(**{"x-fleetgate-policy": "spread"}) for _ in range(4)}
        assert spread == {"mi300x-sglang", "mi355x-vllm", "h100-vllm", "h200-sglang"}
        cheapest = pool()
        last = httpx.get(gw.url + "/admin/decisions?limit=1").json()["decisions"][0]
        assert last["chosen"] == f"{cheapest}-0" and last["policy"] == "cheapest"
        best = max(c["scores"]["cost"] for c in last["candidates"])
        assert last["candidates"][0]["scores"]["cost"] == best > 0  # the cheapest per token
        resp = client.chat.completions.with_raw_response.create(
            model=PUBLIC_8B, messages=MESSAGES, max_tokens=1, extra_headers={"x-priority": "high"})
        assert resp.headers["x-fleetgate-policy"] == "fastest"
    finally:
        gw.stop()
