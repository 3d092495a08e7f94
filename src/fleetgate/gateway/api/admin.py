"""Admin routes: live endpoint state, recent decisions, costs, config reload.

- ``GET /admin/endpoints``: every endpoint's health, breaker, queue, in-flight, TTFT/TPOT
  (EWMA and p50/p95), measured tokens/s, the learned prior corrections, and its price as
  $/Mtok (replica $/s over measured tokens/s) and tokens per $; its capacity columns
  (``kv_capacity_tokens``, ``max_batch``, ``max_model_len``: the engine's report once read,
  else the prior's guess), ``reported_capacity`` (what the engine reported, null before) and
  ``prior_profile`` (the catalog profile of the prior; ``unknown-conservative`` for a model
  the catalog does not know); then the same per pool. ``?pool=NAME`` keeps one pool's
  endpoints; ``?offset=K&limit=N`` pages through them in fleet order (``total`` counts the
  matching endpoints, ``next_offset`` is where the next page starts, null after the last):
  a row costs ~30 µs, so the rows are built ``ROWS_PER_TURN`` at a time with the event
  loop's other work (requests, the collector's ticks) in between, and the answer is encoded
  straight to JSON (its model, ``EndpointsReport``, documents it: validating 10,000 rows
  through it held the event loop another 0.2-0.4 s in one piece; BENCHMARKS.md, "Collector
  at scale"). The pool rows always cover every endpoint matched and come from the live
  columns.
- ``GET /admin/decisions?limit=N&candidates=K``: the last N routing decisions, newest
  first, each with every candidate (or its best K) and their per-scorer scores and
  estimates, the rejected endpoints with the reason, the chosen endpoint and the reason.
- ``GET /admin/costs``: what the fleet's traffic cost (this replica's ledger plus the other
  replicas' latest snapshots from the shared store, ``replicas`` lists each one's part),
  per pool, per model, per pool and model, and per tenant: requests, tokens, GPU-hours,
  $ (failed attempts' share apart), $/Mtok and tokens per $ (output tokens, like the
  router), from the cost ledger (``gateway/costs.py`` has the attribution rule). Each pool
  row also carries its current price and measured fleet $/Mtok from the live state for
  comparison.
- ``POST /admin/reload``: re-read the config; a bad file changes nothing and the answer
  lists each error with its YAML path (HTTP 400).

May touch: starlette, the app state. Must not touch: backends.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from typing import Any

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from fleetgate.catalog.pricing import usd_per_mtok, usd_per_second
from fleetgate.config import ConfigError
from fleetgate.gateway.api.openai import json_ok
from fleetgate.gateway.api.schemas import (
    CostsReport,
    DecisionsReport,
    EndpointsReport,
    ErrorEnvelope,
    ReloadResult,
)
from fleetgate.gateway.costs import LedgerSnapshot
from fleetgate.gateway.errors import envelope
from fleetgate.gateway.state import AppState
from fleetgate.gateway.telemetry.routes import telemetry_of
from fleetgate.state.describe import describe
from fleetgate.state.fleet import prior_of

log = logging.getLogger("fleetgate")


def _state(request: Request) -> AppState:
    state: AppState = request.app.state.fleetgate
    return state


ROWS_PER_TURN = 256  # endpoint rows built between two turns of the event loop


async def endpoint_rows(state: AppState, indices: range | list[int]) -> list[dict[str, Any]]:
    fleet = state.generation.fleet  # one generation for every row, across the turns
    now = fleet.clock()
    shard = fleet.collector.shard if fleet.collector else None
    rows = []
    for n, i in enumerate(indices):
        if n and not n % ROWS_PER_TURN:
            await asyncio.sleep(0)  # let requests and the collector's tick run
        ep = fleet.endpoints[i]
        row: dict[str, Any] = {
            "id": ep.id, "pool": ep.pool, "url": ep.url, "source": ep.source,
            "engine": ep.engine, "accelerator": ep.accelerator, "vendor": ep.vendor,
            "runtime": ep.runtime, "gpus_per_replica": ep.gpus_per_replica,
            "price_per_gpu_hour": ep.price_per_gpu_hour, "models": dict(ep.models),
        }
        row.update(describe(fleet.live, i, now))
        reported = fleet.collector.capacity.get(ep.id) if fleet.collector else None
        row["reported_capacity"] = reported.as_dict() if reported is not None else None
        row["scraped_by"] = shard.source[i] if shard is not None else None
        row["prior_profile"] = prior_of(ep).profile or None
        row.update(_unit_costs(ep.price_per_replica_hour, row.get("tokens_per_s")))
        rows.append(row)
    return rows


def _unit_costs(usd_per_hour: float, tokens_per_s: float | None) -> dict[str, float | None]:
    if not tokens_per_s:
        return {"usd_per_mtok": None, "tokens_per_usd": None}
    per_mtok = usd_per_mtok(usd_per_second(usd_per_hour), tokens_per_s)
    assert per_mtok is not None
    return {"usd_per_mtok": round(per_mtok, 6), "tokens_per_usd": round(1e6 / per_mtok, 1)}


def pool_rows(state: AppState, indices: range | list[int]) -> list[dict[str, Any]]:
    """Per pool over the endpoints ``indices``: counts (ready, and routed: ready and not
    parked by the scaler), in-flight, the engines' queues, measured tokens/s, $/hour (an off
    slot bills nothing) and the breakers' states, read from the live columns (cheap at any
    size: the dashboard reads these, not every endpoint's row)."""
    fleet = state.generation.fleet
    live = fleet.live
    in_flight, tokens = live.column("in_flight"), live.column("tokens_per_s")
    queued = live.column("queued")
    pools: dict[str, dict[str, Any]] = defaultdict(lambda: {
        "endpoints": 0, "ready": 0, "routed": 0, "parked": 0, "in_flight": 0.0, "queued": 0.0,
        "tokens_per_s": 0.0, "usd_per_hour": 0.0, "breakers": set()})
    for i in indices:
        ep = fleet.endpoints[i]
        p = pools[ep.pool]
        p.update(accelerator=ep.accelerator, vendor=ep.vendor, engine=ep.engine,
                 gpus_per_replica=ep.gpus_per_replica,
                 price_per_gpu_hour=ep.price_per_gpu_hour)
        ready = live.stats[i].health.state == "ready"
        parked = bool(live.parked[i])
        p["endpoints"] += 1
        p["ready"] += ready
        p["routed"] += ready and not parked
        p["parked"] += parked
        p["in_flight"] += float(in_flight[i]) if in_flight[i] == in_flight[i] else 0.0
        p["queued"] += float(queued[i]) if queued[i] == queued[i] else 0.0
        p["tokens_per_s"] += float(tokens[i]) if tokens[i] == tokens[i] else 0.0
        p["breakers"].add(live.stats[i].breaker.state)
        if not parked or ready:
            p["usd_per_hour"] += ep.price_per_gpu_hour * ep.gpus_per_replica
    out = []
    for name, p in pools.items():
        p.update(_unit_costs(p["usd_per_hour"], p["tokens_per_s"] or None))
        out.append({"pool": name, **p, "breakers": sorted(p["breakers"])})
    return out


