"""`fleetgate serve --workers 2` against one worker: throughput on an instant engine.

What it measures: requests/s of ``/v1/chat/completions`` (plain and 16-chunk streams, closed
loop) through one ``fleetgate serve`` and through ``fleetgate serve --workers 2``, and the
gateway's CPU ms per request (the supervisor and all its workers together).

How: ``bench/mock_engine.py`` (instant, raw asyncio) and this process's load generator (raw
asyncio HTTP/1.1, keep-alive, one connection per user; ``bench/relay_overhead.py``'s) are
the other processes; nothing is pinned: the workers need every core there is. Both
gateways are started up front (the idle one costs its 1 Hz probe and scrape); rounds
alternate between them and each row reports the round with the least CPU used by other
processes. 64 users, so that SO_REUSEPORT's hash of the connections spreads them evenly.

On a machine with as many cores as workers the load generator and the mock take CPU from
the workers, so the ratio is a floor for what two workers give where the load comes from
elsewhere; the report states each process's CPU per request to show where the time went.

Run: ``.venv/bin/python bench/workers_throughput.py [--rounds 3] [--duration 5]``.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from relay_overhead import (
    CLK_TCK,
    Child,
    Result,
    gateway_config,
    machine,
    quietest_rounds,
    run_scenario,
    start_gateway,
    start_mock,
)

RESULTS = Path(__file__).parent / "results" / "workers_throughput.md"
USERS = 64


class ProcessTree(Child):
    """A child whose CPU time includes every live descendant's (the workers)."""

    def cpu_s(self) -> float:
        total, seen = 0.0, [self.popen.pid]
        while seen:
            pid = seen.pop()
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
                kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2:].split()
            total += (int(fields[11]) + int(fields[12])) / CLK_TCK
            seen += [int(k) for k in kids]
        return total


async def measure(args: argparse.Namespace, mock: Child,
                  gateways: list[tuple[str, Child]]) -> list[Result]:
    results: list[Result] = []
    ours = [mock] + [g for _, g in gateways]
    for round_ in range(args.rounds):
        print(f"round {round_ + 1}/{args.rounds}", flush=True)
        for mode in ("plain", "stream"):
            for name, gw in gateways:
                r = await run_scenario(name, gw.url, mode, USERS, args.warmup, args.duration,
                                       [gw, mock], ours)
                results.append(r)
                print(f"  {name:10} {mode:6} {r.rps:8,.0f} req/s  gateway "
                      f"{r.cpu_ms['gateway']:.3f} ms/req  other {r.other_pct:3.0f}%  "
                      f"errors {r.errors}", flush=True)
    return results


def report(results: list[Result], rounds: int) -> str:
    best = {(r.target, r.mode): r for r in quietest_rounds(results)}
    info = machine()
    lines = [
        "# serve --workers: throughput against one worker", "",
        f"Machine: {info['cpu']}, Python {info['python']}, commit {info['commit']}; "
        f"{rounds} rounds, the quietest per row; {USERS} users, closed loop, instant mock.", "",
        "| mode | workers | req/s | gateway CPU ms/req | mock ms/req | loadgen ms/req "
        "| other load | errors |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for (target, mode), r in sorted(best.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        lines.append(f"| {mode} | {target.split('-')[1]} | {r.rps:,.0f} | "
                     f"{r.cpu_ms['gateway']:.3f} | {r.cpu_ms['mock']:.3f} | "
                     f"{r.cpu_ms['loadgen']:.3f} | {r.other_pct:.0f}% | {r.errors} |")
    lines.append("")
    for mode in ("plain", "stream"):
        one, two = best.get(("workers-1", mode)), best.get(("workers-2", mode))
        if one and two:
            lines.append(f"- {mode}: 2 workers / 1 worker = **{two.rps / one.rps:.2f}x** "
                         "requests/s")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    children: list[Child] = []
    try:
        with tempfile.TemporaryDirectory(prefix="fleetgate-workers-") as tmp:
            mock = start_mock(None)
            children.append(mock)
            gateways: list[tuple[str, Child]] = []
            for workers in (1, 2):
                path = Path(tmp) / f"workers-{workers}.yaml"
                path.write_text(gateway_config(mock.url, "cost"))
                gw = start_gateway(path, None, workers=workers)
                tree = ProcessTree("gateway", gw.popen, gw.url)
                children.append(tree)
                gateways.append((f"workers-{workers}", tree))
            try:
                import uvloop
                results = uvloop.run(measure(args, mock, gateways))
            except ImportError:
                results = asyncio.run(measure(args, mock, gateways))
    finally:
        for child in reversed(children):
            child.stop()
    text = report(results, args.rounds)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    print(f"written to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    os.environ.setdefault("FLEETGATE_REQUEST_LOG", "stderr")
    main()
