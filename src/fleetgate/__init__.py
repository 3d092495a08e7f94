"""fleetgate: an OpenAI-compatible inference gateway for mixed AMD + NVIDIA GPU fleets.

Layers (enforced by import-linter): gateway -> routing -> backends -> config.
"""

__version__ = "0.1.0"