def first_per_pool(state: AppState, indices: range | list[int], count: int) -> list[int]:
    """The first ``count`` of each pool's endpoints among ``indices``, in fleet order."""
    seen: dict[str, int] = defaultdict(int)
    out = []
    for i in indices:
        pool = state.generation.fleet.endpoints[i].pool
        if seen[pool] < count:
            seen[pool] += 1
            out.append(i)
    return out


router = APIRouter(prefix="/admin", tags=["admin"], responses={
    401: {"model": ErrorEnvelope, "description": "no or bad admin key (when auth is on)"}})


@router.get("/endpoints", response_model=EndpointsReport)
async def endpoints(
        request: Request,
        pool: str | None = Query(None, description="only this pool's endpoints"),
        offset: int = Query(0, ge=0, description="the first matching endpoint to list"),
        limit: int | None = Query(None, ge=1, description="at most this many endpoint rows "
                                  "(default: all; at thousands of endpoints, page)"),
        per_pool: int | None = Query(None, ge=0, description="list only the first N "
                                     "endpoints of each pool (the pools' rows still count "
                                     "them all): what the dashboard reads"),
) -> Response:
    """Live state of the endpoints (all, one pool's, or a page of them) and their pools."""
    state = _state(request)
    fleet = state.generation.fleet
    pooled: range | list[int] = range(len(fleet.endpoints))
    if pool is not None:
        pooled = [i for i, ep in enumerate(fleet.endpoints) if ep.pool == pool]
    matched = pooled if per_pool is None else first_per_pool(state, pooled, per_pool)
    end = len(matched) if limit is None else min(offset + limit, len(matched))
    sync = state.sync
    return json_ok({"endpoints": await endpoint_rows(state, matched[offset:end]),
                    "total": len(matched), "next_offset": end if end < len(matched) else None,
                    "pools": pool_rows(state, pooled),
                    "store_degraded": bool(state.stores and state.stores.degraded)
                    or bool(sync and sync.failures),
                    "replica": sync.replica_id if sync else None,
                    "peers": sync.peers_seen if sync else 0,
                    "registered": sorted(state.registrations),
                    "collector": collector_row(state)})


