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

Run: .venv/bin/python bench/scale.py [--replicas 4] [--endpoints 10000] [--interval 1]
     [--duration 30] [--poll SECONDS | 0] [--kill] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson

HERE = Path(__file__).parent
ROOT = HERE.parent
METRICS = ROOT / "tests" / "data" / "vllm_metrics.txt"
CLK_TCK = os.sysconf("SC_CLK_TCK")
POOLS = [("h100", "nvidia", 2.95), ("h200", "nvidia", 3.60), ("mi300x", "amd", 1.99),
         ("mi325x", "amd", 2.25), ("b200", "nvidia", 6.00), ("mi355x", "amd", 2.90)]
MODEL = "m"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hello " * 50}],
        "max_tokens": 16}


# -- processes ------------------------------------------------------------------------------
def cpu_s(pid: int) -> float:
    """User + system seconds of a live process (its threads included)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rfind(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mb(pid: int) -> float:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return -1


def raise_hard_nofile(want: int) -> tuple[int, int]:
    """Raise this process's hard open-files limit (children inherit it) where allowed."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < want:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, want))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def endpoint_urls(n: int, port: int) -> list[str]:
    """127.0.x.y for y in 1..250: 10,000 endpoints are 127.0.0.1 .. 127.0.39.250."""
    return [f"http://127.0.{i // 250}.{i % 250 + 1}:{port}" for i in range(n)]


def fleet_yaml(urls: list[str], pools: int) -> str:
    chunks = np.array_split(np.arange(len(urls)), pools)
    lines = ["pools:"]
    for k, chunk in enumerate(chunks):
        gpu, _, price = POOLS[k % len(POOLS)]
        lines.append(f"  - name: {gpu}-{k}\n    accelerator: {gpu}\n    engine: vllm\n"
                     f"    price_per_gpu_hour: {price}\n    models: {{{MODEL}: {MODEL}}}\n"
                     "    endpoints:")
        lines += [f"      - {urls[i]}" for i in chunk]
    lines.append("policies:\n  c: {strategy: cost}\ndefault_policy: c\n")
    return "\n".join(lines)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Replica:
    index: int
    popen: subprocess.Popen[bytes]
    url: str
    log: Path
    replica_id: str | None = None
    ready_after_s: float = 0.0
    alive: bool = True

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def name(self) -> str:
        return f"replica {self.index}"


