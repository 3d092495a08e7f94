"""The ``fleetgate simulate`` and ``fleetgate plan`` commands (registered on the typer app in
``fleetgate/cli.py``, one line each: ``app.command()(simulate)``, ``app.command()(plan)``).

Thin: parse options, call ``run.simulate`` / ``plan.plan``, print the rich tables, write the
JSON (byte-identical for one seed, whatever ``--jobs`` is), the PNG and the planned fleet
file. ``--jobs`` (default: every core) runs independent simulations in parallel processes
(``parallel.Runner``); their progress and the wall-clock time go to stderr, never into the
JSON or stdout. Exit 1 with a one-line reason on a bad file.

The heavy imports (router, scipy, matplotlib) happen inside the commands, so registering them
costs the ``fleetgate`` app nothing at start-up.

May touch: typer, yaml, every module of ``sim``, config loading. Holds no logic of its own.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from fleetgate.sim import DEFAULT_GPUS


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(1)


def _jobs(jobs: int | None) -> int:
    from fleetgate.sim.parallel import default_jobs

    if jobs is not None and jobs < 1:
        raise _fail("--jobs must be at least 1")
    return jobs or default_jobs()


_JOBS_HELP = "parallel simulations (processes; default: every core)"
_PROBE_HELP = ("requests a replica's capacity is probed with at each rate (default 1500; "
               "6000: about half the noise, 4x the measuring time; docs/simulate.md)")
MIN_PROBE_REQUESTS = 200


def _probe(requests: int) -> int:
    if requests < MIN_PROBE_REQUESTS:
        raise _fail(f"--probe-requests must be at least {MIN_PROBE_REQUESTS}")
    return requests


def simulate(
    config: Annotated[Path, typer.Option(help="fleet config (pools may carry autoscale:)")],
    workload: Annotated[Path, typer.Option(help="workload file (DESIGN.md §1)")],
    policies: Annotated[Optional[str], typer.Option(help="comma-separated policy names of the config (default: all)")] = None,  # noqa: E501, UP045
    duration: Annotated[Optional[float], typer.Option(help="seconds of arrivals (default: the workload's)")] = None,  # noqa: E501, UP045
    seed: Annotated[int, typer.Option(help="random seed: the same seed gives the same JSON")] = 1,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="write the report as JSON")] = None,  # noqa: E501, UP045
    plot: Annotated[Optional[Path], typer.Option(help="write plots to this PNG")] = None,  # noqa: UP045
    jobs: Annotated[Optional[int], typer.Option(help=_JOBS_HELP)] = None,  # noqa: UP045
    probe_requests: Annotated[int, typer.Option(help=_PROBE_HELP)] = 1500,
) -> None:
    """Replay a workload through the real router over simulated replicas in virtual time."""
    from fleetgate.config.loader import ConfigError, load_config
    from fleetgate.routing import PolicyError
    from fleetgate.sim.fleet import FleetError
    from fleetgate.sim.parallel import Runner
    from fleetgate.sim.report import print_tables, simulate_tables
    from fleetgate.sim.run import dumps
    from fleetgate.sim.run import simulate as run_simulation
    from fleetgate.sim.workload import WorkloadError, load_workload

    probe = _probe(probe_requests)
    try:
        fleet, work = load_config(config), load_workload(workload)
        names = [p.strip() for p in policies.split(",") if p.strip()] if policies else None
        t0 = time.perf_counter()
        with Runner(_jobs(jobs), "simulate") as runner:
            report = run_simulation(fleet, work, names, duration, seed, runner, probe)
    except (ConfigError, WorkloadError, FleetError, PolicyError, ValueError, OSError) as exc:
        raise _fail(str(exc)) from None
    typer.echo(f"simulated in {time.perf_counter() - t0:.1f} s (wall, {runner.jobs} jobs)",
               err=True)
    result = report.as_json()
    print_tables(simulate_tables(result))
    if json_out is not None:
        json_out.write_bytes(dumps(result))
    if plot is not None:
        from fleetgate.sim.plots import plot_report

        plot_report(report, work.slo.ttft_ms, work.slo.tpot_ms, plot)


def plan(
    workload: Annotated[Path, typer.Option(help="workload file (DESIGN.md §1)")],
    prices: Annotated[Optional[Path], typer.Option(help="price sheet YAML (default: catalog mid prices)")] = None,  # noqa: E501, UP045
    gpus: Annotated[str, typer.Option(help="comma-separated GPU types to consider")] = ",".join(DEFAULT_GPUS),  # noqa: E501
    seed: Annotated[int, typer.Option(help="random seed")] = 1,
    duration: Annotated[Optional[float], typer.Option(help="seconds of arrivals to confirm with (default: the workload's)")] = None,  # noqa: E501, UP045
    json_out: Annotated[Optional[Path], typer.Option("--json", help="write the plan as JSON")] = None,  # noqa: E501, UP045
    out: Annotated[Optional[Path], typer.Option(help="write the planned fleet as a config file")] = None,  # noqa: E501, UP045
    capacities: Annotated[Optional[Path], typer.Option(help="measured per-replica capacities: a `fleetgate bench sweep --json` file")] = None,  # noqa: E501, UP045
    jobs: Annotated[Optional[int], typer.Option(help=_JOBS_HELP)] = None,  # noqa: UP045
    probe_requests: Annotated[int, typer.Option(help=_PROBE_HELP)] = 1500,
) -> None:
    """The cheapest fleet that meets the workload's SLO (integer program + simulation)."""
    import yaml

    from fleetgate.sim.candidates import load_capacities, load_prices
    from fleetgate.sim.fleet import FleetError
    from fleetgate.sim.parallel import Runner
    from fleetgate.sim.plan import plan as make_plan
    from fleetgate.sim.report import plan_tables, print_tables
    from fleetgate.sim.run import dumps
    from fleetgate.sim.workload import WorkloadError, load_workload

    probe = _probe(probe_requests)
    try:
        work, sheet = load_workload(workload), load_prices(prices)
        wanted = [g.strip() for g in gpus.split(",") if g.strip()]
        t0 = time.perf_counter()
        measured = load_capacities(capacities) if capacities is not None else None
        with Runner(_jobs(jobs), "plan") as runner:
            result = make_plan(work, sheet, wanted, seed, duration, measured=measured,
                               runner=runner, probe_requests=probe)
    except (WorkloadError, FleetError, ValueError, OSError) as exc:
        raise _fail(str(exc)) from None
    typer.echo(f"planned in {time.perf_counter() - t0:.1f} s (wall, {runner.jobs} jobs)",
               err=True)
    fleet_file = result.pop("fleet_config")
    print_tables(plan_tables(result))
    if json_out is not None:
        json_out.write_bytes(dumps(result))
    if out is not None:
        header = (f"# Planned by `fleetgate plan` for {workload.name} (seed {seed}): "
                  f"${result['usd_per_hour']}/hour.\n")
        out.write_text(header + yaml.safe_dump(fleet_file, sort_keys=False), encoding="utf-8")
        typer.echo(f"wrote {out}", err=True)
