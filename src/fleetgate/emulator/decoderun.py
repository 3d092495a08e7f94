"""``DecodeRun``: a run of decode steps of one unchanged batch, in closed form.

``EngineSim.plan_decode_run`` (perfmodel.py) describes the coming steps as one run when the
batch only decodes and nothing can join it; the fleet simulator applies any prefix of it at
once (``EngineSim.run_decode``) instead of stepping one by one.

May touch: the standard library. Must not touch: clocks, I/O.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DecodeRun:
    """``steps`` decode steps of one unchanged batch of ``batch`` sequences (see
    ``EngineSim.plan_decode_run``). Step j (from 0) reads ``batch`` more KV tokens than step
    j-1, so its duration is ``first_s + slope_s·j`` while the step stays on one side of the
    roofline; when the run crosses it, ``ends`` holds the exact cumulative end times."""

    batch: int
    steps: int
    first_s: float
    slope_s: float
    ends: tuple[float, ...] = ()

    def elapsed(self, m: int) -> float:
        """Seconds from the start of the run until its first ``m`` steps have completed."""
        if m <= 0:
            return 0.0
        if self.ends:
            return self.ends[m - 1]
        return m * self.first_s + self.slope_s * (m * (m - 1) / 2)

    def steps_done(self, seconds: float) -> int:
        """How many whole steps have completed ``seconds`` into the run (0..steps)."""
        if seconds <= 0:
            return 0
        if self.ends:
            return bisect_right(self.ends, seconds)
        a, b = self.slope_s / 2, self.first_s - self.slope_s / 2
        m = int(seconds / b) if a <= 0 else int((math.sqrt(b * b + 4 * a * seconds) - b) / (2 * a))
        m = min(max(m, 0), self.steps)
        while m < self.steps and self.elapsed(m + 1) <= seconds:
            m += 1
        while m > 0 and self.elapsed(m) > seconds:
            m -= 1
        return m
