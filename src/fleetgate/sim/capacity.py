"""What one replica sustains within the SLO, on the workload's own request mix.

``replica_capacity`` drives one ``SimReplica`` (the emulator's engine model, no router)
with the workload's lengths arriving at a rate ``λ`` (Poisson unless the mix says otherwise:
gamma gaps with its ``cv``), and searches for the largest ``λ`` at which at least ``target`` of the
requests meet both SLO limits (the first ``WARMUP_SHARE`` of arrivals are not judged: the
replica starts empty). Doubling, then bisection to ``REL_TOL``. The result feeds the lower
bound (tokens/s per replica at the SLO), the planner (requests/s per replica) and the
autoscaler (the concurrency a replica holds at that rate, by Little's law).

Results are memoised in-process per (engine config, workload mix, SLO, target).

May touch: numpy, the replica driver, the emulator's perf model. Must not touch: routing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fleetgate.emulator.config import EmulatorConfig
from fleetgate.emulator.perfmodel import EngineSim
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
    cv: float = 1.0  # of the inter-arrival gaps (1: Poisson)

    @property
    def mean_output(self) -> float:
        return float(np.mean(self.output_tokens))


@dataclass(frozen=True)
class Capacity:
    rate_per_s: float  # requests/s one replica sustains with >= target within the SLO
    tokens_per_s: float  # output tokens/s at that rate
    concurrency: float  # mean requests inside the replica at that rate
    attainment: float


@dataclass(frozen=True)
class Probe:
    attainment: float
    mean_e2e_s: float


def drive(replica: SimReplica, arrivals: npt.NDArray[np.float64], prompts: list[int],
          outputs: list[int]) -> tuple[npt.NDArray[np.float64], ...]:
    """Run requests straight into one replica; returns (ttft, tpot, e2e) per request."""
    n = len(prompts)
    first = np.full(n, np.nan)
    done = np.full(n, np.nan)
    times = arrivals.tolist()
    k = 0
    while True:
        t_engine = replica.next_time
        if k < n and (t_engine is None or times[k] < t_engine):
            replica.add(str(k), prompts[k], outputs[k], times[k])
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
          n: int = PROBE_REQUESTS, speed: float = 1.0) -> Probe:
    rng = np.random.default_rng(seed)
    shape = 1.0 / mix.cv**2
    gaps = rng.gamma(shape, 1.0 / (rate * shape), n)
    arrivals = np.cumsum(gaps)
    pick = rng.integers(0, len(mix.prompt_tokens), n)
    prompts = [mix.prompt_tokens[j] for j in pick]
    outputs = [mix.output_tokens[j] for j in pick]
    ttft, tpot, e2e = drive(SimReplica(factory, speed), arrivals, prompts, outputs)
    judged = slice(int(n * WARMUP_SHARE), n)
    ok = (ttft[judged] <= mix.ttft_s) & (np.isnan(tpot[judged]) | (tpot[judged] <= mix.tpot_s))
    return Probe(float(np.mean(ok)), float(np.mean(e2e[judged])))


_MEMO: dict[tuple[object, ...], Capacity] = {}


def replica_capacity(engine: EmulatorConfig, mix: Mix, seed: int = 0, target: float = TARGET,
                     speed: float = 1.0) -> Capacity:
    """The largest rate (requests/s) one replica sustains with >= ``target`` in the SLO."""
    memo_key = (engine.model_dump_json(), speed, mix, seed, target)
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
    cap = Capacity(lo, lo * mix.mean_output, lo * lo_probe.mean_e2e_s, lo_probe.attainment)
    _MEMO[memo_key] = cap
    return cap


def sample_mix(prompts: npt.NDArray[np.int64], outputs: npt.NDArray[np.int64], ttft_s: float,
               tpot_s: float, cv: float = 1.0, size: int = 4000) -> Mix:
    """A fixed-size, evenly strided sample of the workload's request shapes."""
    step = max(1, math.ceil(len(prompts) / size))
    return Mix(tuple(int(v) for v in prompts[::step]), tuple(int(v) for v in outputs[::step]),
               ttft_s, tpot_s, cv)
