"""fleetgate: an OpenAI-compatible inference gateway for mixed AMD + NVIDIA GPU fleets.

Layers (enforced by import-linter): gateway -> state -> routing -> backends -> config ->
catalog; the emulator, the simulator and the worker stand beside them (docs/architecture.md).
"""

__version__ = "0.1.0"
