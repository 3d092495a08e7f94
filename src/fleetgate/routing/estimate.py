"""Per-candidate predictions for one request: TTFT, TPOT, SLO capacity and $/Mtok.

One compiled pass over the candidate endpoints, run the first time a filter, scorer or
the explainer asks for any estimate, so a round-robin decision never pays for it. With the
prior of ``prior.py`` corrected by the learned ``k_tpot``/``k_ttft``:

    n      = prompt tokens (estimate), g = max_tokens (256 when absent), C = n + g/2
    active = max(in_flight + peers' in_flight, running + queued)   (ours are exact, the
             other replicas' one sync interval old, the engine's one scrape old; kept
             current by ``LiveFleet``)
    B_max  = floor(min(max_batch, kv_capacity_tokens / (n + g)))  (KV memory limits the
             running batch; counted at full length, so admitted requests are never preempted)
    tpot   = k_tpot * (step_base + step_per_ctx_token * C * min(active + 1, B_max))
    wait   = floor(active / B_max) * tpot * g   (a request beyond the running batch waits, at
             worst, for whole generations to free a slot: the running requests may all have
             started together; = ceil(max(0, active + 1 - B_max) / B_max) for whole counts)
    ttft   = k_ttft * (step_base + prefill_per_token * n * (1 + queued) + wait)
    B_slo  = the largest batch whose tpot meets the SLO: (0.8*slo_tpot/k_tpot - step_base)
             / (step_per_ctx_token * C), clipped to [0, B_max]  (B_max without a TPOT SLO)
    usd_per_mtok = usd_per_s / (B_slo / tpot(B_slo)) * 1e6   (replica $/s over the tokens/s
             it sustains at the SLO; infinite when it cannot meet the SLO at all)
    meets_slo = tpot <= 0.8 * slo_tpot and ttft <= 0.8 * slo_ttft   (20% headroom: the
             predictions are averages, the SLO is judged per request)

The loop (numba) costs ~10 ns a candidate; as whole-column numpy operations the same
formulas took ~60 calls whose fixed cost dominated a decision at any fleet size
(BENCHMARKS.md, "Routing decision time").

May touch: numpy and routing types. Must not touch: I/O, clocks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from fleetgate.routing.compiled import compiled
from fleetgate.routing.types import (
    LIVE_ROW,
    STATIC_ROW,
    BoolArray,
    FloatArray,
    IntArray,
    RoutingRequest,
    Snapshot,
)

DEFAULT_MAX_TOKENS = 256
SLO_HEADROOM = 0.8
NAMES = ("ttft_s", "tpot_s", "e2e_s", "usd_per_mtok", "slo_capacity", "active", "load",
         "meets_slo", "kv_headroom_tokens", "fits_context")


T = TypeVar("T")


class lazy(Generic[T]):
    """``functools.cached_property`` without its lock (3.11 takes an RLock per first read)."""

    def __init__(self, fn: Callable[[Any], T]) -> None:
        self.fn = fn
        self.name = fn.__name__

    def __get__(self, obj: Any, owner: type | None = None) -> T:
        value = self.fn(obj)
        obj.__dict__[self.name] = value  # later reads hit the instance dict directly
        return value


@dataclass(frozen=True, slots=True)
class Slo:
    ttft_s: float | None = None
    tpot_s: float | None = None


# The snapshot rows the kernel reads, passed in (never baked into numba's on-disk cache).
_LIVE_IN = np.array([LIVE_ROW[name] for name in (
    "active", "queued", "kv_usage", "k_tpot", "k_ttft")], dtype=np.intp)
_STATIC_IN = np.array([STATIC_ROW[name] for name in (
    "step_base_s", "step_per_ctx_token_s", "prefill_s_per_token", "kv_capacity_tokens",
    "max_batch", "usd_per_s")], dtype=np.intp)
_USABLE_IN = np.array([LIVE_ROW["usable_from"], LIVE_ROW["stale_at"]], dtype=np.intp)
# The rows the kernel writes, in order.
KERNEL_ROWS = ("b_max", "tpot_s", "ttft_s", "e2e_s", "slo_capacity", "usd_per_mtok", "load",
               "kv_headroom_tokens")


@compiled
def _kernel(live: FloatArray, static: FloatArray, live_in: IntArray, static_in: IntArray,
            idx: IntArray, n: float, g: float, tpot_limit: float, ttft_limit: float,
            out: FloatArray, meets: BoolArray) -> None:
    """The module docstring's formulas for candidates ``idx``, one pass (compiled by numba).

    Limits are the SLO times the headroom, +inf without that SLO (then not compared, so an
    unknown prediction does not fail an SLO nobody set).
    """
    active_r, queued_r, kv_usage_r, k_tpot_r, k_ttft_r = live_in
    base_r, per_ctx_r, prefill_r, kv_cap_r, max_batch_r, usd_r = static_in
    ctx = n + g / 2
    full = n + g
    for j in range(idx.shape[0]):
        i = idx[j]
        active, k_tpot = live[active_r, i], live[k_tpot_r, i]
        base, ctx_cost, cap = static[base_r, i], static[per_ctx_r, i] * ctx, static[kv_cap_r, i]
        b_max = max(np.floor(min(static[max_batch_r, i], cap / full)), 1.0)
        tpot = k_tpot * (base + ctx_cost * min(active + 1.0, b_max))
        wait = np.floor(active / b_max) * tpot * g
        prefill = static[prefill_r, i] * n * (live[queued_r, i] + 1.0)
        ttft = live[k_ttft_r, i] * (base + prefill + wait)
        batch = b_max
        if tpot_limit < np.inf:
            batch = min(max(np.floor((tpot_limit / k_tpot - base) / ctx_cost), 0.0), b_max)
        usage = live[kv_usage_r, i]
        if np.isnan(usage):
            usage = min(active * ctx / cap, 1.0)
        out[0, j] = b_max
        out[1, j] = tpot
        out[2, j] = ttft
        out[3, j] = ttft + tpot * (g - 1)
        out[4, j] = batch
        out[5, j] = (static[usd_r, i] * 1e6 * k_tpot * (base + ctx_cost * batch) / batch
                     if batch > 0 else np.inf)  # $/s over tokens/s at the SLO batch
        out[6, j] = active / max(batch, 1.0)
        out[7, j] = (1.0 - usage) * cap
        meets[j] = ((tpot_limit == np.inf or tpot <= tpot_limit)
                    and (ttft_limit == np.inf or ttft <= ttft_limit))


@compiled
def _usable(live: FloatArray, rows: IntArray, idx: IntArray, now: float, out: BoolArray) -> int:
    """out[j] = usable_from <= now <= stale_at for candidate j; returns how many are."""
    count = 0
    for j in range(idx.shape[0]):
        out[j] = live[rows[0], idx[j]] <= now <= live[rows[1], idx[j]]
        count += out[j]
    return count


class _KernelRow:
    """An ``Estimates`` attribute that reads one row of the (lazily run) kernel's output."""

    def __init__(self, name: str) -> None:
        self.row = KERNEL_ROWS.index(name)

    def __get__(self, obj: Estimates, owner: type | None = None) -> FloatArray:
        return obj._kernel_out[0][self.row]


