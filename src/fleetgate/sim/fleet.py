"""A simulated fleet from a fleet config: the gateway's own endpoints and live state, plus one
emulated engine (``SimReplica``) per endpoint.

Endpoints and their ``LiveFleet`` come from ``state.fleet`` (``endpoints_of``,
``live_fleet``), the functions the live gateway builds its fleet with, so the router sees
the same ids, priors, prices and columns. Each endpoint's engine is the emulator's
(``EmulatorConfig.build_sim``) with what its source says: ``emulated://ENGINE/GPU?profile=
&stack=&tp=&speed=``; an ``http://`` endpoint of a vLLM or SGLang pool is simulated as that
engine on the pool's accelerator with the defaults (TP = ``gpus_per_replica``, stock stack).
Pools of other engines (``openai``) or on ``cpu`` have no performance model: an error,
except a hosted API priced per token (``price_per_mtok``), simulated as a fixed latency
distribution up to its cap (``hosted.py``).

A pool with ``autoscale`` gets ``max_replicas`` slots (the configured endpoints first, then
copies of its first source told apart by a ``#slotN`` fragment); the autoscaler decides
which slots exist. The ``#N`` fragment also tells apart the replicas of a planned fleet.

May touch: config, state.fleet, the emulator's config and perf model. Must not touch: I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

import numpy as np
import numpy.typing as npt

from fleetgate.config.schema import AutoscaleConfig, FleetConfig, PoolConfig
from fleetgate.emulator.config import EmulatorConfig
from fleetgate.emulator.perfmodel import EngineSim
from fleetgate.routing import Endpoint
from fleetgate.sim.hosted import HostedReplica
from fleetgate.sim.replica import SimReplica
from fleetgate.state.fleet import endpoints_of, initial_replicas, live_fleet, with_slots
from fleetgate.state.live import LiveFleet

STALE_AFTER_S = 10.0  # the gateway's default (Settings), so staleness behaves the same


class FleetError(ValueError):
    pass


@dataclass(frozen=True)
class SimPool:
    name: str
    slots: tuple[int, ...]  # endpoint indices of this pool
    initial: int  # replicas that exist at t=0 (the first ``initial`` slots)
    autoscale: AutoscaleConfig | None
    usd_per_s: float  # one replica (0 for a hosted API: it is paid per token)
    gpus_per_replica: int
    per_token: bool = False  # a hosted API priced per token


@dataclass
class SimFleet:
    config: FleetConfig
    endpoints: list[Endpoint]
    live: LiveFleet
    replicas: list[SimReplica | HostedReplica]
    pools: list[SimPool]
    pool_of: npt.NDArray[np.int64]  # endpoint index -> pool index


def build_fleet(config: FleetConfig, stale_after_s: float = STALE_AFTER_S) -> SimFleet:
    """A fresh fleet (new live state, idle engines): one per simulated policy."""
    endpoints: list[Endpoint] = []
    replicas: list[SimReplica | HostedReplica] = []
    pools: list[SimPool] = []
    pool_of: list[int] = []
    reports: dict[str, tuple[float, float | None]] = {}
    reported: list[tuple[int, tuple[float, float | None]]] = []
    for p, pool in enumerate(config.pools):
        try:
            eps = endpoints_of(with_slots(pool))
        except ValueError as exc:
            raise FleetError(str(exc)) from None
        factories: dict[str, Callable[[], EngineSim]] = {}
        for k, ep in enumerate(eps if not pool.per_token else ()):
            base = ep.source.split("#", 1)[0]
            if base not in factories:
                engine = emulator_config(pool, base)
                factories[base] = engine.build_sim
                reports[base] = engine_report(engine)
            replicas.append(SimReplica(factories[base], source_speed(base)))
            reported.append((len(endpoints) + k, reports[base]))
        if pool.per_token:
            replicas += [HostedReplica(ep) for ep in eps]
        first = len(endpoints)
        endpoints += eps
        pool_of += [p] * len(eps)
        pools.append(SimPool(pool.name, tuple(range(first, len(endpoints))),
                             initial_replicas(pool),
                             pool.autoscale, eps[0].usd_per_s, pool.gpus_per_replica,
                             pool.per_token))
    live = live_fleet(endpoints, stale_after_s)
    for i, (kv_tokens, max_batch) in reported:  # what the collector reads at first contact
        live.on_capacity(i, kv_tokens, max_batch)
    return SimFleet(config, endpoints, live, replicas, pools, np.array(pool_of, dtype=np.int64))


def engine_report(engine: EmulatorConfig) -> tuple[float, float | None]:
    """What the engine tells the gateway's collector about its capacity at first contact
    (``backends/capacity.py``), as the live gateway applies it: its KV tokens and, SGLang
    only, its batch cap (``max_running_requests``; vLLM does not report ``max_num_seqs``,
    so the prior's 256 stays, which is vLLM's default). Without it the simulated router
    capped an SGLang replica at the prior's 256 where the engine runs 1,024 and predicted
    the rest waiting for whole answers (a planned 5 x MI355X/SGLang fleet: 93.09% within
    the SLO, round_robin 100%; with it 95.26%, BENCHMARKS.md, issue 22)."""
    sim = engine.build_sim()
    batch = float(sim.scheduler.max_num_seqs) if engine.engine == "sglang" else None
    return float(sim.kv_capacity_tokens), batch


def emulator_config(pool: PoolConfig, source: str) -> EmulatorConfig:
    """The emulated engine that stands for ``source`` (see the module docstring)."""
    parts = urlsplit(source)
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    engine = parts.netloc if parts.scheme == "emulated" else pool.engine
    if engine not in ("vllm", "sglang") or pool.accelerator == "cpu":
        raise FleetError(f"pool {pool.name}: a {pool.engine} engine on {pool.accelerator} has "
                         "no performance model to simulate")
    try:
        cfg = EmulatorConfig.model_validate({
            "engine": engine, "gpu": pool.accelerator,
            "served_models": sorted(set(pool.models.values())), "profile": query.get("profile"),
            "stack": query.get("stack", "stock"), "tp": int(query.get("tp", pool.gpus_per_replica)),
            "max_model_len": pool.max_model_len,
            # LoRA: the batch's cap on distinct adapters (vLLM --max-loras) is the pool's
            # max_adapters; the perf model charges each adapter in a step
            "enable_lora": bool(pool.adapters),
            "max_loras": pool.max_adapters if pool.adapters else None})
    except ValueError as exc:
        raise FleetError(f"pool {pool.name}: {exc}") from None
    return cfg


def source_speed(source: str) -> float:
    if not source.startswith("emulated://"):
        return 1.0
    query = parse_qs(urlsplit(source).query)
    return float(query.get("speed", ["1"])[-1])
