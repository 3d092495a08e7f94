"""Replicas sharing the scraping of a large fleet: CPU, visits, staleness, a killed replica.

What it measures (issue 26): R ``fleetgate serve`` replicas (``--workers 1`` each) on one
real Redis (a key prefix of this run's own, deleted at the end) in front of N endpoints, at a
scrape interval I (``FLEETGATE_HEALTH_INTERVAL_S``), in three windows: a quiet one, one in
which the replicas' ``/admin/endpoints`` is read (``--poll``; skipped with ``--poll 0``),
and, after replica 0 is killed with SIGKILL at the end of the second, ``--after`` seconds
of the survivors.

Nothing in the measured windows asks the gateways except the polled window's reads: at
10,000 endpoints one ``/admin/endpoints`` is ~10 MB of JSON built on the gateway's event
loop in seconds, longer than the takeover threshold (1.25 intervals) and the share TTL
(3 sync intervals), so reading it moves what it measures. Instead:

- **CPU per replica**: user + system from ``/proc/<pid>/stat``, as % of one core, per
  endpoint-tick (the CPU over N x the intervals in the window: the issue's "collector CPU
  per endpoint-tick"; with sharding about a 1/R share of a visit plus applying the peers'
  rows and everything else the process does) and per visit it made.
- **Scrapes per endpoint per interval, fleet-wide**: counted by the engine (``--stats``):
  ``/metrics`` requests / (N x wall-clock intervals); each visit of a
  ready endpoint is one. Probes (``/health``) and the capacity reads are counted apart.
- **Visits and takeovers per replica**, from the rows the replicas publish to Redis (the
  sampler below): a row with a newer visit time than the last one seen from that replica
  is a visit; a visit of an endpoint the replica does not own (rendezvous over the live
  replicas, as the gateway computes it) is a takeover (a backup visiting because the
  owner's rows stopped, or came late).
- **Staleness of the rows**: every ``--redis-poll`` seconds (default I/4) the rows in Redis
  give each endpoint's newest visit anywhere: its age is what a replica's next sync can
  apply (the router of a non-owner lags it by up to one sync interval; the owner's own
  row is fresher). In the polled window and after the kill, every ``--poll`` seconds one
  live replica's ``/admin/endpoints`` (the replicas in turn; all of them with
  ``--read-all``) gives ``scrape_age_s``, the age of the row its router reads. Both in
  intervals, p50/p99/max over endpoints and samples, before the kill, in the 2 intervals
  after it and after those, for all endpoints and for the killed replica's.
- **Added latency** (the gateway exposes no decision timing of its own: no histogram in
  ``/metrics``, none in ``/admin/decisions``): a load generator in its own process sends
  ``--rate`` non-streamed chat requests per second per replica, each followed by the same
  request straight to the mock engine on a kept-alive connection; "added" is the gateway's
  latency minus the direct one at the same percentile: the routing decision over N
  endpoints, the relay, and any wait behind the collector's work on the event loop.
- ``/readyz`` (cheap) gives each replica's ready endpoints at each window's end; the
  gateways' logs are searched for warnings, errors and endpoints gone not ready; a last
  ``/admin/endpoints`` per survivor gives its collector's counters over the whole run.

How: ONE ``bench/mock_engine.py`` process (the captured vLLM exposition of
``tests/data/vllm_metrics.txt``, 63 KB, whole, as vLLM sends it) listening on 0.0.0.0,
and the N endpoints are N loopback addresses 127.0.x.y of it (Linux routes all of 127/8 to
lo, no root needed), so each endpoint has its own connections. It closes connections idle
for ``--engine-idle`` seconds (5, as vLLM's uvicorn): a replica keeps a connection to every
endpoint it ever visited (two after the first tick's capacity reads), and R x N of them
would not fit one process's open-files limit. The gateways' YAML (``--pools`` pools over
the N URLs, policy ``cost``) is written to a temporary directory; the replicas start one
after another (each waits for ``/readyz``: its first tick visits the whole fleet alone),
then the run waits until Redis has counted R live replicas for ``--settle`` seconds.

Split by what each part does: ``scale_procs.py`` starts and measures the processes,
``scale_watch.py`` reads the replicas and Redis while it runs, ``scale_report.py`` turns
the results into tables; this file runs the windows and the kill.

Run: .venv/bin/python bench/scale.py [--replicas 4] [--endpoints 10000] [--interval 1]
     [--duration 30] [--poll SECONDS | 0] [--kill] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from scale_procs import (
    Replica,
    cpu_s,
    delete_keys,
    endpoint_urls,
    engine_stats,
    fleet_yaml,
    log_report,
    open_fds,
    raise_hard_nofile,
    ready_count,
    rss_mb,
    start_engine,
    start_replica,
)
from scale_report import (
    array_stats,
    machine,
    markdown,
    pct,
    request_report,
)
from scale_watch import (
    RowSample,
    RowSampler,
    Sample,
    live_members,
    loadgen,
    read_admin,
)

# -- the gateways' view: /admin/endpoints ---------------------------------------------------


# -- load generator (its own process, so the readers' JSON decoding does not delay it) -------


# -- measuring a window ---------------------------------------------------------------------


@dataclass
class Mark:
    t: float
    cpu: dict[str, float]
    engine: Counter[str]


def mark(procs: dict[str, int], port: int) -> Mark:
    return Mark(time.time(), {k: cpu_s(p) for k, p in procs.items()}, engine_stats(port))


def window(a: Mark, b: Mark, rows: list[RowSample], replicas: list[Replica], n: int,
           interval: float) -> dict[str, Any]:
    """CPU, scrapes and the replicas' visits between two marks."""
    seconds = b.t - a.t
    intervals = seconds / interval
    out: dict[str, Any] = {"seconds": round(seconds, 1)}
    per: dict[str, Any] = {}
    gateways = 0.0
    for rep in replicas:
        if rep.name not in b.cpu:
            continue
        cpu = b.cpu[rep.name] - a.cpu[rep.name]
        gateways += cpu
        own = sum(s.own.get(rep.replica_id or "", 0) for s in rows)
        taken = sum(s.taken.get(rep.replica_id or "", 0) for s in rows)
        per[rep.name] = {
            "cpu_pct": round(cpu / seconds * 100, 1),
            "ms_per_endpoint_tick": round(cpu / (n * intervals) * 1e3, 4),
            "ms_per_visit": round(cpu / max(own + taken, 1) * 1e3, 3),
            "own_visits_per_interval": round(own / intervals),
            "takeover_visits_per_interval": round(taken / intervals, 1),
            "takeovers": taken,
        }
    out["replicas"] = per
    out["other_cpu_pct"] = {k: round((b.cpu[k] - a.cpu[k]) / seconds * 100, 1)
                            for k in b.cpu if not k.startswith("replica")}
    eng = b.engine - a.engine
    out["scrapes_per_endpoint_interval"] = round(eng["metrics"] / (n * intervals), 3)
    out["probes_per_endpoint_interval"] = round(eng["/health"] / (n * intervals), 3)
    out["capacity_reads"] = eng["/v1/models"]
    out["new_engine_connections"] = eng["connections"]
    out["published_visits_per_endpoint_interval"] = round(
        sum(sum(s.own.values()) + sum(s.taken.values()) for s in rows) / (n * intervals), 3)
    out["fleet_ms_per_endpoint_tick"] = round(gateways / (n * intervals) * 1e3, 4)
    out["members_seen"] = sorted({len(s.members) for s in rows})
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    import redis

    n, interval = args.endpoints, args.interval
    limits = raise_hard_nofile(1 << 20)
    prefix = f"fleetgate-scale-{uuid.uuid4().hex[:8]}:"
    tmp = Path(tempfile.mkdtemp(prefix="fleetgate-scale-"))
    engine, port = start_engine(args.engine_idle)
    config = tmp / "fleet.yaml"
    config.write_text(fleet_yaml(endpoint_urls(n, port), args.pools))
    env = {**os.environ, "FLEETGATE_REDIS_URL": args.redis, "FLEETGATE_REDIS_PREFIX": prefix,
           "FLEETGATE_HEALTH_INTERVAL_S": str(interval),
           "FLEETGATE_SYNC_INTERVAL_S": str(args.sync_interval),
           "FLEETGATE_REQUEST_LOG": "off", "FLEETGATE_LOG_LEVEL": "info"}
    replicas: list[Replica] = []
    gen: subprocess.Popen[bytes] | None = None
    client = redis.Redis.from_url(args.redis)
    out: dict[str, Any] = {"endpoints": n, "replicas": args.replicas, "interval_s": interval,
                           "sync_interval_s": args.sync_interval, "pools": args.pools,
                           "open_files_limit": limits[1], "engine_idle_s": args.engine_idle,
                           "log_dir": str(tmp)}
    try:
        t_start = time.monotonic()
        ids: list[str] = []
        first: dict[str, Sample] = {}
        for k in range(args.replicas):
            rep = start_replica(k, config, tmp, env, args.start_timeout)
            replicas.append(rep)
            first[rep.name], ids = read_admin(rep, interval)  # its id, the endpoints' ids
            print(f"replica {k} ready after {rep.ready_after_s:.1f}s", file=sys.stderr)
            # Its first tick connected to every endpoint (twice, with the capacity reads):
            # let the engine close the idle ones before the next replica does the same.
            calm = time.monotonic() + 3 * args.engine_idle
            while (open_fds(engine.pid) > min(limits[0], limits[1]) - 2.2 * n
                   and time.monotonic() < calm):
                time.sleep(0.5)
        out["ready_after_s"] = [round(r.ready_after_s, 1) for r in replicas]
        steady_since, deadline = None, time.monotonic() + args.start_timeout
        while True:  # every replica live in Redis for --settle seconds in a row
            count = len(live_members(client, prefix))
            now = time.monotonic()
            steady_since = (steady_since or now) if count == args.replicas else None
            if steady_since is not None and now - steady_since >= args.settle:
                break
            if now > deadline:
                raise RuntimeError(f"{count} of {args.replicas} replicas live after "
                                   f"{args.start_timeout:.0f}s")
            time.sleep(0.25)
        out["settled_after_s"] = round(time.monotonic() - t_start, 1)
        rows = RowSampler(args.redis, prefix, ids, interval, args.redis_poll)
        rows.start()
        samples_out = tmp / "requests.jsonl"
        gen = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--loadgen", str(samples_out),
             "--targets", ",".join(r.url for r in replicas), "--direct",
             f"http://127.0.0.1:{port}", "--rate", str(args.rate * args.replicas)])
        time.sleep(max(2.0, 2 * args.redis_poll))
        procs = {r.name: r.pid for r in replicas}
        procs |= {"mock engine": engine.pid, "load generator": gen.pid}

        # 1. The quiet window: nothing reads the gateways but /readyz at its end.
        print(f"quiet window: {args.duration:.0f}s", file=sys.stderr)
        bench0 = sum(os.times()[:2])
        q0 = mark(procs, port)
        time.sleep(args.duration)
        q1 = mark(procs, port)
        bench1 = sum(os.times()[:2])
        quiet = window(q0, q1, rows.between(q0.t, q1.t), replicas, n, interval)
        quiet["this script cpu_pct"] = round((bench1 - bench0) / (q1.t - q0.t) * 100, 1)
        for rep in replicas:
            quiet["replicas"][rep.name] |= {
                "ready": ready_count(rep), "rss_mb": round(rss_mb(rep.pid)),
                "fds": open_fds(rep.pid)}
        quiet["engine_fds"] = open_fds(engine.pid)
        out["quiet"] = quiet
        windows = {"quiet": (q0.t, q1.t)}

        # 2. The polled window (if any), the kill, the survivors.
        admin: list[Sample] = []
        pending: dict[int, Future[tuple[Sample, list[str]]]] = {}
        skipped, failed_reads = Counter[int](), 0
        victim = replicas[0]
        p0 = mark(procs, port)
        kill_at: float | None = None
        k_mark: Mark | None = None
        end = p0.t + args.duration + (args.after if args.kill else 0.0)
        if args.poll <= 0 and args.kill:
            end = p0.t + args.after  # straight to the kill
        print("polled window" if args.poll > 0 else "kill", file=sys.stderr)
        with ThreadPoolExecutor(max_workers=args.replicas) as pool:
            tick, turn = p0.t, -1
            while time.time() < end:
                due = p0.t + (args.duration if args.poll > 0 else 0.0)
                if args.kill and kill_at is None and time.time() >= due:
                    k_mark = mark(procs, port)
                    victim.popen.send_signal(signal.SIGKILL)
                    victim.popen.wait()
                    victim.alive = False
                    kill_at = time.time()
                    print(f"killed replica {victim.index} ({victim.replica_id})",
                          file=sys.stderr)
                if args.poll > 0:
                    alive = [r for r in replicas if r.alive]
                    turn += 1
                    for r in alive if args.read_all else [alive[turn % len(alive)]]:
                        fut = pending.get(r.index)
                        if fut is not None and not fut.done():
                            skipped[r.index] += 1
                            continue
                        if fut is not None:
                            try:
                                admin.append(fut.result()[0])
                            except (httpx.HTTPError, ValueError, KeyError):
                                failed_reads += 1
                        pending[r.index] = pool.submit(read_admin, r, interval)
                    tick += args.poll
                else:
                    tick += 0.25
                time.sleep(max(0.0, min(tick, end) - time.time()))
            for idx, fut in pending.items():
                with contextlib.suppress(Exception):
                    if replicas[idx].alive or fut.done():
                        admin.append(fut.result(timeout=120)[0])
        survivors = {k: p for k, p in procs.items() if k != victim.name or kill_at is None}
        e_mark = mark(survivors, port)
        rows.stop.set()
        rows.join(timeout=10)
        polled_end = kill_at if kill_at is not None else e_mark.t
        if args.poll > 0:
            pm = k_mark if k_mark is not None else e_mark
            polled = window(p0, pm, rows.between(p0.t, pm.t), replicas, n, interval)
            before = [s for s in admin if s.sent < polled_end]
            took = np.array([s.took_s for s in admin])
            polled |= {"reads": len(admin), "read_s_p50": pct(took, 50),
                       "read_s_max": float(took.max()) if len(took) else float("nan"),
                       "skipped_busy": sum(skipped.values()), "failed_reads": failed_reads}
            by: dict[int, list[Sample]] = {}
            for s in before:
                by.setdefault(s.replica, []).append(s)
            polled["ticks_per_interval"] = {
                f"replica {k}": round((v[-1].collector["ticks"] - v[0].collector["ticks"])
                                      / max((v[-1].sent - v[0].sent) / interval, 1e-9), 2)
                for k, v in by.items() if len(v) > 1}
            out["polled"] = polled
            windows["polled"] = (p0.t, polled_end)
        else:
            before = []
        router: dict[str, Any] = {"before": array_stats([s.ages for s in before])}
        published: dict[str, Any] = {"before": array_stats(
            [s.ages for s in rows.samples if s.t < polled_end])}
        if kill_at is not None and k_mark is not None:
            members = tuple(sorted(r.replica_id or "" for r in replicas))
            mask = rows.owner(members) == members.index(victim.replica_id or "")
            out["victim_endpoints"] = int(mask.sum())
            soon_t, later_t = (kill_at, kill_at + 2 * interval), (kill_at + 2 * interval, 1e18)
            windows["after kill"] = (kill_at, e_mark.t)
            for key, (a, b) in {"after_2_intervals": soon_t, "later": later_t}.items():
                router[key] = array_stats([s.ages for s in admin if a <= s.sent < b])
                router["victim_" + key] = array_stats(
                    [s.ages for s in admin if a <= s.sent < b], mask)
                published[key] = array_stats([s.ages for s in rows.between(a, b)])
                published["victim_" + key] = array_stats(
                    [s.ages for s in rows.between(a, b)], mask)
            router["victim_before"] = array_stats([s.ages for s in before], mask)
            published["victim_before"] = array_stats(
                [s.ages for s in rows.samples if s.t < polled_end], mask)
            after = window(k_mark, e_mark, rows.between(kill_at, e_mark.t),
                           [r for r in replicas if r.alive], n, interval)
            soon = rows.between(*soon_t)
            after["takeovers_in_2_intervals"] = sum(sum(s.taken.values()) for s in soon)
            after["members_over_time"] = [(round(s.t - kill_at, 2), len(s.members))
                                          for s in rows.between(kill_at, e_mark.t)][::4]
            after["ready_at_end"] = {r.name: ready_count(r) for r in replicas if r.alive}
            out["after_kill"] = after
        out["router_view"] = router
        out["published"] = published
        out["row_sampler_errors"] = rows.errors
        out["requests"] = request_report(samples_out, windows, victim.index)
        # The collectors' own counters over the whole run (the measuring is over).
        whole = {}
        for rep in replicas:
            if not rep.alive:
                continue
            last, _ = read_admin(rep, interval)
            a, b = first[rep.name], last
            span = (b.sent - a.sent) / interval
            whole[rep.name] = {
                "ticks_per_interval": round((b.collector["ticks"] - a.collector["ticks"])
                                            / span, 2),
                "visits": b.collector["visits"] - a.collector["visits"],
                "takeovers": b.collector.get("takeovers", 0) - a.collector.get("takeovers", 0),
                "owned": b.collector.get("owned"), "replicas": b.collector.get("replicas"),
                "not_ready": b.not_ready, "seconds": round(b.sent - a.sent)}
        out["whole_run"] = whole
        out["logs"] = log_report(replicas)
    finally:
        if gen is not None:
            gen.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                gen.wait(timeout=10)
        for r in replicas:
            if r.popen.poll() is None:
                r.popen.terminate()
        for r in replicas:
            try:
                r.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                r.popen.kill()
        engine.kill()
        engine.wait()
        delete_keys(client, prefix)
    return out


