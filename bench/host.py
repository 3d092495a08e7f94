"""What the bench scripts say about the machine they ran on."""

from __future__ import annotations

import contextlib
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo`` ("unknown" without one)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"
