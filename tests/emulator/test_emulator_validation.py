"""The emulated engines reject wrong-typed request fields as vLLM 0.33 and SGLang 0.5.23 do:
a 400 in the engine's own shape, never a 500 (issue 24 item 1; docs/engines.md §7).

Before: ``tools: 5`` crashed the emulator's output planner (HTTP 500) and ``temperature:
"hot"`` was answered 200, so tests against emulators could not see what real engines say."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from wire_helpers import MODEL

BASE = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}


def _post(url: str, path: str, **extra: Any) -> httpx.Response:
    body = {**BASE, **extra}
    if path == "/v1/completions":
        body.pop("messages")
        body["prompt"] = "x"
    return httpx.post(url + path, json=body, timeout=30)


@pytest.mark.parametrize("extra", [{"tools": 5}, {"tools": -1}, {"tools": True},
                                   {"temperature": "hot"}, {"response_format": 5},
                                   {"stop": 5}, {"stream_options": []},
                                   {"messages": [{"role": "user", "content": 5}]},
                                   {"messages": [{"role": "user",
                                                  "content": [{"type": "bogus"}]}]}])
def test_a_wrong_typed_chat_field_is_the_engines_400(url: str, engine: str,
                                                     extra: dict[str, Any]) -> None:
    resp = _post(url, "/v1/chat/completions", **extra)
    assert resp.status_code == 400, resp.text
    body = resp.json()
    if engine == "vllm":  # nested ErrorResponse from the validation handler
        err = body["error"]
        assert err["type"] == "Bad Request" and err["code"] == 400
        assert err["message"].startswith(("1 validation error", "2 validation errors")) or \
            "validation error" in err["message"]
        assert err["param"].startswith("body")
    else:  # flat ErrorResponse
        assert body["object"] == "error" and body["code"] == 400
        assert "validation error" in body["message"]


def test_vllm_param_names_the_field(url: str, engine: str) -> None:
    err = _post(url, "/v1/chat/completions", tools=5).json()
    if engine == "vllm":
        assert err["error"]["param"] == "body.tools"
        assert "'loc': 'body.tools'" in err["error"]["message"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_sampling_ranges(url: str, engine: str, path: str) -> None:
    hot = _post(url, path, temperature=3)
    if engine == "vllm":
        assert hot.status_code == 400 and hot.json()["error"]["param"] == "temperature"
    else:
        assert hot.status_code == 200  # SGLang checks only temperature >= 0
    assert _post(url, path, top_p=0).status_code == 400
    assert _post(url, path, n=1000).status_code == 200  # both engines allow it


def test_custom_roles(url: str, engine: str) -> None:
    assert _post(url, "/v1/chat/completions",
                 messages=[{"role": "root", "content": "x"}]).status_code == 200
    odd = _post(url, "/v1/chat/completions", messages=[{"role": "hacker", "content": "x"}])
    assert odd.status_code == (200 if engine == "vllm" else 400)


def test_messages_and_responses_fields(url: str, engine: str) -> None:
    msg = _post(url, "/v1/messages", tools=5)
    assert msg.status_code == 400
    if engine == "vllm":
        assert msg.json()["error"]["param"] == "body.tools"
    else:
        assert msg.json() == {"type": "error", "error": {
            "type": "invalid_request_error", "message": "tools: Input should be a valid list"}}
    resp = httpx.post(url + "/v1/responses", json={"model": MODEL, "input": "x",
                                                   "temperature": "hot"}, timeout=30)
    assert resp.status_code == 400 and "error" in resp.json()
