"""``fleetgate serve --workers N``: N gateway processes on one host, one port, one fleet.

The supervisor (this module, the parent process) does what must happen once per host:

- **holds the port**: it binds it with SO_REUSEPORT (so a port taken fails at once, and port
  0 picks one) without listening, and each worker listens on it with SO_REUSEPORT too
  (``FLEETGATE_REUSE_PORT``): the kernel spreads new connections evenly over the workers
  by their address hash (a shared accept queue would hand most to whichever worker woke
  first);
- **runs the emulated engines** of the config's ``emulated://`` endpoints once, revives one
  that exits, and tells the workers their URLs (``FLEETGATE_SHARED_EMULATORS``), so the
  workers route to the same engines instead of starting N copies;
- **serves the shared state** when no Redis is configured: its in-memory stores over a Unix
  socket (``state/store/local.py``, ``FLEETGATE_STORE_SOCKET``), so rate, concurrency and
  budget limits are exact across workers, each worker sees the others' in-flight requests
  (as replicas do through Redis), registrations made at one worker are routed by all, and
  ``/admin/costs`` sums every worker's charges. With ``FLEETGATE_REDIS_URL`` the workers are
  replicas on Redis like any other;
- **one ``/metrics``**: the workers run prometheus_client's multiprocess mode in a private
  directory (``PROMETHEUS_MULTIPROC_DIR``), so whichever worker answers a scrape reports
  every worker's counters and histograms summed;
- **restarts a worker that dies** (at most once a second), forwards SIGHUP (config reload)
  to every worker, and on SIGTERM/SIGINT stops them gracefully (each drains its streams as
  a single gateway does), then its engines, then removes its directory.

A worker is ``fleetgate serve`` itself (``python -m fleetgate serve``) with those variables
set; it dies with the supervisor (PR_SET_PDEATHSIG on Linux).

May touch: processes, signals, sockets, the state store server, the emulator launcher.
Must not touch: the request path.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from fleetgate.config import default_config_path, load_config
from fleetgate.gateway.server import SHUTDOWN_GRACE_S
from fleetgate.gateway.settings import Settings
from fleetgate.state.fleet import fleet_endpoints, launch_emulators, revive_emulators
from fleetgate.state.store.local import LocalStoreServer
from fleetgate.state.store.memory import MemoryLimits, MemorySharedState

if TYPE_CHECKING:
    from fleetgate.emulator import EmulatorHandle

log = logging.getLogger("fleetgate")

RESTART_EVERY_S = 1.0  # a worker that keeps dying is restarted at most this often


def supervise(settings: Settings) -> int:
    """Run ``settings.workers`` gateway processes until SIGTERM/SIGINT; the exit code."""
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((settings.host, settings.port))  # held, never listened on: the workers do
    try:
        return asyncio.run(_Supervisor(settings, sock).run())
    finally:
        sock.close()


class _Supervisor:
    def __init__(self, settings: Settings, sock: socket.socket) -> None:
        self.settings = settings
        self.sock = sock
        self.dir = Path(tempfile.mkdtemp(prefix="fleetgate-"))  # 0700: the store's socket
        self.workers: list[subprocess.Popen[bytes] | None] = [None] * settings.workers
        self.started_at = [0.0] * settings.workers
        self.stopping = asyncio.Event()

    async def run(self) -> int:
        config_path = self.settings.config_path or default_config_path()
        endpoints = fleet_endpoints(load_config(config_path))
        port = self.sock.getsockname()[1]
        env = {**os.environ, "FLEETGATE_CONFIG": str(config_path), "FLEETGATE_WORKERS": "1",
               "FLEETGATE_HOST": self.settings.host, "FLEETGATE_PORT": str(port),
               "FLEETGATE_REUSE_PORT": "1"}
        metrics_dir = self.dir / "metrics"
        metrics_dir.mkdir()
        env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
        store: LocalStoreServer | None = None
        emulators: dict[str, EmulatorHandle] = {}
        try:
            emulators = await launch_emulators(endpoints)
            env["FLEETGATE_SHARED_EMULATORS"] = json.dumps(
                {key: handle.url for key, handle in emulators.items()})
            if self.settings.redis_url is None:
                store = LocalStoreServer(MemorySharedState(), MemoryLimits())
                await store.start(str(self.dir / "store.sock"))
                env["FLEETGATE_STORE_SOCKET"] = str(self.dir / "store.sock")
            self._signals()
            log.info("fleetgate: %d workers on %s:%d (pid %d)", len(self.workers),
                     self.settings.host, port, os.getpid())
            while not self.stopping.is_set():
                self._keep_running(env)
                await revive_emulators(emulators, endpoints)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), 0.5)
            return await self._stop_workers()
        finally:
            await asyncio.gather(*(h.stop() for h in emulators.values()),
                                 return_exceptions=True)
            if store is not None:
                await store.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    def _signals(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        loop.add_signal_handler(signal.SIGHUP, self._forward, signal.SIGHUP)

    def _forward(self, sig: int) -> None:
        for proc in self.workers:
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(sig)

    def _keep_running(self, env: dict[str, str]) -> None:
        now = time.monotonic()
        for k, proc in enumerate(self.workers):
            if proc is not None and proc.poll() is None:
                continue
            if proc is not None:
                log.warning("worker %d (pid %d) exited with code %s; restarting", k, proc.pid,
                            proc.returncode)
                _forget_metrics_of(proc.pid, env["PROMETHEUS_MULTIPROC_DIR"])
                self.workers[k] = None
            if now - self.started_at[k] < RESTART_EVERY_S:
                continue
            self.started_at[k] = now
            self.workers[k] = subprocess.Popen(
                [sys.executable, "-m", "fleetgate", "serve"], env=env,
                preexec_fn=_die_with_parent)

    async def _stop_workers(self) -> int:
        self._forward(signal.SIGTERM)
        deadline = time.monotonic() + self.settings.shutdown_timeout_s + SHUTDOWN_GRACE_S + 5
        while time.monotonic() < deadline and any(
                p is not None and p.poll() is None for p in self.workers):
            await asyncio.sleep(0.1)
        self._forward(signal.SIGKILL)
        codes = [p.wait() for p in self.workers if p is not None]
        return max((c for c in codes if c > 0), default=0)


def _forget_metrics_of(pid: int, path: str) -> None:
    """prometheus_client's multiprocess cleanup for a dead worker (its live gauges)."""
    from prometheus_client import multiprocess

    with contextlib.suppress(OSError):
        multiprocess.mark_process_dead(pid, path)


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the supervisor dies (Linux; else nothing)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
