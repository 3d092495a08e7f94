"""Gateway relay overhead: what `fleetgate serve` adds on top of an instant engine (BENCHMARKS.md).

What it measures: requests/s, p50/p99 latency, the latency the gateway adds over talking to
the engine directly, and the gateway's CPU time per request, for ``/v1/chat/completions``
plain and streamed (16 content chunks), at concurrency 1 and 32.

How (DESIGN.md §4's method):

* ``bench/mock_engine.py``, an instant vLLM-shaped mock (raw asyncio), pinned to CPU 1.
* ``fleetgate serve`` (uvicorn + uvloop + httptools, the production entry point, default
  settings) pinned to CPU 0: one pool ``bench`` with the mock as its only endpoint; one
  gateway with a ``round_robin`` default policy and one with ``cost`` (both started up
  front; the idle one costs only its 1 Hz probe and scrape).
* The load generator is this process, pinned to CPU 1 beside the mock: a raw asyncio
  HTTP/1.1 client (uvloop; one keep-alive connection per concurrent user, each sends its
  next request the moment the previous response is complete, closed loop). Its own limit is
  the "direct" rows: the same load sent to the mock without the gateway.
* Rounds (4 by default): each runs every target (direct, gw-rr, gw-cost) and scenario in
  turn, 0.5 s warm-up then a 3 s measured window. Interleaving spreads the disturbance of
  other processes on a shared machine; each row reports the round with the least CPU used
  by other processes in its window (all rounds are listed too). ``--nice -10`` (root)
  shields the benchmark further.
* Latency is from the request write to the last byte of the response. Requests/s counts
  responses completed in the window. CPU ms/request is the process's utime+stime from
  /proc/<pid>/stat over the window divided by the requests completed in it (the same for
  the mock and, via ``time.process_time``, for the generator, to show they do not
  dominate). Other load is /proc/stat busy time minus the benchmark's own processes.
* Every response is checked: status 200; the first one of each window in full (the public
  model name rewritten by the gateway, streams of 19 frames ending in ``data: [DONE]``).

Run: ``.venv/bin/python bench/relay_overhead.py [--nice -10]`` (about 3 minutes;
``--rounds 1`` for a quick look). Writes the tables to ``bench/results/relay_overhead.md``.
Children are killed on exit, also when this process dies (PR_SET_PDEATHSIG).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import importlib.metadata
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MOCK = ROOT / "bench" / "mock_engine.py"
RESULTS = ROOT / "bench" / "results" / "relay_overhead.md"
GATEWAY_CPU, LOAD_CPU = 0, 1
CLK_TCK = os.sysconf("SC_CLK_TCK")
PUBLIC, SERVED = "bench-model", "bench-served"


# ---------------------------------------------------------------- child processes

def _child_setup(cpu: int | None) -> Callable[[], None]:
    def setup() -> None:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
    return setup


@dataclass
class Child:
    name: str
    popen: subprocess.Popen[str]
    url: str

    def cpu_s(self) -> float:
        return proc_cpu_s(self.popen.pid)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=5)


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a whole process (all threads), in seconds."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rfind(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_mock(cpu: int | None, frame_gap_ms: float = 0.0) -> Child:
    cmd = [sys.executable, str(MOCK), "--port", "0", "--frame-gap-ms", str(frame_gap_ms)]
    popen = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                             stdin=subprocess.DEVNULL, text=True, preexec_fn=_child_setup(cpu))
    assert popen.stdout is not None
    line = popen.stdout.readline()  # the mock prints its ready line first, or exits
    if not line.startswith("MOCK_ENGINE_READY "):
        popen.kill()
        raise RuntimeError(f"mock engine did not start: {line!r}")
    return Child("mock", popen, line.split(" ", 1)[1].strip())


def gateway_config(mock_url: str, strategy: str) -> str:
    config = {
        "pools": [{"name": "bench", "accelerator": "h100", "engine": "vllm",
                   "price_per_gpu_hour": 2.95, "endpoints": [mock_url],
                   "models": {PUBLIC: SERVED}}],
        "policies": {"bench": {"strategy": strategy}},
        "default_policy": "bench",
    }
    return json.dumps(config, indent=2)  # JSON is YAML


def start_gateway(config_path: Path, cpu: int | None, timeout: float = 60.0,
                  source: Path | None = None, workers: int = 1) -> Child:
    """``fleetgate serve`` with its default settings; its stdout/stderr (the per-request JSON
    log included) go to a file beside the config, as they would go to a log collector.
    ``source``: run the fleetgate package found there instead (a checkout's ``src/``)."""
    port = free_port()
    cmd = [sys.executable, "-m", "fleetgate.cli", "serve", "--config", str(config_path),
           "--port", str(port)] + (["--workers", str(workers)] if workers > 1 else [])
    log_path = config_path.with_suffix(".log")
    env = {**os.environ, "PYTHONPATH": str(source)} if source else None
    with log_path.open("w") as log:
        popen = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                 text=True, preexec_fn=_child_setup(cpu), env=env)
    child = Child("gateway", popen, f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            break
        with contextlib.suppress(OSError), \
                urllib.request.urlopen(child.url + "/readyz", timeout=1.0) as resp:
            if resp.status == 200:
                return child
        time.sleep(0.1)
    child.stop()
    tail = log_path.read_text()[-3000:]
    raise RuntimeError(f"gateway did not become ready (exit {popen.returncode}):\n{tail}")


from loadgen import LoadConnection, Window, request_bytes  # noqa: E402


@dataclass
class Result:
    target: str
    mode: str
    concurrency: int
    requests: int
    seconds: float
    latencies: list[float]
    errors: int
    cpu_ms: dict[str, float]  # process name -> CPU ms per request
    other_pct: float  # CPU used by processes not in this benchmark, % of all CPUs
    steal_pct: float  # hypervisor steal, % of all CPUs

    @property
    def rps(self) -> float:
        return self.requests / self.seconds

    def pct(self, q: float) -> float:
        s = sorted(self.latencies)
        return s[min(len(s) - 1, int(q * len(s)))] * 1000 if s else float("nan")


def system_cpu_s() -> tuple[float, float]:
    """(busy, steal) seconds of all CPUs together since boot, from /proc/stat."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = f[:8]
    return (user + nice + system + irq + softirq) / CLK_TCK, steal / CLK_TCK


async def run_scenario(target: str, url: str, mode: str, concurrency: int, warmup: float,
                       duration: float, watch: list[Child], ours: list[Child]) -> Result:
    """One window: ``watch`` are reported per request, ``ours`` only count as not foreign."""
    host, port = url.removeprefix("http://").split(":")
    model = SERVED if target == "direct" else PUBLIC
    w = Window(request_bytes(host, int(port), model, mode == "stream"))
    loop = asyncio.get_running_loop()
    conns = []
    for _ in range(concurrency):
        _, proto = await loop.create_connection(lambda: LoadConnection(w), host, int(port))
        conns.append(proto)
    for c in conns:
        c.send()
    await asyncio.sleep(warmup)
    cpu0 = {c.name: c.cpu_s() for c in watch}
    ours0 = sum(c.cpu_s() for c in ours)
    sys0, me0, t0 = system_cpu_s(), time.process_time(), time.perf_counter()
    w.recording = True
    await asyncio.sleep(duration)
    w.recording = False
    t1, me1, sys1 = time.perf_counter(), time.process_time(), system_cpu_s()
    cpu1 = {c.name: c.cpu_s() for c in watch}
    ours1 = sum(c.cpu_s() for c in ours)
    w.stopping = True
    if w.in_flight:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(w.drained.wait(), timeout=10)
    for c in conns:
        if c.transport is not None:
            c.transport.close()
    n = len(w.latencies)
    cpu = {name: (cpu1[name] - cpu0[name]) * 1000 / max(n, 1) for name in cpu0}
    cpu["loadgen"] = (me1 - me0) * 1000 / max(n, 1)
    span = (t1 - t0) * (os.cpu_count() or 1) / 100
    other = (sys1[0] - sys0[0]) - (ours1 - ours0) - (me1 - me0)
    check_body(target, mode, w.first_body)
    return Result(target, mode, concurrency, n, t1 - t0, w.latencies, w.errors, cpu,
                  max(other, 0.0) / span, (sys1[1] - sys0[1]) / span)


def check_body(target: str, mode: str, body: bytes | None) -> None:
    if not body:
        raise RuntimeError(f"{target}/{mode}: no response body captured")
    model = SERVED if target == "direct" else PUBLIC
    if f'"model":"{model}"'.encode() not in body:
        raise RuntimeError(f"{target}/{mode}: model not {model!r} in {body[:200]!r}")
    if mode == "stream":
        frames = body.count(b"data: ")
        if not body.endswith(b"data: [DONE]\n\n") or frames != 1 + 16 + 1 + 1:
            raise RuntimeError(f"{target}/{mode}: bad stream ({frames} frames): {body[-200:]!r}")


# ---------------------------------------------------------------- report

def machine() -> dict[str, str]:
    model = "unknown"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    versions = []
    for pkg in ("aiohttp", "uvicorn", "starlette", "uvloop", "httptools", "anyio"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions.append(f"{pkg} {importlib.metadata.version(pkg)}")
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True).stdout.strip() or "?"
    return {"cpu": f"{model}, {os.cpu_count()} CPUs", "kernel": platform.release(),
            "python": platform.python_version(), "packages": ", ".join(versions),
            "commit": rev}


def quietest_rounds(results: list[Result]) -> list[Result]:
    """Per (target, mode, concurrency): the round least disturbed by other processes."""
    groups: dict[tuple[str, str, int], list[Result]] = {}
    for r in results:
        groups.setdefault((r.target, r.mode, r.concurrency), []).append(r)
    return [min(g, key=lambda r: r.other_pct + r.steal_pct) for g in groups.values()]


def rounds_table(results: list[Result], rounds: int) -> str:
    """Every round of every row: req/s, p50 and gateway CPU ms/req (other load %)."""
    groups: dict[tuple[str, str, int], list[Result]] = {}
    for r in results:
        groups.setdefault((r.target, r.mode, r.concurrency), []).append(r)
    head = " | ".join(f"round {i + 1}" for i in range(rounds))
    lines = [f"| target | mode | c | {head} |", "|---|---|--:|" + "---|" * rounds]
    for (target, mode, conc), g in groups.items():
        cells = []
        for r in g:
            gw = f", {r.cpu_ms['gateway']:.2f} ms CPU" if "gateway" in r.cpu_ms else ""
            cells.append(f"{r.rps:,.0f}/s, p50 {r.pct(0.5):.2f}{gw} ({r.other_pct:.0f}%)")
        lines.append(f"| {target} | {mode} | {conc} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table(results: list[Result]) -> str:
    direct = {(r.mode, r.concurrency): r for r in results if r.target == "direct"}
    lines = [
        "| target | mode | c | req/s | p50 ms | p99 ms | added p50 ms | added p99 ms "
        "| gateway CPU ms/req | mock CPU ms/req | loadgen CPU ms/req | other load % | errors |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    order = {"direct": 0}
    for r in sorted(results, key=lambda r: (r.mode, r.concurrency, order.get(r.target, 1))):
        base = direct.get((r.mode, r.concurrency))
        added50 = added99 = gw = "-"
        if r.target != "direct" and base is not None:
            added50 = f"{r.pct(0.5) - base.pct(0.5):+.2f}"
            added99 = f"{r.pct(0.99) - base.pct(0.99):+.2f}"
        if "gateway" in r.cpu_ms:
            gw = f"**{r.cpu_ms['gateway']:.2f}**"
        lines.append(
            f"| {r.target} | {r.mode} | {r.concurrency} | {r.rps:,.0f} | {r.pct(0.5):.2f} "
            f"| {r.pct(0.99):.2f} | {added50} | {added99} | {gw} | {r.cpu_ms['mock']:.3f} "
            f"| {r.cpu_ms['loadgen']:.3f} | {r.other_pct:.0f} | {r.errors} |")
    return "\n".join(lines)


def report(results: list[Result], info: dict[str, str], args: argparse.Namespace,
           idle_ms_per_s: float, niceness: int) -> str:
    gap = (f"{args.frame_gap_ms:g} ms apart" if args.frame_gap_ms else
           "back to back, so the gateway mostly reads a whole stream at once")
    method = (
        f"**Method.** `fleetgate serve` (uvicorn, uvloop, httptools: the production entry "
        f"point, default settings) pinned alone to CPU {GATEWAY_CPU}; `bench/mock_engine.py` "
        f"(instant vLLM-shaped answers, raw asyncio) and the load generator (raw asyncio "
        f"HTTP/1.1 client, one keep-alive connection per concurrent user, closed loop) pinned "
        f"together to CPU {LOAD_CPU}. One pool `bench` (h100, vllm) with the mock as its only "
        f"endpoint; `gw-rr` routes with `round_robin`, `gw-cost` with `cost`. "
        f"`/v1/chat/completions`, plain (589-byte JSON answer) or stream (role chunk + 16 "
        f"content chunks + usage chunk + `[DONE]`, each frame its own socket write by the "
        f"mock, {gap}; the client asks for usage). {args.rounds} rounds, each running every "
        f"target and scenario in turn for {args.warmup:g} s warm-up + {args.duration:g} s "
        f"measured; each row is the round with the least other load (all rounds are "
        f"listed at the end). Latency: request write to "
        f"last response byte. *added* = gateway minus direct at the same mode and "
        f"concurrency. CPU ms/req: the process's utime+stime (`/proc/<pid>/stat`, all "
        f"threads) over the window / responses completed in it. The gateway's idle "
        f"background (health probe + `/metrics` scrape of the one endpoint every 1 s) costs "
        f"{idle_ms_per_s:.1f} CPU ms/s and is included. *other load*: CPU used meanwhile by "
        f"processes outside the benchmark, % of all CPUs (on a shared machine, rows with a "
        f"high value are noisy). Benchmark processes ran at nice {niceness}. The *direct* "
        f"rows are the load generator's own ceiling with the mock.")
    machine_line = (f"**Machine.** {info['cpu']}; Linux {info['kernel']}; Python "
                    f"{info['python']}; {info['packages']}.")
    run_line = (f"Produced by `bench/relay_overhead.py {' '.join(sys.argv[1:])}` at "
                f"{time.strftime('%Y-%m-%d %H:%M')} on commit {info['commit']} plus the "
                f"working tree of that moment.")
    paragraphs = [textwrap.fill(p, 92, break_on_hyphens=False)
                  for p in (run_line, method, machine_line)]
    return "# Gateway relay overhead\n\n" + "\n\n".join(paragraphs) + f"\n\n{table(results)}\n"


# ---------------------------------------------------------------- main

SCENARIOS = [("plain", 1), ("plain", 32), ("stream", 1), ("stream", 32)]


async def one_round(targets: list[tuple[str, Child]], mock: Child, ours: list[Child],
                    args: argparse.Namespace, results: list[Result]) -> None:
    for mode, conc in SCENARIOS:
        for name, server in targets:
            watch = [mock] if server is mock else [server, mock]
            r = await run_scenario(name, server.url, mode, conc, args.warmup, args.duration,
                                   watch, ours)
            results.append(r)
            gw = f"  gateway {r.cpu_ms['gateway']:.3f} ms/req" if "gateway" in r.cpu_ms else ""
            print(f"  {name:8} {mode:6} c={conc:<3} {r.rps:8,.0f} req/s  p50 {r.pct(.5):6.2f} ms"
                  f"  p99 {r.pct(.99):6.2f} ms{gw}  other {r.other_pct:3.0f}%  errors {r.errors}",
                  flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--duration", type=float, default=3.0, help="measured seconds a window")
    parser.add_argument("--warmup", type=float, default=0.5, help="warm-up seconds a window")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--strategies", default="round_robin,cost")
    parser.add_argument("--nice", type=int, default=0,
                        help="niceness for all benchmark processes (negative needs root; "
                             "-10 shields the numbers from other load on a shared machine)")
    parser.add_argument("--frame-gap-ms", type=float, default=0.0,
                        help="the mock's pause between stream frames (0: back to back)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--baseline", type=Path, default=None,
                        help="also run each strategy's gateway from this src/ directory (an "
                             "older checkout, e.g. a git worktree) as gw-<strategy>@base: a "
                             "before/after comparison within one run")
    args = parser.parse_args(argv)

    pinned = {GATEWAY_CPU, LOAD_CPU} <= os.sched_getaffinity(0)
    gw_cpu, load_cpu = (GATEWAY_CPU, LOAD_CPU) if pinned else (None, None)
    if pinned:
        os.sched_setaffinity(0, {LOAD_CPU})
    else:
        print("CPUs 0 and 1 not both available: running unpinned, numbers not comparable")
    niceness = os.nice(0)
    if args.nice:
        try:
            niceness = os.nice(args.nice - niceness)
        except PermissionError:
            print(f"cannot set nice {args.nice} (not root); running at {niceness}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks

    try:
        import uvloop
        run: Callable[..., object] = uvloop.run
    except ImportError:
        run = asyncio.run

    children: list[Child] = []
    results: list[Result] = []
    try:
        with tempfile.TemporaryDirectory(prefix="fleetgate-bench-") as tmp:
            mock = start_mock(load_cpu, args.frame_gap_ms)
            children.append(mock)
            targets: list[tuple[str, Child]] = [("direct", mock)]
            for strategy in args.strategies.split(","):
                path = Path(tmp) / f"{strategy}.yaml"
                path.write_text(gateway_config(mock.url, strategy))
                gateway = start_gateway(path, gw_cpu)
                children.append(gateway)
                label = {"round_robin": "rr"}.get(strategy, strategy)
                targets.append((f"gw-{label}", gateway))
                if args.baseline is not None:
                    base_path = Path(tmp) / f"{strategy}-base.yaml"  # its own log file
                    base_path.write_text(path.read_text())
                    base = start_gateway(base_path, gw_cpu, source=args.baseline.resolve())
                    children.append(base)
                    targets.append((f"gw-{label}@base", base))
            gateways = [c for _, c in targets[1:]]
            time.sleep(1.0)
            c0 = [g.cpu_s() for g in gateways]
            time.sleep(2.0)
            idle = max(((g.cpu_s() - c) * 500 for g, c in zip(gateways, c0, strict=True)),
                       default=0.0)
            print(f"mock {mock.url}, gateways {', '.join(g.url for g in gateways)}; "
                  f"idle gateway {idle:.1f} CPU ms/s", flush=True)
            for i in range(args.rounds):
                print(f"round {i + 1}/{args.rounds}", flush=True)
                run(one_round(targets, mock, children, args, results))
    finally:
        for child in reversed(children):
            child.stop()

    chosen = quietest_rounds(results)
    text = report(chosen, machine(), args, idle, niceness)
    text += ("\nEvery round: req/s, p50 ms, gateway CPU ms/req (other load %).\n\n"
             + rounds_table(results, args.rounds) + "\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print()
    print(table(chosen))
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
