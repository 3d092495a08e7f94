"""The ``fleetgate`` command line (one typer app): serve, check, emulate.

Thin: each command parses its options and calls into the package. ``serve`` runs the gateway
under uvicorn (uvloop + httptools); ``check`` validates a config and prints the resolved
fleet, exiting 1 with each error's YAML path; ``emulate`` runs one emulated engine server.

May touch: every layer (it is above them all). Holds no logic of its own.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Optional

import typer

from fleetgate.config import ConfigError, FleetConfig, load_config

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="OpenAI-compatible gateway for mixed AMD + NVIDIA GPU fleets.")

ENGINES = ["vllm", "sglang"]
GPUS = ["mi300x", "mi325x", "mi355x", "h100", "h200", "b200"]


@app.command()
def serve(
    config: Annotated[Optional[Path], typer.Option(help="fleet config (default: $FLEETGATE_CONFIG or the embedded default)")] = None,  # noqa: E501, UP045
    host: Annotated[Optional[str], typer.Option(help="listen address")] = None,  # noqa: UP045
    port: Annotated[Optional[int], typer.Option(help="listen port")] = None,  # noqa: UP045
) -> None:
    """Run the gateway."""
    import uvicorn

    from fleetgate.gateway.app import create_app
    from fleetgate.gateway.settings import Settings

    settings = Settings.from_env(config_path=config, host=host, port=port)
    _logging(settings.log_level)
    try:  # fail before binding the port if the config is bad
        load_config(settings.config_path) if settings.config_path else None
    except ConfigError as exc:
        _print_errors(exc)
        raise typer.Exit(1) from None
    uvicorn.run(
        create_app(settings), host=settings.host, port=settings.port, loop="uvloop",
        http="httptools", access_log=False, log_level=settings.log_level, timeout_keep_alive=30,
    )


@app.command()
def check(path: Annotated[Path, typer.Argument(help="config file to validate")]) -> None:
    """Validate a config and print the resolved fleet; exit 1 on errors."""
    try:
        config = load_config(path)
    except ConfigError as exc:
        _print_errors(exc)
        raise typer.Exit(1) from None
    typer.echo(render_fleet(config))


@app.command()
def emulate(
    engine: Annotated[str, typer.Option(help="vllm | sglang")],
    gpu: Annotated[str, typer.Option(help="|".join(GPUS))],
    model: Annotated[list[str], typer.Option(help="served model name (repeatable)")],
    profile: Annotated[Optional[str], typer.Option(help="model profile, e.g. llama-3.1-70b-fp8")] = None,  # noqa: E501, UP045
    host: str = "127.0.0.1",
    port: int = 8000,
    speed: Annotated[float, typer.Option(help="run the clock X times faster")] = 1.0,
    stack: Annotated[str, typer.Option(help="stock | tuned software efficiency")] = "stock",
    tp: Annotated[Optional[int], typer.Option(help="tensor-parallel degree (default: the smallest that fits)")] = None,  # noqa: E501, UP045
    max_model_len: Annotated[Optional[int], typer.Option(help="context length")] = None,  # noqa: UP045
    max_queued_requests: Annotated[Optional[int], typer.Option(help="queue cap")] = None,  # noqa: UP045
) -> None:
    """Run one emulated vLLM or SGLang engine server."""
    from fleetgate.backends.emulator import EmulatorConfig, run_emulator

    if engine not in ENGINES or gpu not in GPUS:
        typer.echo(f"--engine must be one of {ENGINES}, --gpu one of {GPUS}", err=True)
        raise typer.Exit(2)
    cfg = EmulatorConfig.model_validate({
        "engine": engine, "gpu": gpu, "served_models": model, "profile": profile, "speed": speed,
        "stack": stack, "tp": tp, "max_model_len": max_model_len,
        "max_queued_requests": max_queued_requests})
    run_emulator(cfg, host, port)


def render_fleet(config: FleetConfig) -> str:
    header = ["pool", "vendor", "runtime", "accelerator", "engine", "endpoints",
              "$/GPU-hr", "$/replica-hr", "models"]
    rows = [header]
    for p in config.pools:
        models = ", ".join(f"{pub} -> {srv}" if pub != srv else pub
                           for pub, srv in p.models.items())
        rows.append([p.name, p.vendor, p.runtime, p.accelerator, p.engine, str(len(p.endpoints)),
                     f"{p.price_per_gpu_hour:.2f}", f"{p.price_per_replica_hour:.2f}", models])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("")
    for p in config.pools:
        for url in p.endpoints:
            lines.append(f"endpoint {p.name}: {url}")
    lines.append("")
    for name, pol in config.policies.items():
        marker = " (default)" if name == config.default_policy else ""
        lines.append(f"policy {name}{marker}: {pol.model_dump(exclude_defaults=True)}")
    for i, route in enumerate(config.routes):
        match = route.match.model_dump(exclude_defaults=True)
        lines.append(f"route {i}: {match} -> {route.policy}")
    auth = "open (no API keys)" if config.auth is None else f"{len(config.auth.keys)} keys"
    lines.append(f"auth: {auth}")
    return "\n".join(lines)


def _print_errors(exc: ConfigError) -> None:
    typer.echo(f"{exc.source}: invalid config", err=True)
    for line in exc.errors:
        typer.echo(f"  {line}", err=True)


def _logging(level: str) -> None:
    logging.basicConfig(level=level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per probe is noise


if __name__ == "__main__":
    app()
