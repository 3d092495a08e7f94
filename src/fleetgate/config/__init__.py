"""Fleet configuration: the YAML schema and its loader (the leaf layer: imports nothing of ours)."""

from fleetgate.config.loader import ConfigError, default_config_path, load_config, parse_config
from fleetgate.config.schema import (
    ACCELERATORS,
    FleetConfig,
    PolicyConfig,
    PoolConfig,
    RouteConfig,
)

__all__ = [
    "ACCELERATORS",
    "ConfigError",
    "FleetConfig",
    "PolicyConfig",
    "PoolConfig",
    "RouteConfig",
    "default_config_path",
    "load_config",
    "parse_config",
]
