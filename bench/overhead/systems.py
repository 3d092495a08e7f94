"""The systems under test of ``bench/overhead/run.py``: installing, starting, stopping them.

Each system runs as a process group we started: ``launch`` says how to start one,
``start_server`` starts it and waits until a plain completion answers 200.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
if str(ROOT / "bench") not in sys.path:
    sys.path.insert(0, str(ROOT / "bench"))

import relay_overhead as ro  # noqa: E402  (bench/ scripts are not a package)

CACHE = ROOT / ".cache" / "overhead"
SUT_CPU, LOAD_CPU = 0, 1
PUBLIC, SERVED = ro.PUBLIC, ro.SERVED
TOKENS = 16
SGLANG_SPEC = "sglang-router==0.3.2"
LITELLM_SPEC = "litellm[proxy]==1.108.5"
SYSTEMS = ("sglang-router", "naive", "fleetgate", "fleetgate-traced", "litellm")
EXTRA = ("naive-granian", "fleetgate-granian")  # on request: the same apps served by granian
BASE = ("fleetgate-base", "fleetgate-base-traced")  # with --baseline: another checkout's code
GRANIAN = ["--interface", "asgi", "--loop", "uvloop", "--workers", "1", "--runtime-threads",
           "1", "--runtime-mode", "st", "--no-access-log", "--log-level", "warning",
           "--host", "127.0.0.1"]
MODEL = {"direct": SERVED, "naive": SERVED, "sglang-router": SERVED}  # others: PUBLIC


class NotAvailable(Exception):
    """A system that cannot be installed or started; its row says why."""


# ---------------------------------------------------------------- processes

def cpu_by_tree(roots: list[int]) -> dict[int, float]:
    """utime+stime (s) of each root's whole process tree, from one scan of /proc."""
    kids: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = Path(f"/proc/{entry.name}/stat").read_text()
                kids.setdefault(int(stat[stat.rfind(")") + 2:].split()[1]), []).append(
                    int(entry.name))
    out: dict[int, float] = {}
    for root in roots:
        total, todo = 0.0, [root]
        while todo:
            pid = todo.pop()
            todo += kids.get(pid, [])
            with contextlib.suppress(OSError, ValueError, IndexError):
                total += ro.proc_cpu_s(pid)
        out[root] = total
    return out


def tree_threads(root: int) -> int:
    """Threads of ``root`` and its children (one level: uvicorn/LiteLLM workers)."""
    pids = [root]
    with contextlib.suppress(OSError):
        pids += [int(p) for t in os.listdir(f"/proc/{root}/task")
                 for p in Path(f"/proc/{root}/task/{t}/children").read_text().split()]
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("Threads:"):
                    total += int(line.split()[1])
    return total


@dataclass
class Server:
    """A system under test (or the mock / OTLP receiver): a process group we started."""

    name: str
    popen: subprocess.Popen[Any]
    url: str
    log: Path | None = None
    ready_s: float = 0.0
    group: bool = False  # started in its own process group (stopped as a whole)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, n: int = 1500) -> str:
        if self.log is None or not self.log.exists():
            return ""
        return self.log.read_text(errors="replace")[-n:]

    def stop(self) -> None:
        if self.popen.poll() is not None:
            return
        self._signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.popen.wait(timeout=5)

    def _signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            if self.group:
                os.killpg(self.popen.pid, sig)
            else:
                self.popen.send_signal(sig)


def plain_ok(url: str, model: str) -> bool:
    body = json.dumps({"model": model, "max_tokens": TOKENS,
                       "messages": [{"role": "user", "content": "Say hello."}]}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", data=body,
                                 headers={"content-type": "application/json"})
    with contextlib.suppress(OSError, urllib.error.HTTPError), \
            urllib.request.urlopen(req, timeout=5.0) as resp:
        return bool(resp.status == 200 and json.loads(resp.read()).get("choices"))
    return False


