"""Which endpoint holds which LoRA adapter, and loading them: once, where routing chose.

``AdapterTable`` (synchronous, shared by the gateway and the simulator) keeps, per endpoint,
the adapters it holds with when each was last used, and the loads under way; ``view()`` is
the immutable ``routing.AdapterView`` a snapshot carries (rebuilt only after a change). It
starts from the config (each pool's ``preload`` adapters on every endpoint) and follows
what the engines say (``observe``: the adapters their ``/v1/models`` lists).

``AdapterLoader`` (the gateway's) makes an adapter ready on an endpoint before a request is
sent there: ``ready(i, name)`` is None when it is loaded (the request goes at once), else
the one load of that adapter on that endpoint (single-flight: every request that routed
there while it loads awaits the same task, so 20 concurrent requests for an unloaded
adapter load it once). The load is marked in the table synchronously, before ``ready``
returns: a request routed a moment later sees the endpoint as holding the adapter and goes
there too, instead of loading it somewhere else. At the endpoint's ``max_adapters`` the
least recently used adapter it holds is unloaded first (never one being loaded, nor one
without a path, which could not be loaded again), so the gateway never asks an engine to
hold more. A failed load unmarks the endpoint; the request
tries its next candidate, and that endpoint is not asked to load that adapter again for
``LOAD_RETRY_S`` (routing sees it as unable to: a bad path makes one load call per endpoint
and pause, not one per request). ``poll()`` reads every adapter endpoint's ``/v1/models`` (the
fleet runs it every ``ADAPTER_POLL_S``). ``discover_adapters`` (a pool's
``discover_adapters: true``) adds the adapters the engines list but the pool does not declare
as models of the pool, when the fleet starts (and at each reload: one loaded by hand later
is routed after the next ``POST /admin/reload``).

Under ``serve --workers N`` each worker keeps its own table: two workers may each load the
same adapter on the same endpoint, which the engine answers as already loaded (no harm), or
on different endpoints (the adapter ends up on both); the poll brings each worker's table
back to what the engines hold.

May touch: asyncio, the control plane's HTTP client (through backends/adapters.py), routing
types. Must not touch: HTTP routes, the router.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from fleetgate.backends.adapters import (
    AdapterError,
    list_adapters,
    load_adapter,
    served_adapter_name,
    unload_adapter,
)
from fleetgate.backends.http1 import Http1Backend
from fleetgate.routing.types import Adapter, AdapterView, Endpoint

log = logging.getLogger("fleetgate.adapters")

ADAPTER_POLL_S = 5.0
LOAD_TIMEOUT_S = 120.0  # a real engine reads the weights from disk (or a hub) first
CONTROL_TIMEOUT_S = 5.0
LOAD_RETRY_S = 30.0  # after a failed load, the endpoint is not asked to load it again for this


class AdapterTable:
    def __init__(self, endpoints: Sequence[Endpoint]) -> None:
        self.endpoints = tuple(endpoints)
        self.names = sorted({a for ep in self.endpoints for a in ep.adapters})
        self._held: list[dict[str, float]] = [{} for _ in self.endpoints]  # name -> last use
        self._loading: set[tuple[int, str]] = set()
        for i, ep in enumerate(self.endpoints):
            for adapter in ep.adapters.values():
                if adapter.preload:
                    self._held[i][adapter.name] = 0.0
        self._loadable = {name: np.array([ep.load_adapters and name in ep.adapters
                                          and ep.adapters[name].path is not None
                                          for ep in self.endpoints], dtype=bool)
                          for name in self.names}
        self._limit = np.array([ep.max_adapters for ep in self.endpoints], dtype=np.intp)
        self._view: AdapterView | None = None
        self._view_until = np.inf  # when a failed load's pause ends: the view is rebuilt
        # (endpoint, adapter) -> until when it is not loaded there again after a failed load
        # (needs ``clock``: the gateway's loader sets it; the simulator's loads do not fail)
        self._failed: dict[tuple[int, str], float] = {}
        self.clock: Callable[[], float] | None = None
        self._version = [0] * len(self.endpoints)  # bumped by every change of ours
        self.loads: Counter[tuple[str, str]] = Counter()  # (endpoint id, adapter) -> loads
        self.unloads: Counter[tuple[str, str]] = Counter()

    @property
    def enabled(self) -> bool:
        return bool(self.names)

    def view(self) -> AdapterView | None:
        if not self.names:
            return None
        if self._view is not None and self.clock is not None and \
                self.clock() >= self._view_until:
            self._view = None
        if self._view is None:
            n = len(self.endpoints)
            loaded = {name: np.zeros(n, dtype=bool) for name in self.names}
            count = np.zeros(n, dtype=np.intp)
            for i, held in enumerate(self._held):
                names = set(held) | {a for j, a in self._loading if j == i}
                count[i] = len(names)
                for name in names:
                    if name in loaded:
                        loaded[name][i] = True
            for mask in loaded.values():
                mask.setflags(write=False)
            count.setflags(write=False)
            self._view = AdapterView(loaded, self._paused_loadable(), count, self._limit)
        return self._view

    def _paused_loadable(self) -> dict[str, Any]:
        """The static ``loadable`` masks less the (endpoint, adapter) pairs whose last load
        failed less than ``LOAD_RETRY_S`` ago."""
        now = self.clock() if self.clock is not None else 0.0
        self._failed = {k: t for k, t in self._failed.items() if t > now}
        self._view_until = min(self._failed.values(), default=np.inf)
        if not self._failed:
            return self._loadable
        out = dict(self._loadable)
        for i, name in self._failed:
            if out[name] is self._loadable[name]:
                out[name] = out[name].copy()  # the static mask stays as configured
            out[name][i] = False
        return out

    # -- reading -------------------------------------------------------------------------
    def holds(self, i: int, name: str) -> bool:
        """Loaded on endpoint ``i`` (a load under way does not count)."""
        return name in self._held[i]

    def loading(self, i: int, name: str) -> bool:
        return (i, name) in self._loading

    def held(self, i: int) -> list[str]:
        return sorted(self._held[i])

    def version(self, i: int) -> int:
        """Changes the gateway made on endpoint ``i`` so far (a poll that began before one
        may have read the engine before it: ``observe`` then ignores it)."""
        return self._version[i]

    # -- changing ------------------------------------------------------------------------
    def touch(self, i: int, name: str, now: float) -> None:
        if name in self._held[i]:
            self._held[i][name] = now

    def start_load(self, i: int, name: str) -> str | None:
        """Mark ``name`` as loading on ``i``; at its limit, take the least recently used
        adapter it holds (of those it could load again) off it and return that name (the
        caller unloads it first)."""
        self._loading.add((i, name))
        self.loads[(self.endpoints[i].id, name)] += 1
        victim = None
        loading_here = sum(1 for j, _ in self._loading if j == i)
        # never one it could not load again (no path): the engine started with it
        spare = [a for a in self._held[i] if self._reloadable(i, a)]
        if spare and len(self._held[i]) + loading_here > self._limit[i]:
            victim = min(spare, key=lambda a: self._held[i][a])
            del self._held[i][victim]
            self.unloads[(self.endpoints[i].id, victim)] += 1
        self._version[i] += 1
        self._view = None
        return victim

    def _reloadable(self, i: int, name: str) -> bool:
        adapter = self.endpoints[i].adapters.get(name)
        return adapter is not None and adapter.path is not None

    def finish_load(self, i: int, name: str, ok: bool, now: float) -> None:
        self._loading.discard((i, name))
        if ok:
            self._held[i][name] = now
            self._failed.pop((i, name), None)
        elif self.clock is not None:  # not loaded there again for a while: no load storm
            self._failed[(i, name)] = now + LOAD_RETRY_S
        self._version[i] += 1
        self._view = None

    def observe(self, i: int, names: set[str], version: int | None = None) -> bool:
        """What endpoint ``i``'s engine says it holds (adapters it declares; loads under
        way stay marked), read when the table was at ``version`` (stale, and ignored, when
        the gateway changed the endpoint since). Whether that changed the table."""
        if version is not None and version != self._version[i]:
            return False
        declared = self.endpoints[i].adapters
        now_held = {n for n in names if n in declared}
        held = self._held[i]
        if now_held == set(held):
            return False
        self._held[i] = {n: held.get(n, 0.0) for n in now_held}
        self._view = None
        return True


class AdapterLoader:
    """Single-flight adapter loads for the gateway (see the module docstring)."""

    def __init__(self, table: AdapterTable, http: Http1Backend,
                 clock: Callable[[], float]) -> None:
        self.table = table
        self._http = http
        self._clock = clock
        table.clock = clock  # failed loads pause in real time
        self._flights: dict[tuple[int, str], asyncio.Task[None]] = {}

    def ready(self, i: int, name: str) -> asyncio.Task[None] | None:
        """None when ``name`` is loaded on endpoint ``i``, else the (one) load to await."""
        table = self.table
        if table.holds(i, name):
            table.touch(i, name, self._clock())
            return None
        key = (i, name)
        task = self._flights.get(key)
        if task is None:
            victim = table.start_load(i, name)  # marked now: requests routed next come here
            task = asyncio.ensure_future(self._load(i, name, victim))
            self._flights[key] = task
            task.add_done_callback(lambda t: self._landed(key, t))
        return task

    def _landed(self, key: tuple[int, str], task: asyncio.Task[None]) -> None:
        self._flights.pop(key, None)
        if not task.cancelled():
            task.exception()  # retrieved: every waiter may have left (the next one retries)

    async def _load(self, i: int, name: str, victim: str | None) -> None:
        ep = self.table.endpoints[i]
        ok = False
        try:
            if victim is not None:
                log.info("unloading adapter %s from %s to make room for %s", victim, ep.id,
                         name)
                try:
                    await unload_adapter(self._http, ep.url, ep.engine, victim,
                                         ep.auth_headers, CONTROL_TIMEOUT_S)
                except AdapterError as exc:
                    log.warning("unloading adapter %s from %s failed: %s", victim, ep.id, exc)
            adapter = ep.adapters[name]
            if adapter.path is None:
                raise AdapterError(0, f"adapter {name!r} has no path to load it from")
            await load_adapter(self._http, ep.url, ep.engine, name, adapter.path,
                               ep.auth_headers, LOAD_TIMEOUT_S)
            ok = True
            log.info("loaded adapter %s on %s", name, ep.id)
        finally:
            self.table.finish_load(i, name, ok, self._clock())

    async def poll(self) -> None:
        """Bring the table to what every adapter endpoint's ``/v1/models`` lists."""
        table = self.table
        todo = [(i, ep) for i, ep in enumerate(table.endpoints) if ep.adapters and ep.url]
        versions = [table.version(i) for i, _ in todo]
        results = await asyncio.gather(*(list_adapters(self._http, ep.url, ep.auth_headers,
                                                       CONTROL_TIMEOUT_S) for _, ep in todo),
                                       return_exceptions=True)
        for (i, ep), version, found in zip(todo, versions, results, strict=True):
            if isinstance(found, BaseException):
                continue
            if table.observe(i, set(found), version):
                log.info("endpoint %s holds adapters %s", ep.id, ", ".join(table.held(i)))

    async def run(self, interval_s: float = ADAPTER_POLL_S) -> None:
        while True:
            try:
                await self.poll()
            except Exception:
                log.exception("adapter poll failed")
            await asyncio.sleep(interval_s)


