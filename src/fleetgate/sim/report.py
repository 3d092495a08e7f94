"""Terminal tables for ``simulate`` and ``plan`` (rich), from their JSON objects.

One row per policy: SLO attainment, TTFT/TPOT p50/p99, throughput, both money numbers per
million output tokens, the distance of ``usd/Mtok`` from the lower bound, and the pools'
shares; then the lower bound. For ``plan``: the chosen fleet, the baselines and the
break-even prices. Everything printed is in the JSON too (the JSON is the contract).

May touch: rich. Must not touch: the simulator.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def _num(value: Any, fmt: str = "{:,.2f}") -> str:
    return "-" if value is None else fmt.format(value)


def simulate_tables(report: dict[str, Any]) -> list[Table]:
    bound = (report.get("lower_bound") or {}).get("usd_per_mtok")
    table = Table(title=f"fleetgate simulate: {report['requests']:,} requests over "
                        f"{report['duration_s']:,.0f} s (seed {report['seed']})")
    for col in ("policy", "SLO met", "TTFT p50/p99 ms", "TPOT p50/p99 ms", "tok/s",
                "busy $", "$/Mtok", "vs bound", "provisioned $", "prov. $/Mtok"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for name, p in report["policies"].items():
        ttft, tpot = p["ttft_ms"], p["tpot_ms"]
        per_mtok = p.get("usd_per_mtok")
        gap = f"{per_mtok / bound - 1:+.0%}" if per_mtok and bound else "-"
        table.add_row(
            name, _num(p["slo_attainment"], "{:.2%}"),
            f"{_num(ttft['p50'], '{:,.0f}')}/{_num(ttft['p99'], '{:,.0f}')}",
            f"{_num(tpot['p50'], '{:,.1f}')}/{_num(tpot['p99'], '{:,.1f}')}",
            _num(p["throughput_tok_s"], "{:,.0f}"), _num(p["usd"], "{:,.3f}"),
            _num(per_mtok, "{:,.3f}"), gap, _num(p["provisioned_usd"], "{:,.3f}"),
            _num(p["provisioned_usd_per_mtok"], "{:,.3f}"))
    if bound is not None:
        table.caption = (f"lower bound ${report['lower_bound']['usd']:,.3f} = ${bound:,.3f}/Mtok "
                         "(every token on the cheapest SLO capacity); busy $ = GPU-time "
                         "charged per request, provisioned $ = replicas x time")
    return [table, _shares(report)]


def _shares(report: dict[str, Any]) -> Table:
    pools = list(next(iter(report["policies"].values()))["pools"]) if report["policies"] else []
    table = Table(title="share of requests (mean replicas)")
    table.add_column("policy")
    for pool in pools:
        table.add_column(pool, justify="right")
    for name, p in report["policies"].items():
        table.add_row(name, *(f"{p['pools'][pool]['share']:.0%} "
                              f"({p['pools'][pool]['replicas_mean']:.1f})" for pool in pools))
    return table


def plan_tables(result: dict[str, Any]) -> list[Table]:
    ip = result.get("ip_optimum_usd_per_hour")
    caption = [f"the plan runs the {result.get('policy', 'cost')} policy"]
    if ip is not None:
        caption.append(f"the integer program's optimum at the demand: ${ip}/hour "
                       f"({_num(result.get('vs_ip_optimum'), '{:.2f}')}x)")
    caption += [f"miss: {m}" for m in result.get("misses", [])]
    fleets = Table(title=f"fleetgate plan: {result['model']} at {result['demand_rps']} req/s",
                   caption="; ".join(caption))
    for col in ("fleet", "replicas", "$/hour", "SLO met: cost", "least_loaded",
                "$/Mtok: cost", "least_loaded "):
        fleets.add_column(col, justify="left" if col in ("fleet", "replicas") else "right")
    rows = [("plan", result), *list(result["baselines"].items())]
    for name, f in rows:
        sim = f.get("simulated") or {}
        other = f.get("simulated_least_loaded") or {}
        replicas = ", ".join(f"{r['replicas']} x {r['accelerator']}/{r['engine']}"
                             + (f" tp{r['gpus_per_replica']}" if r["gpus_per_replica"] > 1 else "")
                             for r in f["fleet"])
        fleets.add_row(name, replicas or "-", _num(f.get("usd_per_hour")),
                       _num(sim.get("slo_attainment"), "{:.2%}"),
                       _num(other.get("slo_attainment"), "{:.2%}"),
                       _num(sim.get("usd_per_mtok"), "{:,.3f}"),
                       _num(other.get("usd_per_mtok"), "{:,.3f}"))
    even = Table(title="break-even $/GPU-hour: the price at which a GPU type enters or leaves "
                       "the integer program's solution")
    even.add_column("GPU")
    even.add_column("break-even", justify="right")
    even.add_column("direction")
    directions = result.get("break_even_direction", {})
    for gpu, price in result["break_even"].items():
        even.add_row(gpu, _num(price), str(directions.get(gpu) or "-"))
    return [fleets, even]


def print_tables(tables: list[Table]) -> None:
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    for table in tables:
        console.print(table)
