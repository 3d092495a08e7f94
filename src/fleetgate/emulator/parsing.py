"""Turn an OpenAI request body into what the emulated engine runs, or the engine's 4xx.

``parse_request`` validates a ``/v1/chat/completions`` or ``/v1/completions`` body the way
the emulated engine does (engines.md §1.4-1.6 for vLLM, §2.4-2.6 for SGLang) and returns a
``ParsedRequest``: prompt tokens, how many tokens to generate and how the output ends.

Token counts (a deterministic stand-in for the model's tokenizer, ~4 characters per token):

* text: ``ceil(len(text) / 4)`` tokens;
* chat prompt: 1 (BOS) + 4 (assistant header) + per message 5 (role header, end of turn)
  + its text (string content, or the ``text`` of list content parts; tool calls and the
  ``tools`` array count by their JSON size);
* completions prompt: 1 (BOS) + text tokens, or the length of a token-id list.

Output length: ``max_completion_tokens`` / ``max_tokens`` when given -> exactly that many
tokens, ``finish_reason`` "length"; when absent -> ``natural_tokens`` (16 by default) ending
with an EOS token (no text, counted in ``completion_tokens``, as vLLM counts it), "stop".
vLLM clamps an output that would overflow ``max_model_len``; SGLang answers 400 instead.

A request whose output is constrained (tool calls, ``response_format``; plan.py) passes its
``OutputPlan``: the planned text's tokens (``script``) then EOS replace the filler, so the
natural length is the plan's, and ``max_tokens`` below it cuts the text ("length").

Prefix-cache keys: the chained hashes of the prompt text's 64-character blocks (each role and
message text for chat; the first prompt string for completions), prefixcache.py.

Continuation (``continue_final_message`` on a chat whose last message is the assistant's;
a completions prompt ending in the model's own output): ``_chat_prompt`` and formats.py
``filler_tokens``; vLLM's 400 when ``add_generation_prompt`` is also true.

Not modelled (accepted and ignored, as vLLM accepts extra fields): ``n`` > 1, ``stop``,
sampling parameters, batched completion prompts (the first prompt is used).

May touch: the standard library. Must not touch: I/O, clocks, the engine.
"""

from __future__ import annotations

import math
import secrets
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

import orjson

from fleetgate.emulator.prefixcache import chat_text, text_block_hashes

if TYPE_CHECKING:
    from fleetgate.emulator.plan import OutputPlan

CHAT_BASE_TOKENS = 5
PER_MESSAGE_TOKENS = 5
CHARS_PER_TOKEN = 4


