"""register sidecar: keeps an engine in the same pod registered with EVERY gateway replica.

What `fleetgate worker` does after it has started the engine (docs/workers.md "What every
run does", steps 3-6), for an engine that runs in its own image (vLLM's, SGLang's) with the
command line the worker would have used: wait for the engine's health route, then
`POST /admin/endpoints` to each address of the gateway's headless Service every ttl/3
seconds (a replica keeps the registrations it received: one POST through the load-balanced
Service would reach one replica only), and on SIGTERM `DELETE /admin/endpoints/{id}` at
each. Standard library only: it runs in the gateway image.

Environment: FLEETGATE_PEERS (headless Service host, e.g. fleetgate-peers), FLEETGATE_PEERS_PORT
(8080), FLEETGATE_ADMIN_KEY, ENGINE_URL (what the gateway dials), ENGINE_HEALTH_URL,
POOL, ENGINE, ACCELERATOR, MODELS ("public=served,..."), PRICE_PER_GPU_HOUR,
GPUS_PER_REPLICA (1), TTL_S (15).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping


def payload(env: Mapping[str, str]) -> dict[str, object]:
    """The registration body (gateway/registrations.py RegistrationBody)."""
    models = dict(item.split("=", 1) for item in env["MODELS"].split(",") if "=" in item)
    return {"pool": env["POOL"], "url": env["ENGINE_URL"].rstrip("/"), "engine": env["ENGINE"],
            "accelerator": env["ACCELERATOR"], "models": models,
            "price_per_gpu_hour": float(env["PRICE_PER_GPU_HOUR"]),
            "gpus_per_replica": int(env.get("GPUS_PER_REPLICA", "1")),
            "ttl_s": float(env.get("TTL_S", "15"))}


def peers(host: str, port: int) -> list[str]:
    """Every gateway replica's base URL (the headless Service's A/AAAA records)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return []
    addresses = sorted({info[4][0] for info in infos})
    return [f"http://[{a}]:{port}" if ":" in a else f"http://{a}:{port}" for a in addresses]


def call(method: str, url: str, key: str | None, body: object = None,
         timeout: float = 5.0) -> tuple[int, dict[str, object]]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, json.loads(exc.read() or b"{}")
        except ValueError:
            return exc.code, {}
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return 0, {"error": str(exc)}


def wait_healthy(url: str, stop: list[bool]) -> bool:
    while not stop:
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                if answer.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(2)
    return False


def beat(gateways: list[str], body: dict[str, object], key: str | None,
         ids: dict[str, str]) -> None:
    """One heartbeat to each replica; remembers each replica's id for the DELETE."""
    for base in gateways:
        status, answer = call("POST", f"{base}/admin/endpoints", key, body)
        if status in (200, 201) and "id" in answer:
            if status == 201 or base not in ids:
                print(f"register: {body['url']} -> {base} as {answer['id']}", flush=True)
            ids[base] = str(answer["id"])
        else:
            print(f"register: {base} answered {status} {answer}", flush=True)


def leave(ids: dict[str, str], key: str | None) -> None:
    for base, endpoint in ids.items():
        status, _ = call("DELETE", f"{base}/admin/endpoints/{endpoint}", key)
        print(f"register: left {base} ({endpoint}): {status}", flush=True)


def main() -> int:
    env = os.environ
    body = payload(env)
    key = env.get("FLEETGATE_ADMIN_KEY")
    host, port = env.get("FLEETGATE_PEERS", "fleetgate-peers"), int(
        env.get("FLEETGATE_PEERS_PORT", "8080"))
    stop: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    signal.signal(signal.SIGINT, lambda *_: stop.append(True))
    if not wait_healthy(env["ENGINE_HEALTH_URL"], stop):
        return 0
    ids: dict[str, str] = {}
    period = float(body["ttl_s"]) / 3  # type: ignore[arg-type]
    while not stop:
        beat(peers(host, port), body, key, ids)
        deadline = time.monotonic() + period
        while not stop and time.monotonic() < deadline:
            time.sleep(0.2)
    leave(ids, key)  # first, so the gateways stop routing before the engine stops
    return 0


if __name__ == "__main__":
    sys.exit(main())