def start_server(name: str, cmd: list[str], env: dict[str, str], cpu: int | None, log: Path,
                 port: int, timeout: float) -> Server:
    """Start ``cmd`` in its own process group; ready once a plain completion answers 200."""
    t0 = time.monotonic()
    with log.open("wb") as out:
        popen = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True,
                                 preexec_fn=ro._child_setup(cpu))
    server = Server(name, popen, f"http://127.0.0.1:{port}", log, group=True)
    while time.monotonic() - t0 < timeout:
        if not server.alive():
            raise NotAvailable(f"{name} exited with {popen.returncode} at start: "
                               f"{server.log_tail(600)!r}")
        if plain_ok(server.url, MODEL.get(name, PUBLIC)):
            server.ready_s = time.monotonic() - t0
            return server
        time.sleep(0.2)
    server.stop()
    raise NotAvailable(f"{name} not ready after {timeout:.0f} s: {server.log_tail(600)!r}")


def ensure_venv(name: str, spec: str, module: str) -> Path:
    """The python of ``.cache/overhead/<name>-venv`` with ``spec`` installed (made once)."""
    venv = CACHE / f"{name}-venv"
    python, marker = venv / "bin" / "python", venv / ".bench-spec"
    if marker.exists() and marker.read_text().strip() == spec and python.exists():
        return python
    print(f"installing {spec} into {venv} (once) ...", flush=True)
    if venv.exists():
        shutil.rmtree(venv)
    CACHE.mkdir(parents=True, exist_ok=True)
    log = CACHE / f"{name}-install.log"
    base = shutil.which("python3") or sys.executable
    steps = [[base, "-m", "venv", str(venv)],
             [str(python), "-m", "pip", "install", "--disable-pip-version-check", spec],
             [str(python), "-c", f"import {module}"]]
    with log.open("w") as out:
        for step in steps:
            try:
                rc = subprocess.run(step, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, timeout=1200).returncode
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise NotAvailable(f"`{' '.join(step[1:])}` failed: {exc}") from exc
            if rc != 0:
                lines = [ln for ln in log.read_text().splitlines()
                         if ln.startswith("ERROR") or "Error" in ln]
                raise NotAvailable(f"`{' '.join(step[1:])}` exited {rc}: "
                                   f"{' / '.join(lines[-2:]) or 'see ' + str(log)}")
    marker.write_text(spec)
    return python


def venv_versions(python: Path, dists: list[str]) -> dict[str, str]:
    code = ("import importlib.metadata as m, json, sys\nout = {}\nfor d in sys.argv[1:]:\n"
            "    try: out[d] = m.version(d)\n    except m.PackageNotFoundError: pass\n"
            "import platform\nout['python'] = platform.python_version()\n"
            "print(json.dumps(out))")
    with contextlib.suppress(OSError, subprocess.SubprocessError, ValueError):
        res = subprocess.run([str(python), "-c", code, *dists], capture_output=True, text=True,
                             timeout=60)
        return dict(json.loads(res.stdout))
    return {}


# ---------------------------------------------------------------- the systems

@dataclass
class Launch:
    """How to start one system: its command and environment, and its packages."""

    cmd: list[str]
    env: dict[str, str]
    timeout: float = 60.0
    versions: dict[str, str] = field(default_factory=dict)


def base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}


