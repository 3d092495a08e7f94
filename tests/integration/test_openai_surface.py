"""The rest of the OpenAI surface, with the official SDKs, unchanged, against `fleetgate serve`.

- ``/openapi.json`` is a valid OpenAPI document (openapi-spec-validator) listing the OpenAI,
  admin and registration routes with their schemas; ``/docs`` answers.
- ``client.responses.create`` (stream and non-stream, usage present) over emulated vLLM and
  SGLang pools; ``client.embeddings.create`` on a pool that serves embeddings; the
  ``anthropic`` SDK's ``messages.create`` (stream and non-stream) on both flavours (vLLM and
  SGLang both serve the Messages API).
- LangChain's ``ChatOpenAI`` (invoke, stream, with_structured_output, bind_tools) against the
  embedded default fleet (what ``make run`` starts).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest
from openapi_spec_validator import validate
from pydantic import BaseModel

from procs import PUBLIC_8B, SERVED_8B, Proc, pool, spawn_emulator, spawn_gateway

EMBED_PUBLIC, EMBED_SERVED = "bge-large-en", "BAAI/bge-large-en-v1.5"
POOLS = {"h100-vllm", "mi300x-sglang"}


@pytest.fixture(scope="module")
def surface(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    """vLLM (H100) and SGLang (MI300X) pools for chat-like APIs, plus an embeddings pool."""
    vllm = spawn_emulator("vllm", "h100", [SERVED_8B])
    sglang = spawn_emulator("sglang", "mi300x", [SERVED_8B])
    embed = spawn_emulator("vllm", "mi300x", [EMBED_SERVED])
    embed_pool = pool("mi300x-embed", "mi300x", "vllm", 1.99, [embed.url],
                      {EMBED_PUBLIC: EMBED_SERVED}) | {"apis": ["embeddings"]}
    config = {"pools": [
        pool("h100-vllm", "h100", "vllm", 2.95, [vllm.url], {PUBLIC_8B: SERVED_8B}),
        pool("mi300x-sglang", "mi300x", "sglang", 1.99, [sglang.url], {PUBLIC_8B: SERVED_8B}),
        embed_pool]}
    gw = spawn_gateway(config, tmp_path_factory.mktemp("surface"))
    yield gw
    for proc in (gw, vllm, sglang, embed):
        proc.stop()


def _client(gw: Proc) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)


def test_openapi_document_is_valid_and_lists_the_contract(surface: Proc) -> None:
    doc = httpx.get(surface.url + "/openapi.json").json()
    validate(doc)
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings",
                 "/v1/messages", "/v1/models", "/admin/endpoints", "/admin/decisions",
                 "/admin/costs", "/admin/reload", "/admin/endpoints/{endpoint_id}",
                 "/health", "/version"):
        assert path in doc["paths"], path
    schemas = doc["components"]["schemas"]
    assert {"ChatCompletionRequest", "EndpointsReport", "RegistrationBody",
            "ErrorEnvelope"} <= set(schemas)
    docs = httpx.get(surface.url + "/docs")
    assert docs.status_code == 200 and "swagger" in docs.text.lower()


def test_bad_admin_input_is_a_400_envelope(surface: Proc) -> None:
    resp = httpx.get(surface.url + "/admin/decisions", params={"limit": "lots"})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "query.limit"
    resp = httpx.post(surface.url + "/admin/endpoints", content=b"{nope",
                      headers={"content-type": "application/json"})
    assert resp.status_code == 400 and set(resp.json()) == {"error"}


def test_responses_non_stream_on_both_engines(surface: Proc) -> None:
    client, seen = _client(surface), set()
    for _ in range(2):
        raw = client.responses.with_raw_response.create(
            model=PUBLIC_8B, input="Say something about GPUs.", max_output_tokens=6)
        seen.add(raw.headers["x-fleetgate-pool"])
        resp = raw.parse()
        assert resp.model == PUBLIC_8B and resp.output_text
        assert resp.usage is not None and resp.usage.output_tokens == 6
        assert resp.usage.input_tokens > 0
    assert seen == POOLS


def test_responses_stream_on_both_engines(surface: Proc) -> None:
    client = _client(surface)
    for _ in range(2):
        events = list(client.responses.create(model=PUBLIC_8B, input="Hello", stream=True,
                                              max_output_tokens=5))
        kinds = [e.type for e in events]
        # max_output_tokens cuts the answer: both engines then end with response.incomplete
        assert kinds[0] == "response.created" and kinds[-1] == "response.incomplete"
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert text
        done = events[-1].response
        assert done.usage is not None and done.usage.output_tokens == 5
        assert done.model == PUBLIC_8B


def test_embeddings(surface: Proc) -> None:
    raw = _client(surface).embeddings.with_raw_response.create(
        model=EMBED_PUBLIC, input=["fleet", "gateway"])
    assert raw.headers["x-fleetgate-pool"] == "mi300x-embed"
    resp = raw.parse()
    assert len(resp.data) == 2 and len(resp.data[0].embedding) > 0
    assert resp.model == EMBED_PUBLIC and resp.usage.prompt_tokens > 0


def test_a_model_not_served_over_an_api_is_a_400(surface: Proc) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        _client(surface).embeddings.create(model=PUBLIC_8B, input="x")
    assert "embeddings" in str(err.value)


def test_anthropic_messages_non_stream_and_stream(surface: Proc) -> None:
    client = anthropic.Anthropic(base_url=surface.url, api_key="unused", max_retries=0)
    msg = client.messages.create(model=PUBLIC_8B, max_tokens=6,
                                 messages=[{"role": "user", "content": "Hello"}])
    assert msg.model == PUBLIC_8B and msg.content[0].type == "text"
    assert msg.usage.output_tokens == 6 and msg.usage.input_tokens > 0
    with client.messages.stream(model=PUBLIC_8B, max_tokens=5,
                                messages=[{"role": "user", "content": "Hi"}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.usage.output_tokens == 5


# -- LangChain against the embedded default fleet ----------------------------------------------
@pytest.fixture(scope="module")
def default_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    from fleetgate.config import default_config_path

    gw = spawn_gateway(default_config_path(), tmp_path_factory.mktemp("default"))
    yield gw
    gw.stop()


class Verdict(BaseModel):
    vendor: str
    gpus: int
    recommended: bool


def _chat(gw: Proc):  # type: ignore[no-untyped-def]
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(model=PUBLIC_8B, base_url=gw.url + "/v1", api_key="unused",
                      max_retries=0, max_tokens=24)


def test_langchain_invoke_and_stream(default_fleet: Proc) -> None:
    chat = _chat(default_fleet)
    assert chat.invoke("Say hi").content
    assert "".join(str(c.content) for c in chat.stream("Say hi"))


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_structured_output(default_fleet: Proc, method: str) -> None:
    verdict = _chat(default_fleet).with_structured_output(Verdict, method=method).invoke(
        "Which GPU vendor should we buy?")
    assert isinstance(verdict, Verdict)


def test_langchain_bind_tools(default_fleet: Proc) -> None:
    def gpu_price(gpu: str, hours: int) -> float:
        """Price of renting a GPU for some hours."""
        return 2.0 * hours

    reply = _chat(default_fleet).bind_tools([gpu_price], tool_choice="gpu_price").invoke(
        "What do 3 hours of MI300X cost?")
    call = reply.tool_calls[0]
    assert call["name"] == "gpu_price"
    assert isinstance(call["args"]["gpu"], str) and isinstance(call["args"]["hours"], int)
    json.dumps(call["args"])
