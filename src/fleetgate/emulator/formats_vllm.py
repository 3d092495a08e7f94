"""vLLM 0.33 OpenAI-server bodies: chunks, responses and errors (engines.md §1.5, §1.6).

Ids ``chatcmpl-<16 hex>`` / ``cmpl-<16 hex>`` (set by parsing.py), ``model`` = the first served
name, a role chunk, one chunk per token with ``finish_reason`` on the last token's chunk, the
usage chunk (``choices: []``) only with ``stream_options.include_usage``, ``system_fingerprint``
on the finish chunk or, with usage, on the usage chunk; errors nested
``{"error": {message, type, param, code}}``. Tool calls as the llama3_json parser streams and
returns them (ids ``chatcmpl-tool-<16 hex>``; tests/data/vllm_chat_tools*.{json,txt}).

May touch: formats.py helpers. Must not touch: I/O, clocks, the engine.
"""

from __future__ import annotations

import hashlib
import secrets

from fleetgate.emulator.formats import VLLM_VERSION, Json, response_object, usage_body
from fleetgate.emulator.parsing import ParsedRequest
from fleetgate.emulator.plan import ToolStep


class VllmWire:
    """vLLM 0.33 OpenAI server bodies (engines.md §1.5, §1.6)."""

    def __init__(self, fingerprint_seed: str, tp: int) -> None:
        digest = hashlib.sha256(fingerprint_seed.encode()).hexdigest()[:8]
        tp_part = f"-tp{tp}" if tp > 1 else ""
        self.system_fingerprint = f"vllm-{VLLM_VERSION}{tp_part}-{digest}"

    def _chunk(self, req: ParsedRequest, choices: list[Json]) -> Json:
        obj = "chat.completion.chunk" if req.kind == "chat" else "text_completion"
        return {
            "id": req.request_id,
            "object": obj,
            "created": req.created,
            "model": req.model,
            "choices": choices,
        }

    def stream_start(self, req: ParsedRequest) -> list[Json]:
        if req.kind != "chat":
            return []
        choice = {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        chunk = self._chunk(req, [choice]) | {"prompt_token_ids": None, "prompt_text": None}
        if req.continuous_usage:
            chunk["usage"] = usage_body(req, 0)
        return [chunk]

    def stream_token(
        self, req: ParsedRequest, text: str, completion_tokens: int, finish_reason: str | None
    ) -> list[Json]:
        if req.kind != "chat":
            choice: Json = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": None,
                "prompt_token_ids": None,
                "token_ids": None,
                "weight_versions": None,
            }
        elif finish_reason is None:
            choice = {
                "index": 0,
                "delta": {"content": text},
                "logprobs": None,
                "finish_reason": None,
                "token_ids": None,
            }
        else:
            choice = {
                "index": 0,
                "delta": {"content": text},
                "logprobs": None,
                "finish_reason": finish_reason,
                "stop_reason": None,
                "token_ids": None,
                "weight_versions": None,
            }
        return [self._token_chunk(req, choice, completion_tokens, finish_reason)]

    def _token_chunk(
        self, req: ParsedRequest, choice: Json, completion_tokens: int, finish: str | None
    ) -> Json:
        chunk = self._chunk(req, [choice]) | {"kv_transfer_params": None}
        if finish is not None and not req.include_usage:
            chunk["system_fingerprint"] = self.system_fingerprint
        if req.continuous_usage:
            chunk["usage"] = usage_body(req, completion_tokens)
        return chunk

    def tool_call_id(self) -> str:
        return f"chatcmpl-tool-{secrets.token_hex(8)}"

    def tool_stream_token(
        self, req: ParsedRequest, step: ToolStep, call_id: str, completion_tokens: int,
        finish_reason: str | None,
    ) -> list[Json]:
        """llama3_json streaming (tool_parsers/llama_tool_parser.py): nothing until the name
        is complete, then the id/type/name delta, then argument fragments; the EOS step sends
        ``arguments: ""`` with the finish reason."""
        plan = req.plan
        assert plan is not None and plan.call is not None
        calls: list[Json] | None = None
        if step.name:
            calls = [{"id": call_id, "type": "function", "index": 0,
                      "function": {"name": plan.call.name}}]
        elif step.fragment is not None:
            calls = [{"index": 0, "function": {"arguments": step.fragment}}]
        if calls is None and finish_reason is None:
            return []  # the parser has nothing to send yet
        delta: Json = {"tool_calls": calls} if calls else {}
        if finish_reason is None:
            choice: Json = {"index": 0, "delta": delta, "logprobs": None,
                            "finish_reason": None, "token_ids": None}
        else:
            reason = _tool_finish(finish_reason, step.started, plan.named)
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason,
                      "stop_reason": None, "token_ids": None, "weight_versions": None}
        return [self._token_chunk(req, choice, completion_tokens, finish_reason)]

    def stream_end(self, req: ParsedRequest, completion_tokens: int) -> list[Json]:
        if not req.include_usage:
            return []
        return [
            self._chunk(req, [])
            | {
                "usage": usage_body(req, completion_tokens),
                "system_fingerprint": self.system_fingerprint,
            }
        ]

    def response(
        self, req: ParsedRequest, text: str, completion_tokens: int, finish_reason: str
    ) -> Json:
        usage = usage_body(req, completion_tokens) | {"prompt_tokens_details": None}
        if req.kind == "chat":
            choice = self._chat_choice(req, text, finish_reason)
            usage["completion_tokens_details"] = None
            tail: Json = {"prompt_logprobs": None, "prompt_token_ids": None,
                          "prompt_text": None, "kv_transfer_params": None,
                          "ec_transfer_params": None, "metrics": None}
        else:
            choice = _completion_choice(text, finish_reason)
            tail = {"kv_transfer_params": None}
        head = {"id": req.request_id, "object": response_object(req), "created": req.created,
                "model": req.model, "choices": [choice], "service_tier": None,
                "system_fingerprint": None, "usage": usage}  # fmt: skip
        return head | tail

    def _chat_choice(self, req: ParsedRequest, text: str, finish_reason: str) -> Json:
        """``ChatCompletionResponseChoice`` (chat_completion/protocol.py:76-141): the message
        drops ``tool_calls`` when empty; a parsed tool call leaves ``content`` null (""
        for a forced tool_choice, message_assembly.py:58)."""
        plan, calls = req.plan, []
        content: str | None = text
        finish = finish_reason
        if plan is not None and plan.call is not None and finish_reason == "stop":
            content = "" if plan.forced else None
            calls = [{"id": self.tool_call_id(), "type": "function",
                      "function": {"name": plan.call.name, "arguments": plan.call.arguments}}]
            finish = _tool_finish(finish_reason, True, plan.named)
        elif plan is not None and plan.forced:
            content = text or ""
        message: Json = {"role": "assistant", "content": content, "refusal": None,
                         "annotations": None, "audio": None, "function_call": None}
        if calls:
            message["tool_calls"] = calls
        message["reasoning"] = None
        return {"index": 0, "message": message, "logprobs": None, "finish_reason": finish,
                "stop_reason": None, "token_ids": None, "routed_experts": None,
                "weight_versions": None}  # fmt: skip

    def error(
        self,
        status: int,
        message: str,
        err_type: str,
        param: str | None = None,
        *,
        in_stream: bool = False,
    ) -> Json:
        return {"error": {"message": message, "type": err_type, "param": param, "code": status}}


def _tool_finish(finish_reason: str, called: bool, named: bool) -> str:
    """``resolve_finish_reason`` (serve/utils/tool_calls_utils.py:41): "tool_calls" for a
    call that stopped on its own, unless the caller named the tool ("stop", as OpenAI)."""
    return "tool_calls" if finish_reason == "stop" and called and not named else finish_reason


def _completion_choice(text: str, finish_reason: str) -> Json:
    return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason,
            "stop_reason": None, "prompt_logprobs": None, "prompt_token_ids": None,
            "token_ids": None}  # fmt: skip
