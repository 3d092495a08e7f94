"""Tracing overhead: the gateway's CPU per request with OpenTelemetry tracing on vs off.

What it measures (BENCHMARKS.md "Tracing overhead"): `fleetgate serve`'s CPU time per
request for ``/v1/chat/completions`` plain and streamed (16 content chunks) in four
configurations of the same gateway over the same instant engine:

* ``bare``: no ``OTEL_*`` variables and the request log off (``FLEETGATE_REQUEST_LOG=off``):
  metrics and cost accounting only;
* ``log``: the default: no tracing, one JSON request line per request (to /dev/null);
* ``traced``: the default plus ``OTEL_EXPORTER_OTLP_ENDPOINT`` pointing at a local OTLP/HTTP
  receiver: every request makes a server span, a ``route`` span and a client span, batched
  and exported as protobuf over HTTP by the SDK's export thread (counted: it is the
  gateway's CPU too);
* ``sampled``: ``traced`` with ``OTEL_TRACES_SAMPLER=parentbased_traceidratio`` at 0.25.

How: ``bench/mock_engine.py`` (instant vLLM-shaped answers), the OTLP receiver (this script
with ``--receiver``: decodes each export and counts the spans) and the load generator (this
process: aiohttp, one keep-alive connection per concurrent user, closed loop). With
``--pin`` the gateway runs alone on CPU 0 and the rest on CPU 1 (as in
``bench/relay_overhead.py``); on a shared machine that needs ``--nice -10`` too, or the
pinned processes starve, so by default nothing is pinned. The
four gateways run side by side; each round runs every configuration in turn for each mode:
warm-up, then a measured window. CPU ms/request is the gateway process's utime+stime
(``/proc/<pid>/stat``, all threads, so the span export thread is counted) over the window /
responses completed in it. The table shows medians over rounds and their range. The
receiver's span count is checked against the traced requests (3 spans each) so a silently
dropping exporter cannot look cheap.

Run: ``.venv/bin/python bench/tracing_overhead.py --pin --nice -10`` (about 4 minutes;
``--nice`` needs root; ``--duration 2 --rounds 1`` for a quick look). Writes
``bench/results/tracing_overhead.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import gzip
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from host import cpu_model

ROOT = Path(__file__).resolve().parent.parent
MOCK = ROOT / "bench" / "mock_engine.py"
RESULTS = ROOT / "bench" / "results" / "tracing_overhead.md"
GATEWAY_CPU, LOAD_CPU = 0, 1
CLK_TCK = os.sysconf("SC_CLK_TCK")
PUBLIC, SERVED = "bench-model", "bench-served"
VARIANTS = ("bare", "log", "traced", "sampled")
READY = "OTLP_RECEIVER_READY "


# ---------------------------------------------------------------- the OTLP receiver process

def _fields(buf: bytes | memoryview, start: int = 0, end: int | None = None
            ) -> Iterator[tuple[int, int, int]]:
    """(field number, start, end) of each length-delimited field of a protobuf message;
    other wire types are skipped."""
    i, end = start, len(buf) if end is None else end
    while i < end:
        key, i = _varint(buf, i)
        kind = key & 7
        if kind == 2:
            size, i = _varint(buf, i)
            yield key >> 3, i, i + size
            i += size
        elif kind == 0:
            _, i = _varint(buf, i)
        else:
            i += {1: 8, 5: 4}[kind]


def _varint(buf: bytes | memoryview, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def count_spans(raw: bytes) -> int:
    """Spans in an ``ExportTraceServiceRequest`` without decoding them: the receiver shares
    the load generator's CPU, and a whole decode (~40 us a span) there slowed the load
    and so inflated a traced gateway's CPU per request."""
    n = 0
    for f, a, b in _fields(raw):
        if f != 1:  # resource_spans
            continue
        for g, c, d in _fields(raw, a, b):
            if g == 2:  # scope_spans
                n += sum(1 for h, _, _ in _fields(raw, c, d) if h == 2)  # spans
    return n


