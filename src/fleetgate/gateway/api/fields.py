"""The typed fields the gateway forwards, checked before any engine sees them (400, ``param``).

An engine answers a wrong-typed field with a 400 when its pydantic model catches it, but
with a 500 (or a dropped stream) when its code trips over it later (``tools: 5`` crashed
chat templating in engines before theirs checked it); one tenant's malformed requests
must not look like a broken engine, and the client is owed a clear 400 naming the field.
So each API's fields of OpenAI's (and Anthropic's) published schema are checked here for
their JSON type and documented bounds, one table row per field; fields not in the table
(``top_k``, ``chat_template_kwargs``, engine extensions) are forwarded untouched, and
semantics the engines differ on (which roles a chat template knows, a tool choice naming a
tool that is not in ``tools``) stay the engine's call, its 400 relayed.

Bounds are OpenAI's: ``temperature`` 0-2 (Messages: 0-1), ``top_p`` 0-1, penalties -2..2,
``n`` 1-128, at most 4 ``stop`` strings, ``top_logprobs`` 0-20. ``null`` is "not set" for
every optional field, as in OpenAI's API.

Cost: a dict lookup per body key; the nested checks walk only the fields that are present.

May touch: gateway errors. Must not touch: anything else.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fleetgate.gateway.errors import BadRequest

Check = Callable[[Any, str], None]


def _bad(param: str, what: str) -> BadRequest:
    return BadRequest(f"'{param}' must be {what}", param=param)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def number(low: float, high: float) -> Check:
    def check(value: Any, param: str) -> None:
        if not _is_number(value) or not low <= value <= high:
            raise _bad(param, f"a number from {low:g} to {high:g}")
    return check


def integer(low: int, high: int | None = None) -> Check:
    def check(value: Any, param: str) -> None:
        if not _is_int(value) or value < low or (high is not None and value > high):
            bound = f"from {low} to {high}" if high is not None else f">= {low}"
            raise _bad(param, f"an integer {bound}")
    return check


def kind(expected: type | tuple[type, ...], what: str) -> Check:
    def check(value: Any, param: str) -> None:
        if not isinstance(value, expected) or (isinstance(value, bool) and bool not in (
                expected if isinstance(expected, tuple) else (expected,))):
            raise _bad(param, what)
    return check


def one_of(*allowed: str) -> Check:
    def check(value: Any, param: str) -> None:
        if value not in allowed:
            raise _bad(param, "one of " + ", ".join(repr(a) for a in allowed))
    return check


def _strings(value: Any, param: str, most: int | None = None) -> None:
    if isinstance(value, list) and all(isinstance(s, str) for s in value) and (
            most is None or len(value) <= most):
        return
    raise _bad(param, "an array of strings" + (f" (at most {most})" if most else ""))


def _stop(value: Any, param: str) -> None:
    if not isinstance(value, str):
        _strings(value, param, 4)


def _logit_bias(value: Any, param: str) -> None:
    if not isinstance(value, dict) or not all(_is_number(v) for v in value.values()):
        raise _bad(param, "an object of token ids to numbers")


def _objects(value: Any, param: str, item: Callable[[dict[str, Any], str], None]) -> None:
    if not isinstance(value, list):
        raise _bad(param, "an array of objects")
    for i, entry in enumerate(value):
        if not isinstance(entry, dict):
            raise _bad(f"{param}[{i}]", "an object")
        item(entry, f"{param}[{i}]")


def _typed_object(entry: dict[str, Any], param: str) -> None:
    if not isinstance(entry.get("type"), str):
        raise _bad(f"{param}.type", "a string")


def _chat_tool(entry: dict[str, Any], param: str) -> None:
    _typed_object(entry, param)
    if entry["type"] == "function":
        fn = entry.get("function")
        if not isinstance(fn, dict):
            raise _bad(f"{param}.function", "an object")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise _bad(f"{param}.function.name", "a non-empty string")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise _bad(f"{param}.function.parameters", "an object (a JSON Schema)")


def _chat_tools(value: Any, param: str) -> None:
    if value == []:
        raise _bad(param, "a non-empty array (omit it for no tools)")
    _objects(value, param, _chat_tool)


def _anthropic_tool(entry: dict[str, Any], param: str) -> None:
    if not isinstance(entry.get("name"), str):
        raise _bad(f"{param}.name", "a string")
    schema = entry.get("input_schema")
    if schema is not None and not isinstance(schema, dict):
        raise _bad(f"{param}.input_schema", "an object (a JSON Schema)")


def _chat_tool_choice(value: Any, param: str) -> None:
    if value in ("none", "auto", "required"):
        return
    if not isinstance(value, dict):
        raise _bad(param, "'none', 'auto', 'required' or an object naming a tool")
    _typed_object(value, param)
    fn = value.get("function")
    if value["type"] == "function" and (not isinstance(fn, dict)
                                        or not isinstance(fn.get("name"), str)):
        raise _bad(f"{param}.function.name", "a string")


def _object_or_string(value: Any, param: str) -> None:
    if isinstance(value, str):
        return
    if not isinstance(value, dict):
        raise _bad(param, "a string or an object")
    _typed_object(value, param)


def _typed_dict(value: Any, param: str) -> None:
    if not isinstance(value, dict):
        raise _bad(param, "an object")
    _typed_object(value, param)


def _response_format(value: Any, param: str) -> None:
    _typed_dict(value, param)
    kind_ = value["type"]
    if kind_ not in ("text", "json_object", "json_schema", "structural_tag"):
        raise _bad(f"{param}.type", "one of 'text', 'json_object', 'json_schema'")
    if kind_ == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise _bad(f"{param}.json_schema", "an object with a string 'name'")
        if spec.get("schema") is not None and not isinstance(spec["schema"], dict):
            raise _bad(f"{param}.json_schema.schema", "an object (a JSON Schema)")


def content(value: Any, param: str, nullable: bool = True) -> None:
    """A message's content: a string, an array of typed parts, or (chat) null."""
    if isinstance(value, str) or (value is None and nullable):
        return
    if not isinstance(value, list):
        raise _bad(param, "a string or an array of content parts")
    for i, part in enumerate(value):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise _bad(f"{param}[{i}]", "an object with a string 'type'")
        if part["type"] in ("text", "input_text", "output_text") and not isinstance(
                part.get("text"), str):
            raise _bad(f"{param}[{i}].text", "a string")


