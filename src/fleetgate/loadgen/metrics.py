"""From request records to the ``bench --json`` object (DESIGN.md §1), overall and per pool.

Per request (``vllm bench serve``'s ``calculate_metrics``): TTFT and e2e as ``client.py``
measures them; TPOT = (e2e - TTFT) / (output tokens - 1), only for requests with more than
one output token; ITL pooled over every gap of every request. Percentiles are numpy's
linear interpolation (vLLM's ``np.percentile``). Throughputs are over the whole run's
duration (first send to last completion), per pool too, so the pools' figures add up.
Failed requests count in ``errors`` (by kind) and in none of the latencies.

Goodput at an SLO (vLLM's rule): a completed request is good when TTFT <= ``ttft_ms`` and
TPOT <= ``tpot_ms`` (a one-token answer's TPOT is 0); ``goodput`` is good requests per
second and ``slo_attainment`` good requests over all sent (failures included), the
simulator's ``slo_attainment``. Without streaming nothing is judged (no TTFT).

May touch: numpy. Must not touch: I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

import numpy as np

from fleetgate.loadgen.client import Record

QUANTILES = (("p50", 50.0), ("p90", 90.0), ("p99", 99.0))
NO_POOL = "(no pool header)"


def stats_ms(values_s: Iterable[float]) -> dict[str, float | None]:
    arr = np.asarray(list(values_s), dtype=float) * 1000.0
    if arr.size == 0:
        return {"mean": None, **{k: None for k, _ in QUANTILES}}
    out: dict[str, float | None] = {"mean": _r(float(arr.mean()))}
    for key, q in QUANTILES:
        out[key] = _r(float(np.percentile(arr, q)))
    return out


def _r(x: float) -> float:
    return round(x, 3)


def tpot_s(rec: Record) -> float | None:
    if not rec.ok or rec.ttft is None or rec.output_tokens <= 1:
        return None
    return (rec.latency - rec.ttft) / (rec.output_tokens - 1)


def is_good(rec: Record, slo: tuple[float, float] | None) -> bool | None:
    """Within the SLO (vLLM's goodput rule); None when there is no SLO or no TTFT."""
    if slo is None or (rec.ok and rec.ttft is None):
        return None
    if not rec.ok or rec.ttft is None:
        return False
    return rec.ttft * 1000 <= slo[0] and (tpot_s(rec) or 0.0) * 1000 <= slo[1]


def summarize(records: list[Record], duration_s: float,
              slo: tuple[float, float] | None = None) -> dict[str, Any]:
    ok = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    tpots = [t for r in ok if (t := tpot_s(r)) is not None]
    row: dict[str, Any] = {
        "requests": len(ok),
        "errors": len(failed),
        "errors_by_kind": dict(sorted(Counter(r.error_kind or "?" for r in failed).items())),
        "ttft_ms": stats_ms(r.ttft for r in ok if r.ttft is not None),
        "tpot_ms": stats_ms(tpots),
        "itl_ms": stats_ms(g for r in ok for g in r.itl),
        "e2e_ms": stats_ms(r.latency for r in ok),
        "input_tokens": in_tokens,
        "output_tokens": out_tokens,
        "request_throughput": _r(len(ok) / duration_s),
        "output_throughput": _r(out_tokens / duration_s),
        "total_token_throughput": _r((in_tokens + out_tokens) / duration_s),
    }
    judged = [g for r in records if (g := is_good(r, slo)) is not None]
    if slo is not None and judged:
        good = sum(judged)
        row["goodput"] = _r(good / duration_s)
        row["slo_attainment"] = round(good / len(judged), 4)
    return row


def by_pool(records: list[Record]) -> dict[str, list[Record]]:
    pools: dict[str, list[Record]] = {}
    for r in records:
        pools.setdefault(r.pool or NO_POOL, []).append(r)
    return dict(sorted(pools.items()))


def per_request(records: list[Record], slo: tuple[float, float] | None) -> dict[str, list[Any]]:
    """Columns of every request (for plots and ``--compare``), in send order."""
    def ms(x: float | None) -> float | None:
        return None if x is None else _r(x * 1000)

    return {
        "start_s": [round(r.start, 4) for r in records],
        "pool": [r.pool for r in records],
        "ok": [r.ok for r in records],
        "error_kind": [r.error_kind for r in records],
        "ttft_ms": [ms(r.ttft) if r.ok else None for r in records],
        "tpot_ms": [ms(tpot_s(r)) for r in records],
        "e2e_ms": [ms(r.latency) if r.ok else None for r in records],
        "input_tokens": [r.prompt_tokens for r in records],
        "output_tokens": [r.output_tokens if r.ok else 0 for r in records],
        "good": [is_good(r, slo) for r in records],
    }


def report(records: list[Record], duration_s: float, slo: tuple[float, float] | None,
           pool_header_seen: bool | None = None) -> dict[str, Any]:
    """``{"overall": {...}, "pools": {POOL: {...}}}``; pools only when the target names them."""
    pools = by_pool(records)
    named = [p for p in pools if p != NO_POOL]
    seen = bool(named) if pool_header_seen is None else pool_header_seen
    return {
        "overall": summarize(records, duration_s, slo),
        "pools": {p: summarize(rs, duration_s, slo) for p, rs in pools.items()} if seen else {},
    }
