"""Mid-stream resume: what continuing a broken chat/completions stream elsewhere needs.

When an engine dies after a stream's first byte, ``stream.StreamRelay`` sends the text
relayed so far to the next candidate as a continuation (chat: a final assistant message
with ``continue_final_message`` and ``add_generation_prompt: false``, which vLLM and SGLang
both read; completions: the prompt plus the text) with the output limits reduced by the
tokens already sent, and stitches its chunks into the same stream. This module holds the
data and the request rules: which requests can be continued (``request_refusal``), their
limit (``max_tokens``), the continuation's body (``continuation_body``) and what one
upstream leg relayed (``Leg``).

May touch: the relay protocol types, the SSE framer. Must not touch: HTTP serving.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from fleetgate.backends.relay import UpstreamResponse
from fleetgate.backends.sse import SSEFramer
from fleetgate.gateway.proxy.attempt import Attempt

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # vLLM's and SGLang's default for /v1/completions
# request fields that constrain the output with a grammar: it cannot restart mid-answer
_GUIDED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar",
           "structured_outputs", "json_schema", "regex", "ebnf", "structural_tag")


class NotResumable(Exception):
    """The continuation's endpoint answered for good (a 4xx, an in-band error): stop trying."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(slots=True)
class Opened:
    """A stream opened upstream and read up to its first data frame."""

    attempt: Attempt
    resp: UpstreamResponse
    framer: SSEFramer
    chunks: AsyncIterator[bytes]
    first: list[bytes]


# (continuation body, endpoint ids already tried, tokens relayed so far) -> an open stream
Resumer = Callable[[dict[str, Any], set[str], int], Awaitable[Opened | None]]


@dataclass(slots=True)
class Resume:
    """What continuing a broken stream elsewhere needs (from the exchange)."""

    body: dict[str, Any]  # the client's request body
    resumer: Resumer
    attempts: list[dict[str, Any]]  # the decision log entry's attempts
    prompt_estimate: int  # the router's prompt estimate: the last resort for usage
    tried: set[str] = field(default_factory=set)  # endpoint ids


@dataclass(slots=True)
class Leg:
    """What one upstream stream of a request relayed, read back when it breaks."""

    text: list[str] = field(default_factory=list)
    tokens: int = 0
    finish: str | None = None
    counted: int = 0  # the engine's running count, where it sent continuous usage
    usage: dict[str, Any] | None = None  # the last usage object the leg carried
    ident: dict[str, Any] | None = None  # id, created, model of its first chunk
    refusal: str | None = None  # why the leg cannot be continued
    raw: list[bytes] = field(default_factory=list)  # the first leg's payloads, read if it breaks


def drop_role(choices: list[Any]) -> bool:
    """Remove ``role`` from the deltas; True when nothing is left to send (a role chunk)."""
    empty = True
    for choice in choices:
        if not isinstance(choice, dict):
            return False
        delta = choice.get("delta")
        if isinstance(delta, dict):
            delta.pop("role", None)
            if any(v for v in delta.values()):
                empty = False
        if choice.get("finish_reason") is not None or choice.get("logprobs"):
            empty = False
    return empty and bool(choices)


def max_tokens(api: str, body: dict[str, Any]) -> int | None:
    """The output limit the client asked for (None: up to the engine)."""
    if api == "chat":
        value = body.get("max_completion_tokens")
        if value is None:
            value = body.get("max_tokens")
    else:
        value = body.get("max_tokens", COMPLETIONS_DEFAULT_MAX_TOKENS)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def request_refusal(api: str, body: dict[str, Any]) -> str | None:
    """Why this request cannot be continued from a prefix (None: it can)."""
    n = body.get("n")
    if isinstance(n, int) and n > 1:
        return "n > 1"
    if any(body.get(key) is not None for key in _GUIDED):
        return "structured output"
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") not in (None, "text"):
        return "structured output"
    if api == "chat":
        messages = body.get("messages")
        return None if isinstance(messages, list) else "no messages"
    if body.get("echo") or body.get("suffix") or (body.get("best_of") or 1) > 1:
        return "echo, suffix or best_of"
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    return None if isinstance(prompt, str) else "the prompt is not one string"


def continuation_body(api: str, body: dict[str, Any], text: str, tokens: int
                      ) -> dict[str, Any]:
    """The request that continues ``body``'s answer after ``text`` (``tokens`` tokens)."""
    out = dict(body)
    if api == "chat":
        if text:
            messages = list(body["messages"])
            last = messages[-1] if messages else None
            if body.get("continue_final_message") and isinstance(last, dict) and \
                    last.get("role") == "assistant" and isinstance(last.get("content"), str):
                messages[-1] = {**last, "content": last["content"] + text}
            else:
                messages.append({"role": "assistant", "content": text})
            out["messages"] = messages
            out["continue_final_message"] = True
            out["add_generation_prompt"] = False
        keys: tuple[str, ...] = ("max_completion_tokens", "max_tokens")
    else:
        prompt = body["prompt"]
        out["prompt"] = [prompt[0] + text] if isinstance(prompt, list) else prompt + text
        out.setdefault("max_tokens", COMPLETIONS_DEFAULT_MAX_TOKENS)
        keys = ("max_tokens",)
    for key in (*keys, "min_tokens"):
        value = out.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            out[key] = max(0 if key == "min_tokens" else 1, value - tokens)
    return out
