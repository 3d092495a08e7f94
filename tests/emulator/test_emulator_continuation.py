"""The emulated engines continue an answer the way vLLM and SGLang do (parsing.py).

A chat whose last message is the assistant's, with ``continue_final_message``, is continued,
not answered anew: the output starts where the assistant's text ends when that text is the
model's own, and the prefix counts as its tokens; vLLM refuses the flag beside
``add_generation_prompt: true``. A completions prompt ending in the model's own output is
continued the same way.
"""

from __future__ import annotations

import pytest

from fleetgate.emulator.formats import filler_tail, filler_tokens, token_text
from fleetgate.emulator.parsing import EngineError, EngineLimits, parse_request

SERVED = "meta-llama/Llama-3.1-8B-Instruct"
USER = [{"role": "user", "content": "tell me a story"}]


def limits(engine: str) -> EngineLimits:
    return EngineLimits(engine, (SERVED,), 4096)  # type: ignore[arg-type]


def own(k: int) -> str:
    return "".join(token_text(i) for i in range(k))


def test_filler_recognises_its_own_text() -> None:
    assert filler_tokens(own(5)) == 5 and filler_tokens(own(40)) == 40
    assert filler_tokens(own(5)[:-1]) == 0 and filler_tokens("hello") == 0
    assert filler_tail("Say:" + own(7)) == (7, len(own(7)))
    assert filler_tail("The capital of France is") == (0, 0)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_continued_chat_starts_after_its_prefix(engine: str) -> None:
    fresh = parse_request("chat", {"model": SERVED, "messages": USER, "max_tokens": 8},
                          {}, limits(engine), 0)
    body = {"model": SERVED, "max_tokens": 5, "continue_final_message": True,
            "add_generation_prompt": False,
            "messages": [*USER, {"role": "assistant", "content": own(3)}]}
    cont = parse_request("chat", body, {}, limits(engine), 0)
    assert cont.offset == 3 and cont.max_tokens == 5
    assert cont.prompt_tokens == fresh.prompt_tokens + 3  # the prefix, no second header


def test_vllm_refuses_continue_final_message_with_a_generation_prompt() -> None:
    body = {"model": SERVED, "continue_final_message": True, "add_generation_prompt": True,
            "messages": [*USER, {"role": "assistant", "content": own(3)}]}
    with pytest.raises(EngineError, match="Cannot set both"):
        parse_request("chat", body, {}, limits("vllm"), 0)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_completions_prompt_ending_in_its_own_text_is_continued(engine: str) -> None:
    fresh = parse_request("completion", {"model": SERVED, "prompt": "Say:"}, {},
                          limits(engine), 0)
    cont = parse_request("completion", {"model": SERVED, "prompt": "Say:" + own(4)}, {},
                         limits(engine), 0)
    assert cont.offset == 4 and cont.prompt_tokens == fresh.prompt_tokens + 4
