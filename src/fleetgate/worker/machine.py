"""What machine ``fleetgate worker`` runs on: ROCm when ``/dev/kfd``, ``amd-smi`` or ``rocm-smi``
is there (the Instinct model from ``amd-smi static --asic`` or ``rocm-smi --showproductname``),
else CUDA when ``nvidia-smi`` lists GPUs, else CPU. The tools are injected so tests can fake
any machine.

May touch: subprocess (the vendor tools). Must not touch: the gateway, routing.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

# GPU product names (as amd-smi / rocm-smi / nvidia-smi print them) -> catalog accelerator.
GPU_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"MI355X", "mi355x"), (r"MI325X", "mi325x"), (r"MI300X", "mi300x"),
    (r"\bH200\b", "h200"), (r"\bH100\b", "h100"), (r"\bB200\b", "b200"),
)


@dataclass(frozen=True, slots=True)
class Machine:
    runtime: str  # "rocm" | "cuda" | "cpu"
    accelerator: str | None  # catalog name (mi300x, h100, cpu), None if the GPU is not in it
    gpu_name: str  # what the vendor tool calls it
    gpu_count: int


def _run(argv: list[str]) -> str | None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def accelerator_of(gpu_name: str) -> str | None:
    return next((acc for pat, acc in GPU_PATTERNS if re.search(pat, gpu_name, re.I)), None)


def _amd_gpu_names(run: Callable[[list[str]], str | None],
                   which: Callable[[str], str | None]) -> list[str]:
    probes = [
        ("amd-smi", ["amd-smi", "static", "--asic", "--json"], r'"market_name"\s*:\s*"([^"]+)"'),
        ("rocm-smi", ["rocm-smi", "--showproductname", "--json"], r'"Card Series"\s*:\s*"([^"]+)"'),
        ("rocm-smi", ["rocm-smi", "--showproductname"], r"Card Series:\s*(.+)$"),
    ]
    for tool, argv, pattern in probes:
        out = run(argv) if which(tool) else None
        names = re.findall(pattern, out or "", re.M)
        if names:
            return [n.strip() for n in names]
    return []


def detect_machine(run: Callable[[list[str]], str | None] = _run,
                   exists: Callable[[str], bool] = os.path.exists,
                   which: Callable[[str], str | None] = shutil.which) -> Machine:
    """ROCm, then CUDA, then CPU; the tools are injected so tests can fake any machine."""
    if exists("/dev/kfd") or which("amd-smi") or which("rocm-smi"):
        names = _amd_gpu_names(run, which)
        name = names[0] if names else "unknown AMD GPU"
        return Machine("rocm", accelerator_of(name), name, len(names))
    out = run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]) \
        if which("nvidia-smi") else None
    names = [line.strip() for line in (out or "").splitlines() if line.strip()]
    if names:
        return Machine("cuda", accelerator_of(names[0]), names[0], len(names))
    return Machine("cpu", "cpu", "cpu", 0)