def collector_row(state: AppState) -> dict[str, Any] | None:
    """This replica's share of the scraping (``state/shard.py``)."""
    collector = state.generation.fleet.collector
    if collector is None:
        return None
    shard = collector.shard
    return {"ticks": collector.ticks, "visits": collector.visits,
            "replicas": len(shard.members) if shard else 1,
            "owned": int(shard.mine.sum()) if shard else len(state.generation.fleet.endpoints),
            "backing_up": int(shard.backup.sum()) if shard else 0,
            "takeovers": shard.takeovers if shard else 0}


@router.get("/decisions", response_model=DecisionsReport)
async def decisions(request: Request, limit: int = Query(20, ge=1, le=1000),
                    candidates: int | None = Query(None, ge=1, le=100_000)) -> dict[str, Any]:
    """The last ``limit`` routing decisions, each with its best ``candidates`` (all if
    omitted), their per-scorer scores and estimates."""
    return {"decisions": _state(request).proxy.decisions.latest(limit, candidates)}


@router.get("/costs", response_model=CostsReport)
async def costs(request: Request) -> dict[str, Any]:
    """What the fleet's traffic cost: this replica's ledger plus every other replica's latest
    snapshot, per pool, model, pool and model, tenant and replica."""
    state = _state(request)
    own = state.sync.replica_id if state.sync else None
    peers: dict[str, LedgerSnapshot] = {}
    if state.stores is not None:
        for rid, blob in (await state.stores.shared.blobs("costs")).items():
            if rid == own:
                continue
            try:
                peers[rid] = LedgerSnapshot.decode(blob)
            except ValueError:
                log.debug("skipping a malformed cost snapshot of replica %r", rid)
    report = telemetry_of(request).ledger.report(own, peers)
    state = _state(request)
    live = {p["pool"]: p for p in pool_rows(state, range(len(state.generation.fleet.endpoints)))}
    for row in report["pools"]:
        now = live.get(row["pool"])
        if now is not None:
            row["live"] = {"endpoints": now["endpoints"], "usd_per_hour": now["usd_per_hour"],
                           "usd_per_mtok": now["usd_per_mtok"],
                           "tokens_per_usd": now["tokens_per_usd"]}
    return report


@router.get("/shadow")
async def shadow(request: Request) -> dict[str, Any]:
    """Per shadow candidate and serving pool: the candidate's figures on the mirrored
    requests beside the serving pool's on the same requests."""
    mirror = _state(request).shadow
    return mirror.report() if mirror is not None else {"candidates": []}


@router.get("/scaling")
async def scaling(request: Request) -> dict[str, Any]:
    """Per autoscaled pool: desired and current replicas (ready, starting, draining), its
    floor and ceiling, why, whether the gateway starts its replicas itself (``actuated``:
    an ``emulated://`` pool) or publishes the desire for KEDA or an HPA, and the hourly bill
    now and at the desired count."""
    scaler = _state(request).scaler
    return scaler.report() if scaler is not None else {"pools": {}}


@router.post("/reload", response_model=ReloadResult,
             responses={400: {"model": ErrorEnvelope}, 503: {"model": ErrorEnvelope}})
async def reload(request: Request) -> Any:
    """Re-read the config file; a bad file changes nothing and the answer lists each error
    with its YAML path."""
    state = _state(request)
    try:
        config = await state.reload()
    except ConfigError as exc:
        body = envelope(400, f"config rejected, still serving the previous one: {exc.source}",
                        type_="invalid_config", code="invalid_config")
        body["error"]["errors"] = exc.errors
        return json_ok(body, status=400)
    except RuntimeError as exc:  # e.g. an emulated engine failed to start
        body = envelope(503, f"reload failed, still serving the previous config: {exc}")
        return json_ok(body, status=503)
    return {"status": "reloaded", "pools": [p.name for p in config.pools],
            "policies": list(config.policies), "models": config.public_models()}