class EngineError(Exception):
    """An error the emulated engine answers with ``status`` (mapped to its wire shape)."""

    def __init__(self, status: int, message: str, err_type: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.err_type, self.param = status, message, err_type, param


@dataclass(frozen=True)
class ParsedRequest:
    kind: Literal["chat", "completion"]
    request_id: str  # the response ``id``
    model: str  # what the response's ``model`` field says
    created: int
    prompt_tokens: int
    max_tokens: int  # tokens the engine generates, EOS included
    finish_reason: Literal["length", "stop"]
    stream: bool
    include_usage: bool
    continuous_usage: bool
    plan: OutputPlan | None = None  # constrained output (tool call / JSON), plan.py
    pooling: bool = False  # an embedding request: prefill, one step, no text
    block_hashes: tuple[int, ...] = ()  # the prompt's prefix-cache blocks (prefixcache.py)
    offset: int = 0  # the filler token the output starts at: it continues its own text
    adapter: str | None = None  # the LoRA adapter it runs with (None: the base model)

    def token_text(self, index: int, eos: bool) -> str | None:
        """The planned text of output token ``index`` (None: use the filler)."""
        if self.plan is None:
            return None
        pieces = self.plan.pieces
        return "" if eos or index >= len(pieces) else pieces[index]


@dataclass(frozen=True)
class EngineLimits:
    engine: Literal["vllm", "sglang"]
    served_models: tuple[str, ...]
    max_model_len: int
    natural_tokens: int = 16
    # LoRA: the adapters the engine holds now (name -> path; the server's live registry,
    # read at each request) and every one it has held (SGLang reloads those on demand)
    loras: Mapping[str, str] = field(default_factory=dict)
    lora_enabled: bool = False


def text_tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def _json_tokens(value: Any) -> int:
    return text_tokens(orjson.dumps(value).decode()) if value else 0


def _content_tokens(content: Any) -> int:
    if isinstance(content, str):
        return text_tokens(content)
    if isinstance(content, list):
        return sum(text_tokens(p.get("text") or "") for p in content if isinstance(p, dict))
    return 0


def chat_prompt_tokens(messages: list[Any], tools: Any = None) -> int:
    total = CHAT_BASE_TOKENS + _json_tokens(tools)
    for msg in messages:
        if isinstance(msg, dict):
            total += PER_MESSAGE_TOKENS + _content_tokens(msg.get("content"))
            total += _json_tokens(msg.get("tool_calls"))
    return total


def completion_prompt_tokens(prompt: Any) -> int:
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch: the emulator serves its first prompt
    if isinstance(prompt, str):
        return 1 + text_tokens(prompt)
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return max(1, len(prompt))
    raise EngineError(
        400, "prompt must be a string or a list of token ids", "BadRequestError", "prompt"
    )


def decode_body(raw: bytes, engine: str) -> dict[str, Any]:
    """The JSON object of a request body, or the engine's 400."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise EngineError(400, f"JSON decode error: {exc}", _bad_request_type(engine)) from None
    if not isinstance(body, dict):
        raise EngineError(400, "Input should be a valid dictionary", _bad_request_type(engine))
    return body


def parse_request(
    kind: Literal["chat", "completion"],
    body: dict[str, Any],
    headers: Mapping[str, str],
    limits: EngineLimits,
    created: int,
    plan: OutputPlan | None = None,
) -> ParsedRequest:
    """Validate ``body`` as ``limits.engine`` does; raise EngineError with its answer."""
    bad = _bad_request_type(limits.engine)
    if plan is not None:
        limits = replace(limits, natural_tokens=len(plan.pieces) + 1)
    offset = 0
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise EngineError(400, "Field required: messages (a non-empty list)", bad)
        prompt, offset = _chat_prompt(messages, body, limits.engine)
        hashes = text_block_hashes(chat_text(messages))
    else:
        if "prompt" not in body:
            raise EngineError(400, "Field required: prompt", bad)
        prompt = completion_prompt_tokens(body["prompt"])
        text = body["prompt"][0] if isinstance(body["prompt"], list) else body["prompt"]
        hashes = text_block_hashes(text) if isinstance(text, str) else ()
        if isinstance(text, str) and plan is None:
            offset, chars = _filler_tail(text)
            if offset:  # the tail is the model's own output: one token per word
                prompt = 1 + text_tokens(text[: len(text) - chars]) + offset
    stream = bool(body.get("stream", False))
    options = body.get("stream_options")
    if limits.engine == "vllm" and options is not None and not stream:
        raise EngineError(400, "Stream options can only be defined when `stream=True`.", bad)
    options = options if isinstance(options, dict) else {}
    include_usage = stream and bool(options.get("include_usage"))
    continuous = stream and bool(options.get("continuous_usage_stats"))
    if limits.engine == "vllm":
        model = _vllm_model(body.get("model"), limits)
        adapter = model if model in limits.loras else None
        continuous = continuous and include_usage
        max_tokens, finish = _vllm_output(prompt, _requested_max(body, kind), limits)
        request_id = _vllm_request_id(kind, headers)
    else:
        model = str(body.get("model") or "default")
        adapter = sglang_adapter(model, body.get("lora_path"), limits)
        max_tokens, finish = _sglang_output(prompt, _requested_max(body, kind), limits)
        rid = body.get("rid")
        request_id = rid if isinstance(rid, str) and rid else uuid.uuid4().hex
    if plan is not None and max_tokens >= limits.natural_tokens:
        max_tokens, finish = limits.natural_tokens, "stop"  # the planned text fits: EOS
    return ParsedRequest(
        kind=kind,
        request_id=request_id,
        model=model,
        created=created,
        prompt_tokens=prompt,
        max_tokens=max_tokens,
        finish_reason=finish,
        stream=stream,
        include_usage=include_usage,
        continuous_usage=continuous,
        plan=plan,
        block_hashes=hashes,
        offset=offset,
        adapter=adapter,
    )


def sglang_adapter(model: str, lora_path: Any, limits: EngineLimits) -> str | None:
    """The adapter an SGLang request names: ``base:adapter`` in ``model`` (the served name
    is matched whole first), else the native ``lora_path`` field; SGLang's 400 when LoRA is
    off. Whether it is loaded is the server's to check (it may reload one it unloaded)."""
    adapter = None
    served = limits.served_models[0]
    if ":" in model and model != served:
        adapter = (model[len(served) + 1:] if model.startswith(served + ":")
                   else model.split(":", 1)[1])
        adapter = adapter.strip() or None
    if adapter is None and isinstance(lora_path, str) and lora_path:
        adapter = lora_path
    if adapter is not None and not limits.lora_enabled:
        raise EngineError(
            400,
            f"LoRA adapter '{adapter}' was requested, but LoRA is not enabled. Please launch "
            "the server with --enable-lora flag and preload adapters using --lora-paths or "
            "/load_lora_adapter endpoint.",
            "BadRequestError",
        )
    return adapter


def _chat_prompt(messages: list[Any], body: dict[str, Any], engine: str) -> tuple[int, int]:
    """(prompt tokens, output offset) of a chat. With ``continue_final_message`` the final
    assistant message is continued, not closed (vLLM: ``add_generation_prompt`` must then
    be false; SGLang drops the message and appends its text after the generation prompt):
    the prompt is the messages before it, the assistant header and its text, and the output
    starts where that text ends when it is the model's own."""
    tools = body.get("tools")
    if not body.get("continue_final_message"):
        return chat_prompt_tokens(messages, tools), 0
    if engine == "vllm" and body.get("add_generation_prompt"):
        raise EngineError(400, "Cannot set both `continue_final_message` and "
                               "`add_generation_prompt` to True.", "Bad Request")
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "assistant" or \
            not isinstance(last.get("content"), str):
        return chat_prompt_tokens(messages, tools), 0
    content = last["content"]
    offset = _filler_tokens(content)
    prefix = offset or text_tokens(content)
    return chat_prompt_tokens(messages[:-1], tools) + _json_tokens(last.get("tool_calls")) \
        + prefix, offset


def _filler_tokens(text: str) -> int:
    from fleetgate.emulator.formats import filler_tokens  # formats imports this module

    return filler_tokens(text)


def _filler_tail(text: str) -> tuple[int, int]:
    from fleetgate.emulator.formats import filler_tail

    return filler_tail(text)


def _bad_request_type(engine: str) -> str:
    return "Bad Request" if engine == "vllm" else "BadRequestError"


def _requested_max(body: dict[str, Any], kind: str) -> int | None:
    value = body.get("max_completion_tokens") if kind == "chat" else None
    if value is None:
        value = body.get("max_tokens")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise EngineError(
            400, f"max_tokens must be at least 1, got {value}.", "BadRequestError", "max_tokens"
        )
    return value


def _vllm_model(requested: Any, limits: EngineLimits) -> str:
    if requested is not None and requested in limits.loras:
        return str(requested)  # an adapter answers under its own name
    if requested is not None and requested not in limits.served_models:
        valid = ", ".join(limits.served_models)
        raise EngineError(
            404,
            f"The model `{requested}` does not exist. Valid aliases: {valid}.",
            "NotFoundError",
            "model",
        )
    return limits.served_models[0]


def _vllm_output(prompt: int, requested: int | None, limits: EngineLimits) -> tuple[int, Any]:
    ctx = limits.max_model_len
    if prompt >= ctx:
        raise EngineError(
            400,
            f"This model's maximum context length is {ctx} tokens. However, your prompt "
            f"contains {prompt} input tokens, which leaves no room for output tokens. "
            f"Please reduce the length of the input. (parameter=input_tokens, value={prompt})",
            "BadRequestError",
            "input_tokens",
        )
    if requested is not None and requested > ctx:
        raise EngineError(
            400,
            f"'max_tokens' is too large: {requested}. This model's maximum context length "
            f"is {ctx} tokens. (parameter=max_tokens, value={requested})",
            "BadRequestError",
            "max_tokens",
        )
    return _clamped(prompt, requested, limits)


def _sglang_output(prompt: int, requested: int | None, limits: EngineLimits) -> tuple[int, Any]:
    ctx = limits.max_model_len
    if prompt >= ctx:
        raise EngineError(
            400,
            f"The input ({prompt} tokens) is longer than the model's context "
            f"length ({ctx} tokens).",
            "BadRequestError",
        )
    if requested is not None and prompt + requested > ctx:
        raise EngineError(
            400,
            f"Requested token count exceeds the model's maximum context length of {ctx} "
            f"tokens. You requested a total of {prompt + requested} tokens: {prompt} tokens "
            f"from the input messages and {requested} tokens for the completion. Please "
            "reduce the number of tokens in the input messages or the completion to fit "
            "within the limit.",
            "BadRequestError",
        )
    return _clamped(prompt, requested, limits)


def _clamped(prompt: int, requested: int | None, limits: EngineLimits) -> tuple[int, Any]:
    room = limits.max_model_len - prompt
    if requested is not None:
        return min(requested, room), "length"
    if limits.natural_tokens > room:
        return room, "length"
    return limits.natural_tokens, "stop"


def _vllm_request_id(kind: str, headers: Mapping[str, str]) -> str:
    base = headers.get("x-request-id") or secrets.token_hex(8)
    return f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{base}"
