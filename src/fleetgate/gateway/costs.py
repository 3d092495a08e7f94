"""Cost accounting: what each upstream attempt is charged, and the ledger behind /admin/costs.

The attribution rule (docs/observability.md "Cost accounting"), the same model as the
router's (``routing/estimate.py``: $/token = replica $/s over the tokens/s it sustains):

    replica $/s      = price_per_gpu_hour * gpus_per_replica / 3600
    replica-seconds  = e2e_s / mean_concurrency      (the attempt's share of the replica while
                       it ran: it shared it with ``mean_concurrency`` requests on average,
                       the endpoint's in-flight count averaged at start and end, >= 1)
    charge $         = replica $/s * replica-seconds
    GPU-hours        = replica-seconds * gpus_per_replica / 3600

A hosted API priced per token (``price_per_mtok``) has no replica: an attempt there is
charged its tokens (``input x input price + output x output price``, per million; the
engine's usage), with no replica- or GPU-seconds; a failed or cancelled one reports no
usage and is charged nothing (what the providers bill for a refused request). Its pool's
row in ``/admin/costs`` says ``price_per_mtok``.

A replica busy with B requests for T seconds is charged B * (T/B) = T replica-seconds: the
charges add up to exactly what the busy replica cost, so $/Mtok measured here is the
router's $/Mtok once the prediction is right. Idle time is charged to nobody (it is the
pool's unused capacity, visible as the gap between its price and what it earned). Failed
and cancelled attempts used the GPU and are charged by the same rule, but tallied apart
(``failed_usd``) so waste is visible. $/Mtok and tokens per $ are per *output* token, like
the router's, ``/admin/endpoints`` and the engines' own throughput counters.

Fleet-wide: every replica keeps its own ledger and publishes a snapshot of it (``snapshot``:
absolute totals, so a retried or repeated publish never counts twice) to the shared store
every sync interval; ``report(peers=...)`` adds the other replicas' latest snapshots to this
one's live tallies, so ``/admin/costs`` at any replica shows the whole fleet, with a
per-replica breakdown (``replicas``).

May touch: backends endpoint descriptions. Must not touch: HTTP, telemetry libraries, clocks
other than the injected one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

import orjson

from fleetgate.catalog.pricing import charge_usd, replica_seconds
from fleetgate.routing import Endpoint


@dataclass(frozen=True, slots=True)
class Charge:
    replica_seconds: float
    gpu_seconds: float
    usd: float


def attempt_charge(endpoint: Endpoint, e2e_s: float, mean_concurrency: float,
                   input_tokens: int = 0, output_tokens: int = 0) -> Charge:
    """The attribution rule above, for one attempt on ``endpoint`` (its tokens: what a
    hosted API charges)."""
    if endpoint.hosted is not None:
        return Charge(0.0, 0.0, endpoint.hosted.price.charge_usd(input_tokens, output_tokens))
    replica_s = replica_seconds(e2e_s, mean_concurrency)
    return Charge(replica_s, replica_s * endpoint.gpus_per_replica,
                  charge_usd(endpoint.usd_per_s, e2e_s, mean_concurrency))


@dataclass(slots=True)
class Tally:
    """Running totals for one (pool, model, tenant)."""

    requests: int = 0  # requests whose final attempt ran here
    attempts: int = 0
    failed_attempts: int = 0  # failed or cancelled
    input_tokens: int = 0
    output_tokens: int = 0
    replica_seconds: float = 0.0
    gpu_seconds: float = 0.0
    usd: float = 0.0  # everything charged, failures included
    failed_usd: float = 0.0  # the part charged to failed or cancelled attempts

    def add_attempt(self, charge: Charge, ok: bool, input_tokens: int = 0,
                    output_tokens: int = 0) -> None:
        self.attempts += 1
        self.replica_seconds += charge.replica_seconds
        self.gpu_seconds += charge.gpu_seconds
        self.usd += charge.usd
        if ok:
            self.input_tokens += input_tokens
            self.output_tokens += output_tokens
        else:
            self.failed_attempts += 1
            self.failed_usd += charge.usd

    def merge(self, other: Tally) -> None:
        for f in fields(Tally):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


@dataclass(frozen=True, slots=True)
class PoolFacts:
    accelerator: str
    vendor: str
    engine: str
    gpus_per_replica: int
    price_per_gpu_hour: float
    # a hosted pool's $ per million input and output tokens (absent: priced per GPU-hour)
    input_usd_per_mtok: float | None = None
    output_usd_per_mtok: float | None = None


TALLY_FIELDS = tuple(f.name for f in fields(Tally))


@dataclass(frozen=True, slots=True)
class LedgerSnapshot:
    """One replica's ledger as published to the shared store (``CostLedger.snapshot``)."""

    since: float
    at: float
    tallies: dict[tuple[str, str, str], Tally]
    pools: dict[str, PoolFacts]

    def encode(self) -> bytes:
        return orjson.dumps({
            "since": self.since, "at": self.at, "fields": TALLY_FIELDS,
            "tallies": [[*k, *(getattr(t, n) for n in TALLY_FIELDS)]
                        for k, t in self.tallies.items()],
            "pools": {p: [f.accelerator, f.vendor, f.engine, f.gpus_per_replica,
                          f.price_per_gpu_hour,
                          *(() if f.input_usd_per_mtok is None else
                            (f.input_usd_per_mtok, f.output_usd_per_mtok))]
                      for p, f in self.pools.items()}})

    @staticmethod
    def decode(blob: bytes) -> LedgerSnapshot:
        """Inverse of ``encode``; a malformed blob raises ``ValueError``. Tally fields are
        matched by name, so replicas of other versions add what both know."""
        try:
            raw = orjson.loads(blob)
            names = list(raw["fields"])
            tallies = {}
            for row in raw["tallies"]:
                values = dict(zip(names, row[3:], strict=True))
                tallies[(str(row[0]), str(row[1]), str(row[2]))] = Tally(
                    **{n: type(getattr(Tally(), n))(values[n]) for n in TALLY_FIELDS
                       if n in values})
            pools = {p: PoolFacts(*f) for p, f in raw["pools"].items()}
            return LedgerSnapshot(float(raw["since"]), float(raw["at"]), tallies, pools)
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed cost snapshot: {exc}") from exc


