"""One endpoint as ``GET /admin/endpoints`` shows it: every live and static column of
``LiveFleet`` (NaN and infinities as null), its health, breaker and counters, and
percentiles of its recent TTFT and TPOT. Presentation only: nothing here is routed on.

May touch: LiveFleet (read only). Must not touch: I/O, clocks (``now`` is passed in).
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from fleetgate.routing.types import LIVE_COLUMNS, STATIC_COLUMNS, finite_or_none
from fleetgate.state.live import LiveFleet

# rows an operator reads better elsewhere (health, breaker) or that are bookkeeping
NOT_DESCRIBED = ("health", "block_until", "last_contact", "usable_from", "stale_at",
                 "prefill_at")


def describe(live: LiveFleet, i: int, now: float) -> dict[str, Any]:
    """Everything known about endpoint ``i``."""
    st = live.stats[i]
    row: dict[str, Any] = {name: _num(live.value(i, name)) for name in LIVE_COLUMNS
                           if name not in NOT_DESCRIBED}
    row.update({name: _num(live.static_value(i, name)) for name in STATIC_COLUMNS})
    row.update({
        "health": st.health.state, "health_detail": st.health.detail,
        "parked": bool(live.parked[i]),
        "breaker": st.breaker.state, "consecutive_failures": st.breaker.consecutive_failures,
        "scrape_age_s": _num(now - st.last_scrape_at), "requests": st.requests,
        "failures": st.failures, "output_tokens": st.output_tokens, "e2e_s": _num(st.e2e_s),
        "ttft_p50_s": _pct(st.ttft_window, 50), "ttft_p95_s": _pct(st.ttft_window, 95),
        "tpot_p50_s": _pct(st.tpot_window, 50), "tpot_p95_s": _pct(st.tpot_window, 95),
    })
    return row


def _num(value: float) -> float | None:
    return finite_or_none(float(value))


def _pct(window: deque[float], q: float) -> float | None:
    return _num(float(np.percentile(window, q))) if window else None
