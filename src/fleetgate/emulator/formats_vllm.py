"""vLLM 0.33 OpenAI-server bodies: chunks, responses and errors (engines.md §1.5, §1.6).

Ids ``chatcmpl-<16 hex>`` / ``cmpl-<16 hex>`` (set by parsing.py), ``model`` = the first served
name, a role chunk, one chunk per token with ``finish_reason`` on the last token's chunk, the
usage chunk (``choices: []``) only with ``stream_options.include_usage``, ``system_fingerprint``
on the finish chunk or, with usage, on the usage chunk; errors nested
``{"error": {message, type, param, code}}``.

May touch: formats.py helpers. Must not touch: I/O, clocks, the engine.
"""

from __future__ import annotations

import hashlib

from fleetgate.emulator.formats import VLLM_VERSION, Json, response_object, usage_body
from fleetgate.emulator.parsing import ParsedRequest


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
        chunk = self._chunk(req, [choice]) | {"kv_transfer_params": None}
        if finish_reason is not None and not req.include_usage:
            chunk["system_fingerprint"] = self.system_fingerprint
        if req.continuous_usage:
            chunk["usage"] = usage_body(req, completion_tokens)
        return [chunk]

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
        if req.kind == "chat":
            choice = _chat_choice(text, finish_reason)
            tail: Json = {"prompt_logprobs": None, "prompt_token_ids": None}
        else:
            choice = _completion_choice(text, finish_reason)
            tail = {}
        usage = usage_body(req, completion_tokens) | {"prompt_tokens_details": None}
        head = {"id": req.request_id, "object": response_object(req), "created": req.created,
                "model": req.model, "choices": [choice], "service_tier": None,
                "system_fingerprint": None, "usage": usage}  # fmt: skip
        return head | tail | {"kv_transfer_params": None}

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


def _chat_choice(text: str, finish_reason: str) -> Json:
    message: Json = {"role": "assistant", "content": text, "refusal": None,
                     "annotations": None, "audio": None, "function_call": None,
                     "tool_calls": [], "reasoning": None}  # fmt: skip
    return {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason,
            "stop_reason": None, "token_ids": None}  # fmt: skip


def _completion_choice(text: str, finish_reason: str) -> Json:
    return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason,
            "stop_reason": None, "prompt_logprobs": None, "prompt_token_ids": None,
            "token_ids": None}  # fmt: skip
