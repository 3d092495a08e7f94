"""Mid-stream resume over real HTTP: the engine serving a stream is SIGKILLed after some of its
tokens and the client's stream (the official openai SDK reading it) ends normally, with every
token it asked for, the text continuous, one usage chunk and one id.

Two emulated engines of one flavour (vLLM or SGLang) behind a real gateway; both run slowed
down (``slow_factor``) so that the kill lands mid-stream; the survivor is sped up again once
it is the only one. The emulated model continues its own text (emulator/formats.py), so the
stitched text must be exactly what an unbroken stream says.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from fleetgate.emulator.formats import token_text
from procs import PUBLIC_8B, SERVED_8B, Proc, pool, spawn_emulator, spawn_gateway

MODELS = {PUBLIC_8B: SERVED_8B}
MESSAGES = [{"role": "user", "content": "tell me a long story"}]
M = 48  # max_tokens
CUT_AFTER = 8  # chunks read before the kill
GPUS = {"vllm": ("h100", "h200"), "sglang": ("mi300x", "h200")}


@pytest.fixture(params=["vllm", "sglang"])
def fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Proc]]:
    """Two engines of one flavour (endpoint id -> process) and the gateway (``gw``)."""
    engine = request.param
    procs: dict[str, Proc] = {}
    pools = []
    for name, gpu in zip(("a", "b"), GPUS[engine], strict=True):
        proc = spawn_emulator(engine, gpu, [SERVED_8B], speed=1.0)
        procs[f"{name}-{engine}-0"] = proc
        pools.append(pool(f"{name}-{engine}", gpu, engine, 2.0, [proc.url], MODELS))
    gw = spawn_gateway({"pools": pools, "default_policy": "fastest",
                        "policies": {"fastest": {"strategy": "latency"}}}, tmp_path)
    yield {**procs, "gw": gw}
    for p in (gw, *procs.values()):
        p.stop()


def _slow(engine: Proc, factor: float) -> None:
    httpx.post(engine.url + "/emulator/faults", json={"slow_factor": factor}).raise_for_status()


def _expected(tokens: int) -> str:
    return "".join(token_text(i) for i in range(tokens))


def _break_mid_stream(fleet: dict[str, Proc], open_stream: object) -> tuple[list, str]:
    """Open the stream, read CUT_AFTER chunks, SIGKILL the serving engine, read the rest."""
    engines = {k: v for k, v in fleet.items() if k != "gw"}
    for proc in engines.values():
        _slow(proc, 5.0)
    with open_stream() as raw:  # type: ignore[operator]
        serving = raw.headers["x-fleetgate-endpoint"]
        stream = iter(raw.parse())
        chunks = [next(stream) for _ in range(CUT_AFTER)]
        engines[serving].kill()
        for key, proc in engines.items():
            if key != serving:
                _slow(proc, 1.0)
        chunks.extend(stream)
    return chunks, serving


def _check_decision(gw: Proc, serving: str) -> None:
    entry = httpx.get(gw.url + "/admin/decisions?limit=1").json()["decisions"][0]
    attempts = entry["attempts"]
    assert attempts[0]["endpoint"] == serving and attempts[0]["migrated"] is True
    assert attempts[0]["status"] >= 500
    assert attempts[-1]["status"] == 200 and attempts[-1]["migrated"] is True
    assert attempts[-1]["endpoint"] != serving
    assert CUT_AFTER - 1 <= attempts[-1]["after_tokens"] < M
    metrics = httpx.get(gw.url + "/metrics").text
    moved = [ln for ln in metrics.splitlines()
             if ln.startswith("fleetgate_stream_migrations_total{")]
    took_over = attempts[-1]["endpoint"].removesuffix("-0")  # the pool's name
    assert len(moved) == 1 and moved[0].endswith(" 1.0") and f'pool="{took_over}"' in moved[0]


def test_a_chat_stream_survives_its_engine_being_killed(fleet: dict[str, Proc]) -> None:
    gw = fleet["gw"]
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
    reference = client.chat.completions.create(model=PUBLIC_8B, messages=MESSAGES,  # type: ignore[arg-type]
                                               max_tokens=2)
    assert reference.usage is not None

    def open_stream() -> object:
        return client.chat.completions.with_streaming_response.create(
            model=PUBLIC_8B, messages=MESSAGES, max_tokens=M, stream=True,  # type: ignore[arg-type]
            stream_options={"include_usage": True})

    chunks, serving = _break_mid_stream(fleet, open_stream)
    assert len({c.id for c in chunks}) == 1 and {c.model for c in chunks} == {PUBLIC_8B}
    usages = [c.usage for c in chunks if c.usage is not None]
    assert len(usages) == 1 and chunks[-1].usage is usages[0]
    assert usages[0].completion_tokens == M
    assert usages[0].prompt_tokens == reference.usage.prompt_tokens
    assert usages[0].total_tokens == M + reference.usage.prompt_tokens
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert sum(d.role is not None for d in deltas) == 1
    assert "".join(d.content or "" for d in deltas) == _expected(M)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and not any(finishes[:-1])
    _check_decision(gw, serving)


def test_a_completions_stream_survives_its_engine_being_killed(
        fleet: dict[str, Proc]) -> None:
    gw = fleet["gw"]
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
    prompt = "Once upon a time,"
    reference = client.completions.create(model=PUBLIC_8B, prompt=prompt, max_tokens=2)
    assert reference.usage is not None

    def open_stream() -> object:
        return client.completions.with_streaming_response.create(
            model=PUBLIC_8B, prompt=prompt, max_tokens=M, stream=True,
            stream_options={"include_usage": True})

    chunks, serving = _break_mid_stream(fleet, open_stream)
    assert len({c.id for c in chunks}) == 1
    usages = [c.usage for c in chunks if c.usage is not None]
    assert len(usages) == 1 and usages[0].completion_tokens == M
    assert usages[0].prompt_tokens == reference.usage.prompt_tokens
    assert "".join(c.choices[0].text for c in chunks if c.choices) == _expected(M)
    _check_decision(gw, serving)
