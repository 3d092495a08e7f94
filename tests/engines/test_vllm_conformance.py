"""One conformance suite, two targets: the emulator's vLLM flavour and a real vLLM (CPU build).

Every test runs against both (``target``), straight at the engine (no gateway), and asserts
what the *real* vLLM does: the shared checks of ``tests/engine_contract.py`` on the raw SSE
bytes, error bodies and ``/metrics``, plus the vLLM-flavour rules of
``tests/integration/test_emulator.py`` written so that they hold for any model. Where the
emulator differs, the test is a strict xfail on the emulator target with the difference as
the reason: fixing the emulator turns it into an XPASS failure that says to drop the marker.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest
from engines_harness import MAX_MODEL_LEN, SERVED, vllm_metrics, wait_for

from engine_contract import (
    HEX16,
    assert_metrics_parse,
    assert_vllm_chat_stream_shape,
    assert_vllm_completion_stream_shape,
    assert_vllm_error_body,
    split_frames,
)
from fleetgate.backends.metrics import parse_engine_metrics

MESSAGES = [{"role": "user", "content": "Say something about GPUs."}]
CHAT = {"model": SERVED, "messages": MESSAGES}
LONG = MAX_MODEL_LEN - 24  # a generation that outlasts the look a test takes at it


@dataclass(frozen=True)
class Target:
    name: str  # "emulator" | "vllm"
    url: str


@pytest.fixture(params=["emulator", "vllm"])
def target(request: pytest.FixtureRequest) -> Target:
    if request.param == "vllm":
        return Target("vllm", request.getfixturevalue("real").url)
    return Target("emulator", request.getfixturevalue("emulated").url)


def emulator_differs(request: pytest.FixtureRequest, target: Target, reason: str) -> None:
    if target.name == "emulator":
        request.applymarker(pytest.mark.xfail(strict=True, reason=f"emulator differs: {reason}"))


def post(target: Target, body: dict[str, Any], path: str = "/v1/chat/completions",
         **kw: Any) -> httpx.Response:
    return httpx.post(target.url + path, json=body, timeout=60, **kw)


# -- discovery and health --------------------------------------------------------------------
def test_models_card(target: Target) -> None:
    cards = httpx.get(target.url + "/v1/models", timeout=10).json()
    assert cards["object"] == "list" and len(cards["data"]) == 1
    card = cards["data"][0]
    assert card["id"] == SERVED and card["object"] == "model" and card["owned_by"] == "vllm"
    assert card["max_model_len"] == MAX_MODEL_LEN and card["parent"] is None and card["root"]
    assert card["permission"][0]["object"] == "model_permission"


def test_health_version_load(target: Target) -> None:
    health = httpx.get(target.url + "/health", timeout=10)
    assert health.status_code == 200 and health.content == b""
    assert isinstance(httpx.get(target.url + "/version", timeout=10).json()["version"], str)
    assert httpx.get(target.url + "/load", timeout=10).json() == {"server_load": 0}


# -- streams ---------------------------------------------------------------------------------
@pytest.mark.parametrize("include_usage", [False, True])
def test_chat_stream(target: Target, include_usage: bool) -> None:
    body = CHAT | {"max_tokens": 5, "stream": True,
                   "stream_options": {"include_usage": include_usage}}
    resp = post(target, body)
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "text/event-stream; charset=utf-8"
    frames = split_frames(resp.content)
    summary = assert_vllm_chat_stream_shape(frames, include_usage=include_usage)
    assert re.fullmatch(r"chatcmpl-" + HEX16.pattern, summary.id)
    assert summary.model == SERVED and summary.finish_reason == "length" and summary.text
    chunks = [orjson.loads(f[6:]) for f in frames[:-1]]
    token_chunks = [c for c in chunks[1:] if c["choices"]]
    # One chunk per token, the finish riding on the last. Real vLLM skips a token whose text
    # is still empty (a byte of an unfinished UTF-8 character, which the random tiny model
    # can pick when a concurrent batch shifts its CPU arithmetic), so it may send fewer.
    last = token_chunks[-1]["choices"][0]
    assert last["finish_reason"] == "length"
    if target.name == "emulator":
        assert len(token_chunks) == 5 and last["delta"]["content"] != ""
    else:
        assert 1 <= len(token_chunks) <= 5, token_chunks
    if include_usage:
        assert summary.usage is not None and summary.usage["completion_tokens"] == 5
        assert summary.usage["prompt_tokens"] > 0


@pytest.mark.parametrize("include_usage", [False, True])
def test_continuous_usage_only_with_include_usage(target: Target, include_usage: bool) -> None:
    options = {"include_usage": include_usage, "continuous_usage_stats": True}
    resp = post(target, CHAT | {"max_tokens": 3, "stream": True, "stream_options": options})
    chunks = [orjson.loads(f[6:]) for f in split_frames(resp.content)[:-1]]
    with_usage = [c for c in chunks if c.get("usage")]
    assert len(with_usage) == (len(chunks) if include_usage else 0)


def test_completions_stream_and_plain(target: Target) -> None:
    body = {"model": SERVED, "prompt": "Once upon a time", "max_tokens": 4}
    resp = post(target, body | {"stream": True, "stream_options": {"include_usage": True}},
                path="/v1/completions")
    summary = assert_vllm_completion_stream_shape(split_frames(resp.content),
                                                  include_usage=True)
    assert summary.finish_reason == "length" and summary.usage is not None
    assert summary.usage["completion_tokens"] == 4
    plain = post(target, body, path="/v1/completions").json()
    assert plain["object"] == "text_completion"
    assert re.fullmatch(r"cmpl-" + HEX16.pattern, plain["id"])
    assert plain["choices"][0]["text"] == summary.text  # greedy / deterministic on both
    assert plain["usage"]["prompt_tokens"] == summary.usage["prompt_tokens"]
    assert plain["usage"]["completion_tokens"] == 4


def test_chat_non_stream(target: Target) -> None:
    resp = post(target, CHAT | {"max_tokens": 7})
    assert resp.status_code == 200 and resp.headers["content-type"] == "application/json"
    body = resp.json()
    assert body["object"] == "chat.completion" and body["model"] == SERVED
    assert re.fullmatch(r"chatcmpl-" + HEX16.pattern, body["id"])
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"]
    assert choice["finish_reason"] == "length" and "stop_reason" in choice
    usage = body["usage"]
    assert usage["completion_tokens"] == 7
    assert usage["total_tokens"] == usage["prompt_tokens"] + 7


def test_non_stream_answers_carry_the_fingerprint(request: pytest.FixtureRequest,
                                                  target: Target) -> None:
    emulator_differs(request, target, "non-streaming chat and completion answers carry "
                     "system_fingerprint 'vllm-<version>-<hash>'; the emulator sends null")
    chat = post(target, CHAT | {"max_tokens": 2}).json()
    comp = post(target, {"model": SERVED, "prompt": "x", "max_tokens": 2},
                path="/v1/completions").json()
    assert str(chat["system_fingerprint"]).startswith("vllm-")
    assert str(comp["system_fingerprint"]).startswith("vllm-")


def test_stream_chunk_fields(request: pytest.FixtureRequest, target: Target) -> None:
    emulator_differs(request, target, "vLLM 0.32 token chunks have no 'kv_transfer_params' and "
                     "no choice 'weight_versions' (the emulator, after the 0.33 reading, sends "
                     "both as null)")
    for path, body in (("/v1/chat/completions", CHAT),
                       ("/v1/completions", {"model": SERVED, "prompt": "x"})):
        resp = post(target, body | {"max_tokens": 3, "stream": True}, path=path)
        chunks = [orjson.loads(f[6:]) for f in split_frames(resp.content)[:-1]]
        for chunk in chunks:
            assert "kv_transfer_params" not in chunk
            assert all("weight_versions" not in c for c in chunk["choices"])


def test_request_id_header_becomes_the_response_id(target: Target) -> None:
    resp = post(target, CHAT | {"max_tokens": 2}, headers={"x-request-id": "conformance-1"})
    assert resp.json()["id"] == "chatcmpl-conformance-1"


# -- errors ----------------------------------------------------------------------------------
def test_unknown_model_is_404(target: Target) -> None:
    resp = post(target, CHAT | {"model": "gpt-4"})
    err = assert_vllm_error_body(resp.content, status=404)
    assert resp.status_code == 404 and err["type"] == "NotFoundError" and err["param"] == "model"
    assert "does not exist" in err["message"]


def test_max_tokens_beyond_the_context_is_400(target: Target) -> None:
    resp = post(target, CHAT | {"max_tokens": MAX_MODEL_LEN + 44})
    err = assert_vllm_error_body(resp.content, status=400)
    assert resp.status_code == 400 and err["param"] == "max_tokens"
    assert err["type"] == "BadRequestError"


def test_prompt_beyond_the_context_is_400(target: Target) -> None:
    long = {"role": "user", "content": "hello world " * MAX_MODEL_LEN}
    resp = post(target, CHAT | {"messages": [long]})
    err = assert_vllm_error_body(resp.content, status=400)
    assert resp.status_code == 400 and err["param"] == "input_tokens"
    assert f"maximum context length is {MAX_MODEL_LEN} tokens" in err["message"]


def test_output_is_clamped_to_the_context(target: Target) -> None:
    def prompt_tokens(reps: int, max_tokens: int = 1) -> dict[str, int]:
        prompt = {"role": "user", "content": "hello world " * reps}
        return dict(post(target, CHAT | {"messages": [prompt], "max_tokens": max_tokens})
                    .json()["usage"])

    # a prompt ~40 tokens short of the context (each target has its own tokenizer)
    p100, p200 = prompt_tokens(100)["prompt_tokens"], prompt_tokens(200)["prompt_tokens"]
    per_rep = (p200 - p100) / 100
    reps = int(100 + (MAX_MODEL_LEN - 40 - p100) / per_rep)
    usage = prompt_tokens(reps, max_tokens=100)
    assert MAX_MODEL_LEN - 100 < usage["prompt_tokens"] < MAX_MODEL_LEN
    assert usage["prompt_tokens"] + usage["completion_tokens"] == MAX_MODEL_LEN


def test_stream_options_without_stream_is_400(request: pytest.FixtureRequest,
                                              target: Target) -> None:
    emulator_differs(request, target, "vLLM 0.32 answers param 'stream_options' and appends "
                     "' (parameter=stream_options)' to the message; the emulator says param "
                     "null and no suffix")
    resp = post(target, CHAT | {"stream": False, "stream_options": {"include_usage": True}})
    err = assert_vllm_error_body(resp.content, status=400)
    assert err["message"].startswith("Stream options can only be defined when `stream=True`.")
    assert err["param"] == "stream_options"


BAD_BODIES = [
    ("malformed json", b"{not json", "application/json", "Bad Request", None),
    ("no content type", b'{"model": "tiny-llama"}', None, "Bad Request", None),
    ("empty messages", b'{"model": "tiny-llama", "messages": []}', "application/json",
     "BadRequestError", "the emulator answers type 'Bad Request' (vLLM: 'BadRequestError', "
     "message 'Cannot apply chat template to an empty conversation. ...')"),
]


@pytest.mark.parametrize(("name", "content", "ctype", "type_", "difference"), BAD_BODIES,
                         ids=[b[0] for b in BAD_BODIES])
def test_bad_bodies_are_400(request: pytest.FixtureRequest, target: Target, name: str,
                            content: bytes, ctype: str | None, type_: str,
                            difference: str | None) -> None:
    if difference:
        emulator_differs(request, target, difference)
    headers = {"content-type": ctype} if ctype else {}
    resp = httpx.post(target.url + "/v1/chat/completions", content=content, timeout=10,
                      headers=headers)
    assert resp.status_code == 400
    assert assert_vllm_error_body(resp.content, status=400)["type"] == type_


# -- metrics and cancellation ----------------------------------------------------------------
# Families engines.md §1.1-1.2 lists for a single-API-server vLLM with default flags.
FAMILIES = {
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total",
    "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds", "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total",
    "vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds", "vllm:cache_config_info", "http_requests_total",
    "http_request_duration_seconds",
}


def test_metrics_families(request: pytest.FixtureRequest, target: Target) -> None:
    emulator_differs(request, target, "the emulator has no vllm:request_queue_time_seconds, "
                     "request_prefill/decode_time_seconds, cache_config_info (nor the other "
                     "request_* histograms, prompt_tokens_cached*, estimated_*_per_gpu) and "
                     "none of the instrumentator's http_* families")
    text = httpx.get(target.url + "/metrics", timeout=10).text
    present = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    assert present >= FAMILIES, f"missing: {sorted(FAMILIES - present)}"


def test_metrics_parse_and_count_a_request(target: Target) -> None:
    assert_metrics_parse(httpx.get(target.url + "/metrics", timeout=10).text, "vllm")
    before = vllm_metrics(target.url)
    post(target, CHAT | {"max_tokens": 6})
    length = 'vllm:request_success_total{finished_reason="length"}'
    after = wait_for(lambda: (m := vllm_metrics(target.url))[length] > before[length] and m,
                     10, "the request to be counted")
    assert after[length] == before[length] + 1
    assert after["vllm:generation_tokens_total"] == before["vllm:generation_tokens_total"] + 6
    assert after["vllm:prompt_tokens_total"] > before["vllm:prompt_tokens_total"]


def test_metrics_ignore_a_name_filter(target: Target) -> None:
    """``?name[]=`` (prometheus_client's filter) changes nothing: vLLM's ``/metrics`` route is
    prometheus-fastapi-instrumentator's, ahead of the prometheus_client app it also mounts,
    and sends the whole exposition. So the collector asks for it whole and parses only the
    lines it reads (``state/collector.py``); the emulator answers the same."""
    whole = httpx.get(target.url + "/metrics", timeout=10).text
    asked = httpx.get(target.url + "/metrics?name%5B%5D=vllm%3Anum_requests_running",
                      timeout=10).text

    def families(text: str) -> set[str]:
        return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}

    assert families(asked) == families(whole)
    assert "vllm:num_requests_waiting" in families(asked)
    assert parse_engine_metrics(asked, "vllm").waiting is not None


def _disconnect_mid_stream(target: Target) -> tuple[dict[str, float], dict[str, float]]:
    """Metrics before and after a streaming client leaves after a few tokens of LONG.

    The client leaves at once: on 2 busy cores vLLM's ``/metrics`` can take seconds to
    answer while it generates, long enough for the whole generation to end first."""
    before = vllm_metrics(target.url)
    body = {"model": SERVED, "prompt": "Once", "max_tokens": LONG, "stream": True}
    with httpx.stream("POST", target.url + "/v1/completions", json=body, timeout=30) as resp:
        lines = resp.iter_lines()
        for _ in range(6):
            next(lines)
    wait_for(lambda: vllm_metrics(target.url)["vllm:num_requests_running"] == 0, 30,
             "the engine to drop the request")
    return before, vllm_metrics(target.url)


def test_client_disconnect_aborts_the_request(target: Target) -> None:
    before, after = _disconnect_mid_stream(target)
    generated = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    assert 0 < generated < LONG, "the engine kept generating for a client that left"


def test_client_disconnect_is_not_a_finished_request(request: pytest.FixtureRequest,
                                                     target: Target) -> None:
    emulator_differs(request, target, "vLLM does not count a client disconnect in "
                     "request_success_total{finished_reason=\"abort\"}; the emulator does")
    before, after = _disconnect_mid_stream(target)
    abort = 'vllm:request_success_total{finished_reason="abort"}'
    assert after[abort] == before[abort]


def test_natural_stop_counts_the_eos_token(request: pytest.FixtureRequest,
                                           target: Target) -> None:
    if target.name == "emulator":
        pytest.skip("the emulator has no logits: its natural stop comes after 16 tokens")
    eos = str(request.getfixturevalue("real").facts["eos_token_id"])
    body = CHAT | {"max_tokens": 20, "logit_bias": {eos: 100}}
    plain = post(target, body).json()
    assert plain["choices"][0]["finish_reason"] == "stop"
    assert plain["choices"][0]["message"]["content"] == ""
    assert plain["usage"]["completion_tokens"] == 1  # the EOS is counted, not shown
    frames = split_frames(post(target, body | {"stream": True}).content)
    summary = assert_vllm_chat_stream_shape(frames, include_usage=False)
    assert summary.finish_reason == "stop" and summary.text == ""
