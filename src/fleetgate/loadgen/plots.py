"""PNG plots of bench results (matplotlib, Agg; imported only when a plot is asked for).

* ``latency_cdf.png``: CDFs of TTFT, TPOT and e2e, overall and per pool;
* ``pools.png``: output tokens/s and $/Mtok per pool;
* ``compare_cdf.png`` (``--compare A B --plot DIR``): A's and B's CDFs on the same axes;
* ``sweep.png`` (``bench sweep --plot DIR``): per pool, p99 TTFT and TPOT against the
  output throughput each load step reached (the throughput-latency curve), the SLO limits,
  and the share of requests within the SLO per step, the capacity marked.

May touch: matplotlib, numpy, the file system (writing PNGs). Must not touch: the network.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

METRICS = (("ttft_ms", "TTFT (ms)"), ("tpot_ms", "TPOT (ms)"), ("e2e_ms", "e2e latency (ms)"))


def _cdf(ax: Any, values: list[float | None], label: str, style: str = "-") -> None:
    v = np.sort(np.asarray([x for x in values if x is not None], dtype=float))
    if v.size:
        ax.plot(v, np.arange(1, v.size + 1) / v.size, style, label=f"{label} (n={v.size})")


def _groups(result: dict[str, Any]) -> list[tuple[str, list[bool]]]:
    cols = result.get("per_request") or {}
    pools = cols.get("pool") or []
    out = [("overall", [True] * len(pools))]
    for name in result.get("pools", {}):
        out.append((name, [p == name for p in pools]))
    return out


def plot_result(result: dict[str, Any], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    cols = result.get("per_request") or {}
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for ax, (key, label) in zip(axes, METRICS, strict=True):
        values = cols.get(key) or []
        for name, mask in _groups(result):
            _cdf(ax, [v for v, m in zip(values, mask, strict=False) if m], name,
                 "-" if name == "overall" else "--")
        ax.set_xlabel(label)
        ax.set_ylabel("share of requests")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(_title(result))
    fig.tight_layout()
    paths = [out_dir / "latency_cdf.png"]
    fig.savefig(paths[0], dpi=110)
    plt.close(fig)
    pools = result.get("pools") or {}
    if pools:
        paths.append(_pool_bars(pools, _title(result), out_dir / "pools.png"))
    return paths


def _pool_bars(pools: dict[str, Any], title: str, path: Path) -> Path:
    names = list(pools)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    tok = [pools[n].get("output_throughput") or 0.0 for n in names]
    usd = [pools[n].get("usd_per_mtok") for n in names]
    axes[0].bar(names, tok, color="tab:blue")
    axes[0].set_ylabel("output tokens/s")
    axes[1].bar(names, [u or 0.0 for u in usd], color="tab:green")
    axes[1].set_ylabel("$ per million output tokens")
    for i, u in enumerate(usd):
        axes[1].annotate("unknown" if u is None else f"${u:.2f}", (i, u or 0.0),
                         ha="center", va="bottom", fontsize=8)
    for ax in axes:
        ax.tick_params(axis="x", rotation=20)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _title(result: dict[str, Any]) -> str:
    run = result.get("run") or {}
    load = (f"concurrency {run.get('concurrency')}" if run.get("mode") == "closed"
            else f"rate {run.get('rate')}/s" if run.get("rate") else str(run.get("mode", "")))
    return f"{run.get('url', '')}  {run.get('api', '')}  {load}"


def plot_compare(a: dict[str, Any], b: dict[str, Any], names: tuple[str, str],
                 out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for ax, (key, label) in zip(axes, METRICS, strict=True):
        _cdf(ax, (a.get("per_request") or {}).get(key) or [], f"A {names[0]}")
        _cdf(ax, (b.get("per_request") or {}).get(key) or [], f"B {names[1]}", "--")
        ax.set_xlabel(label)
        ax.set_ylabel("share of requests")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("fleetgate bench --compare")
    fig.tight_layout()
    path = out_dir / "compare_cdf.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_sweep(sweep: dict[str, Any], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    slo = sweep.get("slo") or {}
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for name, pool in sweep.get("pools", {}).items():
        steps = sorted(pool.get("steps") or [], key=lambda s: s["load"])
        tput = [s.get("output_throughput") or 0.0 for s in steps]
        loads = [s["load"] for s in steps]
        line = axes[0].plot(tput, [s["ttft_ms"]["p99"] for s in steps], "o-", label=name)[0]
        axes[1].plot(tput, [s["tpot_ms"]["p99"] for s in steps], "o-", color=line.get_color(),
                     label=name)
        axes[2].plot(loads, [s.get("slo_attainment") for s in steps], "o-",
                     color=line.get_color(), label=name)
        cap = (pool.get("capacity") or {}).get("load")
        if cap is not None:
            axes[2].axvline(cap, color=line.get_color(), ls=":", lw=1)
    for ax, key, label in ((axes[0], "ttft_ms", "p99 TTFT (ms)"),
                           (axes[1], "tpot_ms", "p99 TPOT (ms)")):
        if slo.get(key):
            ax.axhline(slo[key], color="red", ls="--", lw=1, label="SLO")
        ax.set_xlabel("output tokens/s")
        ax.set_ylabel(label)
        ax.set_yscale("log")
    axes[2].axhline(sweep.get("target_attainment", 0.99), color="red", ls="--", lw=1,
                    label="target")
    axes[2].set_xlabel(f"offered load ({sweep.get('mode', 'rate')})")
    axes[2].set_ylabel("share of requests within the SLO")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("fleetgate bench sweep: throughput-latency per pool (dotted: capacity)")
    fig.tight_layout()
    path = out_dir / "sweep.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
