"""Tracing's own CPU per request, measured in-process: robust where end-to-end runs are noisy.

``bench/tracing_overhead.py`` measures whole gateways; on a shared 2-vCPU machine its
per-round numbers swing by ±30%, more than the effect. This script runs exactly the code
tracing adds, the gateway's observer fed the calls ``ProxyService`` makes for one request
(request -> routed(decision) -> attempt -> headers -> first_token -> finished -> end) with
a real routing decision of the ``cost`` policy over the four pools of the embedded fleet,
and measures this process's CPU time (``time.process_time``: all threads, so the span
batcher's export thread is counted, ``force_flush`` included) per request:

* ``off``: no ``OTEL_*``: metrics, cost ledger, a JSON log line (to a null sink);
* ``spans only``: tracing on, span records built and given to no exporter (the event-loop
  share of the cost);
* ``traced``: tracing on, exported by the batch processor over OTLP/HTTP to a local
  receiver process (``bench/tracing_overhead.py --receiver``);
* ``sampled 25%``: ``traced`` with ``parentbased_traceidratio`` 0.25.

Each variant runs ``--requests`` requests per round, rounds interleaved; the table shows
the minimum over rounds (interference only ever adds time) and the median.

Run: ``.venv/bin/python bench/tracing_component.py`` (about 1 minute). Writes
``bench/results/tracing_component.md``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry

from fleetgate.config.schema import PolicyConfig
from fleetgate.gateway.costs import CostLedger
from fleetgate.gateway.proxy.apis import APIS
from fleetgate.gateway.proxy.observer import AttemptResult
from fleetgate.gateway.proxy.request import ProxyRequest
from fleetgate.gateway.telemetry.logs import RequestLog
from fleetgate.gateway.telemetry.metrics import GatewayMetrics
from fleetgate.gateway.telemetry.recorder import TelemetryObserver
from fleetgate.gateway.telemetry.tracing import Tracing, sampler_from_env, start_tracing
from fleetgate.routing import Decision, Endpoint, RoutingRequest
from fleetgate.routing.policies import build_pipeline
from fleetgate.state.live import LiveFleet
from fleetgate.state.prior import endpoint_prior

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "tracing_component.md"
MODEL, SERVED = "llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct"
POOLS = [("mi300x-sglang", "mi300x", "amd", "sglang", 1.99),
         ("mi355x-vllm", "mi355x", "amd", "vllm", 2.90),
         ("h100-vllm", "h100", "nvidia", "vllm", 2.95),
         ("h200-sglang", "h200", "nvidia", "sglang", 3.60)]


def decisions(n: int, stream: bool) -> tuple[list[Decision], dict[str, Endpoint]]:
    infos = [Endpoint(f"{p}-0", p, f"http://10.0.0.{i}:8000", eng, acc, vendor,
                          {MODEL: SERVED}, {}, price)
             for i, (p, acc, vendor, eng, price) in enumerate(POOLS)]
    live = LiveFleet(infos, [endpoint_prior(i.accelerator, SERVED) for i in infos])
    for i in range(len(infos)):
        live.on_probe(i, 0.0, True, "200")
    policy = PolicyConfig.model_validate({"strategy": "cost",
                                          "slo": {"ttft_ms": 1500, "tpot_ms": 80}})
    pipeline = build_pipeline("cost", policy, seed=1)
    request = RoutingRequest(MODEL, stream=stream, max_tokens=256, prompt_chars=2000)
    endpoints = {i.id: i for i in infos}
    return [pipeline.route(request, live.snapshot(1.0)) for _ in range(n)], endpoints


def run(tracing: Tracing | None, stream: bool, n: int) -> float:
    """CPU microseconds per request through the observer (export included)."""
    observer = TelemetryObserver(GatewayMetrics(CollectorRegistry(), buffered=True), CostLedger(),
                                 RequestLog(lambda _: None), tracing, lambda _: 1.0)
    ds, endpoints = decisions(n, stream)
    routing = RoutingRequest(MODEL, stream=stream, max_tokens=256, prompt_chars=2000)
    body = {"model": MODEL, "max_tokens": 256}
    usage = {"prompt_tokens": 508, "completion_tokens": 256}
    t0 = time.process_time()
    for k, decision in enumerate(ds):
        req = observer.request(ProxyRequest(APIS["chat"], routing, body, f"{k:032x}"))
        req.routed(decision)
        chosen = decision.chosen
        assert chosen is not None
        attempt = req.attempt(endpoints[chosen.id], SERVED, 0)
        attempt.headers()
        if stream:
            attempt.first_token(0.05)
        attempt.finished(AttemptResult(200, usage, 0.05 if stream else None, 2.5, 4.0))
        req.end(200)
    if tracing is not None:
        tracing.force_flush()
    return (time.process_time() - t0) / n * 1e6


def variants(receiver: str) -> dict[str, Callable[[], Tracing | None]]:
    otlp = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver}
    return {
        "off": lambda: None,
        "spans only": lambda: Tracing(Resource.create({}), sampler_from_env({}), []),
        "traced": lambda: start_tracing(otlp),
        "sampled 25%": lambda: start_tracing({**otlp, "OTEL_TRACES_SAMPLER":
                                              "parentbased_traceidratio",
                                              "OTEL_TRACES_SAMPLER_ARG": "0.25"}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    receiver = subprocess.Popen([sys.executable, str(ROOT / "bench" / "tracing_overhead.py"),
                                 "--receiver"], stdout=subprocess.PIPE, text=True)
    assert receiver.stdout is not None
    url = receiver.stdout.readline().split()[1]
    results: dict[tuple[str, str], list[float]] = {}
    try:
        for r in range(args.rounds):
            for mode in ("plain", "stream"):
                for name, make in variants(url).items():
                    tracing = make()
                    results.setdefault((mode, name), []).append(
                        run(tracing, mode == "stream", args.requests))
                    if tracing is not None:
                        tracing.shutdown()
            print(f"round {r + 1}/{args.rounds} done", flush=True)
    finally:
        receiver.kill()
    text = report(results, args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


def report(results: dict[tuple[str, str], list[float]], args: argparse.Namespace) -> str:
    lines = ["| mode | config | CPU us/request (min) | median | added over `off` (min) |",
             "|---|---|--:|--:|--:|"]
    for (mode, name), xs in results.items():
        added = min(xs) - min(results[(mode, "off")])
        lines.append(f"| {mode} | {name} | {min(xs):.1f} | {statistics.median(xs):.1f} | "
                     f"{added:+.1f} |")
    return (f"# Tracing: CPU per request of the telemetry layer\n\nProduced by "
            f"`bench/tracing_component.py` on {time.strftime('%Y-%m-%d')}: {args.requests} "
            f"requests x {args.rounds} rounds per row.\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
