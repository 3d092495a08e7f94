"""Load a fleet config from YAML: ``${ENV_VAR}`` interpolation, validation, YAML-path errors.

``load_config(path)`` returns a validated ``FleetConfig`` or raises ``ConfigError`` whose
``errors`` list says, for each problem, where it is (``pools[1].price_per_gpu_hour``) and
what is wrong. ``${NAME}`` is replaced by the environment variable; ``${NAME:-default}``
uses the default when it is unset; an unset variable without a default is an error (a
missing key must never silently become an empty string).

May touch: the file system (read), the environment, yaml, pydantic. Nothing else of ours.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from fleetgate.config.schema import FleetConfig

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class ConfigError(Exception):
    """A config that cannot be used; ``errors`` holds one ``path: message`` line each."""

    def __init__(self, source: str, errors: list[str]) -> None:
        self.source = source
        self.errors = errors
        super().__init__(f"{source}: " + "; ".join(errors))


def default_config_path() -> Path:
    """The embedded default fleet shipped inside the package."""
    return Path(str(resources.files("fleetgate.config").joinpath("default.yaml")))


def load_config(path: str | Path, env: Mapping[str, str] | None = None) -> FleetConfig:
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(source, [f"(file): cannot read: {exc.strerror or exc}"]) from None
    return parse_config(text, source, os.environ if env is None else env)


def parse_config(text: str, source: str, env: Mapping[str, str]) -> FleetConfig:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(yaml)"
        problem = getattr(exc, "problem", exc)
        raise ConfigError(source, [f"{where}: invalid YAML: {problem}"]) from None
    except RecursionError:  # PyYAML recurses per nesting level
        raise ConfigError(source, ["(yaml): nested too deeply"]) from None
    if not isinstance(raw, dict):
        raise ConfigError(source, ["(root): must be a mapping with at least 'pools'"])
    errors: list[str] = []
    data = _interpolate(raw, env, "", errors)
    if errors:
        raise ConfigError(source, errors)
    try:
        return FleetConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(source, [_format_error(e) for e in exc.errors()]) from None


def _interpolate(node: Any, env: Mapping[str, str], path: str, errors: list[str]) -> Any:
    if isinstance(node, str):
        return _substitute(node, env, path, errors)
    if isinstance(node, list):
        return [_interpolate(v, env, f"{path}[{i}]", errors) for i, v in enumerate(node)]
    if isinstance(node, dict):
        return {
            k: _interpolate(v, env, f"{path}.{k}" if path else str(k), errors)
            for k, v in node.items()
        }
    return node


def _substitute(value: str, env: Mapping[str, str], path: str, errors: list[str]) -> str:
    def repl(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in env:
            return env[name]
        if default is not None:
            return default
        errors.append(f"{path}: environment variable {name} is not set")
        return ""

    return _ENV_REF.sub(repl, value)


def format_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _format_error(err: Mapping[str, Any]) -> str:
    loc = tuple(p for p in err["loc"] if not _is_union_tag(p))
    msg = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown key (check the spelling; see config/example.yaml)"
    if not loc:
        return msg  # model-level checks already start with their path
    return f"{format_path(loc)}: {msg}"


def _is_union_tag(part: int | str) -> bool:
    return isinstance(part, str) and (part.startswith("function-") or "[" in part)
