"""Request-field validation as vLLM 0.33 and SGLang 0.5.23 do it: the engines' 400s, not 500s.

Both engines parse a request body into a pydantic model before anything runs, so a value of
the wrong type (``tools: 5``, ``temperature: "hot"``, ``stream_options: []``) is a 400 in the
engine's own shape; then the sampling parameters are range-checked (``SamplingParams.
_verify_args`` in vLLM's ``vllm/sampling_params.py``, ``SamplingParams.verify`` in SGLang's
``sglang/srt/sampling/sampling_params.py``), also a 400. The models here are this project's
own restatement of the field types those request models declare (vLLM
``chat_completion/protocol.py`` ``ChatCompletionRequest``, ``completion/protocol.py``
``CompletionRequest``; SGLang ``entrypoints/openai/protocol.py``), in pydantic's lax mode as
theirs are (``"0.5"`` is a float, ``"hot"`` is not):

* vLLM: any string is a role (``CustomChatCompletionMessageParam``); ``n`` up to
  ``VLLM_MAX_N_SEQUENCES`` (16,384); at most ``VLLM_MAX_STOP_STRINGS`` (4) stop strings;
  temperature in [0, 2]; the before-validators of ``check_tool_usage`` first (plan.py).
  A pydantic failure is rendered by vLLM's ``validation_exception_handler``: ``N validation
  error(s):`` then one dict per error (``loc`` dotted, ``input`` summarised), ``type`` "Bad
  Request", ``param`` the dotted ``loc`` (``body.tools``); a range failure is a
  ``VLLMValidationError`` ("BadRequestError", ``param`` the field).
* SGLang: roles ``system assistant tool function developer latest_reminder root`` (any case)
  and ``user``; ``frequency_penalty``, ``presence_penalty``, ``n``, ``stream``, ``logprobs``
  are not nullable; temperature >= 0. A pydantic failure is the flat ``ErrorResponse`` with
  ``str(errors)`` (``type`` "Bad Request"), in the Anthropic envelope on ``/v1/messages``.

``/v1/messages`` and ``/v1/responses`` get a shorter model of their public fields (both
engines declare them alike). Content parts: a string, or an object whose ``type`` is a known
part kind carrying that kind's payload (``text`` a string for text parts).

May touch: pydantic, parsing.EngineError, plan.py's tool-choice checks. Must not touch: I/O.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from fleetgate.emulator.api_messages import OpenAIShapedError
from fleetgate.emulator.parsing import EngineError

VLLM_MAX_N = 16384
VLLM_MAX_STOP_STRINGS = 4
_PAYLOAD = {"text": "text", "image_url": "image_url", "input_audio": "input_audio",
            "audio_url": "audio_url", "video_url": "video_url", "refusal": "refusal",
            "file": "file", "image_embeds": "image_embeds", "thinking": None,
            "reasoning": None, "input_text": "text", "output_text": "text",
            "input_image": None, "input_file": None, "image": None, "document": None,
            "tool_use": None, "tool_result": None, "tool_reference": None}


def _part(value: Any) -> Any:
    if isinstance(value, str):
        return value
    if not isinstance(value, dict):
        raise ValueError("a content part must be an object with a 'type'")
    kind = value.get("type")
    if not isinstance(kind, str) or kind not in _PAYLOAD:
        raise ValueError(f"unknown content part type {kind!r}")
    payload = _PAYLOAD[kind]
    if payload == "text" and not isinstance(value.get("text"), str):
        raise ValueError("a text part's 'text' must be a string")
    if payload is not None and payload != "text" and value.get(payload) is None:
        raise ValueError(f"a {kind} part needs '{payload}'")
    return value


Part = Annotated[Any, AfterValidator(_part)]
Content = str | list[Part]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(_Open):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None


class FunctionDef(_Open):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class VllmTool(_Open):
    type: Literal["function"] = "function"
    function: FunctionDef


class SglangTool(_Open):
    type: str = "function"
    function: FunctionDef


class NamedFunction(_Open):
    name: str


class NamedToolChoice(_Open):
    function: NamedFunction
    type: Literal["function"] = "function"


class JsonSchemaFormat(_Open):
    name: str
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Open):
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None


class VllmMessage(_Open):
    role: str
    content: Content | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


def _sglang_role(value: Any) -> Any:
    roles = ("system", "assistant", "tool", "function", "developer", "latest_reminder", "root",
             "user")
    if not isinstance(value, str) or value.lower() not in roles:
        raise ValueError(f"'role' must be one of {', '.join(map(repr, roles))} "
                         "(case-insensitive).")
    return value.lower()


class SglangMessage(VllmMessage):
    role: Annotated[str, AfterValidator(_sglang_role)]


class _Sampling(_Open):
    model: str | None = None
    logit_bias: dict[str, float] | None = None
    max_tokens: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    user: str | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    response_format: ResponseFormat | None = None


class VllmChat(_Sampling):
    messages: list[VllmMessage]
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    max_completion_tokens: int | None = None
    n: int | None = 1
    stream: bool | None = False
    tools: list[VllmTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = True
    echo: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None


class SglangChat(_Sampling):
    messages: list[SglangMessage]
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logprobs: bool = False
    top_logprobs: int | None = None
    max_completion_tokens: int | None = None
    n: int = 1
    stream: bool = False
    tools: list[SglangTool] | None = None
    tool_choice: NamedToolChoice | Literal["auto", "required", "none"] = "auto"
    parallel_tool_calls: bool = True


class VllmCompletion(_Sampling):
    prompt: list[int] | list[list[int]] | str | list[str] | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logprobs: int | None = None
    n: int = 1
    stream: bool | None = False
    echo: bool | None = False
    suffix: str | None = None
    best_of: int | None = None


class SglangCompletion(_Sampling):
    prompt: list[int] | list[list[int]] | str | list[str]
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logprobs: int | None = None
    n: int = 1
    stream: bool = False
    echo: bool = False
    suffix: str | None = None


class AnthropicMessage(_Open):
    role: Literal["user", "assistant"]
    content: Content


class AnthropicTool(_Open):
    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None


class MessagesBody(_Open):
    model: str
    messages: list[AnthropicMessage]
    max_tokens: int
    system: Content | None = None
    stop_sequences: list[str] | None = None
    stream: bool | None = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None


class ResponsesBody(_Open):
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    stream: bool | None = False
    store: bool | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    previous_response_id: str | None = None
    user: str | None = None


MODELS: dict[tuple[str, str], type[BaseModel]] = {
    ("chat", "vllm"): VllmChat, ("chat", "sglang"): SglangChat,
    ("completion", "vllm"): VllmCompletion, ("completion", "sglang"): SglangCompletion,
    ("messages", "vllm"): MessagesBody, ("messages", "sglang"): MessagesBody,
    ("responses", "vllm"): ResponsesBody, ("responses", "sglang"): ResponsesBody,
}


def validate_body(api: str, body: dict[str, Any], engine: str) -> None:
    """Raise the engine's 400 (EngineError) for a body its request model rejects."""
    if api == "chat" and engine == "vllm":
        _vllm_tool_usage(body)
    try:
        parsed = MODELS[(api, engine)].model_validate(body)
    except ValidationError as exc:
        raise _validation_error(api, engine, exc) from None
    if api in ("chat", "completion"):
        _check_sampling(parsed, engine)


