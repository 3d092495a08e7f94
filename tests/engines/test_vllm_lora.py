"""Issue 25 item 2 on a real vLLM (CPU): LoRA adapters made here, served by vLLM, routed.

Two tiny adapters are made in the test with ``peft`` (``LoraConfig(r=8, q_proj/v_proj)`` on
the tiny Llama, random weights so that they change the answers) by the engine venv's
python, offline. vLLM starts with ``--enable-lora --lora-modules sql=...`` and
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``; a ``fleetgate serve`` has one pool on it that
declares both adapters (``sql`` with ``preload: false``: the gateway learns from vLLM's
``/v1/models`` that it is there; ``chat`` with its path, loaded at run time). Through the
gateway with the ``openai`` SDK: ``/v1/models`` lists both with their parent; ``sql``
answers with the adapter applied (a greedy answer differs from the base model's); ``chat``
is loaded by the gateway on the first request, once for 8 concurrent ones (vLLM's own log
says how often it loaded it); vLLM then lists it and reports ``vllm:lora_requests_info``.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from procs import Proc, free_port, spawn_gateway, wait_for

SERVED, BASE = "tiny-llama", "tiny"
START_TIMEOUT_S = 300.0
MAKE_ADAPTER = """
import sys
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
for out, seed in zip(sys.argv[2:], range(1, 100)):
    import torch
    torch.manual_seed(seed)
    lora = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, init_lora_weights=False,
                                            target_modules=["q_proj", "v_proj"]))
    lora.save_pretrained(out)
    model = lora.unload()
print("adapters made")
"""


@dataclass
class LoraVllm:
    url: str
    log: Path
    adapters: dict[str, Path]
    gateway: Proc

    def loads_logged(self, name: str) -> int:
        text = self.log.read_text(errors="replace")
        return text.count(f"Loaded new LoRA adapter: name '{name}'")


def _env_path(name: str) -> Path:
    value = os.environ.get(name)
    if not value or not Path(value).exists():
        pytest.fail(f"{name} must point at an existing path (set by `make test-engines`)")
    return Path(value)


@pytest.fixture(scope="module")
def lora_vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoraVllm]:
    model = _env_path("FLEETGATE_TINY_MODEL")
    python = str(_env_path("FLEETGATE_ENGINE_PYTHON"))
    tmp = tmp_path_factory.mktemp("lora-vllm")
    adapters = {name: tmp / name for name in ("sql", "chat", "extra")}
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    made = subprocess.run([python, "-c", MAKE_ADAPTER, str(model),
                           *(str(p) for p in adapters.values())],
                          env=env, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, f"peft could not make the adapters:\n{made.stderr[-3000:]}"
    port = free_port()
    log = tmp / "vllm.log"
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
           "--served-model-name", SERVED, "--host", "127.0.0.1", "--port", str(port),
           "--dtype", "float32", "--max-model-len", "1024", "--enforce-eager",
           "--enable-lora", "--max-loras", "2", "--max-lora-rank", "8",
           "--lora-modules", f"sql={adapters['sql']}"]
    with log.open("wb") as out:
        popen = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True,
                                 env={**env, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
                                      "VLLM_CPU_KVCACHE_SPACE": "1"})
    url = f"http://127.0.0.1:{port}"
    gateway = None
    try:
        wait_for(lambda: popen.poll() is not None or _up(url), START_TIMEOUT_S,
                 "vLLM with LoRA to start", interval=1.0)
        assert popen.poll() is None, f"vLLM exited:\n{log.read_text(errors='replace')[-4000:]}"
        config = {"pools": [{
            "name": "cpu-vllm", "accelerator": "cpu", "engine": "vllm",
            "price_per_gpu_hour": 0.05, "endpoints": [url], "models": {BASE: SERVED},
            "max_model_len": 1024, "load_adapters": True, "max_adapters": 2,
            "adapters": [{"name": "sql", "path": str(adapters["sql"]), "preload": False},
                         {"name": "chat", "path": str(adapters["chat"])},
                         {"name": "extra", "path": str(adapters["extra"])}]}]}
        gateway = spawn_gateway(config, tmp, env={"FLEETGATE_REQUEST_LOG": "off"})
        yield LoraVllm(url, log, adapters, gateway)
    finally:
        if gateway is not None:
            gateway.stop()
        popen.terminate()
        try:
            popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(popen.pid, 9)
            popen.wait(timeout=10)


def _up(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _client(engine: LoraVllm) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=engine.gateway.url + "/v1", api_key="none",
                              max_retries=0, timeout=120)


async def _greedy(client: openai.AsyncOpenAI, model: str) -> tuple[str, str, str]:
    """(the answer's model, its text, the endpoint) of a greedy 8-token completion."""
    raw = await client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "tell me a story"}],
        max_tokens=8, temperature=0)
    answer = raw.parse()
    return answer.model, answer.choices[0].message.content or "", \
        raw.headers["x-fleetgate-endpoint"]


async def test_models_list_the_adapters_with_their_parent(lora_vllm: LoraVllm) -> None:
    cards = {m.id: m for m in (await _client(lora_vllm).models.list()).data}
    assert {BASE, "sql", "chat", "extra"} <= set(cards)
    for name in ("sql", "chat", "extra"):
        assert (cards[name].model_extra or {})["parent"] == BASE


async def test_a_startup_adapter_is_routed_and_applied(lora_vllm: LoraVllm) -> None:
    client = _client(lora_vllm)
    base_model, base_text, _ = await _greedy(client, BASE)
    model, text, endpoint = await _greedy(client, "sql")
    assert (base_model, model, endpoint) == (BASE, "sql", "cpu-vllm-0")
    assert text != base_text  # vLLM ran the adapter's weights, not the base model's
    assert lora_vllm.loads_logged("sql") == 1  # the startup load; the gateway loaded nothing


async def test_an_unloaded_adapter_is_loaded_once_for_concurrent_requests(
        lora_vllm: LoraVllm) -> None:
    client = _client(lora_vllm)
    answers = await asyncio.gather(*(_greedy(client, "chat") for _ in range(8)))
    assert {model for model, _, _ in answers} == {"chat"}
    assert len({text for _, text, _ in answers}) == 1  # greedy: one answer, one adapter
    assert lora_vllm.loads_logged("chat") == 1
    cards = httpx.get(lora_vllm.url + "/v1/models", timeout=5).json()["data"]
    assert {c["id"]: c["parent"] for c in cards}["chat"] == SERVED


async def test_the_limit_unloads_the_least_recently_used(lora_vllm: LoraVllm) -> None:
    client = _client(lora_vllm)
    await _greedy(client, "chat")  # chat used last: sql is the least recently used
    model, _, _ = await _greedy(client, "extra")  # a third adapter on a 2-adapter endpoint
    assert model == "extra"
    held = {c["id"] for c in httpx.get(lora_vllm.url + "/v1/models", timeout=5).json()["data"]
            if c.get("parent")}
    assert held == {"chat", "extra"}


def test_vllm_reports_lora_requests_info(lora_vllm: LoraVllm) -> None:
    text = httpx.get(lora_vllm.url + "/metrics", timeout=5).text
    lines = [ln for ln in text.splitlines() if ln.startswith("vllm:lora_requests_info{")]
    assert lines and all('max_lora="2"' in ln for ln in lines)
    assert any('running_lora_adapters="chat"' in ln or 'running_lora_adapters="sql"' in ln
               for ln in lines)
    time.sleep(0)  # nothing timed
