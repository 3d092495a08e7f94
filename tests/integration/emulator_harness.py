"""Shared harness for the emulator integration tests: real servers on free local ports.

``ServerThread`` runs an emulator app under a real uvicorn in a background thread (its own
event loop), so sync and async clients can both talk to it; ``procs.wait_for`` is the
bounded waiting loop the tests use instead of sleeps. ``flavour_servers`` starts one vLLM
(H100) and one SGLang (MI300X) emulator for a test module's ``servers`` fixture.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import uvicorn

from fleetgate.emulator import EmulatorConfig, create_emulator_app
from procs import wait_for

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
ALIAS = "llama-3.1-8b"
ENGINES = ("vllm", "sglang")
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Say something."}]}


class ServerThread:
    """An emulator app under uvicorn in a background thread, on a free port."""

    def __init__(self, config: EmulatorConfig) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        uv = uvicorn.Config(
            create_emulator_app(config),
            http="httptools",
            lifespan="on",
            log_level="warning",
            access_log=False,
        )
        self.server = uvicorn.Server(uv)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def __enter__(self) -> ServerThread:
        self.thread.start()
        wait_for(lambda: self.server.started, timeout=10, what="the emulator to start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


def config(engine: str, **kw: Any) -> EmulatorConfig:
    gpu = "h100" if engine == "vllm" else "mi300x"
    return EmulatorConfig(
        engine=engine, gpu=gpu, served_models=[MODEL, ALIAS], **{"speed": 50.0} | kw
    )


@contextlib.contextmanager
def flavour_servers() -> Iterator[dict[str, str]]:
    """One vLLM (H100) and one SGLang (MI300X) emulator, by engine name -> base URL."""
    with ServerThread(config("vllm")) as v, ServerThread(config("sglang")) as s:
        yield {"vllm": v.url, "sglang": s.url}


def sse_events(body: str) -> list[Any]:
    """Decoded ``data:`` payloads of an SSE body; [DONE] kept as the string."""
    assert body.endswith("data: [DONE]\n\n")
    frames = [f for f in body.split("\n\n") if f]
    assert all(f.startswith("data: ") for f in frames)
    return [f[6:] if f[6:] == "[DONE]" else orjson.loads(f[6:]) for f in frames]


def post_stream(
    url: str, body: dict[str, Any], path: str = "/v1/chat/completions", **kw: Any
) -> tuple[httpx.Response, list[Any]]:
    resp = httpx.post(url + path, json=body | {"stream": True}, timeout=10, **kw)
    return resp, sse_events(resp.text)


def set_faults(url: str, **faults: Any) -> dict[str, Any]:
    resp = httpx.post(url + "/emulator/faults", json=faults)
    assert resp.status_code == 200
    return dict(resp.json())


def state(url: str) -> dict[str, Any]:
    return dict(httpx.get(url + "/emulator/state").json())
