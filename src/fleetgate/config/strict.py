"""The base of every config model: unknown keys fail loudly with their YAML path, and a
validated config is immutable.

May touch: pydantic. Must not import any other fleetgate package.
"""

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
