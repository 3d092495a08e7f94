"""Print a bench result as rich tables, and compare two results (``bench --compare A B``).

May touch: rich, orjson, the file system (reading results). Must not touch: the network.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

COLUMNS = (  # header, group key, stat key (None: the value itself)
    ("req/s", "request_throughput", None), ("out tok/s", "output_throughput", None),
    ("TTFT mean", "ttft_ms", "mean"), ("TTFT p99", "ttft_ms", "p99"),
    ("TPOT mean", "tpot_ms", "mean"), ("TPOT p99", "tpot_ms", "p99"),
    ("ITL mean", "itl_ms", "mean"), ("e2e p50", "e2e_ms", "p50"), ("e2e p99", "e2e_ms", "p99"),
    ("goodput", "goodput", None), ("SLO ok", "slo_attainment", None),
    ("$/Mtok", "usd_per_mtok", None),
)
COMPARED = (
    ("requests", "requests", None), ("errors", "errors", None),
    ("request throughput (req/s)", "request_throughput", None),
    ("output throughput (tok/s)", "output_throughput", None),
    ("TTFT mean (ms)", "ttft_ms", "mean"), ("TTFT p50 (ms)", "ttft_ms", "p50"),
    ("TTFT p99 (ms)", "ttft_ms", "p99"), ("TPOT mean (ms)", "tpot_ms", "mean"),
    ("TPOT p99 (ms)", "tpot_ms", "p99"), ("ITL mean (ms)", "itl_ms", "mean"),
    ("ITL p99 (ms)", "itl_ms", "p99"), ("e2e mean (ms)", "e2e_ms", "mean"),
    ("e2e p99 (ms)", "e2e_ms", "p99"), ("goodput (req/s)", "goodput", None),
    ("SLO attainment", "slo_attainment", None), ("$/Mtok", "usd_per_mtok", None),
)


def value(group: dict[str, Any], key: str, stat: str | None) -> float | None:
    v = group.get(key)
    if stat is not None:
        v = v.get(stat) if isinstance(v, dict) else None
    return float(v) if isinstance(v, int | float) else None


def fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if float(v).is_integer() and abs(v) >= 2:
        return f"{int(v):,}"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.3g}" if abs(v) < 1 else f"{v:.1f}"


def result_table(result: dict[str, Any], title: str = "fleetgate bench") -> Table:
    table = Table(title=title)
    table.add_column("")
    table.add_column("ok", justify="right")
    table.add_column("err", justify="right")
    for header, _, _ in COLUMNS:
        table.add_column(header, justify="right")
    groups = [("overall", result["overall"]), *result.get("pools", {}).items()]
    for name, g in groups:
        table.add_row(name, str(g["requests"]), str(g["errors"]),
                      *(fmt(value(g, k, s)) for _, k, s in COLUMNS))
    return table


def print_result(result: dict[str, Any], console: Console | None = None) -> None:
    console = console or wide_console()
    run = result.get("run", {})
    console.print(result_table(result))
    console.print(f"times in ms; duration {run.get('duration_s')} s; "
                  f"{run.get('prompt_lengths', '')}")
    errors = result["overall"].get("errors_by_kind") or {}
    if errors:
        console.print("errors: " + ", ".join(f"{k} x{n}" for k, n in errors.items()))
    if result.get("costs_note"):
        console.print(f"$/Mtok unknown: {result['costs_note']}")


def wide_console() -> Console:
    """stderr; 200 columns when it is not a terminal (a log file, CI), so tables stay whole."""
    probe = Console(stderr=True)
    return probe if probe.is_terminal else Console(stderr=True, width=200)


def load_result(path: Path) -> dict[str, Any]:
    try:
        data = orjson.loads(Path(path).read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    if not isinstance(data, dict) or "overall" not in data:
        raise ValueError(f"{path}: not a `fleetgate bench --json` result")
    return data


def delta(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or a == 0:
        return None
    return (b - a) / abs(a) * 100.0


def compare(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (group, metric) present in either: A, B and B's change from A in %."""
    rows = []
    groups = ["overall", *sorted(set(a.get("pools", {})) | set(b.get("pools", {})))]
    for name in groups:
        ga = a["overall"] if name == "overall" else a.get("pools", {}).get(name, {})
        gb = b["overall"] if name == "overall" else b.get("pools", {}).get(name, {})
        for label, key, stat in COMPARED:
            va, vb = value(ga, key, stat), value(gb, key, stat)
            if va is None and vb is None:
                continue
            d = delta(va, vb)
            rows.append({"group": name, "metric": label, "a": va, "b": vb,
                         "change_pct": None if d is None else round(d, 2)})
    return rows


def compare_table(rows: list[dict[str, Any]], a_name: str, b_name: str) -> Table:
    table = Table(title=f"fleetgate bench --compare: A = {a_name}, B = {b_name}")
    for col, justify in (("group", "left"), ("metric", "left"), ("A", "right"), ("B", "right"),
                         ("B vs A", "right")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for r in rows:
        d = r["change_pct"]
        table.add_row(r["group"], r["metric"], fmt(r["a"]), fmt(r["b"]),
                      "-" if d is None else f"{d:+.1f}%")
    return table


def shadow_sentences(rows: list[dict[str, Any]]) -> list[str]:
    """"On your traffic, pool X would have served at ... against pool Y's ..." per pairing."""
    out = []
    for r in rows:
        s = r["serving"]
        out.append(
            f"On your traffic ({r['mirrored']} requests mirrored, {r['failed']} failed, "
            f"{r['skipped_budget']} skipped by the spend cap), {r['pool']} would have served "
            f"at TTFT p95 {_p(r['ttft_ms'], 'p95')} ms, TPOT p50 {_p(r['tpot_ms'], 'p50')} ms, "
            f"${_money(r['usd_per_mtok'])}/Mtok against {r['serving_pool']}'s "
            f"{_p(s['ttft_ms'], 'p95')} ms, {_p(s['tpot_ms'], 'p50')} ms and "
            f"${_money(s['usd_per_mtok'])}/Mtok.")
    return out


def print_shadow(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="shadow traffic: candidate vs serving pool on the same requests")
    for col in ("pool", "requests", "TTFT p50/p95 ms", "TPOT p50/p95 ms", "$", "$/Mtok"):
        table.add_column(col, justify="left" if col == "pool" else "right")
    for r in rows:
        for label, side in ((f"{r['pool']} (candidate)", r), (f"{r['serving_pool']} (serving)",
                                                              r["serving"])):
            table.add_row(label, str(side["requests"]),
                          f"{_p(side['ttft_ms'], 'p50')} / {_p(side['ttft_ms'], 'p95')}",
                          f"{_p(side['tpot_ms'], 'p50')} / {_p(side['tpot_ms'], 'p95')}",
                          _money(side["usd"]), _money(side["usd_per_mtok"]))
    Console().print(table)


def _p(pcts: dict[str, float] | None, key: str) -> str:
    return "-" if not pcts else f"{pcts[key]:.1f}"


def _money(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"