def start_engine(idle_s: float) -> tuple[subprocess.Popen[str], int]:
    engine = subprocess.Popen(
        [sys.executable, str(HERE / "mock_engine.py"), "--host", "0.0.0.0", "--port", "0",
         "--metrics-file", str(METRICS), "--backlog", "65535", "--idle-timeout-s", str(idle_s),
         "--stats"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert engine.stdout is not None
    line = engine.stdout.readline().strip()
    if not line.startswith("MOCK_ENGINE_READY"):
        raise RuntimeError(f"mock engine did not start: {line!r}")
    return engine, int(line.rsplit(":", 1)[1])


def engine_stats(port: int, tries: int = 20) -> Counter[str]:
    """The engine's visit counts. Near its open-files limit (10,000 addresses, and the
    replicas reconnecting after a kill) it may refuse or reset this connection: try again."""
    for attempt in range(tries):
        try:
            return Counter(httpx.get(f"http://127.0.0.1:{port}/_mock/stats", timeout=30).json())
        except httpx.TransportError:
            if attempt == tries - 1:
                raise
            time.sleep(0.5)
    raise AssertionError("unreachable")


def start_replica(index: int, config: Path, tmp: Path, env: dict[str, str],
                  timeout: float) -> Replica:
    port = free_port()
    log = tmp / f"replica-{index}.log"
    with open(log, "ab") as sink:  # the child keeps its own copy of the descriptor
        popen = subprocess.Popen(
            [sys.executable, "-m", "fleetgate.cli", "serve", "--config", str(config),
             "--port", str(port), "--workers", "1"],
            env=env, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if popen.poll() is not None:
            raise RuntimeError(f"replica {index} exited ({popen.returncode}); see {log}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/readyz", timeout=5).status_code == 200:
                return Replica(index, popen, url, log, ready_after_s=time.monotonic() - t0)
        time.sleep(0.5)
    popen.kill()
    raise RuntimeError(f"replica {index} not ready after {timeout:.0f}s; see {log}")


def ready_count(rep: Replica) -> int | None:
    with contextlib.suppress(httpx.HTTPError, ValueError):
        return int(httpx.get(rep.url + "/readyz", timeout=30).json()["endpoints_ready"])
    return None


# -- the gateways' view: /admin/endpoints ---------------------------------------------------
@dataclass
class Sample:
    replica: int
    sent: float  # wall clock
    took_s: float
    collector: dict[str, Any]
    ages: np.ndarray  # scrape_age_s / interval per endpoint (inf: never scraped)
    not_ready: int


def read_admin(rep: Replica, interval: float, timeout: float = 120.0) -> tuple[Sample, list[str]]:
    sent = time.time()
    t0 = time.perf_counter()
    resp = httpx.get(rep.url + "/admin/endpoints", timeout=timeout)
    resp.raise_for_status()
    took = time.perf_counter() - t0
    data = orjson.loads(resp.content)
    rows = data["endpoints"]
    ages = np.array([np.inf if r["scrape_age_s"] is None else r["scrape_age_s"]
                     for r in rows]) / interval
    rep.replica_id = data.get("replica") or rep.replica_id
    ready = sum(r["health"] == "ready" for r in rows)
    return (Sample(rep.index, sent, took, data.get("collector") or {}, ages, len(rows) - ready),
            [r["id"] for r in rows])


# -- Redis: who is live, the rows they publish -----------------------------------------------
def live_members(client: Any, prefix: str) -> list[str]:
    """The replicas whose shares have not expired (what ``PeerSync`` counts as live)."""
    ids = sorted(m.decode() if isinstance(m, bytes) else str(m)
                 for m in client.smembers(prefix + "replicas"))
    if not ids:
        return []
    alive = client.mget([f"{prefix}replica:{i}" for i in ids])
    return [i for i, blob in zip(ids, alive, strict=True) if blob is not None]


@dataclass
class RowSample:
    t: float
    ages: np.ndarray  # per endpoint: (now - newest visit in any replica's rows) / interval
    own: dict[str, int]  # replica id -> new visits of endpoints it owns since the last sample
    taken: dict[str, int]  # replica id -> new visits of endpoints it does not own
    members: tuple[str, ...]


class RowSampler(threading.Thread):
    """Reads the rows every replica published (``state/shard.py``) every ``every`` seconds."""

    def __init__(self, url: str, prefix: str, ids: list[str], interval: float,
                 every: float) -> None:
        super().__init__(daemon=True)
        import redis

        self.client = redis.Redis.from_url(url)
        self.prefix, self.interval, self.every = prefix, interval, every
        self.ids = ids
        self.index = {eid: i for i, eid in enumerate(ids)}
        self.samples: list[RowSample] = []
        self.errors = 0
        self.stop = threading.Event()
        self._seen: dict[str, np.ndarray] = {}  # replica id -> newest visit time seen
        self._owner: dict[tuple[str, ...], np.ndarray] = {}

    def owner(self, members: tuple[str, ...]) -> np.ndarray:
        """Per endpoint, the index in ``members`` of its owner (the gateway's rendezvous)."""
        from fleetgate.state.shard import rendezvous

        found = self._owner.get(members)
        if found is None:
            found = self._owner[members] = np.asarray(rendezvous(self.ids, members)[0])
        return found

    def sample(self) -> None:
        members = tuple(live_members(self.client, self.prefix))
        writers = sorted(m.decode() if isinstance(m, bytes) else str(m)
                         for m in self.client.smembers(self.prefix + "rows-replicas"))
        blobs = self.client.mget([f"{self.prefix}rows:{m}" for m in writers]) if writers else []
        now = time.time()
        n = len(self.ids)
        newest = np.full(n, -np.inf)
        owner = self.owner(members) if members else None
        own, taken = {}, {}
        for rid, blob in zip(writers, blobs, strict=True):
            if blob is None:
                continue
            rows = orjson.loads(blob)
            idx = np.fromiter((self.index.get(e, -1) for e in rows), dtype=np.int64,
                              count=len(rows))
            at = np.fromiter((r[0] for r in rows.values()), dtype=float, count=len(rows))
            keep = idx >= 0
            idx, at = idx[keep], at[keep]
            np.maximum.at(newest, idx, at)
            seen = self._seen.setdefault(rid, np.full(n, -np.inf))
            new = at > seen[idx]
            seen[idx[new]] = at[new]
            mine = (owner[idx] == members.index(rid)) if owner is not None and rid in members \
                else np.zeros(len(idx), dtype=bool)
            own[rid] = int(np.count_nonzero(new & mine))
            taken[rid] = int(np.count_nonzero(new & ~mine))
        self.samples.append(RowSample(now, (now - newest) / self.interval, own, taken, members))

    def run(self) -> None:
        tick = time.monotonic()
        while not self.stop.is_set():
            try:
                self.sample()
            except Exception:  # a slow or busy Redis: the next sample will do
                self.errors += 1
            tick += self.every
            self.stop.wait(max(0.0, tick - time.monotonic()))

    def between(self, a: float, b: float) -> list[RowSample]:
        return [s for s in self.samples if a <= s.t < b]


# -- load generator (its own process, so the readers' JSON decoding does not delay it) -------
def loadgen(out: Path, targets: list[str], direct: str, rate: float) -> None:
    """Until SIGTERM: round-robin over ``targets``, ``rate`` requests per second in all,
    each followed by the same request to ``direct``; one JSON line per pair."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    clients = [httpx.Client(base_url=t, timeout=30) for t in targets]
    straight = httpx.Client(base_url=direct, timeout=30)
    body = orjson.dumps(BODY)
    headers = {"content-type": "application/json"}
    gap = 1.0 / rate
    nxt = time.monotonic()
    k = 0
    with open(out, "w") as f:
        while not stop.is_set():
            j = k % len(clients)
            k += 1
            row: dict[str, Any] = {"t": time.time(), "replica": j}
            for name, client in (("gw", clients[j]), ("direct", straight)):
                t0 = time.perf_counter()
                try:
                    r = client.post("/v1/chat/completions", content=body, headers=headers)
                    row[name + "_status"] = r.status_code
                except httpx.HTTPError as exc:
                    row[name + "_status"] = type(exc).__name__
                row[name] = time.perf_counter() - t0
            f.write(json.dumps(row) + "\n")
            f.flush()
            nxt += gap
            stop.wait(max(0.0, nxt - time.monotonic()))


# -- measuring a window ---------------------------------------------------------------------
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


def log_report(replicas: list[Replica]) -> dict[str, Any]:
    out = {}
    for r in replicas:
        lines = r.log.read_text(errors="replace").splitlines()
        bad = [ln for ln in lines if re.search(r"\b(ERROR|CRITICAL|WARNING)\b|Traceback", ln)]
        down = [ln for ln in lines if re.search(r"endpoint \S+ is (not_ready|down)", ln)]
        why = Counter(m.group(1) for ln in down if (m := re.search(r"\(([^)]*)\)\s*$", ln)))
        kinds = Counter(re.sub(r"\d+(\.\d+)?", "N", ln[24:])[:120] for ln in bad)
        out[r.name] = {"lines": len(lines), "warnings_errors": len(bad),
                       "went_not_ready": len(down), "not_ready_why": dict(why.most_common(4)),
                       "kinds": dict(kinds.most_common(6))}
    return out


def delete_keys(client: Any, prefix: str) -> None:
    with contextlib.suppress(Exception):
        keys = list(client.scan_iter(match=prefix + "*", count=1000))
        if keys:
            client.delete(*keys)


# -- report ---------------------------------------------------------------------------------
def fmt(x: Any, digits: int = 2) -> str:
    if isinstance(x, float):
        return "-" if x != x else f"{x:.{digits}f}"
    return str(x)


AGE_WINDOWS = {"before": ("before the kill", "all"),
               "after_2_intervals": ("2 intervals after the kill", "all"),
               "later": ("after those, to the end", "all"),
               "victim_before": ("before the kill", "the killed replica's"),
               "victim_after_2_intervals": ("2 intervals after the kill",
                                            "the killed replica's"),
               "victim_later": ("after those, to the end", "the killed replica's")}


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
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True).stdout.strip() or "?"
    return (f"{model}, nproc {os.cpu_count()}, Linux {platform.release()}, Python "
            f"{platform.python_version()}, commit {rev}")


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
