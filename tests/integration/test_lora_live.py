"""Issue 25 item 2: LoRA adapters routed by a real gateway, over HTTP, with the ``openai`` SDK.

A ``fleetgate serve`` process in front of three emulated engines it did not start (so the
test can read each engine's own counts at ``/emulator/state``):

- pool ``cheap`` (vLLM, H100, $2.00): ``e1`` started with the adapter ``sql`` loaded
  (``--lora-modules``), ``e2`` with none; both allow run-time loading, at most 2 adapters;
- pool ``dear`` (SGLang, H200, $4.00): ``e3`` started with ``sgl`` (``--lora-paths``);
- pool ``found`` (vLLM, H200, $3.00): ``e4`` started with ``mystery``, which the pool does
  not declare: it says ``discover_adapters: true``.

The gateway learns who holds what from the engines' ``/v1/models`` (the pools declare the
adapters with ``preload: false``), routes ``sql`` only to ``e1``, loads an adapter nobody
holds exactly once under 20 concurrent requests, keeps every endpoint within its limit by
unloading the least recently used adapter, selects an SGLang adapter as ``base:adapter``,
and lists the adapters with their ``parent`` in ``/v1/models``. No wall-clock timing is
asserted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from procs import Proc, spawn_emulator, spawn_gateway

BASE, SERVED = "tiny", "tiny-llama"
LOADABLE = ["chat", "a1", "a2", "a3"]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Proc]]:
    lora = ["--enable-lora", "--allow-runtime-lora", "--max-loras", "2"]
    procs = {
        "e1": spawn_emulator("vllm", "h100", [SERVED], extra=[*lora, "--lora-modules",
                                                              "sql=org/sql-lora"]),
        "e2": spawn_emulator("vllm", "h100", [SERVED], extra=lora),
        "e3": spawn_emulator("sglang", "h200", [SERVED], extra=["--enable-lora",
                                                                "--lora-paths", "sgl=org/sgl"]),
        "e4": spawn_emulator("vllm", "h200", [SERVED], extra=["--lora-modules",
                                                              "mystery=org/mystery"]),
    }
    adapters = [{"name": "sql", "path": "org/sql-lora", "preload": False},
                *({"name": n, "path": f"org/{n}-lora"} for n in LOADABLE),
                {"name": "broken", "path": "/no/such/adapter/dir"}]
    config = {
        "pools": [
            {"name": "cheap", "accelerator": "h100", "engine": "vllm", "price_per_gpu_hour": 2.0,
             "endpoints": [procs["e1"].url, procs["e2"].url], "models": {BASE: SERVED},
             "adapters": adapters, "load_adapters": True, "max_adapters": 2},
            {"name": "dear", "accelerator": "h200", "engine": "sglang",
             "price_per_gpu_hour": 4.0, "endpoints": [procs["e3"].url],
             "models": {BASE: SERVED}, "adapters": [{"name": "sgl", "preload": False}]},
            {"name": "found", "accelerator": "h200", "engine": "vllm",
             "price_per_gpu_hour": 3.0, "endpoints": [procs["e4"].url],
             "models": {BASE: SERVED}, "discover_adapters": True},
        ],
        "policies": {"cheapest": {"strategy": "cost"}},
        "default_policy": "cheapest",
    }
    procs["gateway"] = spawn_gateway(config, tmp_path_factory.mktemp("lora"),
                                     env={"FLEETGATE_REQUEST_LOG": "off"})
    yield procs
    for proc in procs.values():
        proc.stop()


def _state(proc: Proc) -> dict[str, Any]:
    return dict(httpx.get(proc.url + "/emulator/state", timeout=5).json()["lora"])


def _served_models(proc: Proc) -> list[str]:
    log = httpx.get(proc.url + "/emulator/requests", timeout=5).json()["requests"]
    return [r["body"]["model"] for r in log if r["path"] == "/v1/chat/completions"]


def _client(fleet: dict[str, Proc]) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=fleet["gateway"].url + "/v1", api_key="none",
                              max_retries=0, timeout=60)


async def _ask(client: openai.AsyncOpenAI, model: str) -> tuple[str, str]:
    """(the endpoint that answered, the answer's model field)."""
    raw = await client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    return raw.headers["x-fleetgate-endpoint"], raw.parse().model


def _clear(fleet: dict[str, Proc]) -> None:
    for name in ("e1", "e2", "e3", "e4"):
        httpx.delete(fleet[name].url + "/emulator/requests", timeout=5)


async def test_models_lists_adapters_with_their_parent(fleet: dict[str, Proc]) -> None:
    cards = {m.id: m for m in (await _client(fleet).models.list()).data}
    assert set(cards) == {BASE, "sql", "sgl", "mystery", "broken", *LOADABLE}
    assert cards[BASE].model_extra is not None and cards[BASE].model_extra["parent"] is None
    for name in ("sql", "sgl", "mystery", *LOADABLE):
        assert (cards[name].model_extra or {})["parent"] == BASE, name


async def test_adapter_requests_go_only_where_it_is_loaded(fleet: dict[str, Proc]) -> None:
    _clear(fleet)
    client = _client(fleet)
    answers = [await _ask(client, "sql") for _ in range(8)]
    assert {endpoint for endpoint, _ in answers} == {"cheap-0"}  # e1 holds sql, e2 does not
    assert {model for _, model in answers} == {"sql"}
    assert _served_models(fleet["e1"]) == ["sql"] * 8  # vLLM selects it by its own name
    assert _served_models(fleet["e2"]) == [] and _served_models(fleet["e3"]) == []
    assert _state(fleet["e1"])["loads"] == 0 and _state(fleet["e2"])["loads"] == 0


async def test_sglang_adapter_is_selected_as_base_colon_adapter(fleet: dict[str, Proc]) -> None:
    _clear(fleet)
    endpoint, model = await _ask(_client(fleet), "sgl")
    assert endpoint == "dear-0" and model == "sgl"  # the public name, rewritten back
    assert _served_models(fleet["e3"]) == [f"{SERVED}:sgl"]


async def test_an_unloaded_adapter_is_loaded_once_under_20_concurrent_requests(
        fleet: dict[str, Proc]) -> None:
    before = {n: _state(fleet[n])["loads"] for n in ("e1", "e2", "e3")}
    client = _client(fleet)
    answers = await asyncio.gather(*(_ask(client, "chat") for _ in range(20)))
    loads = {n: _state(fleet[n])["loads"] - before[n] for n in ("e1", "e2", "e3")}
    assert sum(loads.values()) == 1, loads
    loaded_on = next(n for n, k in loads.items() if k)
    assert loaded_on in ("e1", "e2")  # the cheap pool (the cost policy), never SGLang's
    assert {endpoint for endpoint, _ in answers} == {f"cheap-{int(loaded_on[1]) - 1}"}
    assert {model for _, model in answers} == {"chat"}
    # the next request finds it loaded: no second load
    await _ask(client, "chat")
    assert sum(_state(fleet[n])["loads"] for n in ("e1", "e2", "e3")) == sum(before.values()) + 1


async def test_loads_respect_the_per_endpoint_limit(fleet: dict[str, Proc]) -> None:
    client = _client(fleet)
    for name in ("a1", "a2", "a3", "a1", "chat"):
        _, model = await _ask(client, name)
        assert model == name
        for e in ("e1", "e2"):
            assert len(_state(fleet[e])["loaded"]) <= 2, _state(fleet[e])
    unloads = _state(fleet["e1"])["unloads"] + _state(fleet["e2"])["unloads"]
    assert unloads >= 1  # 4 more adapters than 2 endpoints x 2 slots: some were unloaded


async def test_an_adapter_found_on_the_engines_is_routed(fleet: dict[str, Proc]) -> None:
    _clear(fleet)
    endpoint, model = await _ask(_client(fleet), "mystery")
    assert (endpoint, model) == ("found-0", "mystery")
    assert _served_models(fleet["e4"]) == ["mystery"]


async def test_an_adapter_that_cannot_be_loaded_is_not_asked_for_again(
        fleet: dict[str, Proc]) -> None:
    """Each cheap endpoint is asked once (vLLM: 404, nothing at the path); the request gets
    the gateway's 5xx, and the next one finds no endpoint to load it on (no load storm)."""
    _clear(fleet)
    for _ in range(3):
        with pytest.raises(openai.APIStatusError) as info:
            await _ask(_client(fleet), "broken")
        assert info.value.status_code in (502, 503)
    calls = [r for e in ("e1", "e2")
             for r in httpx.get(fleet[e].url + "/emulator/requests", timeout=5).json()["requests"]
             if r["path"] == "/v1/load_lora_adapter"]
    assert len(calls) == 2 and {c["body"]["lora_name"] for c in calls} == {"broken"}


async def test_an_unknown_adapter_is_a_404(fleet: dict[str, Proc]) -> None:
    with pytest.raises(openai.NotFoundError):
        await _ask(_client(fleet), "no-such-lora")