class Estimates:
    """Lazily computed predictions, aligned with the candidate indices ``idx``.

    The prefilter is one compiled call and the context check one numpy comparison; every
    estimate comes from one kernel call the first time any of them is read (round-robin
    decisions never pay for it).
    """

    def __init__(self, snap: Snapshot, idx: IntArray, req: RoutingRequest, slo: Slo) -> None:
        self._snap, self._idx = snap, idx
        self._whole = len(idx) == len(snap.endpoints)
        self._now = snap.taken_at
        self._n = float(req.prompt_tokens_estimate)
        self._g = float(req.max_tokens or DEFAULT_MAX_TOKENS)
        self._slo = slo
        self._one: dict[int, tuple[FloatArray, BoolArray]] = {}  # at(): one candidate's run

    def __getitem__(self, name: str) -> Any:
        if name not in NAMES:
            raise KeyError(name)
        return getattr(self, name)

    def as_dict(self) -> dict[str, FloatArray]:
        return {name: np.asarray(getattr(self, name), dtype=float) for name in NAMES}

    def at(self, name: str, k: int) -> float:
        """One candidate's estimate. When no plugin has needed the whole fleet's (round-robin),
        the kernel runs for that candidate alone: the gateway asks for the attempted
        endpoints' TTFT and TPOT to learn its corrections."""
        if name not in KERNEL_ROWS or "_kernel_out" in self.__dict__:
            return float(self[name][k])
        one = self._one.get(k)
        if one is None:
            one = self._one[k] = self._run(self._idx[k:k + 1])
        return float(one[0][KERNEL_ROWS.index(name), 0])

    def column(self, name: str) -> FloatArray:
        """A live or static column of the snapshot, aligned with the candidates."""
        col = self._snap.col(name)
        return col if self._whole else col[self._idx]

    def prefilter(self) -> tuple[BoolArray, int]:
        """The builtin prefilter (ready or pending, breakers closed, state fresh): the mask of
        candidates that pass and how many do."""
        ok = np.empty(len(self._idx), dtype=bool)
        return ok, _usable(self._snap.live, _USABLE_IN, self._idx, self._now, ok)

    @lazy
    def fits_context(self) -> BoolArray:
        return self.column("max_model_len") >= self._n + self._g

    @lazy
    def active(self) -> FloatArray:
        return self.column("active")

    @lazy
    def _kernel_out(self) -> tuple[FloatArray, BoolArray]:
        return self._run(self._idx)

    def _run(self, idx: IntArray) -> tuple[FloatArray, BoolArray]:
        out = np.empty((len(KERNEL_ROWS), len(idx)))
        meets = np.empty(len(idx), dtype=bool)
        tpot, ttft = self._slo.tpot_s, self._slo.ttft_s
        _kernel(self._snap.live, self._snap.static, _LIVE_IN, _STATIC_IN, idx, self._n,
                self._g, np.inf if tpot is None else SLO_HEADROOM * tpot,
                np.inf if ttft is None else SLO_HEADROOM * ttft, out, meets)
        return out, meets

    b_max = _KernelRow("b_max")
    tpot_s = _KernelRow("tpot_s")
    ttft_s = _KernelRow("ttft_s")
    e2e_s = _KernelRow("e2e_s")
    slo_capacity = _KernelRow("slo_capacity")
    usd_per_mtok = _KernelRow("usd_per_mtok")
    load = _KernelRow("load")
    kv_headroom_tokens = _KernelRow("kv_headroom_tokens")

    @property
    def meets_slo(self) -> BoolArray:
        return self._kernel_out[1]


def _warm_up() -> None:
    """Compile (or load from numba's cache) now, not on the first request."""
    live = np.zeros((len(LIVE_ROW), 1))
    static = np.ones((len(STATIC_ROW), 1))
    for matrix in (live, static):  # read-only, as a snapshot's: numba compiles per flavour
        matrix.setflags(write=False)
    one = np.zeros(1, dtype=np.intp)
    _kernel(live, static, _LIVE_IN, _STATIC_IN, one, 1.0, 1.0, 1.0, np.inf,
            np.empty((len(KERNEL_ROWS), 1)), np.empty(1, dtype=bool))
    _usable(live, _USABLE_IN, one, 0.0, np.empty(1, dtype=bool))


_warm_up()
