"""Real processes for end-to-end tests: emulated engines and `fleetgate serve` on local ports.

Everything here starts real servers (uvicorn over TCP on 127.0.0.1) as child processes and
waits for them with bounded polling, never fixed sleeps. Used by tests/conftest.py fixtures.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

READY_PREFIX = "FLEETGATE_EMULATOR_READY "
SERVED_8B = "meta-llama/Llama-3.1-8B-Instruct"
PUBLIC_8B = "llama-3.1-8b"


@dataclass
class Proc:
    popen: subprocess.Popen[str]
    url: str

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=5)

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(timeout=5)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn_emulator(engine: str, gpu: str, models: list[str], *, speed: float = 20.0,
                   port: int = 0, extra: list[str] | None = None, timeout: float = 30.0) -> Proc:
    cmd = [sys.executable, "-m", "fleetgate.emulator", "--engine", engine, "--gpu", gpu,
           "--port", str(port), "--speed", str(speed)]
    for m in models:
        cmd += ["--model", m]
    cmd += extra or []
    popen = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert popen.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = popen.stdout.readline()
        if not line:
            raise RuntimeError(f"emulator exited early: {cmd}")
        if line.startswith(READY_PREFIX):
            return Proc(popen, line[len(READY_PREFIX):].strip())
    popen.kill()
    raise RuntimeError("emulator did not become ready")


def spawn_gateway(config: dict | Path, tmp: Path, *, env: dict[str, str] | None = None,
                  wait_ready: bool = True, timeout: float = 60.0, workers: int = 1) -> Proc:
    if isinstance(config, dict):
        path = tmp / f"fleet-{time.monotonic_ns()}.yaml"
        path.write_text(yaml.safe_dump(config))
    else:
        path = config
    port = free_port()
    cmd = [sys.executable, "-m", "fleetgate.cli", "serve", "--config", str(path),
           "--port", str(port), "--workers", str(workers)]
    full_env = {**os.environ, "FLEETGATE_HEALTH_INTERVAL_S": "0.2", **(env or {})}
    popen = subprocess.Popen(cmd, env=full_env, stdin=subprocess.DEVNULL, text=True)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + ("/readyz" if wait_ready else "/healthz"), timeout, popen)
    return Proc(popen, url)


def wait_for(check: Callable[[], Any], timeout: float = 2.0, what: str = "the condition",
             interval: float = 0.02) -> Any:
    """The first truthy ``check()`` within ``timeout`` seconds, else AssertionError."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def wait_http(url: str, timeout: float, popen: subprocess.Popen[str] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if popen is not None and popen.poll() is not None:
            raise RuntimeError(f"process exited with {popen.returncode} before {url} answered")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer 200 within {timeout}s")


def pool(name: str, accelerator: str, engine: str, price: float, urls: list[str],
         models: dict[str, str]) -> dict:
    return {"name": name, "accelerator": accelerator, "engine": engine,
            "price_per_gpu_hour": price, "endpoints": urls, "models": models}
