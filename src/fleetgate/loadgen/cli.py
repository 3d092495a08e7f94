"""The ``fleetgate bench`` command group (registered in ``fleetgate/cli.py`` with
``app.add_typer``): ``bench`` runs one load test, ``bench --compare A B`` compares two
results, ``bench sweep`` finds each pool's capacity at the SLO.

Thin: parse options, call ``measure`` / ``sweep``, draw the progress bar, print the tables,
write the JSON and the PNGs. Heavy imports (aiohttp, numpy, matplotlib, the simulator's
readers) happen inside the commands, so the ``fleetgate`` start-up does not pay for them.
Exit 1 with a one-line reason on a bad option or file, or a target whose warm-up request
fails; 2 on conflicting options.

May touch: typer, rich, the loadgen package. Holds no logic of its own.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

bench_app = typer.Typer(invoke_without_command=True, add_completion=False,
                        help="Load generator and report for any OpenAI-compatible URL.")

UrlOpt = Annotated[Optional[str], typer.Option(help="server root, e.g. http://127.0.0.1:8080 (a trailing /v1 is fine)")]  # noqa: E501, UP045
ModelOpt = Annotated[Optional[str], typer.Option(help="model name (default: the workload's, else the first of /v1/models)")]  # noqa: E501, UP045
ApiOpt = Annotated[str, typer.Option(help="chat | completions | responses")]
InOpt = Annotated[str, typer.Option(help="prompt tokens: N, lognormal:MEAN[:MAX], exponential:MEAN[:MAX], uniform:MIN:MAX")]  # noqa: E501
OutOpt = Annotated[str, typer.Option(help="output tokens (sent as max tokens), same forms")]
SloTtft = Annotated[Optional[float], typer.Option(help="TTFT limit for goodput (default: the workload's)")]  # noqa: E501, UP045
SloTpot = Annotated[Optional[float], typer.Option(help="TPOT limit for goodput (default: the workload's)")]  # noqa: E501, UP045
HeaderOpt = Annotated[Optional[list[str]], typer.Option("--header", help="extra request header K:V (repeatable)")]  # noqa: E501, UP045
KeyOpt = Annotated[Optional[str], typer.Option(envvar="OPENAI_API_KEY", help="API key for the target")]  # noqa: E501, UP045
AdminOpt = Annotated[Optional[str], typer.Option(envvar="FLEETGATE_ADMIN_KEY", help="admin key, to read /admin/costs")]  # noqa: E501, UP045
TokOpt = Annotated[Optional[str], typer.Option(help="tokenizer for exact prompt lengths (needs transformers)")]  # noqa: E501, UP045


def _fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def _headers(header: list[str] | None, api_key: str | None) -> dict[str, str]:
    out = {}
    for item in header or []:
        k, sep, v = item.partition(":")
        if not sep:
            raise _fail(f"--header {item!r}: use NAME:VALUE", 2)
        out[k.strip().lower()] = v.strip()
    if api_key and "authorization" not in out:
        out["authorization"] = f"Bearer {api_key}"
    return out


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    import orjson

    path.write_bytes(orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE
                                  | orjson.OPT_SERIALIZE_NUMPY))
    typer.echo(f"wrote {path}", err=True)


@bench_app.callback()
def bench(
    ctx: typer.Context,
    url: UrlOpt = None,
    model: ModelOpt = None,
    concurrency: Annotated[Optional[int], typer.Option(help="closed loop: users (with --rate: a cap on requests in flight)")] = None,  # noqa: E501, UP045
    rate: Annotated[Optional[float], typer.Option(help="open loop: requests/s (Poisson)")] = None,  # noqa: UP045
    burstiness: Annotated[float, typer.Option(help="gamma shape of the gaps (1: Poisson; < 1: burstier)")] = 1.0,  # noqa: E501
    requests: Annotated[Optional[int], typer.Option(help="number of requests")] = None,  # noqa: UP045
    duration: Annotated[Optional[float], typer.Option(help="seconds of sending (no new request after)")] = None,  # noqa: E501, UP045
    input_tokens: InOpt = "512",
    output_tokens: OutOpt = "128",
    api: ApiOpt = "chat",
    stream: Annotated[bool, typer.Option("--stream/--no-stream")] = True,
    ignore_eos: Annotated[bool, typer.Option(help="send ignore_eos (vLLM, SGLang) so every answer has its full length")] = False,  # noqa: E501
    trace: Annotated[Optional[Path], typer.Option(help="replay a JSONL request log (the gateway's)")] = None,  # noqa: E501, UP045
    workload: Annotated[Optional[Path], typer.Option(help="replay a workload file (DESIGN.md §1)")] = None,  # noqa: E501, UP045
    speedup: Annotated[float, typer.Option(help="trace: replay this many times faster")] = 1.0,
    seed: int = 0,
    tokenizer: TokOpt = None,
    slo_ttft_ms: SloTtft = None,
    slo_tpot_ms: SloTpot = None,
    header: HeaderOpt = None,
    api_key: KeyOpt = None,
    admin_key: AdminOpt = None,
    timeout: Annotated[float, typer.Option(help="per-request timeout, seconds")] = 600.0,
    warmup: Annotated[int, typer.Option(help="unmeasured requests first")] = 1,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="write the result as JSON")] = None,  # noqa: E501, UP045
    plot: Annotated[Optional[Path], typer.Option(help="write PNG plots into this directory")] = None,  # noqa: E501, UP045
    compare: Annotated[Optional[tuple[Path, Path]], typer.Option(help="compare two --json results: A B")] = None,  # noqa: E501, UP045
    quiet: Annotated[bool, typer.Option(help="no progress bar")] = False,
) -> None:
    """Load-test an OpenAI-compatible server; `bench sweep` finds capacities."""
    if ctx.invoked_subcommand is not None:
        return
    if compare is not None and compare[0] is not None:
        _compare(compare[0], compare[1], plot, json_out)
        return
    if url is None:
        raise _fail("--url is required (or --compare A B, or `bench sweep`)", 2)
    if api not in ("chat", "completions", "responses"):
        raise _fail("--api must be chat, completions or responses", 2)
    from fleetgate.loadgen.measure import BenchOptions

    opts = BenchOptions(
        url=url, model=model, api=api, stream=stream,  # type: ignore[arg-type]
        ignore_eos=ignore_eos, headers=_headers(header, api_key), timeout_s=timeout,
        concurrency=concurrency, rate=rate, burstiness=burstiness, requests=requests,
        duration_s=duration, input_tokens=input_tokens, output_tokens=output_tokens,
        workload=workload, trace=trace, speedup=speedup, seed=seed, tokenizer=tokenizer,
        slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms, admin_key=admin_key, warmup=warmup)
    result = _run_with_progress(opts, quiet)
    from fleetgate.loadgen.report import print_result

    print_result(result)
    if json_out is not None:
        _write_json(json_out, result)
    if plot is not None:
        from fleetgate.loadgen.plots import plot_result

        for path in plot_result(result, plot):
            typer.echo(f"wrote {path}", err=True)


def _run_with_progress(opts: Any, quiet: bool) -> dict[str, Any]:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    from fleetgate.loadgen.measure import build_plan, measure
    from fleetgate.loadgen.run import WarmupFailed
    from fleetgate.sim.workload import WorkloadError

    try:
        plan = build_plan(opts)
    except (ValueError, WorkloadError, OSError) as exc:
        raise _fail(str(exc)) from None
    console = Console(stderr=True)
    counts = {"ok": 0, "err": 0, "tokens": 0}
    with Progress(SpinnerColumn(), TextColumn("[bold]bench[/bold]"), BarColumn(),
                  MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.fields[info]}"),
                  console=console, disable=quiet or not console.is_terminal) as bar:
        task = bar.add_task("bench", total=plan.total, info="")

        def on_record(rec: Any) -> None:
            counts["ok" if rec.ok else "err"] += 1
            counts["tokens"] += rec.output_tokens if rec.ok else 0
            elapsed = bar.tasks[0].elapsed or 1e-9
            bar.update(task, advance=1, info=(
                f"ok {counts['ok']}  err {counts['err']}  {counts['ok'] / elapsed:.1f} req/s  "
                f"{counts['tokens'] / elapsed:,.0f} tok/s"))

        try:
            return asyncio.run(measure(opts, on_record, plan))
        except (ValueError, WarmupFailed, OSError) as exc:
            raise _fail(str(exc)) from None


def _compare(a_path: Path, b_path: Path, plot: Path | None, json_out: Path | None) -> None:
    from rich.console import Console

    from fleetgate.loadgen.report import compare, compare_table, load_result

    try:
        a, b = load_result(a_path), load_result(b_path)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    rows = compare(a, b)
    Console(width=None if Console().is_terminal else 160).print(
        compare_table(rows, a_path.name, b_path.name))
    if json_out is not None:
        _write_json(json_out, {"a": str(a_path), "b": str(b_path), "rows": rows})
    if plot is not None:
        from fleetgate.loadgen.plots import plot_compare

        typer.echo(f"wrote {plot_compare(a, b, (a_path.name, b_path.name), plot)}", err=True)


@bench_app.command()
def sweep(
    target: Annotated[Optional[list[str]], typer.Option(help="a pool to sweep: URL or NAME=URL (repeatable)")] = None,  # noqa: E501, UP045
    url: UrlOpt = None,
    model: ModelOpt = None,
    mode: Annotated[str, typer.Option(help="rate (open loop, req/s) | concurrency (closed loop)")] = "rate",  # noqa: E501
    loads: Annotated[Optional[str], typer.Option(help="comma-separated loads (default: search from --start)")] = None,  # noqa: E501, UP045
    start: Annotated[float, typer.Option(help="search: first load")] = 1.0,
    max_load: Annotated[float, typer.Option(help="search: never beyond this load")] = 1e4,
    tolerance: Annotated[float, typer.Option(help="search: stop when pass and fail are this close")] = 0.05,  # noqa: E501
    target_attainment: Annotated[float, typer.Option("--target-attainment", help="share of requests within the SLO for a load to pass")] = 0.99,  # noqa: E501
    requests: Annotated[Optional[int], typer.Option(help="requests per step")] = None,  # noqa: UP045
    duration: Annotated[Optional[float], typer.Option(help="seconds of sending per step")] = None,  # noqa: UP045
    input_tokens: InOpt = "512",
    output_tokens: OutOpt = "128",
    api: ApiOpt = "chat",
    ignore_eos: bool = False,
    seed: int = 0,
    tokenizer: TokOpt = None,
    slo_ttft_ms: SloTtft = None,
    slo_tpot_ms: SloTpot = None,
    header: HeaderOpt = None,
    api_key: KeyOpt = None,
    admin_key: AdminOpt = None,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="write the sweep as JSON")] = None,  # noqa: E501, UP045
    plot: Annotated[Optional[Path], typer.Option(help="write sweep.png into this directory")] = None,  # noqa: E501, UP045
) -> None:
    """Per pool: the throughput-latency curve and the highest load within the SLO."""
    from fleetgate.loadgen.measure import BenchOptions
    from fleetgate.loadgen.run import WarmupFailed
    from fleetgate.loadgen.sweep import SweepOptions
    from fleetgate.loadgen.sweep import sweep as run_sweep

    targets = list(target or []) + ([url] if url else [])
    if not targets or mode not in ("rate", "concurrency"):
        raise _fail("give --target URL|NAME=URL (or --url) and --mode rate|concurrency", 2)
    bench_opts = BenchOptions(
        url=targets[0], model=model, api=api, ignore_eos=ignore_eos,  # type: ignore[arg-type]
        headers=_headers(header, api_key), requests=requests or (None if duration else 200),
        duration_s=duration, input_tokens=input_tokens, output_tokens=output_tokens, seed=seed,
        tokenizer=tokenizer, slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms,
        admin_key=admin_key)
    try:
        grid = tuple(float(x) for x in loads.split(",") if x.strip()) if loads else ()
        opts = SweepOptions(bench_opts, mode, grid, start, max_load,  # type: ignore[arg-type]
                            tolerance, target_attainment)
        result = asyncio.run(run_sweep(targets, opts, _print_step))
    except (ValueError, WarmupFailed, OSError) as exc:
        raise _fail(str(exc)) from None
    for name, pool in result["pools"].items():
        cap = pool["capacity"]
        typer.echo(f"{name}: capacity " + ("none (no load passed)" if cap is None else
                   f"{cap['load']} ({mode}) = {cap['rate_per_s']} req/s, "
                   f"{cap['tokens_per_s']} tok/s"), err=True)
    if json_out is not None:
        _write_json(json_out, result)
    if plot is not None:
        from fleetgate.loadgen.plots import plot_sweep

        typer.echo(f"wrote {plot_sweep(result, plot)}", err=True)


def _print_step(target: str, s: dict[str, Any]) -> None:
    ttft, tpot = s["ttft_ms"], s["tpot_ms"]
    typer.echo(f"  {target} load {s['load']:g}: {'pass' if s['passed'] else 'FAIL'} "
               f"within-SLO {s['slo_attainment']:.3f}  {s['request_throughput']} req/s  "
               f"{s['output_throughput']} tok/s  TTFT p99 {ttft['p99']} ms  "
               f"TPOT p99 {tpot['p99']} ms  errors {s['errors']}", err=True)


@bench_app.command()
def report(
    shadow: Annotated[str, typer.Option(help="a fleetgate's root URL: read its /admin/shadow")],
    admin_key: AdminOpt = None,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="write the report as JSON")] = None,  # noqa: E501, UP045
) -> None:
    """One page on shadow traffic: each candidate pool beside the pool that served the same
    requests."""
    import httpx

    from fleetgate.loadgen.report import print_shadow, shadow_sentences

    headers = {"authorization": f"Bearer {admin_key}"} if admin_key else {}
    try:
        resp = httpx.get(shadow.rstrip("/") + "/admin/shadow", headers=headers, timeout=30)
        resp.raise_for_status()
        body = resp.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise _fail(f"cannot read {shadow}/admin/shadow: {exc}") from None
    rows = body.get("candidates") or []
    if not rows:
        typer.echo("no shadow traffic yet: no policy mirrors, or nothing was mirrored")
        return
    print_shadow(rows)
    for line in shadow_sentences(rows):
        typer.echo(line)
    if json_out is not None:
        _write_json(json_out, body)
