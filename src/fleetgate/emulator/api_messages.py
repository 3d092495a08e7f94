"""``POST /v1/messages`` (Anthropic Messages API) as vLLM 0.33 and SGLang 0.5.23 serve it.

Both engines convert the request to a chat completion (system -> system message, content
blocks -> text, ``tools``/``tool_choice`` -> function tools, ``output_config.format`` ->
``response_format``) and convert the answer back; so does ``parse_messages``, and the request
runs through the same parser, output plan and engine loop as chat. Wire facts (research
notes; fixtures tests/data/{vllm,sglang}_messages*.{json,txt}):

* streaming is ``event: <type>\\ndata: <json>\\n\\n``: ``message_start`` (usage
  ``input_tokens``, ``output_tokens: 0``), ``content_block_start`` / ``content_block_delta``
  (``text_delta``; ``input_json_delta`` for a ``tool_use`` block) / ``content_block_stop``,
  ``message_delta`` (``stop_reason`` and usage), ``message_stop``. **No** ``ping``, **no**
  ``[DONE]``;
* vLLM (anthropic/serving.py): id = the chat id ``chatcmpl-<16 hex>``, ``model`` = first
  served name, stream events ``exclude_unset`` (``index`` last; ``message_start`` keeps
  ``stop_reason``/``stop_sequence`` null; ``message_delta`` has both usage counts);
* SGLang (anthropic/serving.py): id ``msg_<32 hex>``, ``model`` = the request's, events
  ``exclude_none`` (``index`` second; ``message_delta`` usage has ``output_tokens`` only);
* non-stream bodies drop nulls: ``{id, type, role, content, model, stop_reason, usage}``;
* errors ``{"type": "error", "error": {"type", "message"}}``, except that vLLM reports a body
  that fails validation (e.g. no ``max_tokens``) in its OpenAI shape (global handler).

``max_tokens`` is mandatory on this API, so the emulator reads it as a cap: the answer has its
natural length (parsing.py) unless ``max_tokens`` is smaller (then ``stop_reason``
"max_tokens"). On chat, a given ``max_tokens`` is the exact length, as before.

May touch: parsing.py, plan.py, formats helpers. Must not touch: I/O, the engine.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import orjson

from fleetgate.emulator.parsing import EngineError, EngineLimits, ParsedRequest, parse_request
from fleetgate.emulator.plan import ToolProgress, body_seed, plan_output
from fleetgate.emulator.runtime import Output

Json = Any
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large",
               429: "rate_limit_error", 503: "overloaded_error"}


class OpenAIShapedError(EngineError):
    """vLLM: a body that fails pydantic validation is answered by the global handler."""


def anthropic_error(status: int, message: str, engine: str) -> Json:
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    if engine == "sglang" and status >= 500:
        message = "Internal server error"
    return {"type": "error", "error": {"type": kind, "message": message}}


def parse_messages(
    body: dict[str, Any], headers: Mapping[str, str], limits: EngineLimits, created: int
) -> tuple[ParsedRequest, MessagesSession]:
    from fleetgate.emulator.api_validation import validate_body  # it imports this module

    engine = limits.engine
    for field in ("model", "messages", "max_tokens"):
        if field not in body:
            if engine == "vllm":
                raise OpenAIShapedError(400, "1 validation error:\n  {'type': 'missing', 'loc': "
                                        f"'body.{field}', 'msg': 'Field required'}}",
                                        "Bad Request", f"body.{field}")
            raise EngineError(400, f"{field}: Field required", "invalid_request_error")
    if not isinstance(body["max_tokens"], int) or body["max_tokens"] <= 0:
        raise EngineError(400, "max_tokens must be positive", "invalid_request_error")
    validate_body("messages", body, engine)
    messages = _messages(body)
    chat: dict[str, Any] = {"model": body["model"], "messages": messages,
                            "max_tokens": body["max_tokens"], "stream": bool(body.get("stream"))}
    tools = [t for t in body.get("tools") or [] if isinstance(t, dict) and "name" in t]
    if tools:
        chat["tools"] = [{"type": "function", "function": {
            "name": t["name"], "description": t.get("description"),
            "parameters": t.get("input_schema") or {"type": "object"}}} for t in tools]
        chat["tool_choice"] = _tool_choice(body.get("tool_choice"))
    fmt = (body.get("output_config") or {}).get("format") if isinstance(
        body.get("output_config"), dict) else None
    if isinstance(fmt, dict) and isinstance(fmt.get("schema"), dict):
        chat["response_format"] = {"type": "json_schema", "json_schema": {
            "name": "json_schema", "schema": fmt["schema"]}}
    seed = body_seed(messages, chat.get("tools"), chat.get("tool_choice"),
                     chat.get("response_format"))
    plan = plan_output(chat, engine, seed)
    req = parse_request("chat", chat, headers, limits, created, plan)  # validates max_tokens
    natural = len(plan.pieces) + 1 if plan is not None else limits.natural_tokens
    if body["max_tokens"] >= natural:  # a cap here (it is mandatory), not a length to fill
        chat.pop("max_tokens")
        req = parse_request("chat", chat, headers, limits, created, plan)
    req = replace(req, include_usage=False, continuous_usage=False)
    if engine == "sglang":
        req = replace(req, request_id=f"msg_{uuid.uuid4().hex}", model=str(body["model"]))
    return req, MessagesSession(engine, req)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text":
            parts.append(str(block.get("text") or ""))
        elif block.get("type") == "tool_use":
            parts.append(orjson.dumps(block.get("input") or {}).decode())
        elif block.get("type") == "tool_result":
            parts.append(_text(block.get("content")))
    return "".join(parts)


def _messages(body: dict[str, Any]) -> list[Json]:
    out: list[Json] = []
    if body.get("system"):
        out.append({"role": "system", "content": _text(body["system"])})
    for msg in body["messages"] if isinstance(body["messages"], list) else []:
        if not isinstance(msg, dict):
            continue
        content = msg.get("content")
        results = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"
                   ] if isinstance(content, list) else []
        role = "tool" if results and msg.get("role") == "user" else str(msg.get("role"))
        out.append({"role": role, "content": _text(content)})
    return out


def _tool_choice(choice: Any) -> Any:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return {"any": "required", "none": "none"}.get(str(kind), "auto")


class MessagesSession:
    """One Messages answer: the event stream, or the message object."""

    def __init__(self, engine: str, req: ParsedRequest) -> None:
        self.engine, self.req = engine, req
        call = req.plan.call if req.plan is not None else None
        self.tools = ToolProgress(call) if call is not None else None
        self.call_id = _call_id(engine) if call is not None else ""
        self.index = 0
        self.block: str | None = None  # the open content block's type

    def _event(self, kind: str, fields: Json) -> bytes:
        payload = {"type": kind, **fields}
        if self.engine == "vllm" and "index" in payload:
            payload["index"] = payload.pop("index")  # vLLM's AnthropicStreamEvent field order
        return f"event: {kind}\ndata: ".encode() + orjson.dumps(payload) + b"\n\n"

    def _start(self, block: Json) -> bytes:
        self.block = block["type"]
        return self._event("content_block_start", {"index": self.index, "content_block": block})

    def _delta(self, delta: Json) -> bytes:
        return self._event("content_block_delta", {"index": self.index, "delta": delta})

    def opening(self) -> bytes:
        usage = {"input_tokens": self.req.prompt_tokens, "output_tokens": 0}
        message: Json = {"id": self.req.request_id, "type": "message", "role": "assistant",
                         "content": [], "model": self.req.model}
        if self.engine == "vllm":
            message |= {"stop_reason": None, "stop_sequence": None}
        return self._event("message_start", {"message": message | {"usage": usage}})

    def token(self, out: Output) -> bytes:
        if self.tools is not None:
            step = self.tools.step(out.text, last=out.finish_reason is not None)
            if step.name:
                call = self.req.plan.call if self.req.plan is not None else None
                return self._start({"type": "tool_use", "id": self.call_id,
                                    "name": call.name if call else "", "input": {}})
            if step.fragment:
                return self._delta({"type": "input_json_delta", "partial_json": step.fragment})
            return b""  # the parser holds the call's JSON back until the name is complete
        if not out.text:
            return b""
        data = b"" if self.block == "text" else self._start({"type": "text", "text": ""})
        return data + self._delta({"type": "text_delta", "text": out.text})

    def closing(self, out: Output) -> bytes:
        data = b""
        if self.block is not None:
            data += self._event("content_block_stop", {"index": self.index})
        reason = self.stop_reason(out.finish_reason)
        tokens = out.completion_tokens
        if self.engine == "vllm":
            delta = {"stop_reason": reason, "stop_sequence": None}
            usage = {"input_tokens": self.req.prompt_tokens, "output_tokens": tokens}
        else:
            delta, usage = {"stop_reason": reason}, {"output_tokens": tokens}
        data += self._event("message_delta", {"delta": delta, "usage": usage})
        return data + self._event("message_stop", {})

    def stop_reason(self, finish: str | None) -> str:
        if finish == "length":
            return "max_tokens"
        return "tool_use" if self.tools is not None and self.tools.started else "end_turn"

    def body(self, text: str, out: Output) -> Json:
        plan = self.req.plan
        blocks: list[Json] = []
        if plan is not None and plan.call is not None and out.finish_reason == "stop":
            blocks.append({"type": "tool_use", "id": _call_id(self.engine),
                           "name": plan.call.name,
                           "input": orjson.loads(plan.call.arguments)})
            reason = "tool_use"
        else:
            if text:
                blocks.append({"type": "text", "text": text})
            reason = "max_tokens" if out.finish_reason == "length" else "end_turn"
        return {"id": self.req.request_id, "type": "message", "role": "assistant",
                "content": blocks or [{"type": "text", "text": ""}], "model": self.req.model,
                "stop_reason": reason,
                "usage": {"input_tokens": self.req.prompt_tokens,
                          "output_tokens": out.completion_tokens}}


def _call_id(engine: str) -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex[:16]}" if engine == "vllm" else (
        f"call_{uuid.uuid4().hex[:24]}")
