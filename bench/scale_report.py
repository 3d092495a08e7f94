"""bench/scale.py's report: percentiles of row ages, the requests' latencies, and the
markdown tables."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from host import cpu_model
from scale_procs import ROOT

AGE_WINDOWS = {"before": ("before the kill", "all"),
               "after_2_intervals": ("2 intervals after the kill", "all"),
               "later": ("after those, to the end", "all"),
               "victim_before": ("before the kill", "the killed replica's"),
               "victim_after_2_intervals": ("2 intervals after the kill",
                                            "the killed replica's"),
               "victim_later": ("after those, to the end", "the killed replica's")}


def pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else float("nan")



def array_stats(arrays: list[np.ndarray], mask: np.ndarray | None = None) -> dict[str, Any]:
    if not arrays:
        return {"samples": 0}
    ages = np.concatenate([a if mask is None else a[mask] for a in arrays])
    finite = ages[np.isfinite(ages)]
    return {"samples": len(arrays), "values": len(ages),
            "never_scraped": int(len(ages) - len(finite)),
            "p50": pct(finite, 50), "p99": pct(finite, 99),
            "max": float(finite.max()) if len(finite) else float("nan"),
            "over_2_intervals": int(np.count_nonzero(ages > 2.0))}



def request_report(path: Path, windows: dict[str, tuple[float, float]],
                   victim: int) -> dict[str, Any]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    out = {}
    for name, (a, b) in windows.items():
        sel = [r for r in rows if a <= r["t"] < b
               and not (name == "after kill" and r["replica"] == victim)]
        ok = [r for r in sel if r.get("gw_status") == 200 and r.get("direct_status") == 200]
        gw = np.array([r["gw"] for r in ok]) * 1e3
        direct = np.array([r["direct"] for r in ok]) * 1e3
        out[name] = {"requests": len(sel), "failed": len(sel) - len(ok),
                     "statuses": dict(Counter(str(r.get("gw_status")) for r in sel)),
                     "gw_p50_ms": pct(gw, 50), "gw_p99_ms": pct(gw, 99),
                     "direct_p50_ms": pct(direct, 50), "direct_p99_ms": pct(direct, 99),
                     "added_p50_ms": pct(gw, 50) - pct(direct, 50),
                     "added_p99_ms": pct(gw, 99) - pct(direct, 99)}
    return out



def fmt(x: Any, digits: int = 2) -> str:
    if isinstance(x, float):
        return "-" if x != x else f"{x:.{digits}f}"
    return str(x)



def age_table(stats: dict[str, Any], missing: str) -> list[str]:
    lines = [f"| window | endpoints | samples | values | p50 | p99 | max | > 2 intervals "
             f"| {missing} |", "|---|---|---|---|---|---|---|---|---|"]
    for key, (name, which) in AGE_WINDOWS.items():
        s = stats.get(key)
        if not s or not s.get("samples"):
            continue
        lines.append(f"| {name} | {which} | {s['samples']} | {s['values']:,} | "
                     f"{fmt(s['p50'])} | {fmt(s['p99'])} | {fmt(s['max'])} | "
                     f"{s['over_2_intervals']:,} | {s['never_scraped']} |")
    return lines



def window_lines(w: dict[str, Any], extra: tuple[tuple[str, str], ...] = ()) -> list[str]:
    head = ("| replica | CPU % of a core | ms per endpoint-tick | ms per visit "
            "| own visits per interval | takeover visits per interval"
            + "".join(f" | {label}" for label, _ in extra) + " |")
    lines = [head, "|---" * (6 + len(extra)) + "|"]
    for name, r in w["replicas"].items():
        lines.append(f"| {name} | {r['cpu_pct']} | {r['ms_per_endpoint_tick']} | "
                     f"{r['ms_per_visit']} | {r['own_visits_per_interval']:,} | "
                     f"{r['takeover_visits_per_interval']}"
                     + "".join(f" | {r.get(key, '')}" for _, key in extra)
                     + " |")
    lines += ["", f"Fleet-wide: **{w['scrapes_per_endpoint_interval']} scrapes per endpoint "
              f"per interval** (engine-counted; {w['probes_per_endpoint_interval']} probes; "
              f"{w['published_visits_per_endpoint_interval']} visits per endpoint per interval "
              f"in the published rows), all replicas' CPU / (N x intervals) = "
              f"**{w['fleet_ms_per_endpoint_tick']} ms per endpoint-tick**; replicas live in "
              f"Redis during the window: {w['members_seen']}; other processes (% of a core): "
              f"{w['other_cpu_pct']}; new engine connections {w['new_engine_connections']:,}, "
              f"capacity reads {w['capacity_reads']:,}."]
    return lines



def markdown(res: dict[str, Any]) -> str:
    q, i = res["quiet"], res["interval_s"]
    lines = [f"{res['replicas']} replicas, {res['endpoints']:,} endpoints, scrape interval "
             f"{i:g} s, sync {res['sync_interval_s']:g} s; replicas ready after "
             f"{res['ready_after_s']} s (one after another), all live in Redis for the "
             f"settling time {res['settled_after_s']} s after the first start; the engine "
             f"closes connections idle {res['engine_idle_s']:g} s; open-files limit "
             f"{res['open_files_limit']}.", ""]
    lines += [f"**Quiet window** ({q['seconds']:.0f} s, nothing reads the gateways):", ""]
    lines += window_lines(q, (("ready endpoints", "ready"), ("RSS MB", "rss_mb"),
                              ("open fds", "fds")))
    lines += [f"The engine held {q['engine_fds']:,} fds; this script used "
              f"{q['this script cpu_pct']}% of a core (the row sampler).", ""]
    if "polled" in res:
        p = res["polled"]
        every = ("each replica's" if res["read_all"] else "one replica's (in turn)")
        lines += [f"**Polled window** ({p['seconds']:.0f} s, {every} /admin/endpoints read "
                  f"every {res['poll_s']:g} s: {p['reads']} reads, p50 {p['read_s_p50']:.2f} "
                  f"s, max {p['read_s_max']:.2f} s each; {p['skipped_busy']} skipped while the "
                  f"previous one ran, {p['failed_reads']} failed; collector ticks per interval "
                  f"{p['ticks_per_interval']}):", ""]
        lines += [*window_lines(p), ""]
    if "after_kill" in res:
        a = res["after_kill"]
        lines += [f"**After the kill** of replica 0 (SIGKILL; it owned "
                  f"{res['victim_endpoints']:,} endpoints), {a['seconds']:.0f} s: takeover "
                  f"visits in the first 2 intervals {a['takeovers_in_2_intervals']:,}; live "
                  f"replicas in Redis (s after the kill, count) {a['members_over_time']}; "
                  f"ready endpoints at the end {a['ready_at_end']}.", ""]
        lines += [*window_lines(a), ""]
    lines += ["Staleness of the rows in Redis (per endpoint, the age of the newest visit any "
              f"replica published; read every {res['redis_poll_s']:g} s from the store, "
              "nothing asked of the gateways), in intervals:", ""]
    lines += [*age_table(res["published"], "none published"), ""]
    if res["router_view"].get("before", {}).get("samples"):
        lines += ["Staleness of the rows the router reads (`scrape_age_s` in the replicas' "
                  "/admin/endpoints during the polled window and after the kill), in "
                  "intervals:", ""]
        lines += [*age_table(res["router_view"], "never scraped"), ""]
    lines += ["Requests (non-streamed chat, instant engine), ms:", "",
              "| window | requests | failed | gateway p50 | gateway p99 | direct p50 "
              "| direct p99 | added p50 | added p99 |", "|---|---|---|---|---|---|---|---|---|"]
    for name, r in res["requests"].items():
        lines.append(f"| {name} | {r['requests']} | {r['failed']} | {fmt(r['gw_p50_ms'])} | "
                     f"{fmt(r['gw_p99_ms'])} | {fmt(r['direct_p50_ms'])} | "
                     f"{fmt(r['direct_p99_ms'])} | {fmt(r['added_p50_ms'])} | "
                     f"{fmt(r['added_p99_ms'])} |")
    lines += ["", "The collectors' counters over the whole run (first read after start to the "
              "last, survivors): " + "; ".join(
                  f"{k}: {v['ticks_per_interval']} ticks per interval, {v['visits']:,} visits, "
                  f"{v['takeovers']:,} takeovers, {v['not_ready']} not ready at the end"
                  for k, v in res["whole_run"].items()) + ".", ""]
    lines += ["Gateway logs:", ""]
    for name, lg in res["logs"].items():
        lines.append(f"- {name}: {lg['warnings_errors']} warnings/errors, endpoints went "
                     f"not ready {lg['went_not_ready']:,} times {lg['not_ready_why']}"
                     + (f"; {lg['kinds']}" if lg["kinds"] else ""))
    return "\n".join(lines)



def machine() -> str:
    model = cpu_model()
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True).stdout.strip() or "?"
    return (f"{model}, nproc {os.cpu_count()}, Linux {platform.release()}, Python "
            f"{platform.python_version()}, commit {rev}")
