"""Capacity from the engines: the parsers (tests/data fixtures), when the collector reads it,
``LiveFleet.on_capacity`` changing what the router predicts, the unknown-model prior, and
the 400 ``context_length_exceeded`` for a request no endpoint can hold. In-process, no
sockets (the collector's HTTP calls are replaced)."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import orjson
import pytest
from routing_fixtures import MODEL, SERVED, make_fleet, pipeline, request
from starlette.testclient import TestClient

import fleetgate.state.collector as collector_module
from fleetgate.backends.capacity import (
    EngineCapacity,
    parse_cache_config_info,
    parse_model_cards,
    parse_model_info,
    parse_server_info,
)
from fleetgate.backends.fake import Answer, FakeBackend
from fleetgate.backends.metrics import EngineLoad
from fleetgate.backends.probes import ProbeResult
from fleetgate.backends.relay import Timeouts
from fleetgate.catalog.engines import ENGINES
from fleetgate.catalog.models import MODEL_PROFILES, UNKNOWN_MODEL_PROFILE, known_profile
from fleetgate.config import FleetConfig
from fleetgate.emulator.config import EmulatorConfig
from fleetgate.emulator.server import EmulatedEngine, create_emulator_app
from fleetgate.gateway.decisions import DecisionLog
from fleetgate.gateway.errors import ContextLengthExceeded
from fleetgate.gateway.proxy.apis import APIS
from fleetgate.gateway.proxy.request import ProxyRequest
from fleetgate.gateway.proxy.service import Generation, ProxyService
from fleetgate.routing import Endpoint, RoutingRequest, build_router
from fleetgate.state.collector import CAPACITY_REFRESH_S, CAPACITY_RETRY_S, Collector
from fleetgate.state.describe import describe
from fleetgate.state.fleet import Fleet, prior_of
from fleetgate.state.live import LiveFleet
from fleetgate.state.prior import MIN_KV_TOKENS, UNKNOWN_CONTEXT, endpoint_prior

DATA = Path(__file__).resolve().parents[1] / "data"


def _json(name: str) -> Any:
    return orjson.loads((DATA / name).read_bytes())


# -- parsers -----------------------------------------------------------------------------------
def test_vllm_kv_capacity_from_cache_config_info() -> None:
    one = parse_cache_config_info((DATA / "vllm_metrics.txt").read_text(),
                                  "vllm:cache_config_info")
    assert (one.kv_capacity_tokens, one.block_size) == (491520, 16)  # 30720 blocks of 16
    two = parse_cache_config_info((DATA / "vllm_metrics_dp2.txt").read_text(),
                                  "vllm:cache_config_info")
    assert two.kv_capacity_tokens == 2 * 491520  # one series per engine (DP rank): summed


def test_older_vllm_label_set_counts_blocks() -> None:
    text = ('vllm:cache_config_info{block_size="16",cache_dtype="auto",'
            'enable_prefix_caching="True",gpu_memory_utilization="0.82",num_cpu_blocks="1024",'
            'num_gpu_blocks="573",num_gpu_blocks_override="None",sliding_window="None"} 1.0\n')
    assert parse_cache_config_info(text, "vllm:cache_config_info").kv_capacity_tokens == 573 * 16
    before_sizing = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1.0\n'
    assert parse_cache_config_info(before_sizing, "vllm:cache_config_info").empty is False
    assert parse_cache_config_info(before_sizing,
                                   "vllm:cache_config_info").kv_capacity_tokens is None


def test_model_cards_give_the_context() -> None:
    assert parse_model_cards(_json("vllm_models.json")).max_model_len == 8192  # LoRA: null
    assert parse_model_cards(_json("sglang_models.json")).max_model_len == 32768
    assert parse_model_cards({"object": "list", "data": []}).max_model_len is None
    assert parse_model_cards("not json").max_model_len is None


def test_sglang_server_info_and_model_info() -> None:
    info = parse_server_info(_json("sglang_server_info.json"))
    assert (info.kv_capacity_tokens, info.max_batch, info.block_size) == (20480, 128, 1)
    assert info.max_model_len is None  # context_length null: not set on the command line
    # qwen2.5-0.5b: 24 layers x 2 KV heads x 64 x 2 (K, V) x 2 bytes = 12288 bytes a token;
    # SGLang rounds the pool's GiB to 2 decimals
    assert info.kv_bytes_per_token == pytest.approx(12288, rel=0.05)
    assert info.weight_bytes == pytest.approx(0.99e9, rel=0.1)
    assert parse_model_info(_json("sglang_model_info.json")).architecture == "Qwen2ForCausalLM"


def test_sglang_data_parallel_ranks_add_up() -> None:
    state = {"memory_usage": {"weight": 15.0, "kvcache": 30.0, "token_capacity": 245760},
             "effective_max_running_requests_per_dp": 512}
    info = parse_server_info({"dp_size": 2, "tp_size": 1, "max_total_num_tokens": 245760,
                              "internal_states": [state, state]})
    assert (info.kv_capacity_tokens, info.max_batch) == (491520, 1024)
    bare = parse_server_info({"dp_size": 2, "max_total_num_tokens": 1000,
                              "max_running_requests": 64, "context_length": 4096})
    assert (bare.kv_capacity_tokens, bare.max_batch, bare.max_model_len) == (2000, 64, 4096)


def test_merged_keeps_the_first_known_value() -> None:
    a = EngineCapacity(max_model_len=8192)
    b = EngineCapacity(max_model_len=4096, kv_capacity_tokens=100)
    assert a.merged(b) == EngineCapacity(max_model_len=8192, kv_capacity_tokens=100)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_emulator_reports_what_it_runs(engine: str) -> None:
    """The emulated engines serve the capacity sources in the shapes the parsers read
    (Starlette's in-process test client: no sockets)."""
    config = EmulatorConfig(engine=engine, gpu="h100", served_models=[SERVED], tp=2,
                            max_model_len=4096, max_num_seqs=96)
    emulated = EmulatedEngine(config)
    kv = emulated.runtime.sim.kv_capacity_tokens
    with TestClient(create_emulator_app(config)) as client:
        spec = ENGINES[engine]
        got = parse_model_cards(client.get("/v1/models").json())
        if spec.capacity_metric:
            got = got.merged(parse_cache_config_info(client.get("/metrics").text,
                                                     spec.capacity_metric))
        for path in spec.server_info_paths:
            got = got.merged(parse_server_info(client.get(path).json()))
        for path in spec.model_info_paths:
            got = got.merged(parse_model_info(client.get(path).json()))
    assert got.max_model_len == 4096
    assert got.kv_capacity_tokens == (kv // 16 * 16 if engine == "vllm" else kv)
    assert got.max_batch == (96 if engine == "sglang" else None)  # vLLM does not report it
    if engine == "sglang":
        assert got.architecture == "LlamaForCausalLM"
        assert got.kv_bytes_per_token == pytest.approx(
            MODEL_PROFILES["llama-3.1-8b"].kv_bytes_per_token, rel=0.02)


# -- LiveFleet.on_capacity -------------------------------------------------------------------
def test_on_capacity_changes_what_the_router_predicts() -> None:
    live = make_fleet()
    i = live.index["h100-vllm-0"]
    before = live.snapshot(1)
    req = request(prompt_chars=4 * 5000, max_tokens=1000)  # ~5,000 + 1,000 tokens
    d = pipeline("latency").route(req, before)
    assert "h100-vllm-0" in {c.endpoint.id for c in d.ranked}
    k = [int(j) for j in d.idx].index(i)
    b_max_before = d.estimates.b_max[k]

    assert live.on_capacity(i, kv_capacity_tokens=60000, max_model_len=4096)
    assert not live.on_capacity(i, kv_capacity_tokens=60000, max_model_len=4096)  # no change
    after = live.snapshot(1)
    d = pipeline("latency").route(req, after)
    assert d.rejected == {"h100-vllm-0": "filter context_fit"}  # 6,000 > 4,096
    small = pipeline("latency").route(request(prompt_chars=4 * 1000, max_tokens=1000), after)
    k = [int(j) for j in small.idx].index(i)
    assert small.estimates["kv_headroom_tokens"][k] == 60000  # idle: all of the reported KV
    assert small.estimates.b_max[k] <= math.floor(60000 / (1008 + 1000)) < b_max_before
    # copy on write: the snapshot taken before still holds the prior's columns
    assert before.static is not after.static
    assert before.col("max_model_len")[i] == 8192 and after.col("max_model_len")[i] == 4096
    assert live.column("kv_capacity_tokens")[i] == 60000
    assert not after.static.flags.writeable
    assert describe(live, i, 1)["max_model_len"] == 4096


def test_none_and_nonsense_keep_the_prior() -> None:
    live = make_fleet()
    prior = live.column("kv_capacity_tokens").copy()
    assert not live.on_capacity(0, None, 0, -5)
    assert (live.column("kv_capacity_tokens") == prior).all()


# -- the unknown model -------------------------------------------------------------------------
def test_an_unknown_model_gets_the_conservative_profile() -> None:
    assert known_profile("acme/chat-model-v2") is None
    unknown = endpoint_prior("h100", "acme/chat-model-v2")
    small = endpoint_prior("h100", SERVED)
    assert unknown.profile == UNKNOWN_MODEL_PROFILE.name and small.profile == "llama-3.1-8b"
    # the largest catalog model's costs, not the 8B's
    assert unknown.step_base_s > 3 * small.step_base_s
    assert unknown.step_per_ctx_token_s > small.step_per_ctx_token_s
    assert unknown.prefill_s_per_token > small.prefill_s_per_token
    assert unknown.kv_capacity_tokens >= MIN_KV_TOKENS  # 70B on one H100: none on paper
    assert unknown.max_model_len == UNKNOWN_CONTEXT  # not guessed: no false 400s
    assert endpoint_prior("h100", "acme/chat-model-v2", max_model_len=16384).max_model_len \
        == 16384


def _endpoint(served: str, source: str = "http://x:8000") -> Endpoint:
    return Endpoint("p-0", "p", source if source.startswith("http") else "", "vllm", "h100",
                    "nvidia", {"m": served}, source=source)


def test_the_fleet_warns_once_per_unknown_model(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="fleetgate.fleet"):
        assert prior_of(_endpoint("acme/once-only")).profile == UNKNOWN_MODEL_PROFILE.name
        prior_of(_endpoint("acme/once-only"))
        prior_of(_endpoint(SERVED))
    assert len(caplog.records) == 1 and "acme/once-only" in caplog.records[0].getMessage()
    # an emulated engine runs the emulator's profile for the name: the prior says the same
    assert prior_of(_endpoint("acme/once-only", "emulated://vllm/h100")).profile \
        == "llama-3.1-8b"


# -- the collector ---------------------------------------------------------------------------
class _Engine:
    """Stands in for the network: probe result, scrape and capacity report of one engine."""

    def __init__(self) -> None:
        self.up = True
        self.generated = 100.0
        self.report = EngineCapacity(kv_capacity_tokens=50000, max_model_len=4096)
        self.reads = 0

    async def probe(self, *_: Any, **__: Any) -> ProbeResult:
        return ProbeResult(self.up, "200" if self.up else "connect refused")

    async def scrape(self, _ep: Endpoint) -> EngineLoad | None:
        if not self.up:
            return None  # what a scrape of an engine that went away gets
        return EngineLoad(waiting=0, running=0, kv_usage=0.0,
                          generation_tokens_total=self.generated)

    async def read(self, *_: Any, **__: Any) -> EngineCapacity:
        self.reads += 1
        return self.report


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> _Engine:
    fake = _Engine()
    monkeypatch.setattr(collector_module, "probe", fake.probe)
    monkeypatch.setattr(collector_module, "read_capacity", fake.read)
    monkeypatch.setattr(Collector, "_scrape", lambda self, ep, i: fake.scrape(ep))

    async def probe_and_scrape(self: Collector, ep: Endpoint, i: int,
                               ) -> tuple[ProbeResult, EngineLoad | None]:
        health = await fake.probe()
        return health, (await fake.scrape(ep) if health.ok else None)

    monkeypatch.setattr(Collector, "_probe_and_scrape", probe_and_scrape)
    return fake


async def test_capacity_is_read_at_first_contact_then_rarely(engine: _Engine) -> None:
    live = make_fleet(rows=[("h100-vllm", "h100", "nvidia", "vllm", 2.95)], ready=False)
    now = [0.0]
    col = Collector(live.endpoints, live, None, lambda: now[0])  # type: ignore[arg-type]
    await col.tick()
    assert engine.reads == 1 and live.stats[0].health.state == "ready"
    assert live.column("max_model_len")[0] == 4096
    assert live.column("kv_capacity_tokens")[0] == 50000
    assert col.capacity["h100-vllm-0"].kv_capacity_tokens == 50000
    for _ in range(5):  # every scrape: no re-read
        now[0] += 1.0
        engine.generated += 10
        await col.tick()
    assert engine.reads == 1
    engine.up = False  # the engine goes away and comes back (a restart, another config)
    now[0] += 1.0
    await col.tick()
    engine.up, engine.report = True, EngineCapacity(kv_capacity_tokens=80000,
                                                    max_model_len=8192)
    now[0] += 1.0
    await col.tick()
    assert engine.reads == 2 and live.column("max_model_len")[0] == 8192
    engine.generated = 5.0  # counters went backwards between two probes: restarted
    now[0] += 1.0
    await col.tick()
    now[0] += 1.0
    await col.tick()
    assert engine.reads == 3
    now[0] += CAPACITY_REFRESH_S
    await col.tick()
    assert engine.reads == 4


async def test_an_engine_that_reports_nothing_is_asked_again_later(engine: _Engine) -> None:
    engine.report = EngineCapacity()
    live = make_fleet(rows=[("h100-vllm", "h100", "nvidia", "vllm", 2.95)], ready=False)
    now = [0.0]
    col = Collector(live.endpoints, live, None, lambda: now[0])  # type: ignore[arg-type]
    await col.tick()
    now[0] += 1.0
    await col.tick()
    assert engine.reads == 1 and live.column("max_model_len")[0] == 8192  # the prior
    now[0] += CAPACITY_RETRY_S
    await col.tick()
    assert engine.reads == 2


async def test_a_configured_context_stays_the_upper_bound(engine: _Engine) -> None:
    engine.report = EngineCapacity(max_model_len=32768)
    ep = Endpoint("p-0", "p", "http://x", "vllm", "h100", "nvidia", {MODEL: SERVED},
                  max_model_len=16384)
    live = LiveFleet([ep], [prior_of(ep)])
    col = Collector([ep], live, None, lambda: 0.0)  # type: ignore[arg-type]
    await col.tick()
    assert live.column("max_model_len")[0] == 16384


# -- over every context: 400, not 503 ----------------------------------------------------------
def test_the_decision_says_when_no_context_can_hold_the_request() -> None:
    live = make_fleet()
    d = pipeline("latency").route(request(prompt_chars=40000, max_tokens=8000), live.snapshot(1))
    assert d.context_limit == 8192 and not len(d.order)
    live.on_capacity(live.index["h200-sglang-0"], max_model_len=32768)
    d = pipeline("latency").route(request(prompt_chars=40000, max_tokens=8000), live.snapshot(1))
    assert d.context_limit is None and d.chosen is not None
    assert d.chosen.id == "h200-sglang-0"
    # the one endpoint that could hold it is down: no capacity now (503), not a client error
    live.on_refused(live.index["h200-sglang-0"], 1.0, "connect refused")
    d = pipeline("latency").route(request(prompt_chars=40000, max_tokens=8000), live.snapshot(1))
    assert d.context_limit is None and not len(d.order)
    # every endpoint down and the request too long for all of them: still the client's error
    d = pipeline("latency").route(request(prompt_chars=200000, max_tokens=10),
                                  live.snapshot(1))
    assert d.context_limit == 32768


def test_without_max_tokens_the_prompt_alone_must_fit() -> None:
    live = make_fleet()
    near = request(prompt_chars=4 * 8100, max_tokens=None)  # 8,108 tokens of 8,192
    d = pipeline("latency").route(near, live.snapshot(1))
    assert d.chosen is not None and d.context_limit is None  # the engine fills what is left
    d = pipeline("latency").route(request(prompt_chars=4 * 8200, max_tokens=None),
                                  live.snapshot(1))
    assert d.context_limit == 8192


def _service() -> ProxyService:
    pools = [{"name": "h100", "accelerator": "h100", "engine": "vllm", "price_per_gpu_hour": 3,
              "endpoints": ["http://h100:8000"], "models": {MODEL: SERVED},
              "apis": ["chat", "completions", "responses", "embeddings"]}]
    config = FleetConfig.model_validate({"pools": pools})
    fleet = Fleet(config, http=None)  # type: ignore[arg-type]  # never started: no I/O
    fleet.live.on_probe(0, fleet.clock(), True, "200")
    gen = Generation(fleet, build_router(config), {})
    backend = FakeBackend({"http://h100:8000": [Answer(200, b"{}")]})
    return ProxyService(lambda: gen, backend, Timeouts(), DecisionLog())


@pytest.mark.parametrize(("api", "param", "max_tokens", "message"), [
    ("chat", "messages", 1000, "However, you requested 11008 tokens (10008 in the messages, "
                               "1000 in the completion). Please reduce the length of the "
                               "messages or completion."),
    ("completions", "prompt", 1000, "(10008 in the prompt, 1000 in the completion)"),
    ("responses", "input", None, "However, your input resulted in 10008 tokens. Please reduce "
                                 "the length of the input."),
    ("embeddings", "input", 1, "your input resulted in 10008 tokens"),
])
async def test_the_gateway_answers_context_length_exceeded(api: str, param: str,
                                                           max_tokens: int | None,
                                                           message: str) -> None:
    proxy = _service()
    routing = RoutingRequest(MODEL, api=api, max_tokens=max_tokens, prompt_chars=40000)
    with pytest.raises(ContextLengthExceeded) as caught:
        await proxy.handle(ProxyRequest(APIS[api], routing, {"model": MODEL}, "rid", False))
    exc = caught.value
    assert (exc.status, exc.code, exc.param) == (400, "context_length_exceeded", param)
    assert exc.message.startswith("This model's maximum context length is 8192 tokens. ")
    assert message in exc.message


@pytest.mark.parametrize(("api", "cap"), [("chat", "max_tokens"),
                                          ("chat", "max_completion_tokens"),
                                          ("completions", "max_tokens"),
                                          ("responses", "max_output_tokens")])
async def test_an_output_cap_over_the_context_is_named(api: str, cap: str) -> None:
    """The prompt fits, the output cap does not: the error names the field the request set,
    as vLLM does (param max_tokens), not the prompt."""
    proxy = _service()
    routing = RoutingRequest(MODEL, api=api, max_tokens=9000, prompt_chars=400)
    with pytest.raises(ContextLengthExceeded) as caught:
        await proxy.handle(ProxyRequest(APIS[api], routing, {"model": MODEL, cap: 9000}, "rid"))
    exc = caught.value
    assert (exc.status, exc.code, exc.param) == (400, "context_length_exceeded", cap)
    assert exc.message == (f"'{cap}' is too large: 9000. This model's maximum context length "
                           "is 8192 tokens and your request has about 108 input tokens "
                           "(9000 > 8192 - 108).")


async def test_probes_and_capacity_reads_carry_the_pools_api_key() -> None:
    """A hosted API (or a vLLM with --api-key) answers 401 without the key: the collector's
    probe and capacity read send the pool's ``api_key`` (``Endpoint.auth_headers``)."""
    from aiohttp import web

    from fleetgate.backends.capacity import read_capacity
    from fleetgate.backends.http1 import Http1Backend
    from fleetgate.backends.probes import probe

    async def models(request: web.Request) -> web.Response:
        if request.headers.get("authorization") != "Bearer sk-key":
            return web.json_response({"error": {"message": "no key"}}, status=401)
        return web.json_response({"object": "list", "data": [
            {"id": SERVED, "object": "model", "max_model_len": 12345}]})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    ep = Endpoint("h-0", "h", url, "openai", "h100", "nvidia", {"m": SERVED}, api_key="sk-key")
    client = Http1Backend(max_idle_per_host=2)  # the control plane's one client
    try:
        assert not (await probe(client, url, ENGINES["openai"])).ok  # 401 without it
        assert (await probe(client, url, ENGINES["openai"], 2.0, ep.auth_headers)).ok
        read = await read_capacity(client, url, ENGINES["openai"], 2.0, ep.auth_headers)
        assert read.max_model_len == 12345
        assert (await read_capacity(client, url, ENGINES["openai"])).max_model_len is None
    finally:
        await client.close()
        await runner.cleanup()


async def test_capacity_reads_over_the_control_plane_client(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``read_capacity`` on the lean client (``backends/http1.py``): a 404 tries the next
    path, any other failure (an error status, a body that does not decode or parse, one over
    ``MAX_BODY_BYTES``, an engine that is not there) leaves the source's fields unknown, and
    nothing raises."""
    from aiohttp import web

    import fleetgate.backends.capacity as capacity
    from fleetgate.backends.capacity import read_capacity
    from fleetgate.backends.http1 import Http1Backend

    served: dict[str, tuple[int, bytes]] = {}  # path -> status, body (else 404)
    hits: list[str] = []

    async def any_path(request: web.Request) -> web.Response:
        hits.append(request.path)
        status, body = served.get(request.path, (404, b""))
        return web.Response(status=status, body=body)

    app = web.Application()
    app.router.add_get("/{tail:.*}", any_path)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    client = Http1Backend(max_idle_per_host=2)
    sglang, vllm = ENGINES["sglang"], ENGINES["vllm"]
    try:
        served["/get_server_info"] = (200, b'{"max_total_num_tokens": 4096}')
        served["/model_info"] = (500, b"{}")
        read = await read_capacity(client, url, sglang)
        assert read.kv_capacity_tokens == 4096 and read.architecture is None
        assert hits == ["/v1/models", "/server_info", "/get_server_info", "/model_info"]
        served["/v1/models"] = (200, b"{not json")
        served["/get_server_info"] = (200, b'{"max_total_num_tokens": \xff}')
        assert (await read_capacity(client, url, sglang)).empty
        metric = b'vllm:cache_config_info{block_size="16",num_gpu_blocks="100"} 1.0\n'
        served["/metrics"] = (200, metric)
        assert (await read_capacity(client, url, vllm)).kv_capacity_tokens == 1600
        served["/metrics"] = (200, b"\xff" + metric)  # not UTF-8
        assert (await read_capacity(client, url, vllm)).empty
        monkeypatch.setattr(capacity, "MAX_BODY_BYTES", len(metric) - 1)
        served["/metrics"] = (200, metric)
        assert (await read_capacity(client, url, vllm)).empty
    finally:
        await client.close()
        await runner.cleanup()
    assert (await read_capacity(client, url, vllm, 0.5)).empty  # nothing listens there now
    await client.close()
