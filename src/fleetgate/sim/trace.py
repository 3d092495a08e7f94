"""Replay the gateway's own request log: JSONL lines become a ``RequestSet``.

The request log (``gateway/telemetry/logs.py``) writes one line per finished request with
``ts`` (wall time at the *end*), ``e2e_ms``, ``model``, ``tenant``, ``stream``, ``status``,
``input_tokens`` and ``output_tokens``. A request arrived at ``ts - e2e_ms/1000``; arrivals
are made relative to the first one and divided by the workload's ``speedup``.

Kept: ``event == "request"`` lines with status 200 and known, positive token counts (what
the engine really did). Skipped and counted: other lines (logging output mixed into the
same stream, errors, shed requests, embeddings, which have no output tokens). The prompt
the log does not keep is replaced by its token count; a prefix shared between prompts is
not known from the log (no ``prefix_group``). Priorities are not logged: every replayed
request is ``normal`` unless the workload's ``priorities`` say otherwise.

May touch: orjson, numpy, the file system (read). Must not touch: the router or engine model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from fleetgate.sim.arrivals import PRIORITIES, RequestSet, max_tokens_sent


@dataclass(frozen=True)
class TraceRead:
    requests: RequestSet
    lines: int
    skipped: int
    span_s: float  # from the first arrival to the last


def read_trace(path: str | Path, speedup: float = 1.0,
               max_tokens_rule: str | int = "exact") -> TraceRead:
    rows: list[tuple[float, int, int, str, str, bool]] = []
    lines = skipped = 0
    with open(path, "rb") as fh:
        for raw in fh:
            if not raw.strip():
                continue
            lines += 1
            row = _row(raw)
            if row is None:
                skipped += 1
            else:
                rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no replayable request lines ({lines} lines, all skipped)")
    rows.sort(key=lambda r: r[0])
    t0 = rows[0][0]
    models = tuple(sorted({r[3] for r in rows}))
    tenants = tuple(sorted({r[4] for r in rows}))
    n = len(rows)
    out = np.array([r[2] for r in rows], dtype=np.int64)
    sent, out = max_tokens_sent(max_tokens_rule, out)
    requests = RequestSet(
        arrival_s=np.array([(r[0] - t0) / speedup for r in rows], dtype=np.float64),
        prompt_tokens=np.array([r[1] for r in rows], dtype=np.int64),
        output_tokens=out,
        max_tokens=sent,
        prefix_group=np.full(n, -1, dtype=np.int64),
        tenant=np.array([tenants.index(r[4]) for r in rows], dtype=np.int64),
        priority=np.full(n, PRIORITIES.index("normal"), dtype=np.int64),
        stream=np.array([r[5] for r in rows], dtype=bool),
        model=np.array([models.index(r[3]) for r in rows], dtype=np.int64),
        models=models,
        tenants=tenants,
    )
    return TraceRead(requests, lines, skipped, float(requests.arrival_s[-1]))


def _row(raw: bytes) -> tuple[float, int, int, str, str, bool] | None:
    try:
        rec: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(rec, dict) or rec.get("event") != "request" or rec.get("status") != 200:
        return None
    try:
        arrival = float(rec["ts"]) - float(rec.get("e2e_ms") or 0.0) / 1000.0
        prompt, output = int(rec["input_tokens"]), int(rec["output_tokens"])
        model = str(rec["model"])
    except (KeyError, TypeError, ValueError):
        return None
    if prompt < 1 or output < 1:
        return None
    return arrival, prompt, output, model, str(rec.get("tenant") or "default"), \
        bool(rec.get("stream", False))
