"""What one replica sustains within the SLO, on the workload's own request mix.

``replica_capacity`` drives one ``SimReplica`` (the emulator's engine model, no router)
with the workload's lengths arriving at a rate ``λ`` (Poisson unless the mix says otherwise:
gamma gaps with its ``cv``, evenly spaced at ``cv`` 0), and searches for the largest ``λ`` at
which at least ``target`` of the requests meet both SLO limits (the first ``WARMUP_SHARE`` of
arrivals are not judged: the replica starts empty). Doubling, then bisection to ``REL_TOL``.
The result feeds the planner (requests/s per replica, at the workload's own arrivals) and
the lower bound (tokens/s per busy replica-second at the SLO: ``run.bound_capacities``).

**Arrivals matter as much as shapes.** One replica's capacity depends on how its requests
come, not only on the fleet's rate, and a router shapes that. Spreading a fleet's arrivals
over its replicas smooths each replica's (round-robin over N replicas: gaps with CV
1/sqrt(N)): a short answer then rarely shares its few steps with another prompt's prefill
(a TPOT miss), and fewer prompts queue. On a 70B with short answers, round_robin ran four
MI325X replicas at 0.95 requests/s each with 99.3% within the SLO, where one replica fed
Poisson arrivals held 99% only up to 0.52 (evenly spaced: 1.17; ``bench/scenario_fuzz.py``,
case 29). Keeping a burst together does the opposite, and also helps a bound counted in
busy time: the burst runs as one batch, then the replica idles. So the bound takes, per
pool, the better of evenly spaced arrivals and the workload's own; the planner sizes fleets
at the workload's own.

**Shared prefixes.** A mix drawn from a workload with ``prefix`` carries each sampled
request's prefix group and the prefix length, and the probe gives the replica the engine's
prefix-cache blocks of each prompt (``prefixes.block_hashes``, what the simulated gateway
passes), so the replica's prefix cache hits as in a fleet. Which groups the measured replica
sees is an assumption, ``Mix.groups_seen``: the request's group ``g`` becomes
``g mod groups_seen``. The default, 1, is the optimistic case: every shared prefix is cached
where it is sent (only the replica's first request of it prefills it), which is what a
router that keeps each group on replicas holding it reaches whenever a replica's share of
the groups fits in its cache. A replica that sees *every* group is not optimistic: when the
groups' prefixes exceed one replica's KV cache (``examples/prefix-workload.yaml``: 400 x 3,000
tokens), they evict each other and it hits less than a replica of a partitioned fleet, so a
capacity measured that way would let the lower bound exceed what a policy reaches. No prefix
hit makes a replica slower (cached blocks live in free KV memory, prefill only shrinks), so
the default is an upper bound on a replica's capacity under any routing.

``Capacity.busy_share`` is the share of the judged window during which the replica held a
request: a policy's ``usd`` charges busy replica-time (``catalog.pricing``), so the lower
bound divides the tokens/s by it (tokens per *busy* second).

Results are memoised in-process per (engine config, workload mix, SLO, target).
``replica_capacities`` measures several at once as tasks of a ``parallel.Runner`` (one
process per search; the plan's rows, the simulator's pools) and memoises what comes back.

May touch: numpy, the replica driver, the emulator's perf model. Must not touch: routing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fleetgate.emulator.config import EmulatorConfig
from fleetgate.emulator.perfmodel import EngineSim
from fleetgate.sim.parallel import Runner
from fleetgate.sim.prefixes import block_hashes
from fleetgate.sim.replica import SimReplica

WARMUP_SHARE = 0.1
PROBE_REQUESTS = 1500
REL_TOL = 0.02
TARGET = 0.99
MAX_RATE = 1e4


@dataclass(frozen=True)
class Mix:
    """The workload's request shapes and SLO, as the capacity search needs them."""

    prompt_tokens: tuple[int, ...]
    output_tokens: tuple[int, ...]
    ttft_s: float
    tpot_s: float
    cv: float = 1.0  # of the inter-arrival gaps (1: Poisson; 0: evenly spaced)
    prefix_groups: tuple[int, ...] = ()  # per shape (-1: none); empty: no shared prefixes
    prefix_tokens: int = 0  # a group's shared prefix (counted in ``prompt_tokens``)
    groups_seen: int = 1  # the groups the measured replica serves (module docstring)
    probe_requests: int = PROBE_REQUESTS  # a probe's requests (more: less noise, more time)

    @property
    def mean_output(self) -> float:
        return float(np.mean(self.output_tokens))

    def blocks(self, j: int, r: int) -> tuple[int, ...]:
        """The engine blocks of request ``r`` of the probe, drawn as shape ``j``."""
        if not self.prefix_groups or self.prefix_tokens <= 0:
            return ()
        group = self.prefix_groups[j]
        if group >= 0:
            group %= max(1, self.groups_seen)
        return block_hashes(r, self.prompt_tokens[j], group, self.prefix_tokens)


