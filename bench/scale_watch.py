"""bench/scale.py's readers while it runs: each replica's /admin/endpoints, the rows the
replicas publish in Redis (a sampler thread), and the load generator."""

from __future__ import annotations

import json
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
from scale_procs import BODY, Replica


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
