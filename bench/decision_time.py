"""Decision time of the router at 10 to 10,000 endpoints, and its memory (BENCHMARKS.md).

Builds a LiveFleet of N endpoints over the six GPU types with random load, then times
``snapshot(now)`` + ``route(request, snapshot)`` per strategy: the full cost of one routing
decision on the request path (numba's kernels are compiled at import, before timing; above
512 endpoints a decision looks at a shortlist of them). 10 interleaved rounds of 300
decisions per strategy (``--rounds``, ``--per-round``); p50/p90/p99 over all 3,000, and
the median of the quickest round (what the code costs when the shared VM is not slowed by
its neighbours: the "min of repeats" of timeit). Pure CPU, one process; prints a markdown
table and this machine's speed before and after (a numpy add of 1,000 floats).

``--memory`` (default on): bytes per endpoint of the largest size's fleet, measured with
tracemalloc (numpy's buffers are traced too) while building it, split into the endpoint
descriptions (``Endpoint`` + prior: what the config gives), the ``LiveFleet`` (its numpy
arrays, counted separately by ``nbytes``, and the per-endpoint Python objects: stats,
breaker, health, windows) and the routing caches the first decision of each strategy
builds; plus, as a cross-check, the resident set's growth while building the same fleet
once more without tracemalloc.

``--stages``: where one ``cost`` decision spends its time, stage by stage (a copy of
``Pipeline.route`` with a clock read between stages; medians over ``--per-round``
decisions, after one warm-up): snapshot, the shortlist (above 512 endpoints:
``routing/shortlist.py``; the copy of its rows is in the prefilter's time), prefilter, the
policy's filters, the estimate kernel (forced here; in ``route`` the first scorer that
reads an estimate runs it), scorers, the SLO preference (``_total``), the picker and the
``Decision``.

Run: .venv/bin/python bench/decision_time.py [--sizes 10 100 1000 10000] [--stages]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import os
import random
import statistics
import time
import timeit
import tracemalloc

import numpy as np

from fleetgate.config.schema import PolicyConfig
from fleetgate.routing import Endpoint, RoutingRequest
from fleetgate.routing.estimate import Estimates
from fleetgate.routing.pipeline import Pipeline
from fleetgate.routing.plugins import ScoringInput
from fleetgate.routing.policies import build_pipeline
from fleetgate.routing.shortlist import SHORTLIST_FROM
from fleetgate.routing.types import PREFILTER, Decision
from fleetgate.state.live import LiveFleet
from fleetgate.state.prior import Prior, endpoint_prior

GPUS = [
    ("mi300x", "amd", 1.99),
    ("mi325x", "amd", 2.25),
    ("mi355x", "amd", 2.90),
    ("h100", "nvidia", 2.95),
    ("h200", "nvidia", 3.60),
    ("b200", "nvidia", 6.00),
]
MODEL, SERVED = "llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct"
POLICIES = {
    "cost": {"strategy": "cost", "slo": {"ttft_ms": 1500, "tpot_ms": 40}},
    "latency": {"strategy": "latency"},
    "least_loaded": {"strategy": "least_loaded"},
    "power_of_two": {"strategy": "power_of_two"},
    "round_robin": {"strategy": "round_robin"},
    "affinity": {"strategy": "affinity"},
    "weighted": {"strategy": "weighted", "slo": {"ttft_ms": 1500, "tpot_ms": 40},
                 "scorers": [{"name": "cost", "weight": 2}, {"name": "queue"},
                             {"name": "kv_headroom", "weight": 0.5}]},
}
REQUEST = RoutingRequest(model=MODEL, prompt_chars=2000, max_tokens=256, user="session-42")


def describe(n: int) -> tuple[list[Endpoint], list[Prior]]:
    infos, priors = [], []
    for i in range(n):
        gpu, vendor, price = GPUS[i % len(GPUS)]
        infos.append(
            Endpoint(
                f"{gpu}-{i}",
                f"{gpu}-pool",
                f"http://10.{i // 65536}.{i // 256 % 256}.{i % 256}",
                "vllm",
                gpu,
                vendor,
                {MODEL: SERVED},
                {},
                price,
            )
        )
        priors.append(endpoint_prior(gpu, SERVED))
    return infos, priors


def load(live: LiveFleet, rng: random.Random) -> LiveFleet:
    for i in range(len(live.endpoints)):
        live.on_probe(i, 0.0, True, "200")
        live.on_scrape(i, 0.0, rng.randint(0, 5), rng.randint(0, 40), rng.random() * 0.8, 1e6, None)
        for _ in range(rng.randint(0, 20)):
            live.on_dispatch(i, 0.0)
    return live


def fleet(n: int, rng: random.Random) -> LiveFleet:
    return load(LiveFleet(*describe(n)), rng)


def pipelines() -> dict[str, Pipeline]:
    return {name: build_pipeline(name, PolicyConfig.model_validate(policy), seed=1)
            for name, policy in POLICIES.items()}


def time_decisions(live: LiveFleet, pipes: dict[str, Pipeline], rounds: int,
                   per_round: int) -> dict[str, list[list[float]]]:
    """Interleaved rounds, so a noisy spell on the (shared) machine hits every strategy."""
    samples: dict[str, list[list[float]]] = {name: [] for name in pipes}
    clock = time.perf_counter
    for _ in range(rounds):
        for name, pipe in pipes.items():
            out: list[float] = []
            for _ in range(per_round):
                t0 = clock()
                pipe.route(REQUEST, live.snapshot(1.0))
                out.append(clock() - t0)
            samples[name].append(out)
    return samples


# -- memory ---------------------------------------------------------------------------------
def _arrays(obj: object, depth: int = 3, seen: set[int] | None = None) -> int:
    """Bytes of the numpy buffers reachable from ``obj``'s attributes (each buffer once)."""
    seen = set() if seen is None else seen
    total = 0
    values = list(vars(obj).values()) if hasattr(obj, "__dict__") else []
    values += [getattr(obj, s) for s in getattr(type(obj), "__slots__", ()) if hasattr(obj, s)]
    for value in values:
        if isinstance(value, np.ndarray):
            base = value if value.base is None else value.base
            if isinstance(base, np.ndarray) and id(base) not in seen:
                seen.add(id(base))
                total += base.nbytes
        elif depth > 0 and not isinstance(value, (str, bytes, int, float, tuple, list, dict)):
            total += _arrays(value, depth - 1, seen)
    return total


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def memory(n: int) -> dict[str, float]:
    """Bytes per endpoint of an n-endpoint fleet (module doc)."""
    rng = random.Random(7)
    gc.collect()
    rss0 = _rss()
    kept = fleet(n, rng)  # the RSS cross-check, untraced
    gc.collect()
    rss = _rss() - rss0
    del kept
    gc.collect()
    tracemalloc.start()
    m0 = tracemalloc.get_traced_memory()[0]
    infos, priors = describe(n)
    m1 = tracemalloc.get_traced_memory()[0]
    live = load(LiveFleet(infos, priors), rng)
    gc.collect()
    m2 = tracemalloc.get_traced_memory()[0]
    pipes = pipelines()
    for pipe in pipes.values():
        pipe.route(REQUEST, live.snapshot(1.0))
    gc.collect()
    m3 = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    arrays = _arrays(live)
    snap = live.snapshot(1.0).live.nbytes
    return {"described": (m1 - m0) / n, "live": (m2 - m1) / n, "arrays": arrays / n,
            "objects": (m2 - m1 - arrays) / n, "caches": (m3 - m2) / n,
            "snapshot": snap / n, "rss": rss / n}