# -- report ---------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--endpoints", type=int, default=10_000)
    parser.add_argument("--interval", type=float, default=1.0, help="scrape interval, s")
    parser.add_argument("--sync-interval", type=float, default=0.5,
                        help="FLEETGATE_SYNC_INTERVAL_S (the gateway's default 0.5)")
    parser.add_argument("--duration", type=float, default=30.0,
                        help="seconds of the quiet window, and of the polled one")
    parser.add_argument("--kill", action=argparse.BooleanOptionalAction, default=True,
                        help="SIGKILL replica 0 after the polled window and keep measuring")
    parser.add_argument("--after", type=float, default=None,
                        help="seconds measured after the kill (default: 6 intervals, >= 10)")
    parser.add_argument("--poll", type=float, default=None,
                        help="seconds between /admin/endpoints reads in the polled window "
                             "(default: one interval; 0: no polled window, kill after the "
                             "quiet one)")
    parser.add_argument("--read-all", action="store_true",
                        help="read every live replica at each poll (default: one, in turn)")
    parser.add_argument("--redis-poll", type=float, default=None,
                        help="seconds between reads of the rows in Redis (default: interval/4)")
    parser.add_argument("--engine-idle", type=float, default=5.0,
                        help="the mock engine closes connections idle this long (vLLM's "
                             "uvicorn: 5 s); keeps its sockets within the open-files limit")
    parser.add_argument("--rate", type=float, default=2.0, help="requests/s per replica")
    parser.add_argument("--pools", type=int, default=4)
    parser.add_argument("--settle", type=float, default=None,
                        help="seconds all replicas must be live before measuring "
                             "(default 3 intervals)")
    parser.add_argument("--start-timeout", type=float, default=300.0)
    parser.add_argument("--redis", default=os.environ.get("FLEETGATE_REDIS_URL",
                                                          "redis://127.0.0.1:6379/0"))
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--loadgen", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--targets", help=argparse.SUPPRESS)
    parser.add_argument("--direct", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.loadgen is not None:
        loadgen(args.loadgen, args.targets.split(","), args.direct, args.rate)
        return
    args.after = args.after if args.after is not None else max(6 * args.interval, 10.0)
    args.poll = args.poll if args.poll is not None else args.interval
    args.redis_poll = args.redis_poll if args.redis_poll is not None else args.interval / 4
    args.settle = args.settle if args.settle is not None else 3 * args.interval
    res = run(args)
    res |= {"poll_s": args.poll, "read_all": args.read_all, "redis_poll_s": args.redis_poll,
            "machine": machine(), "command": " ".join(["bench/scale.py", *sys.argv[1:]])}
    print(f"Machine: {res['machine']}\n")
    print(markdown(res))
    text = json.dumps(res, indent=1, default=str)
    if args.json is not None:
        args.json.write_text(text)
    else:
        print("\n" + text)


if __name__ == "__main__":
    main()