def receiver_main() -> None:
    """Accept OTLP/HTTP exports and count their spans (the first is decoded whole, as a
    check that the export parses); GET /count answers the count."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
        ExportTraceServiceResponse,
    )

    count = 0
    checked = False
    lock = threading.Lock()
    ok = ExportTraceServiceResponse().SerializeToString()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            nonlocal count, checked
            raw = self.rfile.read(int(self.headers.get("content-length", 0)))
            if self.headers.get("content-encoding") == "gzip":
                raw = gzip.decompress(raw)
            n = count_spans(raw)
            with lock:
                if not checked:
                    checked = True
                    req = ExportTraceServiceRequest.FromString(raw)
                    assert n == sum(len(ss.spans) for rs in req.resource_spans
                                    for ss in rs.scope_spans)
                count += n
            self._answer(ok, "application/x-protobuf")

        def do_GET(self) -> None:
            self._answer(json.dumps({"spans": count}).encode(), "application/json")

        def _answer(self, body: bytes, ctype: str) -> None:
            self.send_response(200)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"{READY}http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


# ---------------------------------------------------------------- child processes

@dataclass
class Child:
    name: str
    popen: subprocess.Popen[str]
    url: str

    def cpu_s(self) -> float:
        stat = Path(f"/proc/{self.popen.pid}/stat").read_text()
        fields = stat[stat.rfind(")") + 2:].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=5)


def _setup(cpu: int | None) -> Callable[[], None]:
    def setup() -> None:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})
    return setup


def _spawn_ready(name: str, cmd: list[str], prefix: str, cpu: int | None) -> Child:
    popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                             preexec_fn=_setup(cpu))
    assert popen.stdout is not None
    line = popen.stdout.readline()
    if not line.startswith(prefix):
        popen.kill()
        raise RuntimeError(f"{name} did not start: {line!r}")
    return Child(name, popen, line[len(prefix):].strip())


def start_gateway(config: Path, cpu: int | None, env: dict[str, str]) -> Child:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "fleetgate.cli", "serve", "--config", str(config),
           "--port", str(port)]
    base = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    popen = subprocess.Popen(cmd, env={**base, **env}, stdin=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, text=True, preexec_fn=_setup(cpu))
    child = Child("gateway", popen, f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            raise RuntimeError(f"gateway exited with {popen.returncode}")
        with contextlib.suppress(OSError), \
                urllib.request.urlopen(child.url + "/readyz", timeout=1.0) as resp:
            if resp.status == 200:
                return child
        time.sleep(0.1)
    child.stop()
    raise RuntimeError("gateway did not become ready")


# ---------------------------------------------------------------- load

async def measure(url: str, gateway: Child, stream: bool, concurrency: int, warmup: float,
                  duration: float) -> tuple[int, float, float]:
    """Closed loop: (responses, seconds, gateway CPU seconds) in the measured window."""
    import aiohttp

    body: dict[str, object] = {"model": PUBLIC, "max_tokens": 16,
                               "messages": [{"role": "user", "content": "Say hello."}]}
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    payload = json.dumps(body).encode()
    state = {"recording": False, "stop": False, "done": 0, "errors": 0}

    async def user(session: aiohttp.ClientSession) -> None:
        while not state["stop"]:
            async with session.post(url + "/v1/chat/completions", data=payload,
                                    headers={"content-type": "application/json"}) as resp:
                data = await resp.read()
                if resp.status != 200 or (stream and not data.endswith(b"data: [DONE]\n\n")):
                    state["errors"] += 1
            if state["recording"]:
                state["done"] += 1

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        users = [asyncio.create_task(user(session)) for _ in range(concurrency)]
        await asyncio.sleep(warmup)
        cpu0, t0 = gateway.cpu_s(), time.perf_counter()
        state["recording"] = True
        await asyncio.sleep(duration)
        state["recording"] = False
        cpu1, t1 = gateway.cpu_s(), time.perf_counter()
        state["stop"] = True
        await asyncio.gather(*users)
    if state["errors"]:
        raise RuntimeError(f"{state['errors']} bad responses")
    return int(state["done"]), t1 - t0, cpu1 - cpu0


# ---------------------------------------------------------------- main

@dataclass
class Row:
    variant: str
    mode: str
    rps: float
    cpu_ms: float


def _config(mock_url: str) -> str:
    return json.dumps({
        "pools": [{"name": "bench", "accelerator": "h100", "engine": "vllm",
                   "price_per_gpu_hour": 2.95, "endpoints": [mock_url],
                   "models": {PUBLIC: SERVED}}],
        "policies": {"bench": {"strategy": "cost", "slo": {"ttft_ms": 1500, "tpot_ms": 80}}},
        "default_policy": "bench"})


def _env(variant: str, receiver: str) -> dict[str, str]:
    env = {"FLEETGATE_REQUEST_LOG": "off" if variant == "bare" else "stderr"}
    if variant in ("traced", "sampled"):
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver
    if variant == "sampled":
        env.update(OTEL_TRACES_SAMPLER="parentbased_traceidratio", OTEL_TRACES_SAMPLER_ARG="0.25")
    return env


def _spans(receiver: Child) -> int:
    with urllib.request.urlopen(receiver.url + "/count", timeout=5) as resp:
        return int(json.loads(resp.read())["spans"])


async def one_round(gateways: dict[str, Child], args: argparse.Namespace,
                    rows: list[Row], traced: list[int]) -> None:
    for mode in ("plain", "stream"):
        for variant, gw in gateways.items():
            n, secs, cpu = await measure(gw.url, gw, mode == "stream", args.concurrency,
                                         args.warmup, args.duration)
            rows.append(Row(variant, mode, n / secs, cpu * 1000 / max(n, 1)))
            if variant == "traced":
                traced[0] += n
            print(f"  {variant:7} {mode:6} {n / secs:7,.0f} req/s  gateway "
                  f"{cpu * 1000 / max(n, 1):.3f} CPU ms/req, {cpu / secs:.0%} busy", flush=True)


def table(rows: list[Row]) -> str:
    lines = ["| mode | config | req/s | gateway CPU ms/req (median) | range over rounds "
             "| vs `log` (tracing off) |", "|---|---|--:|--:|--:|--:|"]
    for mode in ("plain", "stream"):
        cpu = {v: [r.cpu_ms for r in rows if r.variant == v and r.mode == mode]
               for v in VARIANTS}
        med = {v: statistics.median(x) for v, x in cpu.items()}
        for v in VARIANTS:
            rps = statistics.median(r.rps for r in rows if r.variant == v and r.mode == mode)
            delta = (med[v] / med["log"] - 1) * 100
            lines.append(f"| {mode} | {v} | {rps:,.0f} | {med[v]:.3f} | "
                         f"{min(cpu[v]):.3f}-{max(cpu[v]):.3f} | {delta:+.1f}% |")
    return "\n".join(lines)


def machine() -> str:
    model = cpu_model()
    return (f"{model}, {os.cpu_count()} CPUs; Linux {platform.release()}; "
            f"Python {platform.python_version()}")


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--receiver", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--duration", type=float, default=5.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--nice", type=int, default=0,
                        help="niceness for every benchmark process (negative needs root; -10 "
                             "shields the numbers from other load on a shared machine)")
    parser.add_argument("--pin", action="store_true",
                        help="pin the gateway to CPU 0 and the rest to CPU 1 (on a shared "
                             "machine only with --nice -10: pinned processes starve otherwise)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    return parser.parse_args()


def main() -> None:
    args = _args()
    if args.receiver:
        receiver_main()
        return
    pinned = args.pin and {GATEWAY_CPU, LOAD_CPU} <= os.sched_getaffinity(0)
    gw_cpu, load_cpu = (GATEWAY_CPU, LOAD_CPU) if pinned else (None, None)
    if pinned:
        os.sched_setaffinity(0, {LOAD_CPU})
    if args.nice:
        try:
            os.nice(args.nice - os.nice(0))
        except PermissionError:
            print(f"cannot set nice {args.nice} (not root); numbers may be noisy")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    children: list[Child] = []
    rows: list[Row] = []
    traced = [0]
    try:
        with tempfile.TemporaryDirectory(prefix="fleetgate-bench-") as tmp:
            mock = _spawn_ready("mock", [sys.executable, str(MOCK), "--port", "0"],
                                "MOCK_ENGINE_READY ", load_cpu)
            receiver = _spawn_ready("receiver", [sys.executable, __file__, "--receiver"],
                                    READY, load_cpu)
            children += [mock, receiver]
            config = Path(tmp) / "fleet.yaml"
            config.write_text(_config(mock.url))
            gateways = {v: start_gateway(config, gw_cpu, _env(v, receiver.url))
                        for v in VARIANTS}
            children += gateways.values()
            for i in range(args.rounds):
                print(f"round {i + 1}/{args.rounds}", flush=True)
                asyncio.run(one_round(gateways, args, rows, traced))
            gateways["traced"].stop()  # flushes the last spans
            spans = _spans(receiver)
    finally:
        for child in reversed(children):
            child.stop()
    text = report(rows, args, spans, traced[0])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print("\n" + table(rows) + f"\n\nwritten to {args.out}")


def report(rows: list[Row], args: argparse.Namespace, spans: int, traced: int) -> str:
    placement = (f"Gateway pinned alone to CPU {GATEWAY_CPU}; mock engine, OTLP receiver and "
                 f"load generator to CPU {LOAD_CPU}." if args.pin else "Processes not pinned.")
    placement += f" Every benchmark process at nice {os.nice(0)}."
    return f"""# Tracing overhead

Produced by `bench/tracing_overhead.py {' '.join(sys.argv[1:])}` on {time.strftime('%Y-%m-%d')}.
{placement} Load generator: aiohttp, c={args.concurrency}, closed loop.
`cost` policy, one endpoint. {args.rounds} rounds, each running every configuration in turn
({args.warmup:g} s warm-up + {args.duration:g} s measured); medians, with the range over rounds.
Spans received by the OTLP receiver: {spans:,} for at least {traced:,} requests of the
`traced` gateway in the measured windows (3 spans each, plus warm-ups and the sampled
quarter of the `sampled` gateway's).

**Machine.** {machine()}.

{table(rows)}
"""


if __name__ == "__main__":
    main()
