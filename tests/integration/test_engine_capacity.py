"""Capacity from the engines, end to end: emulated vLLM and SGLang engines started with a
context and KV cache other than the catalog's guess, a real ``fleetgate serve`` in front
(its config says nothing about either), the official ``openai`` SDK over real HTTP.

The gateway reads each engine's report at the first contact (before it is ready), so
``/admin/endpoints`` shows the engines' figures; a request longer than every endpoint's
context gets OpenAI's 400 ``context_length_exceeded`` (which SDKs do not retry), not a 503.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from fleetgate.catalog.gpus import GPUS
from fleetgate.catalog.models import MODEL_PROFILES
from fleetgate.catalog.roofline import kv_capacity_tokens
from procs import PUBLIC_8B, SERVED_8B, Proc, pool, spawn_emulator, spawn_gateway, wait_for

P8B = MODEL_PROFILES["llama-3.1-8b"]
VLLM_KV = kv_capacity_tokens(GPUS["h100"], P8B, 2) // 16 * 16  # tp 2: whole 16-token blocks
SGLANG_KV = kv_capacity_tokens(GPUS["mi300x"], P8B, 1)
REASON = "the request exceeds every endpoint's context"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    engines = [
        spawn_emulator("vllm", "h100", [SERVED_8B], extra=["--tp", "2", "--max-model-len",
                                                           "2048"]),
        spawn_emulator("sglang", "mi300x", [SERVED_8B], extra=["--max-model-len", "3072",
                                                               "--max-num-seqs", "64"]),
    ]
    gateway = None
    try:
        config = {"pools": [  # one GPU a replica, no max_model_len: the prior guesses 8192
            pool("h100-vllm", "h100", "vllm", 2.95, [engines[0].url], {PUBLIC_8B: SERVED_8B}),
            pool("mi300x-sglang", "mi300x", "sglang", 1.99, [engines[1].url],
                 {PUBLIC_8B: SERVED_8B}),
        ]}
        gateway = spawn_gateway(config, tmp_path_factory.mktemp("capacity"))
        yield gateway
    finally:
        if gateway is not None:
            gateway.stop()
        for engine in engines:
            engine.stop()


def _endpoints(gateway: Proc) -> dict[str, dict]:
    rows = httpx.get(gateway.url + "/admin/endpoints", timeout=10).json()["endpoints"]
    return {row["pool"]: row for row in rows}


def test_the_gateway_shows_what_the_engines_report(fleet: Proc) -> None:
    rows = wait_for(lambda: (r := _endpoints(fleet)) and all(
        row["reported_capacity"] for row in r.values()) and r, 10.0, "capacity reports")
    vllm, sglang = rows["h100-vllm"], rows["mi300x-sglang"]
    assert vllm["max_model_len"] == 2048 and sglang["max_model_len"] == 3072
    assert vllm["kv_capacity_tokens"] == VLLM_KV  # not the tp-1 guess of the config
    assert vllm["kv_capacity_tokens"] > 1.5 * kv_capacity_tokens(GPUS["h100"], P8B, 1)
    assert sglang["kv_capacity_tokens"] == SGLANG_KV
    assert sglang["max_batch"] == 64 and vllm["max_batch"] == 256  # vLLM: the prior's
    assert vllm["reported_capacity"]["block_size"] == 16
    assert sglang["reported_capacity"]["architecture"] == "LlamaForCausalLM"
    assert vllm["prior_profile"] == "llama-3.1-8b"


def _context_decisions(gateway: Proc) -> int:
    body = httpx.get(gateway.url + "/admin/decisions?limit=200", timeout=10).json()
    return sum(1 for d in body["decisions"] if d["reason"] == REASON)


def test_a_request_no_context_holds_is_a_400_with_param(fleet: Proc) -> None:
    client = openai.OpenAI(base_url=fleet.url + "/v1", api_key="none", max_retries=2)
    long_text = "word " * 3500  # ~4,400 tokens: over 3,072, the longest context of the fleet
    before = _context_decisions(fleet)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=PUBLIC_8B, max_tokens=100,
                                       messages=[{"role": "user", "content": long_text}])
    err = caught.value
    assert err.status_code == 400 and err.code == "context_length_exceeded"
    assert err.param == "messages"
    assert err.body["type"] == "invalid_request_error"  # type: ignore[index]
    assert "maximum context length is 3072 tokens" in err.message
    assert _context_decisions(fleet) == before + 1  # asked once: the SDK did not retry

    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=PUBLIC_8B, prompt=long_text, max_tokens=10)
    assert caught.value.code == "context_length_exceeded" and caught.value.param == "prompt"


def test_a_request_one_engine_holds_goes_there(fleet: Proc) -> None:
    client = openai.OpenAI(base_url=fleet.url + "/v1", api_key="none", max_retries=0)
    text = "word " * 2000  # ~2,500 tokens + 100: only SGLang's 3,072 holds it
    raw = client.chat.completions.with_raw_response.create(
        model=PUBLIC_8B, max_tokens=100, messages=[{"role": "user", "content": text}])
    assert raw.headers["x-fleetgate-pool"] == "mi300x-sglang"
