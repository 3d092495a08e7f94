"""The requests of a simulated run: arrival times, lengths, prefixes, tenants, priorities.

``generate(workload, seed, duration_s)`` draws a ``RequestSet`` (columnar numpy arrays,
sorted by arrival) from the workload's process; ``trace.read_trace`` builds the same from a
request log. One seed gives the same requests for every policy, so policies are compared on
identical traffic.

Arrival processes (mean rate ``r``):
- ``poisson``: exponential gaps, mean 1/r;
- ``bursty``: gamma gaps with mean 1/r and coefficient of variation ``cv`` (shape 1/cv²;
  cv = 1 is Poisson, cv = 2 clumps requests into bursts with long quiet spells);
- ``diurnal``: a Poisson process whose rate is ``r·(1 + amplitude·sin(2π(t + phase)/period))``,
  drawn by thinning a rate-``r·(1+amplitude)`` process.

Each random quantity has its own stream spawned from the seed (``SeedSequence.spawn``), so
changing e.g. the tenants does not reshuffle the arrival times.

May touch: numpy, the workload model. Must not touch: the router, the engine model, I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from fleetgate.sim.workload import Lengths, Workload

PRIORITIES = ("high", "normal", "low")
DEFAULT_TENANT = "default"
DEFAULT_DURATION_S = 600.0
FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class RequestSet:
    """Requests in arrival order; every array has one entry per request."""

    arrival_s: FloatArray
    prompt_tokens: IntArray  # what the engine prefills: shared prefix + the request's own
    output_tokens: IntArray  # what the engine generates
    max_tokens: IntArray  # what the client sends as max_tokens (0: none)
    prefix_group: IntArray  # -1: no shared prefix
    tenant: IntArray  # index into ``tenants``
    priority: IntArray  # index into PRIORITIES
    stream: BoolArray
    model: IntArray  # index into ``models``
    models: tuple[str, ...]
    tenants: tuple[str, ...]
    prefix_tokens: int = 0  # the shared prefix of a ``prefix_group`` (sim/prefixes.py)

    def __len__(self) -> int:
        return len(self.arrival_s)

    def until(self, duration_s: float) -> RequestSet:
        """The requests that arrive before ``duration_s``."""
        n = int(np.searchsorted(self.arrival_s, duration_s, side="left"))
        return self.take(slice(0, n))

    def take(self, which: slice | IntArray) -> RequestSet:
        cols = {name: getattr(self, name)[which] for name in _COLUMNS}
        return RequestSet(**cols, models=self.models, tenants=self.tenants,
                          prefix_tokens=self.prefix_tokens)


_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens", "max_tokens", "prefix_group",
            "tenant", "priority", "stream", "model")


def generate(workload: Workload, seed: int, duration_s: float | None = None) -> RequestSet:
    """Draw the workload's requests over ``duration_s`` (default: the workload's)."""
    duration = duration_s or workload.duration_s or DEFAULT_DURATION_S
    streams = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(7)]
    arrivals = arrival_times(workload, duration, streams[0])
    n = len(arrivals)
    req = workload.requests
    if req is None:
        raise ValueError("the workload has no 'requests' section to draw from")
    own = draw_lengths(req.input_tokens, n, streams[1])
    out = draw_lengths(req.output_tokens, n, streams[2])
    group = np.full(n, -1, dtype=np.int64)
    prompt = own
    if req.prefix is not None:
        group = streams[3].integers(0, req.prefix.groups, n).astype(np.int64)
        prompt = own + req.prefix.tokens
    tenant, priority, tenants = _tenants(workload, n, streams[4], streams[5])
    sent, out = max_tokens_sent(req.max_tokens, out)
    model = np.zeros(n, dtype=np.int64)
    if req.adapters:  # a share of the requests names a LoRA adapter as its model
        shares = np.array([a.share for a in req.adapters], dtype=float)
        p = np.concatenate([[max(0.0, 1.0 - shares.sum())], shares])
        model = streams[6].choice(len(p), size=n, p=p / p.sum()).astype(np.int64)
    return RequestSet(arrivals, prompt, out, sent, group, tenant, priority,
                      np.full(n, req.stream, dtype=bool), model,
                      (req.model, *(a.name for a in req.adapters)), tenants,
                      req.prefix.tokens if req.prefix else 0)


def max_tokens_sent(rule: str | int, out: IntArray) -> tuple[IntArray, IntArray]:
    """What clients send as max_tokens (0: none) and the output lengths capped by it."""
    if rule == "exact":
        return out.copy(), out
    if rule == "none":
        return np.zeros(len(out), dtype=np.int64), out
    cap = np.full(len(out), int(rule), dtype=np.int64)
    return cap, np.minimum(out, cap)


def arrival_times(workload: Workload, duration_s: float, rng: np.random.Generator) -> FloatArray:
    arr = workload.arrivals
    rate = float(arr.rate_per_s or 0.0)
    if arr.process == "poisson":
        return _renewal(lambda k: rng.exponential(1.0 / rate, k), rate, duration_s)
    if arr.process == "bursty":
        shape = 1.0 / arr.cv**2
        return _renewal(lambda k: rng.gamma(shape, 1.0 / (rate * shape), k), rate, duration_s)
    peak = rate * (1.0 + arr.amplitude)
    times = _renewal(lambda k: rng.exponential(1.0 / peak, k), peak, duration_s)
    wave = 1.0 + arr.amplitude * np.sin(2 * math.pi * (times + arr.phase_s) / arr.period_s)
    keep = rng.random(len(times)) * (1.0 + arr.amplitude) < wave
    return times[keep]


def _renewal(draw: Callable[[int], FloatArray], rate: float, duration_s: float) -> FloatArray:
    """Cumulative sums of drawn gaps until ``duration_s`` (drawn in chunks, no loop per gap)."""
    chunks: list[FloatArray] = []
    t = 0.0
    while t < duration_s:
        k = max(64, int(rate * (duration_s - t) * 1.1) + 64)
        times = t + np.cumsum(draw(k))
        chunks.append(times)
        t = float(times[-1])
    times = np.concatenate(chunks) if chunks else np.zeros(0)
    return times[times < duration_s]


def draw_lengths(spec: Lengths, n: int, rng: np.random.Generator) -> IntArray:
    """``n`` token counts from ``spec``, rounded and clipped to [min, max]."""
    if spec.dist == "fixed":
        values = np.full(n, float(spec.value or spec.mean or 1))
    elif spec.dist == "uniform":
        values = rng.uniform(spec.min, float(spec.max or spec.min) + 1.0, n)
        values = np.floor(values)
    elif spec.dist == "exponential":
        values = rng.exponential(float(spec.mean or 1.0), n)
    else:
        sigma2 = math.log(1.0 + spec.cv**2)
        mu = math.log(float(spec.mean or 1.0)) - sigma2 / 2
        values = rng.lognormal(mu, math.sqrt(sigma2), n)
    high = spec.max if spec.max is not None else np.iinfo(np.int64).max
    return np.clip(np.rint(values), spec.min, high).astype(np.int64)


def _tenants(workload: Workload, n: int, pick: np.random.Generator,
             prio: np.random.Generator) -> tuple[IntArray, IntArray, tuple[str, ...]]:
    tenants = workload.tenants
    names = tuple(t.name for t in tenants) or (DEFAULT_TENANT,)
    if tenants:
        shares = np.array([t.share for t in tenants], dtype=float)
        tenant = pick.choice(len(tenants), size=n, p=shares / shares.sum()).astype(np.int64)
    else:
        tenant = np.zeros(n, dtype=np.int64)
    normal = PRIORITIES.index("normal")
    drawn = np.full(n, normal, dtype=np.int64)
    if workload.priorities:
        keys = list(workload.priorities)
        weights = np.array([workload.priorities[k] for k in keys], dtype=float)
        codes = np.array([PRIORITIES.index(k) for k in keys], dtype=np.int64)
        drawn = codes[prio.choice(len(keys), size=n, p=weights / weights.sum())]
    fixed = np.array([PRIORITIES.index(t.priority) if t.priority else -1 for t in tenants]
                     or [-1], dtype=np.int64)
    own = fixed[tenant]
    return tenant, np.where(own >= 0, own, drawn), names
