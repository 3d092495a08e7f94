"""What a bench run sends: request lengths and arrival times, always bounded.

Three sources:

* flags: ``--input-tokens`` / ``--output-tokens`` as a length spec (``512``, or
  ``DIST:MEAN[:MAX]`` with DIST one of lognormal, exponential, e.g. ``lognormal:900:8000``,
  or ``uniform:MIN:MAX``: the workload file's distributions, drawn by ``sim.arrivals``);
  arrivals from ``--rate`` (Poisson, or gamma gaps with ``--burstiness``, vLLM's meaning:
  shape = burstiness, 1 = Poisson) or none (closed loop: each of ``--concurrency`` users
  sends its next request when the last one ends);
* a workload file (DESIGN.md §1): its requests and arrival process, drawn by the
  simulator's own ``sim.arrivals.generate`` from ``--seed``, so ``simulate`` and ``bench``
  see the same requests;
* a JSONL request log (``sim.trace.read_trace``): the recorded arrivals and lengths.

A workload's shared prefixes (``prefix:``) are not reproduced: each prompt is its whole
length of fresh text. Bounds: ``--requests N`` (the first N) and/or ``--duration S``
(arrivals before S; a closed loop stops sending at S). One must be given, or the source
must be finite.

May touch: numpy, the simulator's workload, arrival and trace readers. Must not touch: I/O
other than reading those files.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fleetgate.loadgen.client import Planned
from fleetgate.sim.arrivals import RequestSet, draw_lengths, generate
from fleetgate.sim.trace import read_trace
from fleetgate.sim.workload import Lengths, Slo, Workload, load_workload


def parse_lengths(spec: str) -> Lengths:
    """``512`` | ``lognormal:900[:8000]`` | ``exponential:250[:2000]`` | ``uniform:MIN:MAX``."""
    parts = spec.strip().split(":")
    try:
        if len(parts) == 1:
            return Lengths(dist="fixed", value=int(parts[0]))
        dist, nums = parts[0], [float(p) for p in parts[1:]]
        if dist == "uniform" and len(nums) == 2:
            return Lengths(dist="uniform", min=int(nums[0]), max=int(nums[1]))
        if dist in ("lognormal", "exponential") and len(nums) in (1, 2):
            return Lengths(dist=dist, mean=nums[0],  # type: ignore[arg-type]
                           max=int(nums[1]) if len(nums) == 2 else None)
    except ValueError as exc:
        raise ValueError(f"bad length spec {spec!r}: {exc}") from None
    raise ValueError(f"bad length spec {spec!r}: use N, lognormal:MEAN[:MAX], "
                     "exponential:MEAN[:MAX] or uniform:MIN:MAX")


@dataclass
class Plan:
    """The requests of a run, in order; ``closed`` when they carry no arrival times."""

    requests: list[Planned] | None  # None: closed loop drawn on demand until ``duration_s``
    duration_s: float | None
    closed: bool
    input_spec: Lengths | None = None
    output_spec: Lengths | None = None
    seed: int = 0
    slo: Slo | None = None
    model: str | None = None
    source: str = "flags"

    @property
    def total(self) -> int | None:
        return None if self.requests is None else len(self.requests)

    def iterate(self) -> Iterator[Planned]:
        if self.requests is not None:
            yield from self.requests
            return
        assert self.input_spec is not None and self.output_spec is not None
        rng = np.random.default_rng(self.seed)
        i = 0
        while True:
            p, o = _draw(self.input_spec, self.output_spec, 256, rng)
            for a, b in zip(p, o, strict=True):
                yield Planned(i, int(a), int(b))
                i += 1


def _draw(inp: Lengths, out: Lengths, n: int,
          rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    return draw_lengths(inp, n, rng), draw_lengths(out, n, rng)


def from_flags(input_spec: Lengths, output_spec: Lengths, requests: int | None,
               duration_s: float | None, rate: float | None, burstiness: float,
               seed: int) -> Plan:
    _bounded(requests, duration_s)
    rng = np.random.default_rng(seed)
    if rate is None:
        if requests is None:
            return Plan(None, duration_s, True, input_spec, output_spec, seed)
        p, o = _draw(input_spec, output_spec, requests, rng)
        return Plan([Planned(i, int(a), int(b)) for i, (a, b) in enumerate(zip(p, o,
                                                                              strict=True))],
                    duration_s, True, input_spec, output_spec, seed)
    n = requests if requests is not None else int(rate * (duration_s or 0) * 1.5 + 64)
    gaps = rng.gamma(burstiness, 1.0 / (rate * burstiness), n)
    arrivals = np.cumsum(gaps) - gaps[0]  # the first request goes at once
    if duration_s is not None:
        arrivals = arrivals[arrivals < duration_s]
    p, o = _draw(input_spec, output_spec, len(arrivals), rng)
    reqs = [Planned(i, int(a), int(b), float(t))
            for i, (a, b, t) in enumerate(zip(p, o, arrivals, strict=True))]
    return Plan(reqs, duration_s, False, input_spec, output_spec, seed)


def from_workload(path: Path, requests: int | None, duration_s: float | None,
                  seed: int) -> Plan:
    work = load_workload(path)
    trace = work.trace_path()
    if trace is not None:
        rule = work.requests.max_tokens if work.requests else "exact"
        plan = _from_set(read_trace(trace, work.arrivals.speedup, rule).requests, requests,
                         duration_s or work.duration_s, f"workload {path} (trace {trace})")
    else:
        span = duration_s or work.duration_s
        if span is None and requests is None:
            raise ValueError(f"{path}: no duration_s; give --requests or --duration")
        plan = _from_set(generate(work, seed, span or _span_for(work, requests or 0)),
                         requests, span, f"workload {path}")
    plan.slo, plan.seed = work.slo, seed
    plan.model = work.requests.model if work.requests else None
    return plan


def _span_for(work: Workload, requests: int) -> float:
    rate = work.arrivals.rate_per_s or 1.0
    return requests / rate * 1.5 + 10.0


def from_trace(path: Path, requests: int | None, duration_s: float | None,
               speedup: float = 1.0) -> Plan:
    return _from_set(read_trace(path, speedup).requests, requests, duration_s,
                     f"trace {path}")


def _from_set(rs: RequestSet, requests: int | None, duration_s: float | None,
              source: str) -> Plan:
    if duration_s is not None:
        rs = rs.until(duration_s)
    n = len(rs) if requests is None else min(requests, len(rs))
    out = rs.output_tokens[:n]  # sent as max_tokens: the engine makes exactly that many
    reqs = [Planned(i, int(rs.prompt_tokens[i]), int(out[i]), float(rs.arrival_s[i]),
                    rs.models[int(rs.model[i])]) for i in range(n)]
    return Plan(reqs, duration_s, False, source=source)


def _bounded(requests: int | None, duration_s: float | None) -> None:
    if requests is None and duration_s is None:
        raise ValueError("give --requests N or --duration S (a run is always bounded)")
    if requests is not None and requests < 1:
        raise ValueError("--requests must be >= 1")
    if duration_s is not None and duration_s <= 0:
        raise ValueError("--duration must be > 0")
