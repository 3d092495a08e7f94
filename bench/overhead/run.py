"""Proxy overhead side by side: fleetgate vs a naive pass-through, sglang-router and LiteLLM.

One run, one instant upstream, the same load for every system, so the rows can be compared:

| one core | plain c=32 req/s, CPU ms/req | stream c=32 req/s, CPU ms/req | added p50 c=1 |

Systems under test (each pinned alone to CPU 0, all started up front and left idle while
another is measured; their idle CPU is measured and reported):

* ``fleetgate``: ``fleetgate serve`` (the production entry point, default settings: request
  log on, to a file) with one pool ``bench`` whose only endpoint is the mock and a ``cost``
  default policy, configured exactly as ``bench/relay_overhead.py`` does (public model
  ``bench-model`` -> served ``bench-served``).
* ``fleetgate-traced``: the same with OpenTelemetry tracing at 100 % sampling
  (``OTEL_EXPORTER_OTLP_ENDPOINT`` to the OTLP/HTTP receiver of ``bench/tracing_overhead.py``,
  ``OTEL_TRACES_SAMPLER=always_on``); the spans received are counted and reported.
* ``naive``: ``bench/overhead/naive.py``, ~40 lines of FastAPI + one shared aiohttp session,
  under uvicorn (uvloop, httptools, 1 worker, no access log).
* ``sglang-router``: PyPI ``sglang-router==0.3.2`` (Rust, PyO3), ``round_robin`` policy,
  ``TOKIO_WORKER_THREADS=1`` and pinned; default log level (info, to a file). It probes the
  worker's ``/health``, then ``/server_info``, ``/get_server_info``, ``/model_info``,
  ``/get_model_info`` (404s from the mock are tolerated) and tries HTTP/2 prior knowledge
  once; ``bench/mock_engine.py`` as is is enough. Its streams stall ~40 ms each on a
  keep-alive connection (p50 at c=1 ~44 ms at <1 CPU ms/req): it sets no ``TCP_NODELAY`` on
  accepted client sockets (strace), so Nagle waits for the client's delayed ACK; its stream
  req/s is bound by that, not by its CPU (a real pooled client sees the same).
* ``litellm``: PyPI ``litellm[proxy]`` (pinned below: the newest release whose ``proxy`` extra
  resolves on PyPI as served here; 1.108.6+ pin ``litellm-enterprise``/``litellm-proxy-
  extras`` post-releases and 1.110 a ``litellm-proxy`` package that are not there), one model
  ``openai/bench-served`` at the mock, ``--num_workers 1``, no master key
  (``LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY``: no auth, like the others),
  ``LITELLM_LOG=ERROR``, local cost map, spend/error logs off, no callbacks (telemetry is a
  no-op in these versions). Its install has no httptools, so its uvicorn parses HTTP with
  h11 (as shipped).

sglang-router and LiteLLM are not project dependencies: each is installed by this script into
its own venv, ``.cache/overhead/<name>-venv`` (git-ignored), on first use, and reused while
its spec is unchanged. A system that cannot be installed or started is reported as "not
available: <why>" and the rest still run.

Method (as ``bench/relay_overhead.py``): ``bench/mock_engine.py`` (instant vLLM-shaped
answers, 16 content chunks a stream) and the load generator (this process: the raw asyncio
HTTP/1.1 closed-loop client of ``bench/loadgen.py``, one keep-alive connection per user)
pinned to CPU 1. Scenarios: ``/v1/chat/completions`` plain and stream (``stream_options.
include_usage``) at concurrency 1, 32 and 128, each also sent straight to the mock
(``direct``: the baseline for *added* latency). Each round runs every scenario on every
system in turn: warm-up (at least ``--warmup-s`` and until ``c`` responses have completed,
so a slow system is in its steady state), then a measured window. A SUT's CPU ms/request is
utime+stime of its whole process tree (``/proc/<pid>/stat``) over the window / responses
completed in it. Every response must be 200 and the first of each window is checked in
full (JSON with 16 tokens of content, or a stream whose deltas add up to them, with usage,
ending in ``data: [DONE]``); problems are reported per cell. Each cell reports the round
with the least CPU used by processes outside the benchmark (all rounds are listed too).

Run: ``.venv/bin/python bench/overhead/run.py`` (about 5 minutes, plus about 2 minutes to
install the two venvs the first time); ``--quick`` (1.5 s windows, c=1 and 32 only, about 2
minutes); ``--systems naive,fleetgate`` for a subset; ``--rounds N``; ``--window-s S``;
``--out FILE`` (default ``bench/results/overhead.md``). Children are killed on exit, also
when this process dies (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import relay_overhead as ro  # noqa: E402  (bench/ scripts are not a package)
import tracing_overhead as to  # noqa: E402

from loadgen import LoadConnection, Window, request_bytes  # noqa: E402

CACHE = ROOT / ".cache" / "overhead"
RESULTS = ROOT / "bench" / "results" / "overhead.md"
SUT_CPU, LOAD_CPU = 0, 1
PUBLIC, SERVED = ro.PUBLIC, ro.SERVED
TOKENS = 16
SGLANG_SPEC = "sglang-router==0.3.2"
LITELLM_SPEC = "litellm[proxy]==1.108.5"
SYSTEMS = ("sglang-router", "naive", "fleetgate", "fleetgate-traced", "litellm")
LABELS = {
    "direct": "direct (no proxy)",
    "sglang-router": "sglang-router {v} (Rust)",
    "naive": "naive FastAPI + aiohttp pass-through, ~40 lines",
    "fleetgate": "fleetgate, cost policy",
    "fleetgate-traced": "fleetgate, cost policy, tracing 100 %",
    "litellm": "LiteLLM proxy {v}",
}
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
            ("uvicorn", "starlette", "fastapi", "aiohttp", "uvloop", "httptools", "orjson")
            if _has_dist(d)}
    if name in ("fleetgate", "fleetgate-traced"):
        config = tmp / f"{name}.yaml"
        config.write_text(ro.gateway_config(mock, "cost"))
        exe = Path(sys.executable).parent / "fleetgate"
        cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "fleetgate.cli"]
        if args.quiet_logs:
            env["FLEETGATE_REQUEST_LOG"] = "off"
        if name == "fleetgate-traced":
            if receiver is None:
                raise NotAvailable("no OTLP receiver")
            env.update(OTEL_EXPORTER_OTLP_ENDPOINT=receiver, OTEL_TRACES_SAMPLER="always_on")
        versions = {"fleetgate": f"{importlib.metadata.version('fleetgate')} @ {git_rev()}",
                    **here}
        return Launch([*cmd, "serve", "--config", str(config), "--port", str(port)], env,
                      versions=versions)
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


def git_rev() -> str:
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True).stdout.strip()
    return rev or "?"


# ---------------------------------------------------------------- load

@dataclass
class CountingWindow(Window):
    done: int = 0  # responses completed, warm-up included


class CountingConnection(LoadConnection):
    def __init__(self, window: CountingWindow) -> None:
        super().__init__(window)
        self.counting = window

    def _complete(self) -> None:
        self.counting.done += 1
        super()._complete()


@dataclass
class Cell:
    system: str
    mode: str
    conc: int
    round: int
    requests: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    sut_cpu_s: float = 0.0
    mock_cpu_s: float = 0.0
    load_cpu_s: float = 0.0
    idle_suts_cpu_s: float = 0.0  # the other (idle) SUTs on the same CPU, in the window
    other_pct: float = 0.0  # CPU of processes outside the benchmark, % of all CPUs
    steal_pct: float = 0.0
    done: int = 0
    problem: str | None = None

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    def pct(self, q: float) -> float:
        s = sorted(self.latencies)
        return s[min(len(s) - 1, int(q * len(s)))] * 1000 if s else float("nan")

    def per_req_ms(self, cpu_s: float) -> float:
        return cpu_s * 1000 / self.requests if self.requests else float("nan")

    @property
    def sut_ms(self) -> float:
        return self.per_req_ms(self.sut_cpu_s)

    @property
    def ok(self) -> bool:
        return self.problem is None and self.errors == 0 and self.requests > 0


def check_body(mode: str, body: bytes | None) -> str | None:
    """None when the response is a correct completion; else what is wrong with it."""
    if not body:
        return "no response body"
    want = "tok " * TOKENS
    try:
        if mode == "plain":
            content = json.loads(body)["choices"][0]["message"]["content"]
            return None if content == want else f"content {content!r}"
        frames = [f for f in body.split(b"\n\n") if f.strip()]
        if not frames or frames[-1].strip() != b"data: [DONE]":
            return f"stream does not end in data: [DONE]: {body[-120:]!r}"
        text, usage = "", False
        for f in frames[:-1]:
            obj = json.loads(f.removeprefix(b"data: "))
            usage = usage or bool(obj.get("usage"))
            for choice in obj.get("choices") or []:
                text += (choice.get("delta") or {}).get("content") or ""
        if text != want:
            return f"stream content {text!r}"
        return None if usage else "stream without usage chunk"
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
        return f"bad body ({exc!r}): {body[:160]!r}"


async def run_cell(target: Server, mock: Server, everyone: list[Server], suts: list[Server],
                   mode: str, conc: int, rnd: int, args: argparse.Namespace) -> Cell:
    cell = Cell(target.name, mode, conc, rnd)
    if not target.alive():
        cell.problem = f"process exited ({target.popen.returncode})"
        return cell
    host, port = target.url.removeprefix("http://").split(":")
    w = CountingWindow(request_bytes(host, int(port), MODEL.get(target.name, PUBLIC),
                                     mode == "stream"))
    loop = asyncio.get_running_loop()
    conns: list[CountingConnection] = []
    roots = [s.pid for s in everyone]
    try:
        for _ in range(conc):
            _, proto = await loop.create_connection(lambda: CountingConnection(w), host,
                                                    int(port))
            conns.append(proto)
        for c in conns:
            c.send()
        t_start = time.perf_counter()
        await asyncio.sleep(args.warmup_s)
        while w.done < conc and time.perf_counter() - t_start < args.max_warmup_s:
            await asyncio.sleep(0.05)  # a slow system: wait for its steady state
        cpu0, sys0 = cpu_by_tree(roots), ro.system_cpu_s()
        me0, t0 = time.process_time(), time.perf_counter()
        w.recording = True
        await asyncio.sleep(args.window_s)
        w.recording = False
        t1, me1 = time.perf_counter(), time.process_time()
        cpu1, sys1 = cpu_by_tree(roots), ro.system_cpu_s()
        w.stopping = True
        if w.in_flight:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(w.drained.wait(), timeout=20)
        cell.errors = w.errors  # before closing: an in-flight close would count as one
    except Exception as exc:
        cell.problem = f"{type(exc).__name__}: {exc}"
        return cell
    finally:
        for c in conns:
            if c.transport is not None:
                c.transport.close()
    delta = {pid: cpu1[pid] - cpu0[pid] for pid in roots}
    cell.requests, cell.seconds, cell.latencies = len(w.latencies), t1 - t0, w.latencies
    cell.done = w.done
    cell.sut_cpu_s = delta[target.pid] if target is not mock else 0.0
    cell.mock_cpu_s = delta[mock.pid]
    cell.load_cpu_s = me1 - me0
    cell.idle_suts_cpu_s = sum(delta[s.pid] for s in suts if s is not target)
    span = (t1 - t0) * (os.cpu_count() or 1) / 100
    other = (sys1[0] - sys0[0]) - sum(delta.values()) - (me1 - me0)
    cell.other_pct, cell.steal_pct = max(other, 0.0) / span, (sys1[1] - sys0[1]) / span
    bad = check_body(mode, w.first_body)
    if bad:
        cell.problem = f"first response wrong: {bad}"
    elif not cell.requests:
        cell.problem = "no response completed in the window"
    return cell


def scenarios(args: argparse.Namespace) -> list[tuple[str, int]]:
    return [(mode, c) for mode in ("plain", "stream") for c in args.concurrency]


async def measure(targets: list[Server], mock: Server, everyone: list[Server],
                  args: argparse.Namespace) -> list[Cell]:
    suts = [t for t in targets if t is not mock]
    cells: list[Cell] = []
    for rnd in range(1, args.rounds + 1):
        print(f"round {rnd}/{args.rounds}", flush=True)
        for mode, conc in scenarios(args):
            for target in targets:
                cell = await run_cell(target, mock, everyone, suts, mode, conc, rnd, args)
                cells.append(cell)
                print(f"  {target.name:16} {mode:6} c={conc:<3} {cell.rps:8,.0f} req/s  "
                      f"p50 {cell.pct(.5):7.2f} ms  p99 {cell.pct(.99):7.2f} ms  "
                      f"CPU {cell.sut_ms:6.3f} ms/req  other {cell.other_pct:3.0f}%  "
                      f"errors {cell.errors}{'  ' + cell.problem if cell.problem else ''}",
                      flush=True)
    return cells


# ---------------------------------------------------------------- report

def best(cells: list[Cell]) -> dict[tuple[str, str, int], Cell]:
    """Per (system, mode, c): the sound round least disturbed by other processes."""
    groups: dict[tuple[str, str, int], list[Cell]] = {}
    for c in cells:
        groups.setdefault((c.system, c.mode, c.conc), []).append(c)
    return {k: min(g, key=lambda c: (not c.ok, c.other_pct + c.steal_pct))
            for k, g in groups.items()}


def fmt(x: float, spec: str) -> str:
    return "-" if x != x else format(x, spec)  # NaN -> "-"


def fmt_x(x: float) -> str:
    return "n/a" if x != x else f"{x:.2f}x"


def label(name: str, versions: dict[str, dict[str, str]]) -> str:
    v = versions.get(name, {})
    text = LABELS[name].format(v=v.get("sglang-router") or v.get("litellm") or "")
    return " ".join(text.split())


def headline(chosen: dict[tuple[str, str, int], Cell], names: list[str],
             missing: dict[str, str], versions: dict[str, dict[str, str]]) -> str:
    lines = ["| one core | plain c=32 req/s | plain c=32 CPU ms/req | stream c=32 req/s "
             "| stream c=32 CPU ms/req | added p50 at c=1, plain / stream (ms) |",
             "|---|--:|--:|--:|--:|--:|"]
    for name in names:
        if name in missing:
            lines.append(f"| {label(name, versions)} | not available: "
                         f"{missing[name].replace('|', '/')[:300]} | - | - | - | - |")
            continue
        cols = []
        for mode in ("plain", "stream"):
            c = chosen.get((name, mode, 32))
            if c is None or not c.requests:
                cols += ["-", "-"]
            else:
                flag = "" if c.ok else " (!)"
                cols += [f"{c.rps:,.0f}{flag}", f"{c.sut_ms:.3f}"]
        added = []
        for mode in ("plain", "stream"):
            c, d = chosen.get((name, mode, 1)), chosen.get(("direct", mode, 1))
            added.append(f"{c.pct(.5) - d.pct(.5):+.2f}" if c and d and c.requests
                         and d.requests else "-")
        lines.append(f"| {label(name, versions)} | " + " | ".join(cols)
                     + f" | {' / '.join(added)} |")
    return "\n".join(lines)


def full_table(chosen: dict[tuple[str, str, int], Cell], names: list[str]) -> str:
    lines = ["| system | mode | c | req/s | p50 ms | p99 ms | added p50 | added p99 "
             "| SUT CPU ms/req | SUT busy % of a core | idle SUTs % | mock CPU ms/req "
             "| loadgen CPU ms/req | other load % | round | errors | check |",
             "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|"]
    for key in sorted(chosen, key=lambda k: (k[1], k[2], (["direct", *names]).index(k[0]))):
        c = chosen[key]
        d = chosen.get(("direct", c.mode, c.conc))
        a50 = a99 = "-"
        if c.system != "direct" and d is not None and c.requests and d.requests:
            a50, a99 = f"{c.pct(.5) - d.pct(.5):+.2f}", f"{c.pct(.99) - d.pct(.99):+.2f}"
        sut = "-" if c.system == "direct" else fmt(c.sut_ms, ".3f")
        busy = "-" if c.system == "direct" or not c.seconds else \
            f"{c.sut_cpu_s / c.seconds * 100:.0f}"
        idle = f"{c.idle_suts_cpu_s / c.seconds * 100:.1f}" if c.seconds else "-"
        lines.append(
            f"| {c.system} | {c.mode} | {c.conc} | {c.rps:,.0f} | {fmt(c.pct(.5), '.2f')} "
            f"| {fmt(c.pct(.99), '.2f')} | {a50} | {a99} | {sut} | {busy} | {idle} "
            f"| {fmt(c.per_req_ms(c.mock_cpu_s), '.3f')} "
            f"| {fmt(c.per_req_ms(c.load_cpu_s), '.3f')} | {c.other_pct:.0f} | {c.round} "
            f"| {c.errors} | {(c.problem or 'ok').replace('|', '/')[:160]} |")
    return "\n".join(lines)


def rounds_table(cells: list[Cell], rounds: int) -> str:
    groups: dict[tuple[str, str, int], list[Cell]] = {}
    for c in cells:
        groups.setdefault((c.system, c.mode, c.conc), []).append(c)
    head = " | ".join(f"round {i + 1}" for i in range(rounds))
    lines = [f"| system | mode | c | {head} |", "|---|---|--:|" + "---|" * rounds]
    for (system, mode, conc), g in groups.items():
        cells_txt = []
        for c in g:
            cpu = "" if system == "direct" else f", {c.sut_ms:.3f} ms CPU"
            cells_txt.append(f"{c.rps:,.0f}/s, p50 {fmt(c.pct(.5), '.2f')}{cpu} "
                             f"({c.other_pct:.0f}%)" + ("" if c.ok else " (!)"))
        lines.append(f"| {system} | {mode} | {conc} | " + " | ".join(cells_txt) + " |")
    return "\n".join(lines)


def ratio_lines(chosen: dict[tuple[str, str, int], Cell]) -> list[str]:
    def get(system: str, mode: str, conc: int) -> Cell | None:
        c = chosen.get((system, mode, conc))
        return c if c is not None and c.requests else None

    def ratio(num: Cell | None, den: Cell | None, what: Callable[[Cell], float]) -> float:
        return what(num) / what(den) if num and den and what(den) else float("nan")

    def verdict(x: float, at_least: float | None = None, at_most: float | None = None) -> str:
        if x != x:
            return "n/a"
        ok = (at_least is None or x >= at_least) and (at_most is None or x <= at_most)
        return "meets" if ok else "**misses**"

    def rps(c: Cell) -> float:
        return c.rps

    def cpu(c: Cell) -> float:
        return c.sut_ms

    out = []
    for mode in ("plain", "stream"):
        fg = get("fleetgate", mode, 32)
        x = ratio(fg, get("naive", mode, 32), cpu)
        out.append(f"- {mode}, c=32: fleetgate CPU/req / naive = {fmt_x(x)} "
                   "(lower is better)")
        x = ratio(fg, get("naive", mode, 32), rps)
        out.append(f"- {mode}, c=32: fleetgate req/s / naive = {fmt_x(x)} "
                   f"(target >= 1.2x: {verdict(x, at_least=1.2)})")
        target = 0.6 if mode == "plain" else 1.0
        x = ratio(fg, get("sglang-router", mode, 32), rps)
        out.append(f"- {mode}, c=32: fleetgate req/s / sglang-router = {fmt_x(x)} "
                   f"(target >= {target:g}x: {verdict(x, at_least=target)})")
        x = ratio(fg, get("litellm", mode, 32), cpu)
        inv = f"1/{1 / x:.0f}" if x == x and x > 0 else "n/a"
        out.append(f"- {mode}, c=32: fleetgate CPU/req / LiteLLM = {inv} "
                   f"(target <= 1/50: {verdict(x, at_most=1 / 50)})")
        c1, d1 = get("fleetgate", mode, 1), get("direct", mode, 1)
        x = c1.pct(.5) - d1.pct(.5) if c1 and d1 else float("nan")
        out.append(f"- {mode}, c=1: fleetgate added p50 = {fmt(x, '+.3f')} ms "
                   f"(target <= 0.5 ms: {verdict(x, at_most=0.5)})")
        x = ratio(get("fleetgate-traced", mode, 32), fg, cpu)
        out.append(f"- {mode}, c=32: fleetgate CPU/req, tracing 100 % / off = {fmt_x(x)} "
                   f"(target <= 1.10x: {verdict(x, at_most=1.10)})")
    return out


def machine(versions: dict[str, dict[str, str]]) -> list[str]:
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    lines = [f"- CPU: {model}, {os.cpu_count()} cores; Linux {platform.release()}; "
             f"Python {platform.python_version()} (this script, fleetgate, naive)"]
    for name, v in versions.items():
        lines.append(f"- {name}: " + ", ".join(f"{k} {ver}" for k, ver in v.items()))
    return lines


def report(cells: list[Cell], names: list[str], missing: dict[str, str],
           versions: dict[str, dict[str, str]], notes: list[str],
           args: argparse.Namespace) -> str:
    chosen = best(cells)
    method = (
        f"Each system under test pinned alone to CPU {SUT_CPU} (all started up front, the "
        f"others idle meanwhile: *idle SUTs %* is what they used of that CPU during the "
        f"window); `bench/mock_engine.py` (instant, vLLM-shaped, 16 content chunks a stream, "
        f"back to back) and the load generator (raw asyncio HTTP/1.1, one keep-alive "
        f"connection per user, closed loop; `bench/loadgen.py`) pinned to CPU {LOAD_CPU}. "
        f"`/v1/chat/completions` plain or stream (with `stream_options.include_usage`), "
        f"c = {', '.join(map(str, args.concurrency))}. {args.rounds} round(s), each running "
        f"every scenario on every system in turn: warm-up >= {args.warmup_s:g} s and until c "
        f"responses completed (at most {args.max_warmup_s:g} s), then {args.window_s:g} s "
        f"measured. Each cell is the round with the least CPU used by processes outside the "
        f"benchmark (*other load*, % of all CPUs; every round is listed at the end). "
        f"Latency: request write to last response byte; *added* = system minus direct, same "
        f"mode and c. CPU ms/req: utime+stime of the system's whole process tree over the "
        f"window / responses completed in it. Every response must be 200 and the first of "
        f"each cell is checked in full; a cell with a problem is marked (!). "
        f"{'Request logs off (--quiet-logs).' if args.quiet_logs else 'Logs at each system default (fleetgate: one JSON line per request, to a file; sglang-router: info, to a file).'}")  # noqa: E501
    run_line = (f"Produced by `bench/overhead/run.py {' '.join(sys.argv[1:])}` at "
                f"{time.strftime('%Y-%m-%d %H:%M')} on commit {git_rev()} plus the working "
                f"tree of that moment.")
    text = ["# Proxy overhead side by side", "",
            textwrap.fill(run_line, 92, break_on_hyphens=False), "",
            "**Machine.**", "", *machine(versions), "",
            "**Method.** " + textwrap.fill(method, 92, break_on_hyphens=False), "",
            "Busy CPU of the load generator's core limits the *direct* rows and any system "
            "faster than it; a SUT at ~100 % of its core is CPU-bound.", "",
            headline(chosen, names, missing, versions), "",
            "**Against the targets** (fleetgate = cost policy, tracing off):", "",
            *ratio_lines(chosen), ""]
    if notes:
        text += ["**Notes.**", "", *[f"- {n}" for n in notes], ""]
    text += ["## Every cell (best round)", "", full_table(chosen, ["direct", *names]), "",
             "## Every round: req/s, p50 ms, SUT CPU ms/req (other load %)", "",
             rounds_table(cells, args.rounds), ""]
    return "\n".join(text)


# ---------------------------------------------------------------- main

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--systems", default=",".join(SYSTEMS),
                        help=f"comma list out of {', '.join(SYSTEMS)} (direct always runs)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--window-s", type=float, default=None,
                        help="measured seconds a cell (default 3, --quick 1.5)")
    parser.add_argument("--warmup-s", type=float, default=0.5,
                        help="least warm-up seconds a cell (longer until c responses are done)")
    parser.add_argument("--max-warmup-s", type=float, default=10.0)
    parser.add_argument("--concurrency", default=None,
                        help="comma list (default 1,32,128; --quick 1,32)")
    parser.add_argument("--quick", action="store_true", help="short windows, c=1 and 32 only")
    parser.add_argument("--quiet-logs", action="store_true",
                        help="fleetgate request log off, sglang-router log level warn")
    parser.add_argument("--sglang-spec", default=SGLANG_SPEC)
    parser.add_argument("--litellm-spec", default=LITELLM_SPEC)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    args.window_s = args.window_s or (1.5 if args.quick else 3.0)
    args.concurrency = [int(c) for c in (args.concurrency or ("1,32" if args.quick
                                                               else "1,32,128")).split(",")]
    names = [s.strip() for s in args.systems.split(",") if s.strip() and s.strip() != "direct"]
    unknown = set(names) - set(SYSTEMS)
    if unknown:
        parser.error(f"unknown systems: {', '.join(sorted(unknown))}")
    args.names = [s for s in SYSTEMS if s in names]
    return args


@contextlib.contextmanager
def children() -> Iterator[list[Server]]:
    started: list[Server] = []
    try:
        yield started
    finally:
        for s in reversed(started):
            s.stop()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    pinned = {SUT_CPU, LOAD_CPU} <= os.sched_getaffinity(0)
    sut_cpu, load_cpu = (SUT_CPU, LOAD_CPU) if pinned else (None, None)
    if pinned:
        os.sched_setaffinity(0, {LOAD_CPU})
    else:
        print("CPUs 0 and 1 not both available: running unpinned, numbers not comparable")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks
    runner: Callable[[Coroutine[Any, Any, list[Cell]]], list[Cell]] = asyncio.run
    with contextlib.suppress(ImportError):
        import uvloop
        runner = uvloop.run

    missing: dict[str, str] = {}
    versions: dict[str, dict[str, str]] = {}
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="fleetgate-overhead-") as tmp_name, \
            children() as started:
        tmp = Path(tmp_name)
        m = ro.start_mock(load_cpu)
        mock = Server("direct", m.popen, m.url)
        started.append(mock)
        receiver: str | None = None
        if "fleetgate-traced" in args.names:
            r = to._spawn_ready("receiver", [sys.executable, str(ROOT / "bench" /
                                "tracing_overhead.py"), "--receiver"], to.READY, load_cpu)
            started.append(Server("receiver", r.popen, r.url))
            receiver = r.url
        suts: list[Server] = []
        for name in args.names:
            port = ro.free_port()
            try:
                how = launch(name, mock.url, port, tmp, args, receiver)
                versions[name] = how.versions
                print(f"starting {name} ...", flush=True)
                server = start_server(name, how.cmd, how.env, sut_cpu, tmp / f"{name}.log",
                                      port, how.timeout)
            except NotAvailable as exc:
                missing[name] = str(exc)
                print(f"{name}: not available: {exc}", flush=True)
                continue
            started.append(server)
            suts.append(server)
            print(f"{name} ready at {server.url} in {server.ready_s:.1f} s", flush=True)
            notes.append(f"{name}: ready {server.ready_s:.1f} s after start; "
                         f"{tree_threads(server.pid)} threads.")
        time.sleep(1.0)
        idle0 = cpu_by_tree([s.pid for s in suts])
        time.sleep(3.0)
        idle1 = cpu_by_tree([s.pid for s in suts])
        idle = ", ".join(f"{s.name} {(idle1[s.pid] - idle0[s.pid]) * 1000 / 3:.1f}"
                         for s in suts)
        notes.append(f"Idle CPU ms/s (3 s before the load; one clock tick = 3.3): {idle}.")
        print(f"idle CPU ms/s: {idle}", flush=True)
        cells = runner(measure([mock, *suts], mock, started, args))
        for s in suts:
            if not s.alive():
                notes.append(f"{s.name} exited during the run: {s.log_tail(400)!r}")
        traced = next((s for s in suts if s.name == "fleetgate-traced"), None)
        if traced is not None and receiver is not None:
            traced.stop()  # flushes its last spans
            with contextlib.suppress(OSError, ValueError, KeyError), \
                    urllib.request.urlopen(receiver + "/count", timeout=5) as resp:
                spans = int(json.loads(resp.read())["spans"])
                answered = sum(c.done for c in cells if c.system == "fleetgate-traced")
                notes.append(f"OTLP receiver got {spans:,} spans for {answered:,} responses "
                             f"of fleetgate-traced (3 spans a request expected).")

    for key, c in sorted(best(cells).items()):
        busy = c.sut_cpu_s / c.seconds * 100 if c.seconds else 0.0
        if key[0] != "direct" and key[2] >= 32 and c.requests and busy < 60:
            notes.append(f"{key[0]} {key[1]} c={key[2]}: its process used only {busy:.0f} % "
                         f"of its core (p50 {c.pct(.5):.1f} ms): bound by latency, not CPU.")
    text = report(cells, args.names, missing, versions, notes, args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print("\n" + headline(best(cells), args.names, missing, versions))
    print("\n" + "\n".join(ratio_lines(best(cells))))
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
