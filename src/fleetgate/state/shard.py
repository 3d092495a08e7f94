"""Sharded scraping: each engine is probed and scraped by one gateway replica per interval.

Without it every gateway replica scrapes every endpoint, so R replicas send R scrapes per
endpoint and interval and each pays the whole fleet's collection CPU. With it:

- **Who scrapes what**: rendezvous hashing of the endpoint id over the live replicas (this
  one and the peers ``PeerSync`` saw publish within their TTL). Each endpoint has an owner,
  the replica with the highest score, and a backup, the second highest. A replica that
  joins or dies moves only the endpoints it wins or owned; the assignment is recomputed at
  every sync (``assign``), so it follows membership within one share TTL and a sync.
- **What the others read**: after each collector tick the owner publishes the rows it
  visited (``publish``: health, the scraped load, the capacity the engine reported, and
  the wall-clock time of the visit) as one blob (the store's ``"rows"`` kind), and at each
  of their collector steps the other replicas apply the peers' rows that are newer than
  what they hold (``pull``), just before judging which rows stopped coming. A replica's own
  in-flight counts and latencies are never in a row: they stay local and exact, and travel
  as before in the peer shares. Ticks keep fixed deadlines (``Collector.run``), so a row's
  age at a peer is its interval plus the tick's duration, not a drifting period.
- **A replica that dies**: its rows stop coming. The backup of each of its endpoints visits
  it as soon as the newest row it holds is older than ``TAKEOVER`` intervals (the collector
  checks at quarter-interval steps), before the membership has even expired, and after that
  the endpoint has a new owner. A replica alone scrapes everything.

Rows carry no monotonic time: a row's visit time is the owner's wall clock, converted to
this replica's monotonic clock at apply (``now_mono - (now_wall - row_wall)``), so replicas
agree as far as their clocks do (NTP), as elsewhere in the shared state.

May touch: numpy, orjson, the store's protocol, routing live state. Must not touch: HTTP.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import orjson

from fleetgate.backends.capacity import EngineCapacity
from fleetgate.backends.metrics import EngineLoad
from fleetgate.routing import Endpoint
from fleetgate.state.live import LiveFleet
from fleetgate.state.store import SharedState, StoreUnavailable

log = logging.getLogger("fleetgate.shard")

TAKEOVER = 1.25  # intervals without a row before the backup visits the endpoint itself
ROWS_TTL = 3.0  # intervals a published blob of rows lives
KIND = "rows"

# A row: [visit wall time, health state, health detail, waiting, running, kv_usage,
#         generation_tokens_total, gen_throughput, kv_capacity_tokens, max_batch,
#         max_model_len]; None where unknown. Load fields are all None when not scraped.
Row = list[object]


def _h64(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a well-spread score from ``endpoint hash ^ replica hash``."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def rendezvous(endpoint_ids: Sequence[str], members: Sequence[str]) -> np.ndarray:
    """Per endpoint, the member indices from highest to lowest score (shape members x n)."""
    keys = np.array([_h64(e) for e in endpoint_ids], dtype=np.uint64)
    scores = np.stack([_mix(keys ^ np.uint64(_h64(m))) for m in members])
    return np.argsort(scores, axis=0)[::-1]


class ScrapeShard:
    """This replica's share of the collector's visits (module doc)."""

    def __init__(self, endpoints: Sequence[Endpoint], live: LiveFleet, me: str,
                 shared: SharedState, interval_s: float, clock: Callable[[], float],
                 on_capacity: Callable[[int, EngineCapacity], None],
                 wall: Callable[[], float] = time.time) -> None:
        self.me = me
        self._ids = [ep.id for ep in endpoints]
        self._live = live
        self._shared = shared
        self.interval_s = interval_s
        self._clock, self._wall = clock, wall
        n = len(self._ids)
        self.members: tuple[str, ...] = (me,)
        self.mine = np.ones(n, dtype=bool)
        self.backup = np.zeros(n, dtype=bool)
        self.heard = np.full(n, -math.inf)  # monotonic time of the newest row held, per endpoint
        self._rows: dict[int, Row] = {}  # this replica's latest visit of each endpoint
        self._applied: dict[str, bytes] = {}  # peer -> the last blob applied (unchanged: skip)
        self._on_capacity = on_capacity  # what a peer's row says an engine reported
        self.source: list[str | None] = [None] * n  # the replica whose visit is the newest
        self.takeovers = 0

    # -- who visits what -----------------------------------------------------------------
    def assign(self, peers: Iterable[str]) -> bool:
        """Recompute the assignment for these live peers; True when it changed."""
        members = tuple(sorted({self.me, *peers}))
        if members == self.members:
            return False
        self.members = members
        if len(members) == 1 or not self._ids:
            self.mine[:], self.backup[:] = True, False
        else:
            order = rendezvous(self._ids, members)
            me = members.index(self.me)
            self.mine, self.backup = order[0] == me, order[1] == me
        log.info("scraping %d of %d endpoints, backing up %d, with %d replicas",
                 int(self.mine.sum()), len(self._ids), int(self.backup.sum()), len(members))
        return True

    def due(self, now: float, full: bool) -> np.ndarray:
        """The endpoints to visit in this step: owned ones on full ticks, backed-up ones
        whose rows stopped coming (more than ``TAKEOVER`` intervals old) at any step."""
        late = self.backup & (now - self.heard > TAKEOVER * self.interval_s)
        self.takeovers += int(late.sum())
        return (self.mine | late) if full else late

    # -- this replica's visits -------------------------------------------------------------
    def visited(self, i: int, now: float, health: str, detail: str, load: EngineLoad | None,
                capacity: EngineCapacity | None) -> None:
        self.heard[i] = now
        self.source[i] = self.me
        lo = load or _NO_LOAD
        cap = capacity or _NO_CAPACITY
        self._rows[i] = [self._wall(), health, detail, lo.waiting, lo.running, lo.kv_usage,
                         lo.generation_tokens_total, lo.gen_throughput,
                         cap.kv_capacity_tokens, cap.max_batch, cap.max_model_len]

    async def publish(self) -> None:
        """The rows this replica visited lately, for the others (none while it is alone)."""
        if len(self.members) == 1:
            self._rows.clear()
            return
        oldest = self._wall() - ROWS_TTL * self.interval_s
        self._rows = {i: row for i, row in self._rows.items() if _num(row[0]) > oldest}
        rows = {self._ids[i]: row for i, row in self._rows.items()}
        try:
            await self._shared.publish_blob(KIND, self.me, orjson.dumps(rows),
                                            ROWS_TTL * self.interval_s)
        except StoreUnavailable as exc:
            log.debug("could not publish scraped rows: %s", exc)

    # -- the others' visits ----------------------------------------------------------------
    async def pull(self) -> int:
        """Apply the peers' rows newer than what this replica holds; returns how many."""
        if len(self.members) == 1:
            return 0
        try:
            blobs = await self._shared.blobs(KIND)
        except StoreUnavailable as exc:
            log.debug("could not read scraped rows: %s", exc)
            return 0
        applied = 0
        for rid, blob in blobs.items():
            if rid == self.me or self._applied.get(rid) == blob:
                continue
            self._applied[rid] = blob
            try:
                rows = orjson.loads(blob)
                applied += sum(self._apply(rid, eid, row) for eid, row in rows.items())
            except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError, IndexError):
                log.debug("skipping malformed rows of replica %r", rid)
        return applied

    def _apply(self, peer: str, endpoint_id: str, row: Row) -> bool:
        i = self._live.index.get(endpoint_id)
        if i is None:
            return False
        now_mono, now_wall = self._clock(), self._wall()
        at = now_mono - (now_wall - _num(row[0]))
        if at <= self.heard[i]:
            return False
        self.heard[i], self.source[i] = at, peer
        live = self._live
        waiting, running, kv, gen_total, gen_tp, kv_cap, batch, context = map(_opt, row[3:11])
        if kv_cap is not None or batch is not None or context is not None:
            self._on_capacity(i, EngineCapacity(kv_capacity_tokens=_int(kv_cap),
                                                max_batch=_int(batch), max_model_len=_int(context)))
            live.on_capacity(i, kv_cap, batch, context)
        if live.set_health(i, at, str(row[1]), str(row[2])):
            log.info("endpoint %s is %s (%s, seen by a peer)", endpoint_id, row[1], row[2])
        if any(v is not None for v in (waiting, running, kv, gen_total, gen_tp)):
            live.on_scrape(i, at, waiting, running, kv, gen_total, gen_tp)
        return True


def _num(x: object) -> float:
    if not isinstance(x, int | float):
        raise ValueError(f"not a number: {x!r}")
    return float(x)


def _opt(x: object) -> float | None:
    return None if x is None else _num(x)


def _int(x: float | None) -> int | None:
    return None if x is None else int(x)


_NO_LOAD = EngineLoad()
_NO_CAPACITY = EngineCapacity()