def _vllm_tool_usage(body: dict[str, Any]) -> None:
    """vLLM's ``check_tool_usage`` runs before the fields are validated (plan.py has it)."""
    from fleetgate.emulator.plan import _vllm_tool_choice

    tools = body.get("tools")
    choice = body.get("tool_choice")
    if (tools is None or isinstance(tools, list)) and not (
            isinstance(choice, dict) and not all(isinstance(t, dict) for t in tools or [])):
        _vllm_tool_choice(body, tools, choice)


def _validation_error(api: str, engine: str, exc: ValidationError) -> EngineError:
    errors = exc.errors(include_url=False)
    if engine == "vllm":
        label = "error" if len(errors) == 1 else "errors"
        lines = "".join(f"  {_vllm_entry(e)}\n" for e in errors[:10])
        more = f"  ...and {len(errors) - 10} more {label}\n" if len(errors) > 10 else ""
        message = f"{len(errors)} validation {label}:\n{lines}{more}".rstrip()
        param = _loc(errors[0].get("loc", ())) if errors else None
        return OpenAIShapedError(400, message, "Bad Request", param)
    if api == "messages":  # SGLang's _anthropic_validation_message
        text = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}"
                         for e in errors)
        return EngineError(400, text[:500] or "Invalid request", "invalid_request_error")
    summary = [{k: v for k, v in e.items() if k in ("type", "loc", "msg")} for e in errors]
    count = len(errors)
    return EngineError(400, f"{count} validation error{'s' if count > 1 else ''} "
                            f"{summary}", "Bad Request")


