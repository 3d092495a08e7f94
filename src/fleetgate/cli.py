"""The ``fleetgate`` command line (one typer app): serve, check, emulate, worker, simulate, plan.

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

from fleetgate.catalog.engines import ENGINES as CATALOG_ENGINES
from fleetgate.catalog.gpus import GPUS as CATALOG_GPUS
from fleetgate.config import ConfigError, FleetConfig, load_config
from fleetgate.config.schema import AdapterConfig, PoolConfig

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="OpenAI-compatible gateway for mixed AMD + NVIDIA GPU fleets.")

ENGINES = [name for name, spec in CATALOG_ENGINES.items() if spec.emulated]
GPUS = list(CATALOG_GPUS)


def checked_config(path: Path) -> FleetConfig:
    """Load a config and run every check ``serve`` and ``/admin/reload`` run (the schema,
    then the policies' strategies, plugins and their params); raises ``ConfigError``."""
    from fleetgate.routing import PolicyError, build_router

    config = load_config(path)
    try:
        build_router(config)
    except PolicyError as exc:
        raise ConfigError(str(path), exc.errors) from None
    return config


@app.command()
def serve(
    config: Annotated[Optional[Path], typer.Option(help="fleet config (default: $FLEETGATE_CONFIG or the embedded default)")] = None,  # noqa: E501, UP045
    host: Annotated[Optional[str], typer.Option(help="listen address")] = None,  # noqa: UP045
    port: Annotated[Optional[int], typer.Option(help="listen port")] = None,  # noqa: UP045
    workers: Annotated[Optional[int], typer.Option(help="gateway processes sharing the port, the limits and /metrics (default: $FLEETGATE_WORKERS or 1)")] = None,  # noqa: E501, UP045
) -> None:
    """Run the gateway."""
    import socket

    from fleetgate.gateway.app import create_app
    from fleetgate.gateway.server import GatewayServer, server_config
    from fleetgate.gateway.settings import Settings

    settings = Settings.from_env(config_path=config, host=host, port=port, workers=workers)
    _logging(settings.log_level)
    try:  # fail before binding the port if the config is bad
        checked_config(settings.config_path) if settings.config_path else None
    except ConfigError as exc:
        _print_errors(exc)
        raise typer.Exit(1) from None
    _lift_open_files_limit()
    if settings.workers > 1:
        from fleetgate.gateway.processes import supervise

        raise typer.Exit(supervise(settings))
    gateway = create_app(settings)
    server = GatewayServer(server_config(gateway, settings.host, settings.port,
                                         settings.log_level, settings.header_timeout_s,
                                         settings.shutdown_timeout_s),
                           gateway.state.stop_streams, settings.shutdown_timeout_s,
                           freeze_gc=True)
    if not settings.reuse_port:
        server.run()
    else:  # a worker of ``serve --workers``: the kernel spreads connections over the workers
        server.run(sockets=[socket.create_server((settings.host, settings.port),
                                                 reuse_port=True, backlog=2048)])


def _lift_open_files_limit(ceiling: int = 65536) -> None:
    """The gateway holds a socket per engine (probes) besides the relay's: many hosts start
    processes with a soft limit of 1,024 open files, fewer than a large fleet needs."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = ceiling if hard == resource.RLIM_INFINITY else min(hard, ceiling)
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ImportError, ValueError, OSError) as exc:  # not Unix, or not allowed: keep it
        logging.getLogger("fleetgate").info("open-files limit unchanged: %s", exc)


@app.command()
def check(path: Annotated[Path, typer.Argument(help="config file to validate")]) -> None:
    """Validate a config and print the resolved fleet; exit 1 on errors."""
    try:
        config = checked_config(path)
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
    enable_lora: Annotated[bool, typer.Option(help="serve LoRA adapters")] = False,
    lora_modules: Annotated[Optional[list[str]], typer.Option(help="NAME=PATH: an adapter served from the start (repeatable; docs/lora.md)")] = None,  # noqa: E501, UP045
    max_loras: Annotated[Optional[int], typer.Option(help="distinct adapters in one batch")] = None,  # noqa: UP045
    allow_runtime_lora: Annotated[bool, typer.Option(help="vLLM's load/unload routes (VLLM_ALLOW_RUNTIME_LORA_UPDATING)")] = False,  # noqa: E501
) -> None:
    """Run one emulated vLLM or SGLang engine server."""
    from fleetgate.emulator import EmulatorConfig, run_emulator

    if engine not in ENGINES or gpu not in GPUS:
        typer.echo(f"--engine must be one of {ENGINES}, --gpu one of {GPUS}", err=True)
        raise typer.Exit(2)
    cfg = EmulatorConfig.model_validate({
        "engine": engine, "gpu": gpu, "served_models": model, "profile": profile, "speed": speed,
        "stack": stack, "tp": tp, "max_model_len": max_model_len,
        "max_queued_requests": max_queued_requests, "enable_lora": enable_lora,
        "lora_modules": dict(m.split("=", 1) for m in lora_modules or [] if "=" in m),
        "max_loras": max_loras, "runtime_lora": allow_runtime_lora})
    run_emulator(cfg, host, port)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def worker(
    ctx: typer.Context,
    engine: Annotated[str, typer.Option(help="vllm | sglang")],
    model: Annotated[str, typer.Option(help="model path or name the engine serves")],
    pool: Annotated[str, typer.Option(help="pool to join at the gateway")],
    gateway: Annotated[Optional[str], typer.Option(help="gateway URL to register with")] = None,  # noqa: UP045
    port: Annotated[Optional[int], typer.Option(help="engine port (0: a free one)")] = None,  # noqa: UP045
    host: str = "0.0.0.0",
    advertise_url: Annotated[Optional[str], typer.Option(help="URL the gateway should use")] = None,  # noqa: UP045
    python: Annotated[Optional[str], typer.Option(help="python of the engine's venv")] = None,  # noqa: UP045
    served_model_name: Optional[str] = None,  # noqa: UP045
    public_name: Annotated[Optional[list[str]], typer.Option(help="public model name (repeatable)")] = None,  # noqa: E501, UP045
    accelerator: Annotated[Optional[str], typer.Option(help="override the detected GPU")] = None,  # noqa: UP045
    price_per_gpu_hour: Optional[float] = None,  # noqa: UP045
    tp: Annotated[int, typer.Option(help="tensor-parallel degree")] = 1,
    gateway_key: Annotated[Optional[str], typer.Option(envvar="FLEETGATE_ADMIN_KEY", help="admin key for the gateway")] = None,  # noqa: E501, UP045
    ttl: Annotated[float, typer.Option(help="heartbeat TTL in seconds")] = 15.0,
    start_timeout: float = 1800.0,
    stop_timeout: Annotated[float, typer.Option(help="seconds to wait for the engine to stop")] = 30.0,  # noqa: E501
    env: Annotated[Optional[list[str]], typer.Option(help="extra engine env K=V (repeatable)")] = None,  # noqa: E501, UP045
    dry_run: Annotated[bool, typer.Option(help="print the engine command and exit")] = False,
) -> None:
    """Launch a real engine with this machine's ROCm/CUDA/CPU settings and register it.

    Engine arguments go after ``--``, e.g. ``-- --dtype float32 --max-model-len 256``.
    """
    from fleetgate.worker import run_worker

    options: dict[str, object] = {
        "host": host, "advertise_url": advertise_url, "served_model_name": served_model_name,
        "public_names": public_name or [], "accelerator": accelerator,
        "price_per_gpu_hour": price_per_gpu_hour, "tensor_parallel": tp,
        "gateway_key": gateway_key, "ttl_s": ttl, "start_timeout_s": start_timeout,
        "stop_timeout_s": stop_timeout,
        "env_overrides": dict(item.split("=", 1) for item in env or [] if "=" in item)}
    if python:
        options["python"] = python
    raise typer.Exit(run_worker(engine, model, pool, gateway, port, list(ctx.args),
                                dry_run=dry_run, **options))  # type: ignore[arg-type]


def render_fleet(config: FleetConfig) -> str:
    header = ["pool", "vendor", "runtime", "accelerator", "engine", "endpoints",
              "$/GPU-hr", "$/replica-hr", "models"]
    rows = [header]
    for p in config.pools:
        models = ", ".join(f"{pub} -> {srv}" if pub != srv else pub
                           for pub, srv in p.models.items())
        prices = [f"{p.price_per_gpu_hour:.2f}", f"{p.price_per_replica_hour:.2f}"]
        if p.price_per_mtok is not None:  # a hosted API: per token, not per hour
            prices = ["per token", f"${p.price_per_mtok.input:g}/${p.price_per_mtok.output:g} "
                      "per Mtok in/out"]
        rows.append([p.name, p.vendor, p.runtime, p.accelerator, p.engine, str(len(p.endpoints)),
                     *prices, models])
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append("")
    for p in config.pools:
        for url in p.endpoints:
            lines.append(f"endpoint {p.name}: {url}")
        if p.autoscale is not None:
            lines.append(f"autoscale {p.name}: {p.autoscale.model_dump()}")
        if p.adapters or p.discover_adapters:  # LoRA adapters (docs/lora.md)
            names = ", ".join(f"{a.name} (on {p.adapter_base(a)}{_adapter_note(p, a)})"
                              for a in p.adapters) or "none declared"
            lines.append(f"adapters {p.name}: {names}; at most {p.max_adapters} per endpoint"
                         f"{'; loaded at run time' if p.load_adapters else ''}"
                         f"{'; more from the engines' if p.discover_adapters else ''}")
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


def _adapter_note(pool: PoolConfig, adapter: AdapterConfig) -> str:
    if pool.adapter_preloaded(adapter):
        return ""
    return ", loaded on demand" if pool.load_adapters and adapter.path else \
        ", where the engines list it"


def _print_errors(exc: ConfigError) -> None:
    typer.echo(f"{exc.source}: invalid config", err=True)
    for line in exc.errors:
        typer.echo(f"  {line}", err=True)


def _logging(level: str) -> None:
    logging.basicConfig(level=level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per probe is noise


def _register_simulator() -> None:
    from fleetgate.sim import cli as sim_cli

    app.command()(sim_cli.simulate)
    app.command()(sim_cli.plan)


_register_simulator()


def _register_bench() -> None:
    from fleetgate.loadgen import cli as bench_cli  # typer only: the heavy imports are lazy

    app.add_typer(bench_cli.bench_app, name="bench")


_register_bench()

if __name__ == "__main__":
    app()
