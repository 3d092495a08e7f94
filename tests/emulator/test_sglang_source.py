"""The SGLang emulator against SGLang 0.5.23's own source (docs/engines.md §2.9)."""

from __future__ import annotations

import pytest

from fleetgate.emulator.config import EmulatorConfig
from fleetgate.emulator.formats_sglang import SglangWire

SERVED = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.mark.parametrize(("gpu", "chunk"), [("h100", 8192), ("h200", 8192), ("b200", 16384),
                                            ("mi300x", 16384), ("mi325x", 16384)])
def test_chunked_prefill_size_follows_sglangs_memory_rule(gpu: str, chunk: int) -> None:
    """arg_groups/memory_hook.py handle_gpu_memory_settings: 8192 below 160 GiB ("H20,
    H200"), 16384 above ("B200, MI300"); H200's 141 GB is below."""
    cfg = EmulatorConfig.model_validate({"engine": "sglang", "gpu": gpu,
                                         "served_models": [SERVED]})
    assert cfg.scheduler_config().max_num_batched_tokens == chunk


def test_streamed_error_frame_has_no_param() -> None:
    """serving_base.py create_streaming_error_response: ErrorResponse(param=None) nested
    under "error"; the plain response (create_error_response) keeps its param."""
    wire = SglangWire()
    frame = wire.error(400, "bad", "BadRequestError", "max_tokens", in_stream=True)
    assert frame == {"error": {"object": "error", "message": "bad", "type": "BadRequestError",
                               "param": None, "code": 400}}
    assert wire.error(400, "bad", "BadRequestError", "max_tokens")["param"] == "max_tokens"