_INTERNAL = frozenset({"str", "int", "float", "bool", "list", "dict", "none", "union",
                       "function-after", "function-before", "function-plain", "tagged-union",
                       "literal", "nullable", "default", "json-or-python", "lax-or-strict"})


def _loc(loc: Any) -> str:
    """vLLM's ``clean_loc_for_param``: pydantic's union-branch markers dropped."""
    parts = [str(p) for p in loc]
    kept = [p for p in parts if p.lower() not in _INTERNAL and not any(c in p for c in "[](){}")
            and not p[:1].isupper() and not p.startswith("literal")]
    return ".".join(["body", *kept])


def _vllm_entry(error: Any) -> str:
    entry = {"type": error.get("type"), "loc": _loc(error.get("loc", ())),
             "msg": error.get("msg"), "input": _summary(error.get("input"))}
    return str(entry)[:1000]


def _summary(value: Any) -> Any:
    if isinstance(value, str):
        return value[:200]
    if isinstance(value, list | tuple | dict):
        return f"<{type(value).__name__} of {len(value)} items>"
    return str(value)[:200]


def _check_sampling(req: Any, engine: str) -> None:
    """The engines' sampling-parameter range checks (after the model parsed)."""
    checks: list[tuple[str, Any, bool, str]] = []
    n, temperature = req.n, req.temperature
    if engine == "vllm":
        checks += [("n", n, n is not None and not 1 <= n <= VLLM_MAX_N,
                    f"n must be at least 1 and at most {VLLM_MAX_N}, got {n}.")]
        stops = [req.stop] if isinstance(req.stop, str) else req.stop or []
        checks += [("stop", len(stops), len(stops) > VLLM_MAX_STOP_STRINGS,
                    f"stop must have at most {VLLM_MAX_STOP_STRINGS} strings")]
    else:
        checks += [("n", n, n < 1, f"n must be at least 1, got {n}.")]
    checks += [
        ("temperature", temperature, temperature is not None and (
            not math.isfinite(temperature) or temperature < 0
            or (engine == "vllm" and temperature > 2)),
         f"temperature must be in [0, 2], got {temperature}."),
        ("top_p", req.top_p, req.top_p is not None and not 0 < req.top_p <= 1,
         f"top_p must be in (0, 1], got {req.top_p}."),
        ("min_p", req.min_p, req.min_p is not None and not 0 <= req.min_p <= 1,
         f"min_p must be in [0, 1], got {req.min_p}."),
        ("top_k", req.top_k, req.top_k is not None and req.top_k < -1,
         f"top_k must be 0 (disable), or at least 1, got {req.top_k}."),
        ("min_tokens", req.min_tokens, req.min_tokens < 0,
         f"min_tokens must be greater than or equal to 0, got {req.min_tokens}."),
    ]
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(req, name)
        checks.append((name, value, value is not None and not -2 <= value <= 2,
                       f"{name} must be in [-2, 2], got {value}."))
    for name, value, bad, message in checks:
        if bad:
            if engine == "vllm":
                raise EngineError(400, f"{message} (parameter={name}, value={value})",
                                  "BadRequestError", name)
            raise EngineError(400, message, "BadRequestError")
