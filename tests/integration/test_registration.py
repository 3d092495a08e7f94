"""Worker registration: POST /admin/endpoints adds an engine to the fleet, a heartbeat keeps
it, DELETE or a lapsed heartbeat removes it. A real gateway and a real emulated engine."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from procs import PUBLIC_8B, SERVED_8B, pool, spawn_emulator, spawn_gateway

MESSAGES = [{"role": "user", "content": "hi"}]


def test_register_heartbeat_deregister_and_lapse(tmp_path: Path) -> None:
    static = spawn_emulator("vllm", "h100", [SERVED_8B])
    worker = spawn_emulator("sglang", "mi300x", [SERVED_8B])
    gw = spawn_gateway({"pools": [pool("h100-vllm", "h100", "vllm", 2.95, [static.url],
                                       {PUBLIC_8B: SERVED_8B})]}, tmp_path)
    body = {"pool": "mi300x-workers", "url": worker.url, "engine": "sglang",
            "accelerator": "mi300x", "models": {"llama-3.1-8b-amd": SERVED_8B},
            "price_per_gpu_hour": 1.5, "ttl_s": 1.0}
    try:
        first = httpx.post(gw.url + "/admin/endpoints", json=body, timeout=30)
        assert first.status_code == 201, first.text
        endpoint = first.json()["id"]
        assert endpoint == "mi300x-workers-0"
        again = httpx.post(gw.url + "/admin/endpoints", json=body, timeout=30)  # heartbeat
        assert again.status_code == 200 and again.json()["new"] is False
        ids = [e["id"] for e in httpx.get(gw.url + "/admin/endpoints").json()["endpoints"]]
        assert endpoint in ids
        models = [m["id"] for m in httpx.get(gw.url + "/v1/models").json()["data"]]
        assert "llama-3.1-8b-amd" in models
        chat = httpx.post(gw.url + "/v1/chat/completions", timeout=30, json={
            "model": "llama-3.1-8b-amd", "messages": MESSAGES, "max_tokens": 2})
        assert chat.status_code == 200 and chat.headers["x-fleetgate-endpoint"] == endpoint
        assert httpx.delete(gw.url + f"/admin/endpoints/{endpoint}").status_code == 200
        assert httpx.delete(gw.url + "/admin/endpoints/h100-vllm-0").status_code == 404
        models = [m["id"] for m in httpx.get(gw.url + "/v1/models").json()["data"]]
        assert models == [PUBLIC_8B]
        bad = httpx.post(gw.url + "/admin/endpoints", json={**body, "engine": "trt"})
        assert bad.status_code == 400
        assert httpx.post(gw.url + "/admin/endpoints", json=body, timeout=30).status_code == 201
        deadline = time.monotonic() + 10  # no heartbeat: gone within ttl_s + one sweep
        while "llama-3.1-8b-amd" in [m["id"] for m in
                                     httpx.get(gw.url + "/v1/models").json()["data"]]:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        for p in (gw, static, worker):
            p.stop()
