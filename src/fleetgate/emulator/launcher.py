"""Run an emulated engine: in this process (``run_emulator``) or as a child (``start_emulator``).

``run_emulator(config, host, port)`` binds the listening socket itself (port 0 = a free port
chosen by the OS, so there is no port race), serves the app with uvicorn (uvloop, httptools,
no access log, log level warning) and, once uvicorn accepts connections, prints exactly one
line ``FLEETGATE_EMULATOR_READY http://HOST:PORT`` on stdout; later output goes to stderr.

``start_emulator(...)`` runs ``python -m fleetgate.emulator ... --port 0
--exit-on-stdin-eof`` as a child process and waits (bounded) for that line. The child's stdin
is a pipe the parent never writes: when the parent dies, for any reason and on any OS, the
pipe closes and the child shuts itself down (SIGTERM to itself, a hard exit 10 s later if the
graceful shutdown hangs). ``EmulatorHandle.stop()`` asks politely first, ``kill()`` does not.

May touch: sockets, subprocesses, uvicorn, the current process's stdio and signals (only in
``run_emulator``, which owns its process). Must not touch: the emulator's internals.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import threading
import time

import uvicorn

from fleetgate.emulator.config import EmulatorConfig
from fleetgate.emulator.server import create_emulator_app

READY_PREFIX = "FLEETGATE_EMULATOR_READY "
HARD_EXIT_AFTER_S = 10.0


def run_emulator(
    config: EmulatorConfig, host: str, port: int, exit_on_stdin_eof: bool = False
) -> None:
    """Serve one emulated engine until SIGINT/SIGTERM (or stdin EOF when asked)."""
    sock = _bind(host, port)
    bound_port = sock.getsockname()[1]
    url_host = f"[{host}]" if ":" in host else host
    url = f"http://{url_host}:{bound_port}"
    if exit_on_stdin_eof:
        threading.Thread(target=_exit_on_stdin_eof, name="stdin-watch", daemon=True).start()
    uv_config = uvicorn.Config(
        create_emulator_app(config),
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
        lifespan="on",
        timeout_graceful_shutdown=3,
    )
    server = uvicorn.Server(uv_config)
    with asyncio.Runner(loop_factory=uv_config.get_loop_factory()) as runner:
        runner.run(_serve_and_announce(server, sock, url))


async def _serve_and_announce(server: uvicorn.Server, sock: socket.socket, url: str) -> None:
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not serving.done():
        await asyncio.sleep(0.01)
    if server.started:
        sys.stdout.write(f"{READY_PREFIX}{url}\n")
        sys.stdout.flush()
        sys.stdout = sys.stderr  # the parent stops reading our stdout after that line
    await serving


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _exit_on_stdin_eof() -> None:
    with contextlib.suppress(OSError, ValueError):
        while sys.stdin.buffer.read(4096):
            pass
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(HARD_EXIT_AFTER_S)
    os._exit(1)


class EmulatorHandle:
    """A running child emulator: ``url``, ``pid``, ``stop()`` and ``kill()``."""

    def __init__(self, process: asyncio.subprocess.Process, url: str) -> None:
        self.process, self.url = process, url

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    async def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM, wait up to ``timeout`` seconds, then SIGKILL."""
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), timeout)
            except TimeoutError:
                self.kill()
                await self.process.wait()
        self._close_stdin()

    def kill(self) -> None:
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
        self._close_stdin()

    def _close_stdin(self) -> None:
        if self.process.stdin is not None and not self.process.stdin.is_closing():
            self.process.stdin.close()


async def start_emulator(
    engine: str,
    gpu: str,
    served_models: list[str],
    profile: str | None = None,
    speed: float = 1.0,
    stack: str = "stock",
    host: str = "127.0.0.1",
    *,
    tp: int | None = None,
    max_queued_requests: int | None = None,
    max_model_len: int | None = None,
    startup_timeout: float = 30.0,
    port: int = 0,
    enable_lora: bool = False,
    lora_modules: dict[str, str] | None = None,
    max_loras: int | None = None,
    runtime_lora: bool = False,
) -> EmulatorHandle:
    """Start an emulated engine as a child process; returns once it accepts connections.
    ``port`` 0: a free port; a given one restarts a dead engine at its old URL."""
    config = EmulatorConfig.model_validate(
        {
            "engine": engine,
            "gpu": gpu,
            "served_models": served_models,
            "profile": profile,
            "speed": speed,
            "stack": stack,
            "tp": tp,
            "max_queued_requests": max_queued_requests,
            "max_model_len": max_model_len,
            "enable_lora": enable_lora,
            "lora_modules": lora_modules or {},
            "max_loras": max_loras,
            "runtime_lora": runtime_lora,
        }
    )
    process = await asyncio.create_subprocess_exec(
        *_child_command(config, host, port),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        url = await asyncio.wait_for(_read_ready_line(process), startup_timeout)
    except BaseException:
        handle = EmulatorHandle(process, "")
        handle.kill()
        await process.wait()
        raise
    return EmulatorHandle(process, url)


def _child_command(config: EmulatorConfig, host: str, port: int = 0) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "fleetgate.emulator",
        "--engine",
        config.engine,
        "--gpu",
        config.gpu,
        "--host",
        host,
        "--port",
        str(port),
        "--speed",
        repr(config.speed),
        "--stack",
        config.stack,
        "--exit-on-stdin-eof",
    ]
    for name in config.served_models:
        cmd += ["--model", name]
    optional = {
        "--profile": config.profile,
        "--tp": config.tp,
        "--max-queued-requests": config.max_queued_requests,
        "--max-model-len": config.max_model_len,
    }
    for flag, value in optional.items():
        if value is not None:
            cmd += [flag, str(value)]
    if config.lora_enabled:
        cmd += ["--enable-lora"]
        if config.max_loras is not None:
            cmd += ["--max-loras", str(config.max_loras)]
        if config.runtime_lora:
            cmd += ["--allow-runtime-lora"]
        if config.lora_modules:
            cmd += ["--lora-modules", *(f"{k}={v}" for k, v in config.lora_modules.items())]
    return cmd


async def _read_ready_line(process: asyncio.subprocess.Process) -> str:
    assert process.stdout is not None
    while True:
        line = await process.stdout.readline()
        if not line:
            code = await process.wait()
            raise RuntimeError(f"emulated engine exited with code {code} before it was ready")
        text = line.decode(errors="replace").strip()
        if text.startswith(READY_PREFIX):
            return text[len(READY_PREFIX) :]
