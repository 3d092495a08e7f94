"""SGLang 0.5.23 OpenAI-server bodies: chunks, responses and errors (engines.md §2.5, §2.6).

Bare 32-hex ids, ``model`` echoes the client, ``reasoning_content: null`` in every chat delta,
chunks only for non-empty text, a separate finish chunk with ``matched_stop`` (EOS id 128009
for a natural stop), continuous usage independent of include_usage; errors flat
``{"object": "error", message, type, param, code}``, nested only inside SSE error frames.
Tool calls as ``--tool-call-parser llama3`` returns them (ids ``call_<24 hex>``, content "",
finish "tool_calls"; tests/data/sglang_chat_tools*.{json,txt}).

May touch: formats.py helpers. Must not touch: I/O, clocks, the engine.
"""

from __future__ import annotations

import uuid

from fleetgate.emulator.formats import (
    Json,
    matched_stop,
    response_object,
    usage_body,
)
from fleetgate.emulator.parsing import ParsedRequest
from fleetgate.emulator.plan import ToolStep


class SglangWire:
    """SGLang 0.5.23 OpenAI server bodies (engines.md §2.5, §2.6)."""

    def _chunk(self, req: ParsedRequest, choices: list[Json]) -> Json:
        obj = "chat.completion.chunk" if req.kind == "chat" else "text_completion"
        return {
            "id": req.request_id,
            "object": obj,
            "created": req.created,
            "model": req.model,
            "choices": choices,
        }

    def _with_usage(self, req: ParsedRequest, chunk: Json, completion_tokens: int) -> Json:
        if req.continuous_usage:
            chunk["usage"] = usage_body(req, completion_tokens)
        return chunk

    def stream_start(self, req: ParsedRequest) -> list[Json]:
        if req.kind != "chat":
            return []
        delta = {"reasoning_content": None, "role": "assistant", "content": ""}  # msgspec order
        choice = {
            "index": 0,
            "delta": delta,
            "logprobs": None,
            "finish_reason": None,
            "matched_stop": None,
        }
        return [self._with_usage(req, self._chunk(req, [choice]), 0)]

    def stream_token(
        self, req: ParsedRequest, text: str, completion_tokens: int, finish_reason: str | None
    ) -> list[Json]:
        matched = matched_stop(finish_reason)
        if req.kind != "chat":  # completions: no separate finish chunk
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish_reason,
                "matched_stop": matched,
            }
            return [self._with_usage(req, self._chunk(req, [choice]), completion_tokens)]
        chunks: list[Json] = []
        if text:
            choice = {
                "index": 0,
                "delta": {"reasoning_content": None, "content": text},
                "logprobs": None,
                "finish_reason": None,
                "matched_stop": None,
            }
            chunks.append(self._with_usage(req, self._chunk(req, [choice]), completion_tokens))
        if finish_reason is not None:
            choice = {
                "index": 0,
                "delta": {"reasoning_content": None},
                "logprobs": None,
                "finish_reason": finish_reason,
                "matched_stop": matched,
            }
            chunks.append(self._with_usage(req, self._chunk(req, [choice]), completion_tokens))
        return chunks

    def tool_call_id(self) -> str:
        return f"call_{uuid.uuid4().hex[:24]}"

    def tool_stream_token(
        self, req: ParsedRequest, step: ToolStep, call_id: str, completion_tokens: int,
        finish_reason: str | None,
    ) -> list[Json]:
        """``_process_tool_call_stream`` (serving_chat.py:3604-3730): pydantic chunks with
        every null kept; the name chunk carries ``arguments: ""``; then the separate msgspec
        finish chunk ("tool_calls" once a call went out)."""
        plan = req.plan
        assert plan is not None and plan.call is not None
        chunks: list[Json] = []
        if step.name or step.fragment:
            call = {"id": call_id if step.name else None, "index": 0, "type": "function",
                    "function": {"name": plan.call.name if step.name else None,
                                 "arguments": "" if step.name else step.fragment}}
            delta = {"role": None, "content": None, "reasoning_content": None,
                     "tool_calls": [call]}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None,
                      "matched_stop": None}
            usage = _full_usage(req, completion_tokens) if req.continuous_usage else None
            chunks.append(self._chunk(req, [choice]) | {"usage": usage})
        if finish_reason is not None:
            reason = "tool_calls" if finish_reason == "stop" and step.started else finish_reason
            choice = {"index": 0, "delta": {"reasoning_content": None}, "logprobs": None,
                      "finish_reason": reason, "matched_stop": matched_stop(finish_reason)}
            chunks.append(self._with_usage(req, self._chunk(req, [choice]), completion_tokens))
        return chunks

    def stream_end(self, req: ParsedRequest, completion_tokens: int) -> list[Json]:
        if not req.include_usage:
            return []
        usage = usage_body(req, completion_tokens) | {
            "prompt_tokens_details": None,
            "reasoning_tokens": 0,
        }
        if req.kind == "chat":
            usage["completion_tokens_details"] = None
        return [self._chunk(req, []) | {"usage": usage}]

    def response(
        self, req: ParsedRequest, text: str, completion_tokens: int, finish_reason: str
    ) -> Json:
        usage = usage_body(req, completion_tokens) | {
            "prompt_tokens_details": None,
            "reasoning_tokens": 0,
        }
        matched = matched_stop(finish_reason)
        if req.kind == "chat":
            usage["completion_tokens_details"] = None
            # ChatMessage drops tool_calls when None (protocol.py:1293-1304)
            message: Json = {"role": "assistant", "content": text, "reasoning_content": None}
            plan = req.plan
            if plan is not None and plan.call is not None and finish_reason == "stop":
                message["content"] = ""
                message["tool_calls"] = [
                    {"id": self.tool_call_id(), "index": 0, "type": "function",
                     "function": {"name": plan.call.name, "arguments": plan.call.arguments}}]
                finish_reason, matched = "tool_calls", None
            choice: Json = {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish_reason,
                "matched_stop": matched,
            }
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish_reason,
                "matched_stop": matched,
            }
        return {
            "id": req.request_id,
            "object": response_object(req),
            "created": req.created,
            "model": req.model,
            "choices": [choice],
            "usage": usage,
            "metadata": {"weight_version": "default"},
        }

    def error(
        self,
        status: int,
        message: str,
        err_type: str,
        param: str | None = None,
        *,
        in_stream: bool = False,
    ) -> Json:
        flat = {
            "object": "error",
            "message": message,
            "type": err_type,
            "param": None if in_stream else param,  # create_streaming_error_response: None
            "code": status,
        }
        return {"error": flat} if in_stream else flat


def _full_usage(req: ParsedRequest, completion_tokens: int) -> Json:
    return usage_body(req, completion_tokens) | {
        "prompt_tokens_details": None, "reasoning_tokens": 0, "completion_tokens_details": None}
