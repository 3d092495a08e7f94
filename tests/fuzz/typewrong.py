"""The type-wrong fuzz profile: every field OpenAI's (and Anthropic's) published request
schemas define, given values of the wrong JSON type or out of range, against real gateways
over real emulated engines (issue 24 item 1).

The field table below is written from the public API references (OpenAI chat completions,
completions, responses, embeddings; Anthropic messages), not from the gateway's own schema,
so a field the gateway forgot to check is still sent. Each case takes a valid base body of
its API and replaces 1-3 fields (top-level or nested: ``messages[0].content``,
``tools[0].function.name``, ...) with a wrong value for that field's type. Counted as
findings:

* ``server_error``: any 500 (or other 5xx besides 502/503/504);
* ``request_502``: a 502/503/504 (an engine's 500 the gateway relays, a poison request):
  the engines validate as vLLM / SGLang do, so a malformed request is a 400 somewhere;
* ``not_envelope``: a non-2xx body that is not ``{"error": {message, type, param, code}}``;
* ``dropped``: a connection reset or a cut body.

May touch: requests. Must not touch: the gateway's code (it is tested from outside).
"""

from __future__ import annotations

import copy
import itertools
import json
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import requests

# field path -> JSON type(s) it takes; "[0]" is the first element of an array
CHAT_FIELDS = {
    "model": "string", "messages": "array", "frequency_penalty": "number",
    "logit_bias": "object", "logprobs": "boolean", "top_logprobs": "integer",
    "max_tokens": "integer", "max_completion_tokens": "integer", "n": "integer",
    "presence_penalty": "number", "response_format": "object", "seed": "integer",
    "service_tier": "string", "stop": "string|array", "stream": "boolean",
    "stream_options": "object", "temperature": "number", "top_p": "number",
    "tools": "array", "tool_choice": "string|object", "parallel_tool_calls": "boolean",
    "user": "string", "store": "boolean", "metadata": "object", "modalities": "array",
    "reasoning_effort": "string", "prediction": "object", "audio": "object",
    "web_search_options": "object", "prompt_cache_key": "string",
    "safety_identifier": "string", "verbosity": "string",
    "messages[0]": "object", "messages[0].role": "string",
    "messages[0].content": "string|array", "messages[0].content[0]": "object",
    "messages[0].content[0].type": "string", "messages[0].content[0].text": "string",
    "messages[0].name": "string", "messages[0].tool_calls": "array",
    "messages[0].tool_call_id": "string",
    "tools[0]": "object", "tools[0].type": "string", "tools[0].function": "object",
    "tools[0].function.name": "string", "tools[0].function.parameters": "object",
    "tools[0].function.description": "string", "tools[0].function.strict": "boolean",
    "response_format.type": "string", "response_format.json_schema": "object",
    "response_format.json_schema.name": "string",
    "response_format.json_schema.schema": "object",
    "stream_options.include_usage": "boolean", "tool_choice.function": "object",
    "tool_choice.function.name": "string",
}
COMPLETIONS_FIELDS = {
    "model": "string", "prompt": "string|array", "best_of": "integer", "echo": "boolean",
    "frequency_penalty": "number", "logit_bias": "object", "logprobs": "integer",
    "max_tokens": "integer", "n": "integer", "presence_penalty": "number", "seed": "integer",
    "stop": "string|array", "stream": "boolean", "stream_options": "object",
    "suffix": "string", "temperature": "number", "top_p": "number", "user": "string",
}
MESSAGES_FIELDS = {
    "model": "string", "messages": "array", "max_tokens": "integer",
    "system": "string|array", "stop_sequences": "array", "stream": "boolean",
    "temperature": "number", "top_p": "number", "top_k": "integer", "tools": "array",
    "tool_choice": "object", "metadata": "object", "thinking": "object",
    "service_tier": "string", "messages[0]": "object", "messages[0].role": "string",
    "messages[0].content": "string|array", "messages[0].content[0].type": "string",
    "messages[0].content[0].text": "string", "tools[0]": "object",
    "tools[0].name": "string", "tools[0].input_schema": "object",
    "tools[0].description": "string",
}
RESPONSES_FIELDS = {
    "model": "string", "input": "string|array", "instructions": "string",
    "max_output_tokens": "integer", "temperature": "number", "top_p": "number",
    "tools": "array", "tool_choice": "string|object", "parallel_tool_calls": "boolean",
    "stream": "boolean", "store": "boolean", "text": "object", "reasoning": "object",
    "metadata": "object", "previous_response_id": "string", "include": "array",
    "truncation": "string", "user": "string", "background": "boolean",
    "max_tool_calls": "integer", "top_logprobs": "integer", "service_tier": "string",
    "input[0]": "object", "input[0].role": "string", "input[0].content": "string|array",
    "tools[0]": "object", "tools[0].type": "string",
}
EMBEDDINGS_FIELDS = {
    "model": "string", "input": "string|array", "encoding_format": "string",
    "dimensions": "integer", "user": "string",
}

TOOL = {"type": "function", "function": {"name": "get_weather", "description": "w",
                                         "parameters": {"type": "object", "properties": {}}}}
