"""$/Mtok per pool from a fleetgate's own cost accounting (``GET /admin/costs``).

The ledger is cumulative since the gateway started, so the bench reads it just before and
just after the measured run and takes the difference per pool: $ charged and output tokens
made in between, $/Mtok = Δ$ / Δoutput tokens x 1e6 (the ledger's rule: busy GPU-time
charged per request; ``docs/observability.md``). Traffic from other clients in that window
is counted too, so bench a gateway nobody else is using when the figure matters. A target
that is not a fleetgate (404), or one whose admin routes need a key the bench was not given
(401/403), has no figure: ``usd_per_mtok`` is left out and the report says why.

``pool_facts`` reads ``GET /admin/endpoints`` for what a sweep records about each pool
(accelerator, engine, GPUs per replica, replicas), which ``plan --capacities`` matches.

May touch: httpx. Must not touch: the run (called before and after it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx


@dataclass(frozen=True)
class Ledger:
    pools: dict[str, tuple[float, int]]  # pool -> (usd, output tokens), cumulative
    error: str | None = None


def _get(url: str, admin_key: str | None) -> tuple[Any, str | None]:
    headers = {"authorization": f"Bearer {admin_key}"} if admin_key else {}
    try:
        resp = httpx.get(url, headers=headers, timeout=10.0)
    except httpx.HTTPError as exc:
        return None, f"{url}: {exc}"
    if resp.status_code != 200:
        return None, f"{url}: HTTP {resp.status_code}" + (
            " (pass --admin-key or $FLEETGATE_ADMIN_KEY)" if resp.status_code in (401, 403)
            else " (not a fleetgate?)")
    try:
        return resp.json(), None
    except ValueError:
        return None, f"{url}: not JSON"


def read_ledger(base: str, admin_key: str | None) -> Ledger:
    body, error = _get(base + "/admin/costs", admin_key)
    if body is None or not isinstance(body.get("pools"), list):
        return Ledger({}, error or "no pools in /admin/costs")
    return Ledger({str(p["pool"]): (float(p.get("usd") or 0.0), int(p.get("output_tokens") or 0))
                   for p in body["pools"]})


def cost_delta(before: Ledger, after: Ledger) -> dict[str, dict[str, float | None]]:
    """Per pool and ``"overall"``: the $ and output tokens charged between the two reads."""
    if before.error or after.error:
        return {}
    out: dict[str, dict[str, float | None]] = {}
    total_usd, total_tok = 0.0, 0
    for pool, (usd, tok) in after.pools.items():
        usd0, tok0 = before.pools.get(pool, (0.0, 0))
        d_usd, d_tok = usd - usd0, tok - tok0
        if d_tok <= 0 and d_usd <= 0:
            continue
        total_usd, total_tok = total_usd + d_usd, total_tok + d_tok
        out[pool] = {"usd": round(d_usd, 9),
                     "usd_per_mtok": round(d_usd / d_tok * 1e6, 6) if d_tok > 0 else None}
    out["overall"] = {"usd": round(total_usd, 9),
                      "usd_per_mtok": round(total_usd / total_tok * 1e6, 6) if total_tok else None}
    return out


def pool_facts(base: str, admin_key: str | None) -> dict[str, dict[str, Any]]:
    """Per pool: accelerator, engine, GPUs per replica, $/GPU-hour and replicas, from the
    pool rows (``?per_pool=0``: no endpoint row, cheap at thousands of endpoints); from the
    endpoint rows when the gateway is older than those pool fields (it ignores the query
    and lists every endpoint)."""
    body, _ = _get(base + "/admin/endpoints?per_pool=0", admin_key)
    if not isinstance(body, dict):
        return {}
    facts: dict[str, dict[str, Any]] = {}
    pools = body.get("pools") or []
    if pools and all("price_per_gpu_hour" in p for p in pools):
        return {str(p["pool"]): {"accelerator": p.get("accelerator"), "engine": p.get("engine"),
                                 "gpus_per_replica": p.get("gpus_per_replica"),
                                 "price_per_gpu_hour": p.get("price_per_gpu_hour"),
                                 "replicas": p.get("endpoints")} for p in pools}
    for ep in body.get("endpoints") or []:
        f = facts.setdefault(str(ep["pool"]), {
            "accelerator": ep.get("accelerator"), "engine": ep.get("engine"),
            "gpus_per_replica": ep.get("gpus_per_replica"),
            "price_per_gpu_hour": ep.get("price_per_gpu_hour"), "replicas": 0})
        f["replicas"] += 1
    return facts
