"""Emulated vLLM 0.33 / SGLang 0.5.23 engine servers for tests, demos and experiments.

Same endpoints, SSE framing, usage chunk, error shapes and ``/metrics`` names as the real
engines, over a continuous-batching performance model per GPU (perfmodel.py, using the GPU
catalog in fleetgate.catalog). Module map:

* ``config``         - ``EmulatorConfig`` (validated settings, engine defaults)
* ``perfmodel``      - ``EngineSim``: the pure scheduler + roofline step cost
* ``runtime``        - the asyncio engine loop feeding per-request token queues
* ``parsing``        - request validation and token counting per engine
* ``formats``        - SSE framing, usage, filler text, model cards (shared)
* ``formats_vllm`` / ``formats_sglang``   - chunk / response / error bodies per engine
* ``metrics``        - the metrics hook protocol and family tables (shared)
* ``metrics_vllm`` / ``metrics_sglang``   - Prometheus families per engine (private registry)
* ``faults``         - run-time fault injection (``/emulator/faults``) as ASGI middleware
* ``plan`` / ``schema`` - tool calls and JSON output: what the model writes, minimal schema
                       instances
* ``sessions``       - per-request stream sessions (chat / completions framing)
* ``api_responses`` / ``api_messages`` / ``api_embeddings`` - /v1/responses, /v1/messages,
                       /v1/embeddings bodies and streams per engine; ``apis`` their routes
* ``responses``      - the token-streaming ASGI response (aborts on disconnect), request log
* ``server``         - the Starlette app (``create_emulator_app``) and ``/emulator/*``
* ``launcher``       - ``run_emulator`` (this process) and ``start_emulator`` (a child)

Public API: ``EmulatorConfig``, ``create_emulator_app``, ``run_emulator``, ``start_emulator``,
``EmulatorHandle``. May touch: fleetgate.catalog only, outside this package.
"""

from fleetgate.emulator.config import EmulatorConfig
from fleetgate.emulator.launcher import (
    READY_PREFIX,
    EmulatorHandle,
    run_emulator,
    start_emulator,
)
from fleetgate.emulator.server import create_emulator_app

__all__ = [
    "READY_PREFIX",
    "EmulatorConfig",
    "EmulatorHandle",
    "create_emulator_app",
    "run_emulator",
    "start_emulator",
]
