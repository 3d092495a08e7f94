"""Mid-stream resume onto a real vLLM: the continuation request is one the engine takes.

A gateway of its own (the session gateway is left alone) over an emulated vLLM (H100, tried
first by the ``latency`` policy) and the session's real vLLM on the CPU. The emulated engine
is SIGKILLed after some tokens of a stream; the real vLLM gets the continuation (the text so
far as an assistant message with ``continue_final_message: true`` and
``add_generation_prompt: false``, ``max_tokens`` reduced) and the client's stream ends
normally with ``max_tokens`` tokens in all (``ignore_eos``: the tiny model would stop at
random), one usage chunk, one id, no error event. The prompt count is the real engine's
continuation prompt less the tokens relayed, so it differs from the emulator's own count by
the tokenizers' difference; it is only checked to be positive.

Runs inside ``make test-engines`` (before test_vllm_lifecycle.py stops the engine).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from engines_harness import MAX_MODEL_LEN, PUBLIC, SERVED, RealEngine

from fleetgate.emulator.formats import token_text
from procs import Proc, pool, spawn_emulator, spawn_gateway

M = 24
CUT_AFTER = 6
MESSAGES = [{"role": "user", "content": "Say something about GPUs."}]


@pytest.fixture()
def pair(real: RealEngine, tmp_path: Path) -> Iterator[tuple[Proc, Proc]]:
    """(the emulated engine, a gateway over it and the real vLLM)."""
    emu = spawn_emulator("vllm", "h100", [SERVED], speed=1.0,
                         extra=["--max-model-len", str(MAX_MODEL_LEN)])
    config = {"pools": [pool("h100-emu-resume", "h100", "vllm", 2.95, [emu.url],
                             {PUBLIC: SERVED}),
                        pool("cpu-vllm-resume", "cpu", "vllm", 0.05, [real.url],
                             {PUBLIC: SERVED})],
              "policies": {"fastest": {"strategy": "latency"}}, "default_policy": "fastest"}
    gw = spawn_gateway(config, tmp_path, env={"FLEETGATE_REQUEST_LOG": "off"})
    yield emu, gw
    gw.stop()
    emu.stop()


def test_a_stream_moves_from_a_killed_engine_to_the_real_vllm(
        pair: tuple[Proc, Proc]) -> None:
    emu, gw = pair
    httpx.post(emu.url + "/emulator/faults", json={"slow_factor": 10.0}).raise_for_status()
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)
    with client.chat.completions.with_streaming_response.create(
            model=PUBLIC, messages=MESSAGES, max_tokens=M, stream=True,  # type: ignore[arg-type]
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True}) as raw:
        assert raw.headers["x-fleetgate-endpoint"] == "h100-emu-resume-0"
        stream = iter(raw.parse())
        chunks = [next(stream) for _ in range(CUT_AFTER)]
        emu.kill()
        chunks.extend(stream)
    assert len({c.id for c in chunks}) == 1
    usages = [c.usage for c in chunks if c.usage is not None]
    assert len(usages) == 1 and usages[0].completion_tokens == M and usages[0].prompt_tokens > 0
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    relayed = "".join(token_text(i) for i in range(CUT_AFTER - 1))  # after the role chunk
    assert text.startswith(relayed) and len(text) > len(relayed)
    attempts = httpx.get(gw.url + "/admin/decisions?limit=1").json()["decisions"][0]["attempts"]
    assert [(a["endpoint"], a["migrated"]) for a in attempts] == [
        ("h100-emu-resume-0", True), ("cpu-vllm-resume-0", True)]
    assert attempts[-1]["status"] == 200