@dataclass(frozen=True)
class Capacity:
    rate_per_s: float  # requests/s one replica sustains with >= target within the SLO
    tokens_per_s: float  # output tokens/s at that rate
    concurrency: float  # mean requests inside the replica at that rate
    attainment: float
    busy_share: float = 1.0  # of the time the replica held a request, at that rate

    @property
    def tokens_per_busy_s(self) -> float:
        return self.tokens_per_s / self.busy_share if self.busy_share > 0 else 0.0


@dataclass(frozen=True)
class Probe:
    attainment: float
    mean_e2e_s: float
    busy_share: float = 1.0


def drive(replica: SimReplica, arrivals: npt.NDArray[np.float64], prompts: list[int],
          outputs: list[int], blocks: list[tuple[int, ...]] | None = None,
          ) -> tuple[npt.NDArray[np.float64], ...]:
    """Run requests straight into one replica (``blocks``: each prompt's prefix-cache
    blocks); returns (ttft, tpot, e2e) per request."""
    n = len(prompts)
    first = np.full(n, np.nan)
    done = np.full(n, np.nan)
    times = arrivals.tolist()
    k = 0
    while True:
        t_engine = replica.next_time
        if k < n and (t_engine is None or times[k] < t_engine):
            replica.add(str(k), prompts[k], outputs[k], times[k], blocks[k] if blocks else ())
            k += 1
            continue
        if t_engine is None:
            break
        for ev in replica.advance():
            r = int(ev.request_id)
            if ev.index == 0:
                first[r] = t_engine
            if ev.finished:
                done[r] = t_engine
    out = np.asarray(outputs, dtype=float)
    tpot = np.where(out > 1, (done - first) / np.maximum(out - 1, 1), np.nan)
    return first - arrivals, tpot, done - arrivals


def probe(factory: Callable[[], EngineSim], mix: Mix, rate: float, seed: int,
          n: int | None = None, speed: float = 1.0) -> Probe:
    """One replica at ``rate`` for ``n`` requests (default: the mix's ``probe_requests``)."""
    n = mix.probe_requests if n is None else n
    rng = np.random.default_rng(seed)
    if mix.cv > 0:
        shape = 1.0 / mix.cv**2
        gaps = rng.gamma(shape, 1.0 / (rate * shape), n)
    else:
        gaps = np.full(n, 1.0 / rate)
    arrivals = np.cumsum(gaps)
    pick = rng.integers(0, len(mix.prompt_tokens), n)
    prompts = [mix.prompt_tokens[j] for j in pick]
    outputs = [mix.output_tokens[j] for j in pick]
    blocks = [mix.blocks(int(j), r) for r, j in enumerate(pick)] if mix.prefix_groups else None
    ttft, tpot, e2e = drive(SimReplica(factory, speed), arrivals, prompts, outputs, blocks)
    start = int(n * WARMUP_SHARE)
    judged = slice(start, n)
    ok = (ttft[judged] <= mix.ttft_s) & (np.isnan(tpot[judged]) | (tpot[judged] <= mix.tpot_s))
    busy = busy_share(arrivals, arrivals + e2e, float(arrivals[start]), float(arrivals[-1]))
    return Probe(float(np.mean(ok)), float(np.mean(e2e[judged])), busy)