def launch(name: str, mock: str, port: int, tmp: Path, args: argparse.Namespace,
           receiver: str | None) -> Launch:
    env = base_env()
    here = {d: importlib.metadata.version(d) for d in
            ("uvicorn", "starlette", "fastapi", "aiohttp", "uvloop", "httptools", "orjson",
             "granian")
            if _has_dist(d)}
    if name in ("fleetgate", "fleetgate-traced", *BASE):
        config = tmp / f"{name}.yaml"
        config.write_text(ro.gateway_config(mock, "cost"))
        exe = Path(sys.executable).parent / "fleetgate"
        cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "fleetgate.cli"]
        if name in BASE:  # the same entry point over the baseline's package (its src/)
            env["PYTHONPATH"] = str(args.baseline)
            cmd = [sys.executable, "-m", "fleetgate.cli"]
        if args.quiet_logs:
            env["FLEETGATE_REQUEST_LOG"] = "off"
        if name.endswith("-traced"):
            if receiver is None:
                raise NotAvailable("no OTLP receiver")
            env.update(OTEL_EXPORTER_OTLP_ENDPOINT=receiver, OTEL_TRACES_SAMPLER="always_on")
        rev = git_rev(args.baseline) if name in BASE else git_rev()
        versions = {"fleetgate": f"{importlib.metadata.version('fleetgate')} @ {rev}", **here}
        return Launch([*cmd, "serve", "--config", str(config), "--port", str(port)], env,
                      versions=versions)
    if name == "fleetgate-granian":
        config = tmp / f"{name}.yaml"
        config.write_text(ro.gateway_config(mock, "cost"))
        env["FG_CONFIG"] = str(config)
        if args.quiet_logs:
            env["FLEETGATE_REQUEST_LOG"] = "off"
        cmd = [str(Path(sys.executable).parent / "granian"), *GRANIAN, "--port", str(port),
               "--working-dir", str(HERE), "granian_app:app"]
        return Launch(cmd, env, versions=here)
    if name == "naive-granian":
        env["NAIVE_UPSTREAM"] = mock
        cmd = [str(Path(sys.executable).parent / "granian"), *GRANIAN, "--port", str(port),
               "--working-dir", str(HERE), "naive:app"]
        return Launch(cmd, env, versions=here)
    if name == "naive":
        env["NAIVE_UPSTREAM"] = mock
        cmd = [sys.executable, "-m", "uvicorn", "naive:app", "--app-dir", str(HERE),
               "--host", "127.0.0.1", "--port", str(port), "--loop", "uvloop", "--http",
               "httptools", "--workers", "1", "--no-access-log", "--log-level", "warning"]
        return Launch(cmd, env, versions=here)
    if name == "sglang-router":
        python = ensure_venv(name, args.sglang_spec, "sglang_router")
        env["TOKIO_WORKER_THREADS"] = "1"
        cmd = [str(python), "-m", "sglang_router.launch_router", "--worker-urls", mock,
               "--host", "127.0.0.1", "--port", str(port), "--policy", "round_robin",
               "--prometheus-host", "127.0.0.1", "--prometheus-port", str(ro.free_port()),
               "--log-level", "warn" if args.quiet_logs else "info"]
        return Launch(cmd, env, 90.0, venv_versions(python, ["sglang-router"]))
    if name == "litellm":
        python = ensure_venv(name, args.litellm_spec, "litellm.proxy.proxy_cli")
        config = tmp / "litellm.yaml"
        config.write_text(json.dumps({
            "model_list": [{"model_name": PUBLIC, "litellm_params": {
                "model": f"openai/{SERVED}", "api_base": f"{mock}/v1", "api_key": "x"}}],
            "litellm_settings": {"set_verbose": False, "json_logs": False,
                                 "callbacks": [], "success_callback": [],
                                 "failure_callback": []},
            "general_settings": {"disable_spend_logs": True, "disable_error_logs": True},
        }, indent=2))
        env.update(LITELLM_LOG="ERROR", LITELLM_LOCAL_MODEL_COST_MAP="True",
                   LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY="true")
        cmd = [str(python.parent / "litellm"), "--config", str(config), "--host", "127.0.0.1",
               "--port", str(port), "--num_workers", "1"]
        versions = venv_versions(python, ["litellm", "uvicorn", "fastapi", "starlette",
                                          "uvloop", "httptools", "httpx", "openai", "aiohttp"])
        return Launch(cmd, env, 240.0, versions)
    raise ValueError(name)


def _has_dist(name: str) -> bool:
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def git_rev(where: Path | None = None) -> str:
    rev = subprocess.run(["git", "-C", str(where or ROOT), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True).stdout.strip()
    return rev or "?"


@contextlib.contextmanager
def children() -> Iterator[list[Server]]:
    started: list[Server] = []
    try:
        yield started
    finally:
        for s in reversed(started):
            s.stop()
