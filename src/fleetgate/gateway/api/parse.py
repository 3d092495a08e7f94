"""Parse and validate an OpenAI request body: just what routing needs, the rest forwarded as is.

Reads the body with a size cap (413 beyond ``max_body_bytes``, checked on Content-Length
first and while reading), decodes JSON (400 on malformed input or a non-object), checks the
few fields the gateway relies on and builds a ``RoutingRequest``. Per API:

| api | prompt (sized for routing) | output cap |
|---|---|---|
| chat | ``messages`` (objects with a ``role``) | max_completion_tokens, max_tokens |
| completions | ``prompt`` (string, strings or tokens) | max_tokens |
| responses | ``input`` (string or array of items), ``instructions`` | max_output_tokens |
| messages | ``messages``, ``system`` | max_tokens (required, as Anthropic's API says) |
| embeddings | ``input`` (string, strings or tokens) | none (1 for routing) |

The prompt's text (each message's role and text parts, in order) is also cut into chained
chunk hashes for the ``prefix_cache`` scorer and the prefix index (``routing/plugins/
prefix_cache.py``): about 1 µs per KB of prompt, so it is done for every generative request.

The typed fields of each API's public schema (``tools``, ``tool_choice``,
``response_format``, ``n``, ``stop``, sampling parameters, each message's role and content
parts) are checked for their type and bounds by ``fields.py`` (400 with ``param``); fields
no published schema defines (``top_k``, ``chat_template_kwargs``, ...) are forwarded
untouched.

May touch: starlette Request, orjson, gateway errors. Must not touch: backends.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import orjson
from starlette.requests import Request

from fleetgate.gateway.api.fields import anthropic_message, chat_message, check_fields
from fleetgate.gateway.errors import BadRequest, PayloadTooLarge, RequestTimeout
from fleetgate.gateway.proxy.apis import APIS
from fleetgate.routing import RoutingRequest
from fleetgate.routing.plugins.prefix_cache import chunk_hashes

ROUTING_HEADERS = ("x-priority", "x-fleetgate-session", "x-session-id")


def header_map(raw: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """An ASGI scope's headers by name (lower case, as ASGI servers give them), the first of
    a repeated one winning as in Starlette's ``Headers.get``: one pass over the headers
    instead of a scan per lookup."""
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in reversed(list(raw))}


async def read_body(request: Request, limit: int, timeout_s: float | None = None,
                    declared: str | None = None) -> bytes:
    """The whole body, at most ``limit`` bytes (413), within ``timeout_s`` (408: a body
    that never finishes holds no connection and no handler for ever); ``declared``: the
    request's ``content-length``. A body uvicorn has already read whole (the common case:
    it came with the head) is taken as it is, with no deadline to arm."""
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body of {declared} bytes exceeds the {limit}-byte limit")
    cycle: Any = getattr(request.receive, "__self__", None)  # uvicorn's request cycle
    if getattr(cycle, "more_body", True) is False and not cycle.disconnected \
            and cycle.message_event.is_set():  # it holds all of it: nothing to wait for
        message = await request.receive()
        body: bytes = message.get("body", b"")
        if len(body) > limit:
            raise PayloadTooLarge(f"request body exceeds the {limit}-byte limit")
        return body
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise PayloadTooLarge(f"request body exceeds the {limit}-byte limit")
                chunks.append(chunk)
    except TimeoutError:
        raise RequestTimeout(f"request body not received within {timeout_s:g} s "
                             f"({size} bytes arrived)") from None
    return b"".join(chunks)


def decode_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, nested at most ``MAX_JSON_DEPTH`` deep (orjson itself
    reads 1,024 levels but writes only 254: a deeper body would fail when forwarded)."""
    if not raw:
        raise BadRequest("request body is empty; expected a JSON object")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if "depth" in str(exc):
            raise BadRequest(_TOO_DEEP) from None
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    # every container opens with one of these bytes: fewer of them, no deeper nesting
    if raw.count(b"{") + raw.count(b"[") > MAX_JSON_DEPTH and _too_deep(body):
        raise BadRequest(_TOO_DEEP)
    return body


MAX_JSON_DEPTH = 128
_TOO_DEEP = f"request body is nested deeper than {MAX_JSON_DEPTH} levels"


def _too_deep(value: dict[str, Any]) -> bool:
    """Whether any container lies more than ``MAX_JSON_DEPTH`` levels down (iterative)."""
    level: list[Any] = [value]
    for _ in range(MAX_JSON_DEPTH):
        level = [child for node in level
                 for child in (node.values() if isinstance(node, dict) else node)
                 if isinstance(child, dict | list)]
        if not level:
            return False
    return True


REQUEST_ID_MAX = 128
_REQUEST_ID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                              "0123456789-_.:/+=@")


