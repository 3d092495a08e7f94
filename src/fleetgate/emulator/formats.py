"""What both emulated engines' bodies share: SSE framing, usage, filler text, model cards.

The per-engine bodies live in formats_vllm.py (vLLM 0.33, engines.md §1.5-1.6) and
formats_sglang.py (SGLang 0.5.23, §2.5-2.6); both implement ``WireFormat``. SSE frames are
``data: <json>\n\n``, the stream always ends with ``data: [DONE]\n\n`` and the content type is
``text/event-stream; charset=utf-8``.

Generated text is deterministic filler: token i is the i-th word of a fixed cycle, with a
leading space after the first; the EOS token that ends a natural stop has no text. The model
continues its own text: a prefix that is its first k tokens (a chat's final assistant message
with ``continue_final_message``, the tail of a completions prompt) makes it start at token k,
and that prefix counts k prompt tokens (``filler_tokens``, ``filler_tail``).

May touch: orjson, the request description from parsing.py, plan.py's types. Must not touch:
I/O, clocks (``created`` comes in with the request), the engine.
"""

from __future__ import annotations

from typing import Any, Protocol

import orjson

from fleetgate.emulator.parsing import ParsedRequest
from fleetgate.emulator.plan import ToolStep

VLLM_VERSION = "0.33.0"
SGLANG_VERSION = "0.5.23"
LLAMA3_EOS_TOKEN_ID = 128009
DONE_FRAME = b"data: [DONE]\n\n"
SSE_CONTENT_TYPE = "text/event-stream; charset=utf-8"
_FILLER = (
    "The quick brown fox jumps over the lazy dog while the engine streams one token per step "
    "and every chunk arrives in order ."
)
_WORDS = tuple(_FILLER.split(" "))

Json = dict[str, Any]


def token_text(index: int, eos: bool = False) -> str:
    """Deterministic text of output token ``index`` (EOS has none)."""
    if eos:
        return ""
    word = _WORDS[index % len(_WORDS)]
    return word if index == 0 else " " + word


_filler_text = ""


def filler_tokens(text: str) -> int:
    """How many output tokens ``text`` is when it is exactly the start of the emulated
    model's own output (its first k filler tokens); 0 when it is not."""
    global _filler_text
    n = len(text)
    while len(_filler_text) <= n:  # grown once, as far as the longest text asked about
        k = _filler_text.count(" ") + 1 if _filler_text else 0
        _filler_text += "".join(token_text(i) for i in range(k, k + 256))
    if not n or _filler_text[n] != " " or not _filler_text.startswith(text):
        return 0
    return text.count(" ") + 1


def filler_tail(text: str) -> tuple[int, int]:
    """(tokens, characters) of the longest tail of ``text`` that is the start of the
    emulated model's own output; (0, 0) when there is none."""
    start = text.find(_WORDS[0])
    while start >= 0:
        tokens = filler_tokens(text[start:])
        if tokens:
            return tokens, len(text) - start
        start = text.find(_WORDS[0], start + 1)
    return 0, 0


def sse(obj: Json) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def usage_body(req: ParsedRequest, completion_tokens: int) -> Json:
    return {
        "prompt_tokens": req.prompt_tokens,
        "total_tokens": req.prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


class WireFormat(Protocol):
    """What the server needs from an engine's wire format."""

    def stream_start(self, req: ParsedRequest) -> list[Json]: ...

    def stream_token(
        self, req: ParsedRequest, text: str, completion_tokens: int, finish_reason: str | None
    ) -> list[Json]: ...

    def stream_end(self, req: ParsedRequest, completion_tokens: int) -> list[Json]: ...

    def tool_call_id(self) -> str: ...

    def tool_stream_token(
        self, req: ParsedRequest, step: ToolStep, call_id: str, completion_tokens: int,
        finish_reason: str | None,
    ) -> list[Json]: ...

    def response(
        self, req: ParsedRequest, text: str, completion_tokens: int, finish_reason: str
    ) -> Json: ...

    def error(
        self,
        status: int,
        message: str,
        err_type: str,
        param: str | None = None,
        *,
        in_stream: bool = False,
    ) -> Json: ...


def response_object(req: ParsedRequest) -> str:
    return "chat.completion" if req.kind == "chat" else "text_completion"


def matched_stop(finish_reason: str | None) -> int | None:
    return LLAMA3_EOS_TOKEN_ID if finish_reason == "stop" else None


def model_cards(
    engine: str, served: list[str], root: str, max_model_len: int, created: int, perm_ids: list[str]
) -> Json:
    """``GET /v1/models`` body (vLLM: one card per alias with a permission; SGLang: none)."""
    cards: list[Json] = []
    for name, perm in zip(served, perm_ids, strict=True):
        card: Json = {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": engine,
            "root": root if engine == "vllm" else name,
            "parent": None,
            "max_model_len": max_model_len,
        }
        if engine == "vllm":
            card["permission"] = [
                {
                    "id": perm,
                    "object": "model_permission",
                    "created": created,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ]
        cards.append(card)
    return {"object": "list", "data": cards}