def busy_share(starts: npt.NDArray[np.float64], ends: npt.NDArray[np.float64], t0: float,
               t1: float) -> float:
    """The share of ``[t0, t1]`` covered by the union of ``[starts[i], ends[i]]`` (``starts``
    sorted): when the replica held at least one request. 1 for an empty window."""
    if t1 <= t0:
        return 1.0
    covered, reach = 0.0, -math.inf
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        if math.isnan(b):
            b = math.inf  # never finished: held to the end
        a, b = max(a, reach, t0), min(b, t1)
        if b > a:
            covered += b - a
        reach = max(reach, b)
    return min(1.0, covered / (t1 - t0))


_MEMO: dict[tuple[object, ...], Capacity] = {}


def replica_capacity(engine: EmulatorConfig, mix: Mix, seed: int = 0, target: float = TARGET,
                     speed: float = 1.0) -> Capacity:
    """The largest rate (requests/s) one replica sustains with >= ``target`` in the SLO."""
    memo_key = _memo_key(engine, mix, seed, target, speed)
    found = _MEMO.get(memo_key)
    if found is not None:
        return found
    factory = engine.build_sim
    lo, lo_probe = 0.0, Probe(1.0, 0.0)
    hi = 1.0
    while hi < MAX_RATE:
        p = probe(factory, mix, hi, seed, speed=speed)
        if p.attainment < target:
            break
        lo, lo_probe, hi = hi, p, hi * 2
    while hi - lo > REL_TOL * max(lo, 1e-3) and lo < MAX_RATE:
        mid = (lo + hi) / 2 if lo > 0 else hi / 2
        p = probe(factory, mix, mid, seed, speed=speed)
        if p.attainment >= target:
            lo, lo_probe = mid, p
        else:
            hi = mid
        if lo == 0 and hi < 1e-3:
            break
    cap = Capacity(lo, lo * mix.mean_output, lo * lo_probe.mean_e2e_s, lo_probe.attainment,
                   lo_probe.busy_share if lo > 0 else 1.0)
    _MEMO[memo_key] = cap
    return cap


def _memo_key(engine: EmulatorConfig, mix: Mix, seed: int, target: float,
              speed: float) -> tuple[object, ...]:
    return (engine.model_dump_json(), speed, mix, seed, target)


CapacityCall = tuple[EmulatorConfig, Mix, int, float, float]  # engine, mix, seed, target, speed


def replica_capacities(calls: Sequence[CapacityCall],
                       runner: Runner | None = None) -> list[Capacity]:
    """``replica_capacity(*call)`` for each call, in order: the ones not memoised here are
    searched as ``runner``'s tasks (in parallel; here, one by one, without one), each
    distinct one once, and memoised here."""
    keys = [_memo_key(*call) for call in calls]
    todo = {key: call for key, call in zip(keys, calls, strict=True) if key not in _MEMO}
    if runner is None:
        found = [replica_capacity(*call) for call in todo.values()]
    else:
        found = runner.map(lambda c: f"capacity of {c[0].engine}/{c[0].gpu} tp{c[0].tp}",
                           replica_capacity, todo.values())
    _MEMO.update(zip(todo, found, strict=True))
    return [_MEMO[key] for key in keys]


def sample_mix(prompts: npt.NDArray[np.int64], outputs: npt.NDArray[np.int64], ttft_s: float,
               tpot_s: float, cv: float = 1.0, size: int = 4000,
               groups: npt.NDArray[np.int64] | None = None, prefix_tokens: int = 0,
               probe_requests: int = PROBE_REQUESTS) -> Mix:
    """A fixed-size, evenly strided sample of the workload's request shapes (``groups``:
    each request's prefix group, -1 none; ``prefix_tokens``: a group's shared prefix)."""
    step = max(1, math.ceil(len(prompts) / size))
    sampled: tuple[int, ...] = ()
    if groups is not None and prefix_tokens > 0 and bool((groups >= 0).any()):
        sampled = tuple(int(v) for v in groups[::step])
    return Mix(tuple(int(v) for v in prompts[::step]), tuple(int(v) for v in outputs[::step]),
               ttft_s, tpot_s, cv, sampled, prefix_tokens if sampled else 0,
               probe_requests=probe_requests)
