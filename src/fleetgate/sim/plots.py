"""PNG plots of a ``simulate`` run (matplotlib, headless Agg backend).

One figure: the TTFT and TPOT CDFs per policy (with the SLO limits), $/Mtok against SLO
attainment per policy (busy and provisioned $, the lower bound as a line), and each
policy's pool shares over time (share of the requests that arrived in each interval).

May touch: matplotlib, numpy, the run's report. Must not touch: the simulator's state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import numpy.typing as npt

from fleetgate.sim.outcomes import OK
from fleetgate.sim.run import Report
from fleetgate.sim.summary import share_over_time


def _cdf(ax: Any, values: npt.NDArray[np.float64], label: str) -> None:
    v = np.sort(values[~np.isnan(values)])
    if len(v):
        ax.plot(v, np.arange(1, len(v) + 1) / len(v), label=label)


def plot_report(report: Report, ttft_ms: float, tpot_ms: float, path: str | Path) -> None:
    runs = report.runs
    fig = plt.figure(figsize=(16, 9), constrained_layout=True)
    grid = fig.add_gridspec(2, 1)
    top = grid[0].subgridspec(1, 3)
    bottom = grid[1].subgridspec(1, max(1, len(runs)))
    ax_ttft, ax_tpot, ax_cost = (fig.add_subplot(top[0, k]) for k in range(3))
    for run in runs:
        ok = run.outcomes.status == OK
        _cdf(ax_ttft, run.outcomes.ttft_s[ok] * 1000, run.policy)
        _cdf(ax_tpot, run.outcomes.tpot_s[ok] * 1000, run.policy)
    for ax, limit, what in ((ax_ttft, ttft_ms, "TTFT"), (ax_tpot, tpot_ms, "TPOT")):
        ax.axvline(limit, color="grey", linestyle="--", linewidth=1)
        ax.set_xscale("log")
        ax.set_xlabel(f"{what} (ms, log)")
        ax.set_ylabel("share of finished requests")
        ax.set_title(f"{what} CDF (dashed: SLO)")
        ax.legend(fontsize=8)
    _cost_panel(ax_cost, report)
    for k, run in enumerate(runs):
        ax = fig.add_subplot(bottom[0, k])
        t, shares = share_over_time(run.outcomes, report.requests, run.fleet,
                                    report.duration_s)
        ax.stackplot(t, *shares.values(), labels=list(shares))
        ax.set_title(f"{run.policy}: pool share over time", fontsize=9)
        ax.set_xlabel("arrival time (s)")
        ax.set_ylim(0, 1)
        if k == 0:
            ax.legend(fontsize=7, loc="lower left")
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _cost_panel(ax: Any, report: Report) -> None:
    for run in report.runs:
        s = run.summary
        att = s["slo_attainment"] or 0.0
        ax.scatter([att], [s["usd_per_mtok"] or np.nan], marker="o")
        ax.scatter([att], [s["provisioned_usd_per_mtok"] or np.nan], marker="x", color="grey")
        ax.annotate(run.policy, (att, s["usd_per_mtok"] or 0.0), fontsize=8,
                    textcoords="offset points", xytext=(4, 4))
    bound = (report.bound or {}).get("usd_per_mtok")
    if bound:
        ax.axhline(bound, color="green", linestyle=":", label="lower bound")
        ax.legend(fontsize=8)
    ax.set_xlabel("SLO attainment")
    ax.set_ylabel("$ per million output tokens")
    ax.set_title("$/Mtok vs SLO (o busy GPU-time, x provisioned)")
