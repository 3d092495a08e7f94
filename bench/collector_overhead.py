"""CPU the collector spends per endpoint and tick, at 100 and 1,000 endpoints (BENCHMARKS.md).

One mock engine (``bench/mock_engine.py``) answers ``/health`` and serves a captured vLLM
``/metrics`` exposition (``tests/data/vllm_metrics.txt``, 63 KB); the fleet's N endpoints
are N loopback addresses (127.0.x.y) of that one server, so each endpoint has its own
connections as real engines would. The gateway side is the production code: ``Fleet``'s
``LiveFleet`` and ``Collector`` on the control plane's client (``backends/http1.py``).
After one warm-up tick, 10 ticks are timed; prints this process's CPU per endpoint and tick
(the engine's CPU is in another process) and a tick's wall time. The scrapes are whole, as
every engine sends them (vLLM ignores prometheus_client's ``?name[]=`` filter).

Run: .venv/bin/python bench/collector_overhead.py [N ...]
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import uvloop

from fleetgate.backends.http1 import Http1Backend
from fleetgate.config import parse_config
from fleetgate.state.collector import Collector
from fleetgate.state.fleet import Fleet

HERE = Path(__file__).parent
METRICS = HERE.parent / "tests" / "data" / "vllm_metrics.txt"


def fleet_yaml(n: int, port: str) -> str:
    pools = "".join(
        f"  - {{name: p{i}, accelerator: h100, engine: vllm, price_per_gpu_hour: 2, "
        f"endpoints: ['http://127.0.{i // 250}.{i % 250 + 1}:{port}'], models: {{m: m}}}}\n"
        for i in range(n))
    return f"pools:\n{pools}policies: {{c: {{strategy: cost}}}}\ndefault_policy: c\n"


async def measure(n: int, port: str, ticks: int = 10) -> tuple[float, float, int]:
    config = parse_config(fleet_yaml(n, port), "bench", {})
    http = Http1Backend(max_idle_per_host=2)  # as the gateway's control-plane client
    try:
        fleet = Fleet(config, http)
        collector = Collector(fleet.endpoints, fleet.live, http, time.monotonic)
        await collector.tick()  # connections opened, code warm
        wall0, cpu0 = time.perf_counter(), time.process_time()
        for _ in range(ticks):
            await collector.tick()
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        assert all(st.last_scrape_at > 0 for st in fleet.live.stats), "an endpoint unscraped"
        assert fleet.live.column("running")[0] == fleet.live.column("running")[0]  # read: not NaN
    finally:
        await http.close()
    return cpu / ticks / n * 1e3, wall / ticks * 1e3, sum(collector.scrape_errors.values())


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [100, 1000]
    engine = subprocess.Popen(
        [sys.executable, str(HERE / "mock_engine.py"), "--host", "0.0.0.0", "--port", "0",
         "--metrics-file", str(METRICS)], stdout=subprocess.PIPE, text=True)
    try:
        assert engine.stdout is not None
        port = engine.stdout.readline().strip().rsplit(":", 1)[1]
        print("| endpoints | scrape | CPU ms per endpoint and tick | tick wall ms "
              "| scrape errors |")
        print("|---|---|---|---|---|")
        for n in sizes:
            cpu_ms, wall_ms, errors = uvloop.run(measure(n, port))  # as `serve` runs
            print(f"| {n} | whole (63 KB) | {cpu_ms:.3f} | {wall_ms:.0f} | {errors} |")
    finally:
        engine.kill()


if __name__ == "__main__":
    main()
