"""The engine's command line and environment for ``fleetgate worker``, from the catalog row.

``build_engine_command`` is pure: the launcher per device (``cpu``, ``gpu`` or ``any``), the
TP flag, runtime arguments and runtime environment all come from
``catalog.engines.ENGINES[engine].launch``. Environment precedence is table < the operator's
environment < ``--env``; ``HF_HUB_OFFLINE=1`` for a model in a local directory; the worker
adds no model-specific flags (dtype, context length): those go after ``--``.

May touch: the catalog. Must not touch: processes, the network.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping, Sequence

from fleetgate.catalog.engines import ENGINES, Launch
from fleetgate.worker.machine import Machine

WORKER_ENGINES = tuple(name for name, spec in ENGINES.items() if spec.launch is not None)


def launch_of(engine: str) -> Launch:
    launch = ENGINES[engine].launch if engine in ENGINES else None
    if launch is None:
        raise ValueError(f"engine must be one of {WORKER_ENGINES}, not {engine!r}")
    return launch


def _launcher(launch: Launch, runtime: str) -> tuple[str, ...]:
    for device in (runtime, "gpu" if runtime != "cpu" else "cpu", "any"):
        if device in launch.commands:
            return launch.commands[device]
    raise ValueError(f"no launcher for {runtime}")


def build_engine_command(
    engine: str, model: str, machine: Machine, *, port: int, host: str = "0.0.0.0",
    python: str = sys.executable, served_model_name: str | None = None,
    tensor_parallel: int = 1, extra_args: Sequence[str] = (), model_is_local: bool = False,
    environ: Mapping[str, str] | None = None, env_overrides: Mapping[str, str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The engine's argv and the environment settings the worker adds to ``environ``.

    Pure: reads no environment, touches no file. The returned dict holds only the settings
    the worker chose (table defaults the operator's ``environ`` does not already set, then
    ``env_overrides``); the child runs with ``{**environ, **settings}``.
    """
    launch = launch_of(engine)
    values = {"python": python, "model": model, "host": host, "port": str(port),
              "served": served_model_name or model}
    argv = [part.format(**values) for part in _launcher(launch, machine.runtime)]
    if tensor_parallel > 1:
        argv += [launch.tp_flag, str(tensor_parallel)]
    argv += list(launch.runtime_args.get(machine.runtime, ())) + list(extra_args)
    defaults = dict(launch.runtime_env.get(machine.runtime, {}))
    if model_is_local:
        defaults["HF_HUB_OFFLINE"] = "1"
    current = environ or {}
    settings = {k: v for k, v in defaults.items() if k not in current}
    settings.update(env_overrides or {})
    return argv, settings


def render_command(argv: Sequence[str], settings: Mapping[str, str]) -> str:
    """What an operator can paste into a shell to run the same engine."""
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(settings.items()))
    return f"{env} {shlex.join(argv)}".strip()


def tensor_parallel_of(extra_args: Sequence[str], default: int) -> int:
    """The TP degree if the extra engine args set one (it is the replica's GPU count)."""
    flags = {"--tensor-parallel-size", "-tp", "--tp-size", "--tp"}
    for i, arg in enumerate(extra_args):
        name, _, inline = arg.partition("=")
        if name in flags:
            value = inline or (extra_args[i + 1] if i + 1 < len(extra_args) else "")
            if value.isdigit():
                return int(value)
    return default