def chat_message(msg: dict[str, Any], param: str) -> None:
    role = msg.get("role")
    if not isinstance(role, str) or not role:
        raise _bad(f"{param}.role", "a non-empty string")
    content(msg.get("content"), f"{param}.content")
    if msg.get("tool_calls") is not None:
        _objects(msg["tool_calls"], f"{param}.tool_calls", _typed_object)
    for key in ("name", "tool_call_id"):
        if msg.get(key) is not None and not isinstance(msg[key], str):
            raise _bad(f"{param}.{key}", "a string")


def anthropic_message(msg: dict[str, Any], param: str) -> None:
    if msg.get("role") not in ("user", "assistant"):
        raise _bad(f"{param}.role", "'user' or 'assistant'")
    content(msg.get("content"), f"{param}.content", nullable=False)


def _system(value: Any, param: str) -> None:
    content(value, param, nullable=False)


def _input_items(value: Any, param: str) -> None:
    if isinstance(value, list):
        _objects(value, param, lambda item, p: content(item.get("content"), f"{p}.content"))


BOOL = kind(bool, "a boolean")
STRING = kind(str, "a string")
OBJECT = kind(dict, "an object")
SAMPLING: dict[str, Check] = {
    "temperature": number(0, 2), "top_p": number(0, 1), "seed": integer(-(2**63)),
    "frequency_penalty": number(-2, 2), "presence_penalty": number(-2, 2), "stop": _stop,
    "logit_bias": _logit_bias, "n": integer(1, 128), "metadata": OBJECT,
}
CHAT: dict[str, Check] = {
    **SAMPLING, "tools": _chat_tools, "tool_choice": _chat_tool_choice,
    "response_format": _response_format, "parallel_tool_calls": BOOL, "logprobs": BOOL,
    "top_logprobs": integer(0, 20), "store": BOOL, "reasoning_effort": STRING,
    "service_tier": STRING, "modalities": _strings, "prediction": OBJECT, "audio": OBJECT,
    "web_search_options": OBJECT,
}
COMPLETIONS: dict[str, Check] = {
    **SAMPLING, "logprobs": integer(0), "echo": BOOL, "suffix": STRING, "best_of": integer(1),
}
MESSAGES: dict[str, Check] = {
    "temperature": number(0, 1), "top_p": number(0, 1), "top_k": integer(0),
    "stop_sequences": _strings, "system": _system, "metadata": OBJECT,
    "tools": lambda v, p: _objects(v, p, _anthropic_tool), "tool_choice": _typed_dict,
    "thinking": _typed_dict, "service_tier": STRING,
}
RESPONSES: dict[str, Check] = {
    "temperature": number(0, 2), "top_p": number(0, 1), "instructions": STRING,
    "tools": lambda v, p: _objects(v, p, _typed_object), "tool_choice": _object_or_string,
    "parallel_tool_calls": BOOL, "store": BOOL, "text": OBJECT, "reasoning": OBJECT,
    "metadata": OBJECT, "previous_response_id": STRING, "include": _strings,
    "truncation": STRING, "background": BOOL, "max_tool_calls": integer(1),
    "top_logprobs": integer(0, 20), "service_tier": STRING, "input": _input_items,
}
EMBEDDINGS: dict[str, Check] = {
    "encoding_format": one_of("float", "base64"), "dimensions": integer(1),
}
FIELDS: dict[str, dict[str, Check]] = {
    "chat": CHAT, "completions": COMPLETIONS, "messages": MESSAGES, "responses": RESPONSES,
    "embeddings": EMBEDDINGS,
}


def check_fields(api: str, body: dict[str, Any]) -> None:
    """400 (``param`` naming the field) for a known field of the wrong type or range."""
    table = FIELDS[api]
    for key, value in body.items():
        check = table.get(key)
        if check is not None and value is not None:
            check(value, key)
