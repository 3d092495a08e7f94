"""``fleetgate bench sweep``: per pool, the throughput-latency curve and the highest load it
sustains within the SLO.

A *target* is one pool: ``NAME=URL`` (an engine, or a gateway whose traffic all lands on that
pool), or a plain URL whose pool is named by the answers' ``x-fleetgate-pool`` header. Each
step is one bounded bench run at one load: an open-loop Poisson rate (``--mode rate``,
requests/s) or a closed-loop concurrency (``--mode concurrency``). A step *passes* when at
least ``target`` (default 0.99) of its requests, after the first ``WARMUP_SHARE`` of them
(the server starts each step idle), completed within both SLO limits: the rule of the
simulator's ``sim/capacity.py``, so a sweep and ``simulate --json``'s ``capacity`` measure
the same thing.

Loads: the ones given (``--loads 1,2,4``), or a search from ``--start``: doubling until a
step fails, then bisection until the passing and failing loads are within ``--tolerance``
of each other (5% by default). The capacity is the highest passing load; in rate mode its
``rate_per_s`` is that offered rate (the simulator's definition), in concurrency mode the
request throughput measured at it. ``tokens_per_s`` is that rate times the mean output
tokens, ``concurrency`` the mean requests in flight (rate x mean e2e, Little's law), and
``per_replica`` divides by the pool's endpoints when the target is a fleetgate
(``/admin/endpoints``), which is what ``fleetgate plan --capacities`` reads.

May touch: the other loadgen modules. Must not touch: printing (``on_step`` is told each step).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

from fleetgate.loadgen import costs
from fleetgate.loadgen.client import base_url
from fleetgate.loadgen.measure import BenchOptions, measure

WARMUP_SHARE = 0.1
Mode = Literal["rate", "concurrency"]


@dataclass(frozen=True)
class SweepOptions:
    bench: BenchOptions  # lengths, API, SLO, per-step bound (requests / duration)
    mode: Mode = "rate"
    loads: tuple[float, ...] = ()
    start: float = 1.0
    max_load: float = 1e4
    tolerance: float = 0.05
    target: float = 0.99
    max_steps: int = 20


def parse_target(spec: str) -> tuple[str | None, str]:
    name, sep, url = spec.partition("=")
    return (name, url) if sep and "://" not in name else (None, spec)


def judged_attainment(result: dict[str, Any]) -> float:
    good = result["per_request"]["good"]
    judged = good[int(len(good) * WARMUP_SHARE):]
    return sum(1 for g in judged if g) / len(judged) if judged else 0.0


def _step(load: float, mode: Mode, result: dict[str, Any], passed: bool) -> dict[str, Any]:
    o = result["overall"]
    return {"load": load, "mode": mode, "passed": passed,
            "slo_attainment": round(judged_attainment(result), 4),
            "requests": o["requests"], "errors": o["errors"],
            "request_throughput": o["request_throughput"],
            "output_throughput": o["output_throughput"],
            "ttft_ms": o["ttft_ms"], "tpot_ms": o["tpot_ms"], "e2e_ms": o["e2e_ms"],
            "usd_per_mtok": o.get("usd_per_mtok"),
            "mean_input_tokens": round(o["input_tokens"] / max(o["requests"], 1), 1),
            "mean_output_tokens": round(o["output_tokens"] / max(o["requests"], 1), 1),
            "pools_seen": sorted(p for p in result["pools"] if not p.startswith("("))}


async def sweep_target(url: str, opts: SweepOptions,
                       on_step: Callable[[dict[str, Any]], None] | None = None
                       ) -> list[dict[str, Any]]:
    if opts.bench.slo_ttft_ms is None and opts.bench.slo_tpot_ms is None:
        raise ValueError("a sweep needs an SLO: --slo-ttft-ms and/or --slo-tpot-ms")
    steps: list[dict[str, Any]] = []

    async def at(load: float) -> bool:
        b = replace(opts.bench, url=url, rate=load if opts.mode == "rate" else None,
                    concurrency=int(load) if opts.mode == "concurrency" else None)
        result = await measure(b)
        passed = judged_attainment(result) >= opts.target
        steps.append(_step(load, opts.mode, result, passed))
        if on_step is not None:
            on_step(steps[-1])
        return passed

    if opts.loads:
        for load in opts.loads:
            await at(load)
        return steps
    lo, hi, load = 0.0, None, opts.start
    while len(steps) < opts.max_steps and load <= opts.max_load:
        if await at(load):
            lo = load
            load *= 2
        else:
            hi = load
            break
    while hi is not None and len(steps) < opts.max_steps and hi - lo > opts.tolerance * hi:
        mid = (lo + hi) / 2 if lo > 0 else hi / 2
        if opts.mode == "concurrency":
            mid = float(round(mid))
            if mid in (lo, hi):
                break
        if await at(mid):
            lo = mid
        else:
            hi = mid
    return steps


def capacity(steps: list[dict[str, Any]], mode: Mode) -> dict[str, Any] | None:
    passing = [s for s in steps if s["passed"]]
    if not passing:
        return None
    best = max(passing, key=lambda s: s["load"])
    failing = [s["load"] for s in steps if not s["passed"] and s["load"] > best["load"]]
    rate = best["load"] if mode == "rate" else best["request_throughput"]
    e2e = (best["e2e_ms"] or {}).get("mean") or 0.0
    return {"load": best["load"], "first_failing_load": min(failing) if failing else None,
            "rate_per_s": rate, "tokens_per_s": round(rate * best["mean_output_tokens"], 3),
            "concurrency": round(rate * e2e / 1000.0, 3),
            "slo_attainment": best["slo_attainment"]}


async def sweep(targets: list[str], opts: SweepOptions,
                on_step: Callable[[str, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    pools: dict[str, Any] = {}
    for spec in targets:
        name, url = parse_target(spec)
        base = base_url(url)
        label = name or base

        def told(step: dict[str, Any], label: str = label) -> None:
            if on_step is not None:
                on_step(label, step)

        steps = await sweep_target(base, opts, told)
        seen = {p for s in steps for p in s["pools_seen"]}
        pool = name or (next(iter(seen)) if len(seen) == 1 else base)
        facts = costs.pool_facts(base, opts.bench.admin_key).get(pool, {})
        cap = capacity(steps, opts.mode)
        replicas = facts.get("replicas") or 1
        pools[pool] = {
            "url": base, **facts, "steps": steps, "capacity": cap,
            "per_replica": None if cap is None else {
                "rate_per_s": round(cap["rate_per_s"] / replicas, 4),
                "tokens_per_s": round(cap["tokens_per_s"] / replicas, 3),
                "concurrency": round(cap["concurrency"] / replicas, 3)},
        }
    b = opts.bench
    return {"mode": opts.mode, "target_attainment": opts.target, "warmup_share": WARMUP_SHARE,
            "slo": {"ttft_ms": b.slo_ttft_ms, "tpot_ms": b.slo_tpot_ms},
            "workload": {"api": b.api, "stream": b.stream, "input_tokens": b.input_tokens,
                         "output_tokens": b.output_tokens, "requests_per_step": b.requests,
                         "duration_per_step_s": b.duration_s, "model": b.model},
            "pools": pools}