# -- stages ---------------------------------------------------------------------------------
STAGES = ("snapshot", "shortlist", "prefilter", "filters", "estimate kernel", "scorers",
          "SLO preference", "picker", "Decision", "whole (sum)")


def staged_route(pipe: Pipeline, live: LiveFleet, req: RoutingRequest,
                 clock=time.perf_counter) -> tuple[list[float], Decision]:
    """``Pipeline.route`` for a plain model (no adapter), with a clock read between stages."""
    t = [clock()]
    snap = live.snapshot(1.0)
    t.append(clock())
    idx = snap.by_model[(req.model, req.api)]
    if len(idx) > SHORTLIST_FROM:
        idx = pipe._shortlist.pick(snap, req, idx, pipe._sticky)
    t.append(clock())
    est = Estimates(snap, idx, req, pipe.slo)
    alive, left = est.prefilter()
    count = len(idx)
    stages = [] if left == count else [(PREFILTER, alive)]
    t.append(clock())
    inp = ScoringInput(snap, idx, req, est, alive)
    for flt in pipe.filters:
        keep = flt(inp)
        if keep is None:
            continue
        stages.append((flt.label, keep))
        alive = inp.mask = alive & keep
        left = int(np.count_nonzero(alive))
    t.append(clock())
    est._kernel_out  # noqa: B018  (the lazy kernel run, which the first scorer would trigger)
    t.append(clock())
    scores = {s.name: s(inp) for s in pipe.scorers}
    t.append(clock())
    total, reason, over = pipe._total(scores, est, alive, left)
    t.append(clock())
    rank = total if left == count else np.where(alive, total, -np.inf)
    order = pipe.picker.order(rank, min(pipe.max_attempts, left))
    t.append(clock())
    decision = Decision(pipe.name, req.model, reason, snap.endpoints, idx, order, total, scores,
                        est, tuple(stages), alive, over)
    t.append(clock())
    steps = [b - a for a, b in itertools.pairwise(t)]
    return [*steps, t[-1] - t[0]], decision


