"""The real engine for ``make test-engines``: ``fleetgate worker`` starting vLLM (CPU build)
on the tiny model, registered with a real ``fleetgate serve``; plus small helpers.

Environment (set by ``make test-engines``, see docs/workers.md):

- ``FLEETGATE_ENGINE_PYTHON``: the interpreter of the engine venv (``.venv-engines``), passed
  to the worker as ``--python``; the gateway and the tests run in the main ``.venv``.
- ``FLEETGATE_TINY_MODEL``: the directory ``scripts/make_tiny_model.py`` built.
- ``FLEETGATE_WORKER_CLI`` (optional): a script to run instead of ``python -m fleetgate.cli``
  (to try a worker command under development).

Everything is bounded: the worker's start waits at most ``START_TIMEOUT_S``, and the engine's
whole process group is killed at the end whatever happened.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from procs import free_port, wait_for

SERVED = "tiny-llama"  # what vLLM serves
PUBLIC = "tiny"  # public name on both the real and the emulated pool
PUBLIC_REAL = "tiny-real"  # public name on the real vLLM only
REAL_POOL = "cpu-vllm"
EMU_POOL = "h100-emu"
MAX_MODEL_LEN = 1024  # long enough that a stream outlasts a test's look at it
START_TIMEOUT_S = 300.0
TTL_S = 3.0
ENGINE_ARGS = ["--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN), "--enforce-eager"]


def worker_command() -> list[str]:
    script = os.environ.get("FLEETGATE_WORKER_CLI")
    return [sys.executable, script, "worker"] if script else \
        [sys.executable, "-m", "fleetgate.cli", "worker"]


@dataclass
class RealEngine:
    """A ``fleetgate worker`` process and the vLLM server it started."""

    popen: subprocess.Popen[bytes]
    url: str  # the engine, e.g. http://127.0.0.1:PORT
    log: Path  # the worker's stdout+stderr, vLLM's log included
    model_dir: Path
    started_s: float = 0.0  # from the worker's start to its registration
    engine_pid: int = 0

    @property
    def facts(self) -> dict[str, Any]:
        return dict(json.loads((self.model_dir / "tiny_model.json").read_text()))

    def worker_lines(self) -> list[str]:
        """The worker's own lines (found anywhere in a line: the engine's output, which shares
        the file, may end without a newline)."""
        text = self.log.read_text(errors="replace")
        return re.findall(r"fleetgate worker: [^\n]*", text)

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self) -> None:
        """SIGTERM the worker (it deregisters and stops vLLM), then make sure of it."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=10)
        if self.engine_pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.engine_pid, signal.SIGKILL)


def start_real_vllm(gateway_url: str, model_dir: Path, python: str, log: Path) -> RealEngine:
    port = free_port()
    cmd = [
        *worker_command(), "--engine", "vllm", "--model", str(model_dir), "--pool", REAL_POOL,
        "--gateway", gateway_url, "--host", "127.0.0.1", "--port", str(port),
        "--python", python, "--served-model-name", SERVED,
        "--public-name", PUBLIC, "--public-name", PUBLIC_REAL, "--price-per-gpu-hour", "0.05",
        "--ttl", str(TTL_S), "--start-timeout", str(START_TIMEOUT_S),
        "--", *ENGINE_ARGS]
    started = time.monotonic()
    with log.open("wb") as out:
        popen = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL)
    engine = RealEngine(popen, f"http://127.0.0.1:{port}", log, model_dir)
    try:
        wait_for(lambda: _registered_or_dead(engine), START_TIMEOUT_S + 30,
                 "the worker to register vLLM")
    except AssertionError:
        engine.stop()
        raise
    if not engine.alive():
        engine.stop()
        raise AssertionError(f"worker exited with {popen.returncode}:\n{engine.tail()}")
    engine.started_s = time.monotonic() - started
    pid_line = next(ln for ln in engine.worker_lines() if "engine pid=" in ln)
    engine.engine_pid = int(pid_line.split("engine pid=")[1].split()[0])
    return engine


def _registered_or_dead(engine: RealEngine) -> bool:
    return not engine.alive() or any("registered id=" in ln for ln in engine.worker_lines())


def vllm_metrics(url: str) -> dict[str, float]:
    """``vllm:`` samples of one engine, keyed ``name{labels}`` minus model_name/engine."""
    out: dict[str, float] = {}
    for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
        if not line.startswith("vllm:"):
            continue
        key, _, value = line.rpartition(" ")
        name, _, labels = key.partition("{")
        extra = ",".join(p for p in labels.rstrip("}").split(",")
                         if p and not p.startswith(("model_name=", "engine=")))
        out[f"{name}{{{extra}}}" if extra else name] = float(value)
    return out


def endpoint_row(gateway_url: str, url: str) -> dict[str, Any] | None:
    rows = httpx.get(gateway_url + "/admin/endpoints", timeout=5).json()["endpoints"]
    return next((r for r in rows if r["url"] == url), None)


def public_models(gateway_url: str) -> list[str]:
    return [m["id"] for m in httpx.get(gateway_url + "/v1/models", timeout=5).json()["data"]]