async def discover_adapters(http: Http1Backend, endpoints: Sequence[Endpoint],
                            pools: set[str]) -> list[Endpoint]:
    """``endpoints`` with the adapters their engines list in ``/v1/models`` added to every
    endpoint of their pool (for the pools in ``pools``: ``discover_adapters``): an adapter
    the pool does not declare becomes a model of it, adapting the base model its card names
    as ``parent`` (the pool's first model when none is served under that name), loadable
    from the card's ``root`` where the pool loads adapters. Which endpoint holds it is the
    table's business (``observe``): none is assumed."""
    todo = [ep for ep in endpoints if ep.pool in pools and ep.url]
    found = await asyncio.gather(*(list_adapters(http, ep.url, ep.auth_headers,
                                                 CONTROL_TIMEOUT_S) for ep in todo),
                                 return_exceptions=True)
    by_pool: dict[str, dict[str, Adapter]] = {}
    for ep, cards in zip(todo, found, strict=True):
        if isinstance(cards, BaseException):
            log.warning("adapters of %s: %s", ep.id, cards)
            continue
        public = {served: name for name, served in ep.models.items() if name not in ep.adapters}
        for name, (parent, root) in cards.items():
            if name in ep.models:
                continue
            base = public.get(parent, next(iter(public), parent))
            by_pool.setdefault(ep.pool, {})[name] = Adapter(name, base, root, preload=False)
    out = []
    for ep in endpoints:
        new = {n: a for n, a in by_pool.get(ep.pool, {}).items() if n not in ep.adapters}
        if new:
            log.info("pool %s: adapters found on its engines: %s", ep.pool, ", ".join(new))
            ep = replace(ep, adapters={**ep.adapters, **new}, models={
                **ep.models, **{n: served_adapter_name(ep.engine, ep.models[a.base], n)
                                for n, a in new.items()}})
        out.append(ep)
    return out
