"""Gateway variants side by side, interleaved: CPU per request of each, min and median.

For before/after questions the side-by-side run (``run.py``) cannot resolve on a noisy
shared machine: each variant is a ``fleetgate serve`` from a source tree (a checkout's
``src/``, e.g. a ``git worktree`` of another commit; empty: this checkout) with its own
environment (``OTEL_*``, ``FLEETGATE_*``), configured as ``bench/relay_overhead.py`` does
(one pool on ``bench/mock_engine.py``, ``cost`` policy). All are started up front, pinned
to CPU 0; the mock, the OTLP receiver of ``bench/tracing_overhead.py`` and the load
generator run on CPU 1. Every round measures every (mode, concurrency) on every variant in
turn, so a slow minute of the machine hits all of them; the table gives the minimum
(interference only adds time) and the median over rounds, and each ratio to the first
variant, minimum to minimum and median to median; and the median over rounds of each
window's p50 latency (request written to last byte read).

A variant is ``name=SRC`` or ``name=SRC:VAR=VALUE,VAR=VALUE``; ``RECEIVER`` in a value is
the receiver's URL. Example, tracing before and after a change::

    .venv/bin/python bench/overhead/ab.py --rounds 5 --modes plain:32,plain:1 \\
        off= traced=:OTEL_EXPORTER_OTLP_ENDPOINT=RECEIVER \\
        before=/tmp/wt/src:OTEL_EXPORTER_OTLP_ENDPOINT=RECEIVER
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import relay_overhead as ro
import tracing_overhead as to


def parse_variant(text: str) -> tuple[str, str, dict[str, str]]:
    name, _, rest = text.partition("=")
    src, _, envs = rest.partition(":")
    env = dict(kv.split("=", 1) for kv in envs.split(",") if kv)
    return name, src, env


def start(variants: list[tuple[str, str, dict[str, str]]], mock_url: str, receiver: str,
          tmp: Path) -> list[ro.Child]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    children = []
    for name, src, extra in variants:
        config = tmp / f"{name}.yaml"
        config.write_text(ro.gateway_config(mock_url, "cost"))
        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(clean, **{k: v.replace("RECEIVER", receiver) for k, v in
                                    extra.items()})
        try:
            child = ro.start_gateway(config, 0, source=Path(src) if src else None)
        finally:
            os.environ.clear()
            os.environ.update(saved)
        child.name = name
        children.append(child)
    return children


Results = dict[tuple[str, str, int], list[tuple[float, float]]]  # (CPU ms/req, p50 ms)


async def measure(gateways: list[ro.Child], others: list[ro.Child], modes: list[tuple[str, int]],
                  rounds: int, window: float) -> Results:
    out: Results = {}
    for r in range(rounds):
        for mode, c in modes:
            for gw in gateways:
                res = await ro.run_scenario(gw.name, gw.url, mode, c, 0.7, window, [gw],
                                            gateways + others)
                out.setdefault((gw.name, mode, c), []).append((res.cpu_ms[gw.name],
                                                               res.pct(0.5)))
        print(f"round {r + 1}/{rounds}", file=sys.stderr, flush=True)
    return out


def table(results: Results, first: str) -> str:
    lines = ["| variant | mode | c | CPU ms/req min | median | vs first (min / median) | "
             "p50 ms, median of rounds | CPU per round |", "|---|---|--:|--:|--:|--:|--:|---|"]
    for (name, mode, c), rows in results.items():
        xs = [x for x, _ in rows]
        base = [x for x, _ in results[(first, mode, c)]]
        lo, mid = min(xs), statistics.median(xs)
        ratio = f"{lo / min(base):.2f}x / {mid / statistics.median(base):.2f}x"
        p50 = statistics.median(p for _, p in rows)
        lines.append(f"| {name} | {mode} | {c} | {lo:.3f} | {mid:.3f} | {ratio} | {p50:.3f} | "
                     + " ".join(f"{x:.3f}" for x in xs) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("variants", nargs="+", help="name=SRC[:VAR=VALUE,...]")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--window-s", type=float, default=2.0)
    parser.add_argument("--modes", default="plain:32", help="mode:concurrency,...")
    args = parser.parse_args()
    modes = [(m.split(":")[0], int(m.split(":")[1])) for m in args.modes.split(",")]
    variants = [parse_variant(v) for v in args.variants]
    os.sched_setaffinity(0, {1})
    mock = ro.start_mock(1)
    receiver = subprocess.Popen([sys.executable, str(Path(to.__file__)), "--receiver"],
                                stdout=subprocess.PIPE, text=True,
                                preexec_fn=ro._child_setup(1))
    assert receiver.stdout is not None
    url = receiver.stdout.readline().split()[1]
    gateways: list[ro.Child] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            gateways = start(variants, mock.url, url, Path(tmp))
            results = asyncio.run(measure(gateways, [mock], modes, args.rounds,
                                          args.window_s))
    finally:
        for child in [*gateways, mock]:
            child.stop()
        receiver.kill()
    print(table(results, variants[0][0]))


if __name__ == "__main__":
    main()