class CostLedger:
    """Per (pool, model, tenant) tallies; aggregated per pool, model and tenant on demand."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self.since = clock()
        self._tallies: dict[tuple[str, str, str], Tally] = {}
        self._pools: dict[str, PoolFacts] = {}

    def tally(self, endpoint: Endpoint, model: str, tenant: str) -> Tally:
        """The tally an attempt on ``endpoint`` for ``model`` and ``tenant`` adds to."""
        key = (endpoint.pool, model, tenant)
        found = self._tallies.get(key)
        if found is None:
            found = self._tallies[key] = Tally()
        price = endpoint.hosted.price if endpoint.hosted is not None else None
        self._pools[endpoint.pool] = PoolFacts(
            endpoint.accelerator, endpoint.vendor, endpoint.engine, endpoint.gpus_per_replica,
            endpoint.price_per_gpu_hour, None if price is None else price.input_usd_per_mtok,
            None if price is None else price.output_usd_per_mtok)
        return found

    def total_usd(self) -> float:
        return sum(t.usd for t in self._tallies.values())

    def version(self) -> int:
        """Changes whenever a charge or a request is added (to skip unchanged publishes)."""
        return sum(t.attempts + t.requests for t in self._tallies.values())

    def snapshot(self) -> LedgerSnapshot:
        """A copy of every tally now, for the other replicas."""
        tallies = {}
        for k, t in self._tallies.items():
            copy = Tally()
            copy.merge(t)
            tallies[k] = copy
        return LedgerSnapshot(self.since, self._clock(), tallies, dict(self._pools))

    def report(self, replica: str | None = None,
               peers: Mapping[str, LedgerSnapshot] | None = None) -> dict[str, Any]:
        """The body of ``GET /admin/costs``: this ledger (as ``replica``) plus the other
        replicas' latest snapshots (``peers``, replica id -> snapshot; this replica's own
        id, if there, is ignored: the live ledger is newer)."""
        now = self._clock()
        own = self.snapshot()
        ledgers = {replica or "local": own}
        for rid, snap in sorted((peers or {}).items()):
            ledgers.setdefault(rid, snap)
        items = [(k, t) for snap in ledgers.values() for k, t in snap.tallies.items()]
        facts_of: dict[str, PoolFacts] = {}
        for snap in [*(s for s in ledgers.values() if s is not own), own]:
            facts_of.update(snap.pools)  # this replica's own facts win
        pools = []
        for pool, tally in _group(items, lambda k: k[0]):
            facts = facts_of.get(pool)
            pools.append({"pool": pool, **(_facts(facts) if facts else {}), **_row(tally)})
        since = min(snap.since for snap in ledgers.values())
        return {
            "since": since,
            "seconds": round(now - since, 3),
            "replica": replica,
            "replicas": [{"replica": rid, "since": snap.since,
                          "as_of": now if snap is own else snap.at,
                          **_row(_sum(snap.tallies.values()))}
                         for rid, snap in ledgers.items()],
            "rule": "charge = price_per_gpu_hour * gpus_per_replica / 3600 * e2e_s / "
                    "mean_concurrency (a pool priced per token: input_tokens * "
                    "price_per_mtok.input + output_tokens * price_per_mtok.output, per "
                    "million); $/Mtok and tokens_per_usd count output tokens",
            "total": _row(_sum(t for _, t in items)),
            "pools": pools,
            "models": [{"model": m, **_row(t)} for m, t in _group(items, lambda k: k[1])],
            "pool_models": [{"pool": p, "model": m, **_row(t)}
                            for (p, m), t in _group(items, lambda k: (k[0], k[1]))],
            "tenants": [{"tenant": n, **_row(t)} for n, t in _group(items, lambda k: k[2])],
        }


def _sum(tallies: Iterable[Tally]) -> Tally:
    total = Tally()
    for t in tallies:
        total.merge(t)
    return total


def _group(items: list[tuple[tuple[str, str, str], Tally]],
           key: Callable[[tuple[str, str, str]], Any]) -> list[tuple[Any, Tally]]:
    groups: dict[Any, Tally] = {}
    for k, tally in items:
        groups.setdefault(key(k), Tally()).merge(tally)
    return sorted(groups.items(), key=lambda kv: str(kv[0]))


def _facts(f: PoolFacts) -> dict[str, Any]:
    out: dict[str, Any] = {"accelerator": f.accelerator, "vendor": f.vendor,
                           "engine": f.engine, "gpus_per_replica": f.gpus_per_replica,
                           "price_per_gpu_hour": f.price_per_gpu_hour}
    if f.input_usd_per_mtok is not None:
        out["price_per_mtok"] = {"input": f.input_usd_per_mtok,
                                 "output": f.output_usd_per_mtok}
    return out


def _row(t: Tally) -> dict[str, Any]:
    usd = t.usd
    return {
        "requests": t.requests, "attempts": t.attempts, "failed_attempts": t.failed_attempts,
        "input_tokens": t.input_tokens, "output_tokens": t.output_tokens,
        "tokens": t.input_tokens + t.output_tokens,
        "gpu_hours": t.gpu_seconds / 3600.0, "replica_hours": t.replica_seconds / 3600.0,
        "usd": usd, "failed_usd": t.failed_usd,
        "usd_per_mtok": usd / t.output_tokens * 1e6 if t.output_tokens else None,
        "tokens_per_usd": t.output_tokens / usd if usd > 0 else None,
    }
