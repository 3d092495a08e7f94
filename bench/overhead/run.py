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
import json
import os
import signal
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(1, str(HERE))  # the sibling modules: systems, report

import relay_overhead as ro  # noqa: E402  (bench/ scripts are not a package)
import tracing_overhead as to  # noqa: E402
from report import Cell, best, headline, ratio_lines, report  # noqa: E402
from systems import (  # noqa: E402
    BASE,
    EXTRA,
    LITELLM_SPEC,
    LOAD_CPU,
    MODEL,
    PUBLIC,
    SGLANG_SPEC,
    SUT_CPU,
    SYSTEMS,
    TOKENS,
    NotAvailable,
    Server,
    children,
    cpu_by_tree,
    launch,
    start_server,
    tree_threads,
)

from loadgen import LoadConnection, Window, request_bytes  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "overhead.md"


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


# ---------------------------------------------------------------- main

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--systems", default=",".join(SYSTEMS),
                        help=f"comma list out of {', '.join(SYSTEMS + EXTRA)} (direct always "
                             "runs; the default is all but the granian ones)")
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
    parser.add_argument("--baseline", type=Path, default=None,
                        help="a checkout's src/ (e.g. a worktree of the commit before): adds "
                             "fleetgate-base, and fleetgate-base-traced beside "
                             "fleetgate-traced, run from that code in the same run")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    args.window_s = args.window_s or (1.5 if args.quick else 3.0)
    args.concurrency = [int(c) for c in (args.concurrency or ("1,32" if args.quick
                                                               else "1,32,128")).split(",")]
    names = [s.strip() for s in args.systems.split(",") if s.strip() and s.strip() != "direct"]
    unknown = set(names) - set(SYSTEMS + EXTRA)
    if unknown:
        parser.error(f"unknown systems: {', '.join(sorted(unknown))}")
    if args.baseline is not None:
        if not (args.baseline / "fleetgate").is_dir():
            parser.error(f"--baseline {args.baseline}: no fleetgate package there")
        names += [b for b, of in zip(BASE, ("fleetgate", "fleetgate-traced"), strict=True)
                  if of in names]
    order = (*SYSTEMS[:3], BASE[0], *EXTRA, SYSTEMS[3], BASE[1], *SYSTEMS[4:])
    args.names = [s for s in order if s in names]
    return args


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