APIS: dict[str, tuple[str, dict[str, Any], dict[str, str]]] = {
    "chat": ("/v1/chat/completions", {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "max_tokens": 4, "tools": [TOOL],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}},
        "stream_options": {"include_usage": True}, "stream": True}, CHAT_FIELDS),
    "completions": ("/v1/completions", {"prompt": "hi", "max_tokens": 4}, COMPLETIONS_FIELDS),
    "messages": ("/v1/messages", {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "max_tokens": 4, "tools": [{"name": "f", "input_schema": {"type": "object"}}]},
        MESSAGES_FIELDS),
    "responses": ("/v1/responses", {
        "input": [{"role": "user", "content": "hi"}], "max_output_tokens": 4,
        "tools": [{"type": "function", "name": "f", "parameters": {}}]}, RESPONSES_FIELDS),
    "embeddings": ("/v1/embeddings", {"input": "hi"}, EMBEDDINGS_FIELDS),
}
WRONG: dict[str, list[Any]] = {  # values of the wrong type (or out of range) for each type
    "string": [5, -1, 1.5, True, [], {}, ["x"], {"a": 1}],
    "integer": ["x", "5", 1.5, True, [], {}, -1, 0, 10**6, 10**20, -(10**20)],
    "number": ["hot", "0.5", True, [], {}, -5, 9, 1e308, -1e308],
    "boolean": ["yes", "true", 1, 0, [], {}, 5],
    "array": [5, -1, True, "x", {}, [5], [None], [[]], []],
    "object": [5, -1, True, "x", [], [{}], {"type": 5}, {}],
}
FINDINGS = ("server_error", "request_502", "not_envelope", "dropped")


def wrong_values(kinds: str) -> list[Any]:
    """Wrong values for a field of these types (a union takes each type's; a value right
    for the other type of the union is then merely a valid case)."""
    return [v for kind in kinds.split("|") for v in WRONG[kind]]


def _set(body: dict[str, Any], path: str, value: Any) -> None:
    """Set ``path`` (``a.b[0].c``) in ``body``, creating (or replacing) what is in the way."""
    parts: list[str | int] = []
    for piece in path.split("."):
        name, _, rest = piece.partition("[")
        parts.append(name)
        if rest:
            parts.append(int(rest.rstrip("]")))
    node: Any = body
    for key, nxt in itertools.pairwise(parts):
        want: type = list if isinstance(nxt, int) else dict
        child = _get(node, key)
        if not isinstance(child, want):
            child = want()
            _put(node, key, child)
        node = child
    _put(node, parts[-1], value)


def _get(node: Any, key: str | int) -> Any:
    if isinstance(node, dict):
        return node.get(key)
    return node[key] if isinstance(key, int) and key < len(node) else None


def _put(node: Any, key: str | int, value: Any) -> None:
    if isinstance(node, dict) or (isinstance(key, int) and key < len(node)):
        node[key] = value
    else:
        node.append(value)


def make_case(rng: random.Random, model: dict[str, str]) -> tuple[str, str, dict[str, Any]]:
    api = rng.choice(list(APIS))
    path, base, fields = APIS[api]
    body = json.loads(json.dumps(base))
    body["model"] = model[api]
    if api == "chat" and rng.random() < 0.5:
        body["stream"] = False
        body.pop("stream_options")
    for name in rng.sample(list(fields), rng.choice((1, 1, 2, 3))):
        _set(body, name, copy.deepcopy(rng.choice(wrong_values(fields[name]))))
    return api, path, body


@dataclass
class TypeWrongTally:
    cases: int = 0
    by_status: Counter[int] = field(default_factory=Counter)
    by_api: dict[str, Counter[int]] = field(default_factory=dict)
    findings: dict[str, list[str]] = field(default_factory=lambda: {k: [] for k in FINDINGS})

    def report(self) -> dict[str, Any]:
        return {"cases": self.cases,
                "by_status": {str(k): v for k, v in sorted(self.by_status.items())},
                "by_api": {a: {str(k): v for k, v in sorted(c.items())}
                           for a, c in sorted(self.by_api.items())},
                "findings": {k: len(v) for k, v in self.findings.items()},
                "examples": {k: v[:5] for k, v in self.findings.items() if v}}

    @property
    def clean(self) -> bool:
        return not any(self.findings.values())


def _envelope_ok(raw: bytes) -> bool:
    try:
        err = json.loads(raw)["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return isinstance(err, dict) and {"message", "type", "param", "code"} <= err.keys()


def run_typewrong(gateways: dict[str, tuple[str, dict[str, str]]], model: dict[str, str],
                  cases: int, seed: int = 0, timeout: float = 30.0) -> TypeWrongTally:
    """``gateways``: name -> (base URL, headers to send); ``model``: api -> public model."""
    rng, tally = random.Random(seed), TypeWrongTally()
    sessions = {name: requests.Session() for name in gateways}
    names = sorted(gateways)
    while tally.cases < cases:
        gw = names[tally.cases % len(names)]
        url, headers = gateways[gw]
        api, path, body = make_case(rng, model)
        tally.cases += 1
        sent = json.dumps(body)
        try:
            resp = sessions[gw].post(url + path, data=sent, timeout=timeout,
                                     headers={"content-type": "application/json", **headers})
            raw = resp.content
        except requests.exceptions.RequestException as exc:
            tally.findings["dropped"].append(f"{gw} {path} {sent[:500]} -> {exc!r}")
            sessions[gw] = requests.Session()
            continue
        status = resp.status_code
        tally.by_status[status] += 1
        tally.by_api.setdefault(api, Counter())[status] += 1
        what = f"{gw} {path} {sent[:500]} -> {status}: {raw[:300]!r}"
        if status >= 500 and status not in (502, 503, 504):
            tally.findings["server_error"].append(what)
        elif status in (502, 503, 504):
            tally.findings["request_502"].append(what)
        if status >= 400 and not _envelope_ok(raw):
            tally.findings["not_envelope"].append(what)
    return tally
