"""What an emulated model writes when a request constrains its output: tool calls or JSON.

``plan_output(body, engine, seed)`` reads a chat-shaped body (``tools``, ``tool_choice``,
``response_format``; the Responses and Messages APIs convert theirs to that shape first),
validates them as the engine does, and returns an ``OutputPlan`` (or ``None`` for free text):

* a **tool call** when ``tool_choice`` is ``"required"`` (the first tool), a named function
  (that one), or ``"auto"`` / absent with tools, unless the conversation's last message is a
  tool result (then the model answers in text, so agent loops end). The emulated servers run
  with a tool parser (vLLM ``--enable-auto-tool-choice --tool-call-parser llama3_json``,
  SGLang ``--tool-call-parser llama3``), so the model writes Llama-3's JSON form
  ``{"name": "<fn>", "parameters": {...}}`` and the parser turns it into ``tool_calls``;
  ``arguments`` is ``json.dumps`` of a minimal instance of the tool's ``parameters``
  (schema.py), ``", "`` / ``": "`` separators as both parsers write it;
* **JSON** content for ``response_format`` ``json_object`` / ``json_schema``.

The text is cut into ~4-character tokens (parsing.py's token model), so its length sets the
completion length; EOS follows. Deterministic: same body (and seed) -> same text.

May touch: the standard library, schema.py, parsing.py's EngineError. Must not touch: I/O,
clocks, the engine.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from fleetgate.emulator.parsing import CHARS_PER_TOKEN, EngineError
from fleetgate.emulator.schema import instance

_JSON_OBJECT_ANSWER = {"answer": "The quick brown fox jumps over the lazy dog"}


@dataclass(frozen=True)
class ToolCallPlan:
    name: str
    arguments: str  # JSON text, as the parsers re-dump it
    name_end: int  # offset in the text just past the name's closing quote
    args_start: int  # offset of ``arguments`` in the text
    args_end: int


@dataclass(frozen=True)
class OutputPlan:
    kind: Literal["tool", "json"]
    text: str  # everything the model writes (EOS excluded)
    pieces: tuple[str, ...]  # ``text`` as tokens
    call: ToolCallPlan | None = None
    named: bool = False  # tool_choice named a function (vLLM then reports "stop")
    forced: bool = False  # "required" or a named function (vLLM: content "" not null)


@dataclass(frozen=True)
class ToolStep:
    """What one output token adds to a streamed tool call."""

    name: bool  # the call's id and name go out now
    fragment: str | None  # argument text that goes out now (None: nothing)
    started: bool  # the name has gone out, now or before


class ToolProgress:
    """Follows a planned tool call through its tokens, as the llama3 JSON parsers do: the name
    once its closing quote has arrived, then the arguments as their text arrives."""

    def __init__(self, call: ToolCallPlan) -> None:
        self.call, self.seen, self.sent, self.started = call, 0, 0, False

    def step(self, text: str, last: bool) -> ToolStep:
        self.seen += len(text)
        call = self.call
        if not self.started:
            if self.seen < call.name_end:
                return ToolStep(False, None, False)
            self.started = True
            return ToolStep(True, None, True)
        end = min(self.seen, call.args_end) - call.args_start
        fragment = call.arguments[self.sent : end] if end > self.sent else ""
        self.sent += len(fragment)
        return ToolStep(False, fragment if fragment or last else None, True)


def split_tokens(text: str) -> tuple[str, ...]:
    return tuple(text[i : i + CHARS_PER_TOKEN] for i in range(0, len(text), CHARS_PER_TOKEN))


def body_seed(*parts: Any) -> str:
    raw = orjson.dumps(parts, option=orjson.OPT_SORT_KEYS, default=str)
    return hashlib.sha256(raw).hexdigest()[:16]


def plan_output(body: dict[str, Any], engine: str, seed: str) -> OutputPlan | None:
    """The constrained output for ``body``, or None for free text; EngineError if invalid."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if engine == "vllm":
        choice = _vllm_tool_choice(body, tools, choice)
    else:
        choice = _sglang_tool_choice(tools, choice)
    functions = [t["function"] for t in tools or [] if _is_function_tool(t)]
    fn = _chosen_function(functions, choice, body.get("messages"))
    if fn is not None:
        return tool_plan(fn, seed, named=isinstance(choice, dict), forced=choice != "auto")
    return _json_plan(body, engine, seed)


def tool_plan(fn: dict[str, Any], seed: str, named: bool = False, forced: bool = False
              ) -> OutputPlan:
    name = str(fn.get("name"))
    params = fn.get("parameters")
    args = json.dumps(instance(params if isinstance(params, dict) else {}, seed),
                      ensure_ascii=False)
    head = '{"name": ' + json.dumps(name, ensure_ascii=False) + ', "parameters": '
    text = head + args + "}"
    call = ToolCallPlan(name, args, name_end=len(head) - len(', "parameters": '),
                        args_start=len(head), args_end=len(head) + len(args))
    return OutputPlan("tool", text, split_tokens(text), call, named, forced)


