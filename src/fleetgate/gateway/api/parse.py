"""Parse and validate an OpenAI request body: just what routing needs, the rest forwarded as is.

Reads the body with a size cap (413 beyond ``max_body_bytes``, checked on Content-Length
first and while reading), decodes JSON (400 on malformed input or a non-object), checks the
few fields the gateway relies on (``model``, ``messages``/``prompt``, ``stream``,
``stream_options``, ``max_tokens``, ``user``) and builds a ``RoutingRequest``. Fields the
gateway does not know (``tools``, ``response_format``, ``top_k``, ``min_p``, ...) are
forwarded untouched.

May touch: starlette Request, orjson, gateway errors. Must not touch: backends.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request

from fleetgate.gateway.errors import BadRequest, PayloadTooLarge
from fleetgate.routing import RoutingRequest

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
ROUTING_HEADERS = ("x-priority", "x-fleetgate-session", "x-session-id")


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body of {declared} bytes exceeds the {limit}-byte limit")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body exceeds the {limit}-byte limit")
        chunks.append(chunk)
    return b"".join(chunks)


def decode_json(raw: bytes) -> dict[str, Any]:
    if not raw:
        raise BadRequest("request body is empty; expected a JSON object")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


def routing_request(path: str, body: dict[str, Any], request: Request) -> RoutingRequest:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is required and must be a non-empty string", param="model")
    stream = _typed(body, "stream", bool, False)
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise BadRequest("'stream_options' must be an object", param="stream_options")
        if not stream:
            raise BadRequest("'stream_options' is only allowed when 'stream' is true",
                             param="stream_options")
    max_tokens = _max_tokens(body)
    user = _typed(body, "user", str, None)
    return RoutingRequest(
        model=model,
        stream=stream,
        max_tokens=max_tokens,
        prompt_chars=_prompt_chars(path, body),
        headers={h: v for h in ROUTING_HEADERS if (v := request.headers.get(h)) is not None},
        user=user,
        policy=request.headers.get("x-fleetgate-policy"),
    )


def wants_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def _typed(body: dict[str, Any], key: str, kind: type, default: Any) -> Any:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise BadRequest(f"'{key}' must be of type {kind.__name__}", param=key)
    return value


def _max_tokens(body: dict[str, Any]) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise BadRequest(f"'{key}' must be a positive integer", param=key)
        return value
    return None


def _prompt_chars(path: str, body: dict[str, Any]) -> int:
    if path == CHAT:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' is required and must be a non-empty array",
                             param="messages")
        total = 0
        for i, msg in enumerate(messages):
            if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
                raise BadRequest(f"messages[{i}] must be an object with a 'role'",
                                 param=f"messages[{i}]")
            total += _content_chars(msg.get("content"))
        return total
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return len(prompt)
    if isinstance(prompt, list) and prompt:
        return sum(len(p) if isinstance(p, str | list) else 1 for p in prompt)
    raise BadRequest("'prompt' is required (a string, an array of strings or of tokens)",
                     param="prompt")


def _content_chars(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(len(p.get("text", "")) for p in content if isinstance(p, dict))
    return 0
