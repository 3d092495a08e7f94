"""LoRA adapters in routing and live state (issue 25 item 2): config, the adapter stage,
the table's limit and LRU eviction, the single-flight loader, the emulator's perf model."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from aiohttp import web
from pydantic import ValidationError

from fleetgate.backends.http1 import Http1Backend
from fleetgate.catalog.gpus import GPUS
from fleetgate.catalog.models import MODEL_PROFILES
from fleetgate.config.schema import FleetConfig
from fleetgate.emulator.perfmodel import EngineSim, SchedulerConfig
from fleetgate.routing import RoutingRequest
from fleetgate.routing.adapters import STAGE
from fleetgate.routing.policies import build_router
from fleetgate.state.adapters import LOAD_RETRY_S, AdapterLoader, AdapterTable
from fleetgate.state.fleet import fleet_endpoints, live_fleet

BASE, SERVED = "llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct"


def _config(**cheap: Any) -> FleetConfig:
    pool = {"accelerator": "h100", "engine": "vllm", "models": {BASE: SERVED}}
    return FleetConfig.model_validate({
        "pools": [
            {"name": "cheap", "price_per_gpu_hour": 2.0,
             "endpoints": ["http://c0:8000", "http://c1:8000"], **pool,
             "adapters": [{"name": "sql", "path": "/a/sql"}, {"name": "chat", "path": "/a/chat"},
                          {"name": "fixed", "preload": False}],
             "load_adapters": True, "max_adapters": 2, **cheap},
            {"name": "dear", "price_per_gpu_hour": 4.0, "endpoints": ["http://d0:8000"],
             **{**pool, "engine": "sglang", "accelerator": "h200"},
             "adapters": [{"name": "sql", "path": "/a/sql", "preload": True}]},
        ],
        "policies": {"cheapest": {"strategy": "cost"}}, "default_policy": "cheapest"})


def _live(config: FleetConfig):  # type: ignore[no-untyped-def]
    live = live_fleet(fleet_endpoints(config))
    for i in range(len(live.endpoints)):
        live.on_probe(i, 0.0, True, "200")
    return live


def _route(config: FleetConfig, live: Any, model: str):  # type: ignore[no-untyped-def]
    return build_router(config).route(RoutingRequest(model=model, prompt_chars=400,
                                                     max_tokens=16), live.snapshot(0.0))


# -- config ------------------------------------------------------------------------------
def test_adapters_are_models_of_their_pool_with_the_engines_names() -> None:
    eps = {ep.id: ep for ep in fleet_endpoints(_config())}
    assert eps["cheap-0"].models["sql"] == "sql"  # vLLM: the adapter's own name
    assert eps["dear-0"].models["sql"] == f"{SERVED}:sql"  # SGLang: base:adapter
    assert eps["cheap-0"].adapters["fixed"].path is None
    assert not eps["cheap-0"].adapters["sql"].preload  # a loading pool preloads nothing
    assert eps["dear-0"].adapters["sql"].preload
    assert _config().adapter_parents() == {"sql": BASE, "chat": BASE, "fixed": BASE}
    # without a path it can only have come with the engine: taken as preloaded
    plain = fleet_endpoints(_config(adapters=["plain"]))[0].adapters["plain"]
    assert plain.preload and plain.path is None


@pytest.mark.parametrize(("change", "error"), [
    ({"adapters": [{"name": "x", "base": "nope"}]}, "adapters[0].base"),
    ({"adapters": ["x", "x"]}, "listed twice"),
    ({"adapters": [{"name": BASE}]}, "also a model of the pool"),
    ({"adapters": [{"name": "a:b"}]}, "without spaces"),
    ({"max_adapters": 0}, "max_adapters"),
])
def test_bad_adapter_config_names_its_path(change: dict[str, Any], error: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(error)) as info:
        _config(**change)
    assert info.value.errors()[0]["loc"][:2] == ("pools", 0)


def test_an_adapter_adapts_one_model_everywhere() -> None:
    raw = _config().model_dump()
    raw["pools"][1]["models"] = {"other": SERVED}
    raw["pools"][1]["adapters"] = [{"name": "sql"}]
    with pytest.raises(ValidationError, match=re.escape("adapts 'llama-3.1-8b' in another pool")):
        FleetConfig.model_validate(raw)


# -- routing -----------------------------------------------------------------------------
def test_only_endpoints_holding_the_adapter_are_candidates() -> None:
    config = _config()
    live = _live(config)
    table: AdapterTable = live.adapters
    table.start_load(1, "sql")
    table.finish_load(1, "sql", True, 1.0)
    decision = _route(config, live, "sql")
    # cheap-1 and dear-0 (preloaded) hold it; cheap-0 does not, though it is as cheap
    assert {c.endpoint.id for c in decision.ranked} == {"cheap-1", "dear-0"}
    assert decision.chosen is not None and decision.chosen.id == "cheap-1"
    assert decision.adapter == "sql" and not decision.load_adapter
    assert decision.rejected == {"cheap-0": STAGE}
    assert decision.explain()["adapter"] == {"name": "sql", "load": False}


def test_a_load_under_way_counts_as_held() -> None:
    config = _config()
    live = _live(config)
    first = _route(config, live, "chat")
    assert first.load_adapter and first.chosen is not None
    live.adapters.start_load(live.index[first.chosen.id], "chat")
    again = _route(config, live, "chat")  # routed while it loads: follows it, loads nothing
    assert not again.load_adapter
    assert [c.endpoint.id for c in again.ranked] == [first.chosen.id]


def test_none_holds_it_the_cheapest_with_room_loads_it() -> None:
    raw = _config().model_dump()
    raw["pools"][0]["adapters"].append({"name": "new", "path": "/a/new"})
    config = FleetConfig.model_validate(raw)
    live2 = _live(config)
    for name in ("sql", "chat"):  # cheap-0 is full
        live2.adapters.start_load(0, name)
        live2.adapters.finish_load(0, name, True, 1.0)
    decision = _route(config, live2, "new")
    assert decision.load_adapter
    assert [c.endpoint.id for c in decision.ranked] == ["cheap-1"]  # the one with room


def test_with_no_room_anywhere_the_loading_endpoints_stay() -> None:
    config = _config(max_adapters=1)
    live = _live(config)
    live.adapters.start_load(0, "sql")
    live.adapters.finish_load(0, "sql", True, 1.0)
    live.adapters.start_load(1, "sql")
    live.adapters.finish_load(1, "sql", True, 1.0)
    decision = _route(config, live, "chat")
    assert decision.load_adapter
    assert {c.endpoint.id for c in decision.ranked} == {"cheap-0", "cheap-1"}


def test_an_adapter_nobody_holds_or_may_load_is_unserved() -> None:
    config = _config(adapters=[{"name": "fixed", "preload": False}])
    decision = _route(config, _live(config), "fixed")
    assert decision.chosen is None and decision.adapter == "fixed"


def test_a_base_model_request_ignores_adapters() -> None:
    config = _config()
    decision = _route(config, _live(config), BASE)
    assert decision.adapter is None and len(decision.ranked) == 3


# -- the table: limit, LRU, what the engines say -------------------------------------------
def test_the_limit_evicts_the_least_recently_used() -> None:
    table = live_fleet(fleet_endpoints(_config())).adapters
    for name, t in (("sql", 1.0), ("chat", 2.0)):
        assert table.start_load(0, name) is None
        table.finish_load(0, name, True, t)
    table.touch(0, "sql", 3.0)  # chat is now the least recently used
    assert table.start_load(0, "fixed") == "chat"
    assert table.view().count[0] == 2  # sql + fixed (loading): never over the limit
    table.finish_load(0, "fixed", False, 4.0)  # failed: unmarked
    assert table.held(0) == ["sql"] and not table.view().holds("fixed", 0)


def test_an_adapter_it_could_not_load_again_is_never_evicted() -> None:
    config = _config(max_adapters=1, adapters=[{"name": "fixed", "preload": True},
                                                {"name": "sql", "path": "/a/sql"}])
    table = live_fleet(fleet_endpoints(config)).adapters
    assert table.held(0) == ["fixed"]  # the engine started with it; it has no path
    assert table.start_load(0, "sql") is None
    table.finish_load(0, "sql", True, 1.0)
    assert table.held(0) == ["fixed", "sql"]


def test_a_failed_load_pauses_loading_it_there() -> None:
    config = _config()
    live = _live(config)
    table = live.adapters
    now = [0.0]
    table.clock = lambda: now[0]
    table.start_load(0, "chat")
    table.finish_load(0, "chat", False, 0.0)
    decision = _route(config, live, "chat")
    assert [c.endpoint.id for c in decision.ranked] == ["cheap-1"]  # cheap-0 paused
    now[0] = LOAD_RETRY_S + 1
    assert {c.endpoint.id for c in _route(config, live, "chat").ranked} == {"cheap-0",
                                                                           "cheap-1"}


def test_observe_follows_the_engine_but_not_a_stale_read() -> None:
    table = live_fleet(fleet_endpoints(_config())).adapters
    before = table.version(0)
    assert table.observe(0, {"sql", "unknown-to-us"}, before)
    assert table.held(0) == ["sql"]
    stale = table.version(0)
    table.start_load(0, "chat")
    table.finish_load(0, "chat", True, 1.0)
    assert not table.observe(0, {"sql"}, stale)  # read before our load finished
    assert table.held(0) == ["chat", "sql"]


# -- the loader: single flight --------------------------------------------------------------
async def test_concurrent_requests_load_an_adapter_once() -> None:
    calls: list[dict[str, Any]] = []
    gate = asyncio.Event()

    async def load(request: web.Request) -> web.Response:
        calls.append(await request.json())
        await gate.wait()
        return web.Response(text="Success")

    app = web.Application()
    app.router.add_post("/v1/load_lora_adapter", load)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    table = AdapterTable(fleet_endpoints(_config(endpoints=[f"http://127.0.0.1:{port}"])))
    http = Http1Backend(max_idle_per_host=2)  # the control plane's one client
    try:
        loader = AdapterLoader(table, http, lambda: 0.0)
        waits = [loader.ready(0, "chat") for _ in range(20)]
        assert all(w is waits[0] for w in waits) and waits[0] is not None
        assert table.loading(0, "chat")
        gate.set()
        await asyncio.gather(*[w for w in waits if w is not None])
        assert loader.ready(0, "chat") is None  # loaded: requests go at once
    finally:
        await http.close()
        await runner.cleanup()
    assert calls == [{"lora_name": "chat", "lora_path": "/a/chat"}]
    assert table.held(0) == ["chat"]


async def test_adapter_calls_over_the_control_plane_client() -> None:
    """Load, unload and list on the lean client (``backends/http1.py``): JSON bodies with
    their content type and the endpoint's credentials; an engine that already holds (or never
    held) the adapter is where we wanted it; a refusal carries the engine's status, and one
    that cannot be reached or answers garbage status 0."""
    from fleetgate.backends.adapters import (
        AdapterError,
        list_adapters,
        load_adapter,
        unload_adapter,
    )

    seen: list[tuple[str, str, str, Any]] = []
    models = [b'{"data": [{"id": "chat", "parent": "base", "root": "/a/chat"}, {"id": "base"}]}']

    async def control(request: web.Request) -> web.Response:
        seen.append((request.path, request.headers.get("content-type", ""),
                     request.headers.get("authorization", ""), await request.json()))
        name = seen[-1][3]["lora_name"]
        if name == "held":
            return web.json_response({"error": {"message": "adapter held has already been "
                                                           "loaded"}}, status=400)
        if name == "missing":
            return web.json_response({"error": {"message": "no adapter at path"}}, status=404)
        return web.Response(text="Success")

    async def listing(_: web.Request) -> web.Response:
        return web.Response(body=models[0], content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/load_lora_adapter", control)
    app.router.add_post("/v1/unload_lora_adapter", control)
    app.router.add_get("/v1/models", listing)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    auth = {"authorization": "Bearer sk-key"}
    http = Http1Backend(max_idle_per_host=2)
    try:
        await load_adapter(http, url, "vllm", "chat", "/a/chat", auth, 5.0)
        await load_adapter(http, url, "vllm", "held", "/a/held", auth, 5.0)
        await unload_adapter(http, url, "vllm", "chat", auth, 5.0)
        with pytest.raises(AdapterError) as refused:
            await load_adapter(http, url, "vllm", "missing", "/nowhere", auth, 5.0)
        assert refused.value.status == 404 and "no adapter at path" in refused.value.message
        assert seen == [
            ("/v1/load_lora_adapter", "application/json", "Bearer sk-key",
             {"lora_name": "chat", "lora_path": "/a/chat"}),
            ("/v1/load_lora_adapter", "application/json", "Bearer sk-key",
             {"lora_name": "held", "lora_path": "/a/held"}),
            ("/v1/unload_lora_adapter", "application/json", "Bearer sk-key",
             {"lora_name": "chat"}),
            ("/v1/load_lora_adapter", "application/json", "Bearer sk-key",
             {"lora_name": "missing", "lora_path": "/nowhere"})]
        assert await list_adapters(http, url, auth, 5.0) == {"chat": ("base", "/a/chat")}
        models[0] = b"[not json"
        with pytest.raises(AdapterError) as garbage:
            await list_adapters(http, url, auth, 5.0)
        assert garbage.value.status == 0
    finally:
        await runner.cleanup()
    for gone in (load_adapter(http, url, "vllm", "chat", "/a/chat", auth, 0.5),
                 list_adapters(http, url, auth, 0.5)):
        with pytest.raises(AdapterError) as unreachable:
            await gone
        assert unreachable.value.status == 0
    await http.close()


# -- the perf model -----------------------------------------------------------------------
def _sim(max_loras: int = 0) -> EngineSim:
    return EngineSim(GPUS["h100"], MODEL_PROFILES["llama-3.1-8b"],
                     scheduler=SchedulerConfig(max_loras=max_loras))


def test_each_adapter_in_a_batch_adds_to_the_step() -> None:
    plain, one, two = _sim(), _sim(), _sim()
    for k in range(4):
        plain.add(f"r{k}", 100, 8)
        one.add(f"r{k}", 100, 8, adapter="a")
        two.add(f"r{k}", 100, 8, adapter="ab"[k % 2])
    d0, d1, d2 = (s.next_step_duration() for s in (plain, one, two))
    assert d0 is not None and d1 is not None and d2 is not None
    assert d0 < d1 < d2
    assert d2 - d1 == pytest.approx(one.lora_step_seconds(2) - one.lora_step_seconds(1))


def test_max_loras_keeps_a_third_adapter_waiting_but_lets_the_queue_go_on() -> None:
    sim = _sim(max_loras=2)
    sim.add("a", 100, 8, adapter="a")
    sim.add("b", 100, 8, adapter="b")
    sim.add("c", 100, 8, adapter="c")  # skipped: two adapters already run
    sim.add("base", 100, 8)  # behind it, still admitted
    sim.next_step_duration()
    assert sim.num_running == 3 and sim.num_waiting == 1
    assert sim.running_adapters == ["a", "b"] and sim.waiting_adapters == ["c"]
    while sim.num_waiting:
        sim.step()
        sim.next_step_duration()
    assert "c" in sim.running_adapters
