"""Issue 24 item 1 over real HTTP: one tenant's requests open no breaker.

A real gateway (in-process, on uvicorn) over two real emulated engines (vLLM on H100, SGLang
on MI300X) on local ports, auth on with two tenants. Each engine sits behind a thin ASGI
wrapper that answers 500 to a body carrying ``x_poison`` (a field the gateway forwards
untouched, standing for any engine bug a request's content can trip), so the poison path is
exercised end to end; the issue's own bodies (``tools: 5`` ...) are sent too. The noisy
tenant is rate-limited, as in the issue.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from fleetgate.emulator import EmulatorConfig, create_emulator_app
from inproc import inproc_gateway, tick
from procs import wait_for

MODEL, SERVED = "llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct"
NOISY, QUIET, ADMIN = "noisy-key-0123456789", "quiet-key-0123456789", "admin-key-0123456789"
MESSAGES = [{"role": "user", "content": "x"}]


class PoisonedEngine:
    """The emulator app, except that a body with ``x_poison`` crashes it (HTTP 500)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        if b'"x_poison"' in body:
            await send({"type": "http.response.start", "status": 500,
                        "headers": [(b"content-type", b"text/plain; charset=utf-8")]})
            await send({"type": "http.response.body", "body": b"Internal Server Error"})
            return
        sent = False

        async def replay() -> Any:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


@contextmanager
def poisoned_engine(engine: str, gpu: str) -> Iterator[str]:
    config = EmulatorConfig.model_validate({"engine": engine, "gpu": gpu, "speed": 50.0,
                                            "served_models": [SERVED, MODEL]})
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(PoisonedEngine(create_emulator_app(config)),
                                           http="httptools", lifespan="on",
                                           log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, timeout=10, what=f"the {engine} emulator to start")
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def _config(vllm: str, sglang: str) -> dict[str, Any]:
    pools = [{"name": name, "accelerator": gpu, "engine": engine, "price_per_gpu_hour": price,
              "endpoints": [url], "models": {MODEL: SERVED}}
             for name, gpu, engine, price, url in (("h100", "h100", "vllm", 2.9, vllm),
                                                  ("mi300x", "mi300x", "sglang", 1.99, sglang))]
    return {"pools": pools, "auth": {"admin_keys": [ADMIN], "keys": [
        {"name": "noisy", "key": NOISY, "tenant": "noisy", "limits": {"rpm": 6000}},
        {"name": "quiet", "key": QUIET, "tenant": "quiet"}]}}


POISON: list[tuple[str, dict[str, Any]]] = [  # the bodies, and an engine-side crash
    ("/v1/chat/completions", {"tools": 5}),
    ("/v1/chat/completions", {"tools": -1}),
    ("/v1/chat/completions", {"tools": True}),
    ("/v1/messages", {"tools": 5}),
    ("/v1/chat/completions", {"temperature": "hot"}),
    ("/v1/chat/completions", {"n": 1000}),
    ("/v1/chat/completions", {"x_poison": True}),
    ("/v1/chat/completions", {"x_poison": True, "stream": True}),
    ("/v1/messages", {"x_poison": True}),
]


async def test_one_tenant_opens_no_breaker_and_the_other_keeps_getting_200s(
        tmp_path: Path) -> None:
    with poisoned_engine("vllm", "h100") as vllm, poisoned_engine("sglang", "mi300x") as sg:
        async with inproc_gateway(_config(vllm, sg), tmp_path) as (url, state), \
                httpx.AsyncClient(timeout=30) as client:
            await tick(state)
            live = state.generation.fleet.live
            seen: dict[int, int] = {}
            for n in range(60):  # 4x the 15 that opened both breakers in the issue
                path, extra = POISON[n % len(POISON)]
                body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 2, **extra}
                bad = await client.post(url + path, json=body,
                                        headers={"authorization": f"Bearer {NOISY}"})
                seen[bad.status_code] = seen.get(bad.status_code, 0) + 1
                assert bad.status_code in (400, 502), bad.text
                assert set(bad.json()["error"]) == {"message", "type", "param", "code"}
                if bad.status_code == 400 and "x_poison" not in extra:
                    assert bad.json()["error"]["param"] in ("tools", "temperature", "n")
                assert [s.breaker.state for s in live.stats] == ["closed", "closed"]
                assert [s.breaker.consecutive_failures for s in live.stats] == [0, 0]
                good = await client.post(url + "/v1/chat/completions", json={
                    "model": MODEL, "messages": MESSAGES, "max_tokens": 2},
                    headers={"authorization": f"Bearer {QUIET}"})
                assert good.status_code == 200, good.text
            assert seen[502] >= 15 and seen[400] >= 30  # both paths were exercised
            admin = await client.get(url + "/admin/endpoints",
                                     headers={"authorization": f"Bearer {ADMIN}"})
            assert {row["breaker"] for row in admin.json()["endpoints"]} == {"closed"}
