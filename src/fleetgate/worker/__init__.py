"""``fleetgate worker``: run a real vLLM or SGLang server with this machine's settings, register
it with a gateway, keep it registered, and stop it cleanly (docs/workers.md).

``machine.py`` detects ROCm / CUDA / CPU and the GPU model; ``command.py`` builds the
engine's command line from its catalog row (``catalog/engines.py``); ``process.py`` runs it,
registers with the gateway, heartbeats, and stops it on a signal.

May touch: subprocess, signals, httpx, the catalog. Must not touch: the gateway, routing.
Never imports vllm or sglang.
"""

from fleetgate.worker.command import (
    WORKER_ENGINES,
    build_engine_command,
    render_command,
    tensor_parallel_of,
)
from fleetgate.worker.machine import Machine, accelerator_of, detect_machine
from fleetgate.worker.process import exit_status, run_worker

__all__ = [
    "WORKER_ENGINES",
    "Machine",
    "accelerator_of",
    "build_engine_command",
    "detect_machine",
    "exit_status",
    "render_command",
    "run_worker",
    "tensor_parallel_of",
]