def stage_profile(live: LiveFleet, pipe: Pipeline, runs: int) -> list[float]:
    """Median µs of each stage of one ``cost`` decision over ``runs``."""
    staged_route(pipe, live, REQUEST)
    per: list[list[float]] = [[] for _ in STAGES]
    for _ in range(runs):
        steps, _ = staged_route(pipe, live, REQUEST)
        for k, s in enumerate(steps):
            per[k].append(s)
    return [statistics.median(p) * 1e6 for p in per]


def machine_reference_us() -> float:
    """This machine's speed right now: one numpy add of 1,000 floats (~0.55 us when this
    2-vCPU VM is quiet; it drifts up to 2x between minutes, and the decisions with it)."""
    a, b = np.ones(1000), np.ones(1000)
    best = min(timeit.repeat(lambda: np.add(a, b), number=2000, repeat=7))
    return best / 2000 * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000, 10000])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=300)
    parser.add_argument("--no-memory", dest="memory", action="store_false",
                        help="skip the memory measurement (at the largest size)")
    parser.add_argument("--stages", action="store_true",
                        help="also time one cost decision stage by stage at each size")
    args = parser.parse_args()
    rng = random.Random(42)
    before = machine_reference_us()
    mem = memory(max(args.sizes)) if args.memory else None
    profiles: dict[int, list[float]] = {}
    print("| endpoints | strategy | p50 µs | p90 µs | p99 µs | best round's p50 µs |")
    print("|---|---|---|---|---|---|")
    for n in args.sizes:
        live = fleet(n, rng)
        pipes = pipelines()
        for name, rounds in time_decisions(live, pipes, args.rounds, args.per_round).items():
            values = sorted(v for r in rounds for v in r)
            p50, p90, p99 = (values[int(len(values) * q)] * 1e6 for q in (0.5, 0.9, 0.99))
            best = min(statistics.median(r) for r in rounds) * 1e6
            print(f"| {n} | {name} | {p50:.1f} | {p90:.1f} | {p99:.1f} | {best:.1f} |",
                  flush=True)
        if args.stages:
            profiles[n] = stage_profile(live, pipes["cost"], args.per_round)
        del live, pipes
        gc.collect()
    if profiles:
        print("\nOne `cost` decision by stage, median µs:\n")
        print("| stage | " + " | ".join(f"{n} endpoints" for n in profiles) + " |")
        print("|---|" + "---|" * len(profiles))
        for k, stage in enumerate(STAGES):
            print(f"| {stage} | " + " | ".join(f"{p[k]:.1f}" for p in profiles.values()) + " |")
    if mem is not None:
        n = max(args.sizes)
        print(f"\nMemory per endpoint at {n:,} endpoints (tracemalloc while building; bytes):\n")
        print("| part | bytes per endpoint |")
        print("|---|---|")
        print(f"| endpoint descriptions (`Endpoint` + prior, from the config) "
              f"| {mem['described']:,.0f} |")
        print(f"| `LiveFleet` with its load | {mem['live']:,.0f} |")
        print(f"| - of which numpy arrays (`nbytes`) | {mem['arrays']:,.0f} |")
        print(f"| - of which per-endpoint Python objects and indexes | {mem['objects']:,.0f} |")
        print(f"| routing caches after one decision per strategy | {mem['caches']:,.0f} |")
        print(f"| one snapshot's rows (copied per decision up to {SHORTLIST_FROM:,} "
              f"endpoints, shared above) | {mem['snapshot']:,.0f} |")
        print(f"| cross-check: RSS growth building descriptions + `LiveFleet` "
              f"| {mem['rss']:,.0f} |")
    print(f"\nmachine reference (numpy add of 1,000 floats): {before:.2f} µs before, "
          f"{machine_reference_us():.2f} µs after")


if __name__ == "__main__":
    main()