def json_text_plan(schema: Any, seed: str) -> OutputPlan:
    value = _JSON_OBJECT_ANSWER if schema is None else instance(schema, seed)
    text = json.dumps(value, ensure_ascii=False)
    return OutputPlan("json", text, split_tokens(text))


def _is_function_tool(tool: Any) -> bool:
    return isinstance(tool, dict) and isinstance(tool.get("function"), dict) and isinstance(
        tool["function"].get("name"), str)


def _chosen_function(functions: list[dict[str, Any]], choice: Any, messages: Any
                     ) -> dict[str, Any] | None:
    if not functions or choice == "none":
        return None
    if isinstance(choice, dict):
        wanted = (choice.get("function") or {}).get("name")
        return next((f for f in functions if f.get("name") == wanted), None)
    if choice == "auto" and isinstance(messages, list) and messages:
        last = messages[-1]
        if isinstance(last, dict) and last.get("role") == "tool":
            return None  # a tool result came back: answer it in words
    return functions[0]


def _vllm_invalid(message: str, param: str | None, body: dict[str, Any]) -> EngineError:
    """A model-validator error, rendered by vLLM's RequestValidationError handler."""
    text = (f"1 validation error:\n  {{'type': 'value_error', 'loc': 'body', 'msg': "
            f"\"Value error, {message}\", 'input': '<dict of {len(body)} items>'}}")
    return EngineError(400, text, "Bad Request", param)


def _vllm_tool_choice(body: dict[str, Any], tools: Any, choice: Any) -> Any:
    """vLLM ``ChatCompletionRequest.check_tool_usage`` (chat_completion/protocol.py:976)."""
    if tools == []:
        raise _vllm_invalid("`tools` must not be an empty array. Either provide at least one "
                            "tool or omit the field entirely.", "tools", body)
    if choice is None:
        return "auto" if tools else "none"
    if choice == "none":
        return choice
    if not tools:
        raise _vllm_invalid("When using `tool_choice`, `tools` must be set.", "tool_choice", body)
    if choice not in ("auto", "required") and not isinstance(choice, dict):
        raise _vllm_invalid(f"Invalid value for `tool_choice`: {choice}! Only named tools, "
                            '"none", "auto" or "required" are supported.', "tool_choice", body)
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if isinstance(
            choice.get("function"), dict) else None
        usage = 'Correct usage: `{"type": "function", "function": {"name": "my_function"}}`'
        if not isinstance(name, str) or not name:
            raise _vllm_invalid(f"Expected field `name` in `function` in `tool_choice`! {usage}",
                                "tool_choice.function.name", body)
        if not any(_is_function_tool(t) and t["function"]["name"] == name for t in tools):
            raise _vllm_invalid("The tool specified in `tool_choice` does not match any of the "
                                "specified `tools`", "tool_choice", body)
    return choice


def _sglang_tool_choice(tools: Any, choice: Any) -> Any:
    """SGLang ``set_tool_choice_default`` and ``_validate_request`` (serving_chat.py:1103)."""
    if choice is None:
        choice = "auto" if tools is not None else "none"
    if choice == "required" and not tools:
        raise EngineError(400, "Tools cannot be empty if tool choice is set to required.",
                          "BadRequestError")
    if isinstance(choice, dict):
        if not tools:
            raise EngineError(400, "Tools cannot be empty if tool choice is set to a specific "
                              "tool.", "BadRequestError")
        name = (choice.get("function") or {}).get("name")
        if not any(_is_function_tool(t) and t["function"]["name"] == name for t in tools):
            raise EngineError(400, f"Tool '{name}' not found in tools list.", "BadRequestError")
    return choice


def _json_plan(body: dict[str, Any], engine: str, seed: str) -> OutputPlan | None:
    fmt = body.get("response_format")
    if not isinstance(fmt, dict) or fmt.get("type") in (None, "text"):
        return None
    kind = fmt.get("type")
    if kind == "json_object":
        return json_text_plan(None, seed)
    if kind != "json_schema":
        return None  # structural tags: free text in the emulator
    spec = fmt.get("json_schema")
    if engine == "vllm":
        if not isinstance(spec, dict):
            raise _vllm_invalid("When response_format type is 'json_schema', the 'json_schema' "
                                "field must be provided.", "response_format", body)
        return json_text_plan(spec.get("schema") or {}, seed)
    schema = spec.get("schema") if isinstance(spec, dict) else fmt.get("schema")
    if not isinstance(schema, dict):
        raise EngineError(400, "schema_ is required for json_schema response format request.",
                          "BadRequestError")
    return json_text_plan(schema, seed)
