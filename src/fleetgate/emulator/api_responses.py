"""``POST /v1/responses`` (OpenAI Responses API) as vLLM 0.33 and SGLang 0.5.23 serve it.

``parse_responses`` turns the body into a chat-shaped request (``instructions`` -> system
message, ``input`` -> messages, ``text.format`` -> ``response_format``) so it runs through the
same parser, output plan and engine loop as chat; ``ResponsesSession`` writes the answer.
Wire facts (research notes; fixtures tests/data/{vllm,sglang}_responses*.{json,txt}):

* streaming is ``event: <type>\\ndata: <json>\\n\\n``, **no** ``data: [DONE]``; every event has
  ``sequence_number`` 0, 1, 2...: ``response.created``, ``response.in_progress``,
  ``response.output_item.added``, ``response.content_part.added``,
  ``response.output_text.delta``..., ``response.output_text.done``,
  ``response.content_part.done``, ``response.output_item.done``, then ``response.completed``
  (``response.incomplete`` when ``max_output_tokens`` cut it). Usage only in that last event;
* vLLM (openai/responses/serving.py, streaming_events.py): id ``resp_<16 hex>``, ``model`` =
  first served name, every ``ResponsesResponse`` field (nulls kept), ``temperature``/``top_p``
  from the model's generation config (0.6/0.9), ``max_output_tokens`` = the effective cap,
  the item's ``phase`` null and ``status`` "incomplete" on a cut;
* SGLang (serving_responses.py, protocol.py:2239): id ``resp_<32 hex>``, ``model`` = the
  request's, request fields echoed (null when unset), ``phase`` "final_answer", lifecycle
  events put ``type`` first, the item is always "completed";
* errors are nested ``{"error": {message, type, param, code}}`` for both (SGLang too).

Not modelled: function tools (the model answers in text), ``previous_response_id`` / store,
background mode, logprobs.

May touch: parsing.py, plan.py, formats helpers. Must not touch: I/O, the engine.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import orjson

from fleetgate.emulator.api_validation import validate_body
from fleetgate.emulator.formats import Json
from fleetgate.emulator.parsing import (
    EngineError,
    EngineLimits,
    ParsedRequest,
    chat_prompt_tokens,
    parse_request,
)
from fleetgate.emulator.plan import body_seed, plan_output
from fleetgate.emulator.runtime import Output

VLLM_TEMPERATURE, VLLM_TOP_P = 0.6, 0.9  # Llama-3.1-Instruct generation_config.json


def parse_responses(
    body: dict[str, Any], headers: Mapping[str, str], limits: EngineLimits, created: int
) -> tuple[ParsedRequest, ResponsesSession]:
    engine = limits.engine
    if "input" not in body:
        raise _missing("input", engine)
    validate_body("responses", body, engine)
    messages = _messages(body)
    model = body.get("model")
    if engine == "sglang" and model is not None and model not in limits.served_models:
        raise EngineError(404, f"The model '{model}' does not exist", "invalid_request_error",
                          "model")
    prompt = chat_prompt_tokens(messages)
    if engine == "vllm" and prompt >= limits.max_model_len:
        raise EngineError(400, f"The engine prompt length {prompt} exceeds the max_model_len "
                          f"{limits.max_model_len}. Please reduce prompt.",
                          "invalid_request_error", "input")
    chat = {"model": model, "messages": messages, "stream": bool(body.get("stream")),
            "max_tokens": body.get("max_output_tokens"),
            "response_format": _response_format(body.get("text"))}
    plan = plan_output(chat, engine, body_seed(messages, chat["response_format"]))
    try:
        req = parse_request("chat", chat, headers, limits, created, plan)
    except EngineError as exc:  # the chat wording, in the Responses envelope
        raise EngineError(exc.status, exc.message, "invalid_request_error", exc.param) from None
    if engine == "vllm":
        rid = body.get("request_id") or f"resp_{secrets.token_hex(8)}"
        req = replace(req, request_id=str(rid), include_usage=False, continuous_usage=False)
    else:
        name = model if isinstance(model, str) else limits.served_models[0]
        req = replace(req, request_id=f"resp_{uuid.uuid4().hex}", model=name,
                      include_usage=False, continuous_usage=False)
    room = limits.max_model_len - prompt
    asked = body.get("max_output_tokens")
    cap = min(asked, room) if isinstance(asked, int) and asked > 0 else room
    return req, ResponsesSession(engine, req, body, cap)


def _missing(field: str, engine: str) -> EngineError:
    detail = f"{{'type': 'missing', 'loc': ('body', '{field}'), 'msg': 'Field required'}}"
    if engine == "vllm":
        return EngineError(400, f"1 validation error:\n  {detail}", "Bad Request",
                           f"body.{field}")
    return EngineError(400, f"1 validation error: [{detail}]", "Bad Request")


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
    return ""


def _messages(body: dict[str, Any]) -> list[Json]:
    out: list[Json] = []
    if isinstance(body.get("instructions"), str):
        out.append({"role": "system", "content": body["instructions"]})
    items = body.get("input")
    if isinstance(items, str):
        return [*out, {"role": "user", "content": items}]
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "function_call_output":
            out.append({"role": "tool", "content": str(item.get("output") or "")})
        elif item.get("type") == "function_call":
            out.append({"role": "assistant", "content": str(item.get("arguments") or "")})
        else:
            out.append({"role": str(item.get("role") or "user"),
                        "content": _text_of(item.get("content"))})
    return out


def _response_format(text: Any) -> Json | None:
    fmt = text.get("format") if isinstance(text, dict) else None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("json_object", "json_schema"):
        return None
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {"name": fmt.get("name") or "response",
                                                   "schema": fmt.get("schema") or {}}}


class ResponsesSession:
    """One Responses answer: the event stream, or the response object."""

    def __init__(self, engine: str, req: ParsedRequest, body: dict[str, Any], cap: int) -> None:
        self.engine, self.req, self.echo, self.cap = engine, req, body, cap
        self.seq, self.text, self.open = 0, "", False
        self.msg_id = f"msg_{secrets.token_hex(8) if engine == 'vllm' else uuid.uuid4().hex}"

    # -- stream ----------------------------------------------------------------------------
    def _frame(self, kind: str, payload: Json) -> bytes:
        self.seq += 1
        return f"event: {kind}\ndata: ".encode() + orjson.dumps(payload) + b"\n\n"

    def _event(self, kind: str, fields: Json) -> bytes:
        """An item/part/text event: the openai event classes' (alphabetical) field order."""
        return self._frame(kind, dict(sorted(
            {**fields, "sequence_number": self.seq, "type": kind}.items())))

    def _lifecycle(self, kind: str, response: Json) -> bytes:
        if self.engine == "sglang":  # ResponsesLifecycleEvent (protocol.py:2415)
            return self._frame(kind, {"type": kind, "response": response,
                                      "sequence_number": self.seq})
        return self._frame(kind, {"response": response, "sequence_number": self.seq,
                                  "type": kind})

    def opening(self) -> bytes:
        snapshot = self.response("in_progress", [], None)
        return (self._lifecycle("response.created", snapshot)
                + self._lifecycle("response.in_progress", snapshot))

    def token(self, out: Output) -> bytes:
        if not out.text:
            return b""  # the EOS step (or an empty delta) emits no event
        data = b""
        if not self.open:
            self.open = True
            item = self.message("in_progress", None)
            data += self._event("response.output_item.added", {"item": item, "output_index": 0})
            data += self._event("response.content_part.added", {
                "content_index": 0, "item_id": self.msg_id, "output_index": 0,
                "part": _part("", [] if self.engine == "vllm" else None)})
        self.text += out.text
        return data + self._event("response.output_text.delta", {
            "content_index": 0, "delta": out.text, "item_id": self.msg_id, "logprobs": [],
            "output_index": 0})

    def closing(self, out: Output) -> bytes:
        status = _status(out.finish_reason)
        data, output = b"", []
        if self.open:
            item = self.message(status if self.engine == "vllm" else "completed", self.text)
            data += self._event("response.output_text.done", {
                "content_index": 0, "item_id": self.msg_id, "logprobs": [], "output_index": 0,
                "text": self.text})
            data += self._event("response.content_part.done", {
                "content_index": 0, "item_id": self.msg_id, "output_index": 0,
                "part": _part(self.text, None)})
            data += self._event("response.output_item.done", {"item": item, "output_index": 0})
            output = [item]
        final = self.response(status, output, self.usage(out))
        return data + self._lifecycle(f"response.{status}", final)

    # -- non-stream ------------------------------------------------------------------------
    def body(self, text: str, out: Output) -> Json:
        status = _status(out.finish_reason)
        if self.engine == "vllm":
            output = [self.message(status, text)]
        else:
            output = [self.message("completed", text)] if text else []
        return self.response(status, output, self.usage(out))

    # -- objects ---------------------------------------------------------------------------
    def message(self, status: str, text: str | None) -> Json:
        content = [_part(text, None)] if text else []
        phase = None if self.engine == "vllm" else "final_answer"
        return {"id": self.msg_id, "content": content, "role": "assistant", "status": status,
                "type": "message", "phase": phase}

    def usage(self, out: Output) -> Json:
        prompt, completion = self.req.prompt_tokens, out.completion_tokens
        if self.engine == "vllm":
            return {"input_tokens": prompt,
                    "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0,
                                             "input_tokens_per_turn": [],
                                             "cached_tokens_per_turn": []},
                    "output_tokens": completion,
                    "output_tokens_details": {"reasoning_tokens": 0, "tool_output_tokens": 0,
                                              "output_tokens_per_turn": [],
                                              "tool_output_tokens_per_turn": []},
                    "total_tokens": prompt + completion}
        return {"input_tokens": prompt,
                "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                "output_tokens": completion,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt + completion}

    def response(self, status: str, output: list[Json], usage: Json | None) -> Json:
        b, req = self.echo, self.req
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        if self.engine == "sglang":
            effort = (b.get("reasoning") or {}).get("effort") if isinstance(
                b.get("reasoning"), dict) else None
            text = b.get("text") if isinstance(b.get("text"), dict) else (
                {"format": {"type": "text"}} if output else None)
            return {"id": req.request_id, "object": "response", "created_at": req.created,
                    "model": req.model, "output": output, "status": status, "usage": usage,
                    "parallel_tool_calls": b.get("parallel_tool_calls", True),
                    "tool_choice": b.get("tool_choice", "auto"), "tools": b.get("tools") or [],
                    "error": None, "incomplete_details": incomplete,
                    "instructions": b.get("instructions"),
                    "max_output_tokens": b.get("max_output_tokens"),
                    "previous_response_id": b.get("previous_response_id"),
                    "reasoning": {"effort": effort if effort in ("minimal", "low", "medium",
                                                                 "high") else None,
                                  "summary": None},
                    "store": b.get("store", True), "temperature": b.get("temperature"),
                    "text": text, "top_p": b.get("top_p"),
                    "truncation": b.get("truncation", "disabled"), "user": b.get("user"),
                    "metadata": b.get("metadata") or {}}
        return {"id": req.request_id, "created_at": req.created,
                "incomplete_details": incomplete, "instructions": b.get("instructions"),
                "metadata": b.get("metadata"), "model": req.model, "object": "response",
                "output": output, "parallel_tool_calls": b.get("parallel_tool_calls", True),
                "temperature": _num(b.get("temperature"), VLLM_TEMPERATURE),
                "tool_choice": b.get("tool_choice", "auto"), "tools": b.get("tools") or [],
                "top_p": _num(b.get("top_p"), VLLM_TOP_P), "background": False,
                "max_output_tokens": self.cap, "max_tool_calls": b.get("max_tool_calls"),
                "previous_response_id": None, "prompt": None, "prompt_cache_options": None,
                "prompt_cache_key": b.get("prompt_cache_key"), "prompt_cache_retention": None,
                "reasoning": b.get("reasoning"), "safety_identifier": b.get("safety_identifier"),
                "service_tier": b.get("service_tier", "auto"), "status": status,
                "text": b.get("text"), "top_logprobs": None,
                "truncation": b.get("truncation", "disabled"), "usage": usage,
                "user": b.get("user"), "presence_penalty": _num(b.get("presence_penalty"), 0.0),
                "frequency_penalty": _num(b.get("frequency_penalty"), 0.0),
                "kv_transfer_params": None, "ec_transfer_params": None,
                "input_messages": None, "output_messages": None}


def _part(text: str, logprobs: list[Any] | None) -> Json:
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs}


def _status(finish: str | None) -> str:
    return "incomplete" if finish == "length" else "completed"


def _num(value: Any, default: float) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else (
        default)
