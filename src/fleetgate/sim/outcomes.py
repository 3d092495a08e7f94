"""What happened to every simulated request, as columns (one entry per request).

The gateway side of the simulator (``gateway.py``) fills these in as the run goes; the
summary (``summary.py``) reads them. Times are virtual seconds; ``ttft_s`` is when the first
token left the engine (for a non-streamed answer too, so every request is judged on the
same clock), ``tpot_s`` the time per output token after the first, both as the client sees
them (failover included). Money follows ``catalog.pricing``: ``usd`` is what the ledger
charges (every attempt, failed ones included, also tallied in ``failed_usd``).

May touch: numpy. Must not touch: anything else.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

PENDING, OK, BAD_REQUEST, SHED, FAILED, NO_CAPACITY = 0, 200, 400, 429, 502, 503


@dataclass
class Outcomes:
    status: npt.NDArray[np.int16]
    ttft_s: npt.NDArray[np.float64]
    tpot_s: npt.NDArray[np.float64]
    e2e_s: npt.NDArray[np.float64]
    tokens: npt.NDArray[np.int64]
    endpoint: npt.NDArray[np.int64]  # where the final attempt ran (-1: none)
    usd: npt.NDArray[np.float64]
    failed_usd: npt.NDArray[np.float64]
    attempts: npt.NDArray[np.int16]
    replica_seconds: npt.NDArray[np.float64]  # busy replica-seconds charged (all attempts)
    gpu_seconds: npt.NDArray[np.float64]
    provisioned: list[tuple[int, float, float]] = field(default_factory=list)
    # ^ (endpoint, from, to): every interval a replica existed (billed), cold start included

    @classmethod
    def empty(cls, n: int) -> Outcomes:
        nan = np.full(n, np.nan)
        return cls(np.zeros(n, dtype=np.int16), nan.copy(), nan.copy(), nan.copy(),
                   np.zeros(n, dtype=np.int64), np.full(n, -1, dtype=np.int64),
                   np.zeros(n), np.zeros(n), np.zeros(n, dtype=np.int16), np.zeros(n),
                   np.zeros(n))

    def met_slo(self, ttft_limit_s: float, tpot_limit_s: float) -> npt.NDArray[np.bool_]:
        """Requests that finished and met both limits (a one-token answer has no TPOT)."""
        tpot_ok = np.isnan(self.tpot_s) | (self.tpot_s <= tpot_limit_s)
        return (self.status == OK) & (self.ttft_s <= ttft_limit_s) & tpot_ok