def request_id_of(given: str | None) -> str:
    """The request id: the client's ``x-request-id`` when it is 1-128 characters of
    ``[A-Za-z0-9-_.:/+=@]`` (echoed, forwarded upstream and logged as is), else a new one.
    A longer or non-ASCII id would be echoed unbounded or garbled upstream."""
    if given and len(given) <= REQUEST_ID_MAX and _REQUEST_ID_CHARS.issuperset(given):
        return given
    # 128 random bits like uuid4().hex, from the process's generator (reseeded in a forked
    # child): no system call per request; an id names a request, it guards nothing
    return f"{random.getrandbits(128):032x}"


def routing_request(api: str, body: dict[str, Any], headers: Mapping[str, str],
                    tenant: str | None = None) -> RoutingRequest:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is required and must be a non-empty string", param="model")
    stream = _typed(body, "stream", bool, False)
    if stream and api == "embeddings":
        raise BadRequest("embeddings cannot be streamed", param="stream")
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise BadRequest("'stream_options' must be an object", param="stream_options")
        if not stream:
            raise BadRequest("'stream_options' is only allowed when 'stream' is true",
                             param="stream_options")
    max_tokens = _max_tokens(body, APIS[api].output_caps)
    if api == "messages" and max_tokens is None:
        raise BadRequest("'max_tokens' is required", param="max_tokens")
    user = _typed(body, "user", str, None)
    check_fields(api, body)
    return RoutingRequest(
        model=model,
        api=api,
        stream=stream,
        max_tokens=1 if api == "embeddings" else max_tokens,
        prompt_chars=PROMPT_SIZE[api](body),
        headers={h: v for h in ROUTING_HEADERS if (v := headers.get(h)) is not None},
        user=user,
        tenant=tenant,
        policy=headers.get("x-fleetgate-policy"),
        prefix_hashes=chunk_hashes(PROMPT_TEXT[api](body)) if api in PROMPT_TEXT else (),
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


def _max_tokens(body: dict[str, Any], keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = body.get(key)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise BadRequest(f"'{key}' must be a positive integer", param=key)
        return value
    return None


def _chat_chars(body: dict[str, Any], check: Callable[[dict[str, Any], str], None] = chat_message
                ) -> int:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' is required and must be a non-empty array",
                         param="messages")
    total = 0
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise BadRequest(f"messages[{i}] must be an object with a 'role'",
                             param=f"messages[{i}]")
        check(msg, f"messages[{i}]")
        total += _content_chars(msg.get("content"))
    return total


def _messages_chars(body: dict[str, Any]) -> int:
    return _chat_chars(body, anthropic_message) + _content_chars(body.get("system"))


def _prompt_chars(body: dict[str, Any], key: str = "prompt") -> int:
    prompt = body.get(key)
    if isinstance(prompt, str):
        return len(prompt)
    if isinstance(prompt, list) and prompt:
        return sum(len(p) if isinstance(p, str | list) else 1 for p in prompt)
    raise BadRequest(f"'{key}' is required (a string, an array of strings or of tokens)",
                     param=key)


def _responses_chars(body: dict[str, Any]) -> int:
    items = body.get("input")
    extra = _content_chars(body.get("instructions"))
    if isinstance(items, str):
        return len(items) + extra
    if isinstance(items, list) and items:
        return extra + sum(_content_chars(item.get("content")) if isinstance(item, dict)
                           else _content_chars(item) for item in items)
    raise BadRequest("'input' is required (a string or an array of input items)",
                     param="input")


def _content_chars(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        total = 0
        for part in content:
            if not isinstance(part, dict) or "text" not in part:
                continue
            text = part["text"]
            if not isinstance(text, str):  # engines answer a 500 to a number, null or true
                raise BadRequest("a content part's 'text' must be a string", param="content")
            total += len(text)
        return total
    return 0


PROMPT_SIZE: dict[str, Callable[[dict[str, Any]], int]] = {
    "chat": _chat_chars, "completions": _prompt_chars, "responses": _responses_chars,
    "messages": _messages_chars, "embeddings": lambda body: _prompt_chars(body, "input"),
}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(text for p in content
                       if isinstance(p, dict) and isinstance(text := p.get("text"), str))
    return ""


def _messages_text(body: dict[str, Any]) -> str:
    """Each message's role and text, in order (after ``system`` for the Messages API)."""
    messages = body.get("messages")
    head = _text(body.get("system"))
    return head + "".join(f"<{m.get('role')}>{_text(m.get('content'))}" for m in messages
                          if isinstance(m, dict)) if isinstance(messages, list) else head


def _completion_text(body: dict[str, Any]) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        return prompt[0]
    return prompt if isinstance(prompt, str) else ""


def _responses_text(body: dict[str, Any]) -> str:
    items = body.get("input")
    head = _text(body.get("instructions"))
    if isinstance(items, list):
        return head + "".join(_text(i.get("content")) if isinstance(i, dict) else _text(i)
                              for i in items)
    return head + _text(items)


PROMPT_TEXT: dict[str, Callable[[dict[str, Any]], str]] = {
    "chat": _messages_text, "messages": _messages_text, "completions": _completion_text,
    "responses": _responses_text,
}
