"""Per-candidate predictions for one request: TTFT, TPOT, SLO capacity and $/Mtok.

Vectorised over the candidate endpoints and lazy: each value is computed the first time a
filter, scorer or the explainer asks for it, so a round-robin decision pays for almost
nothing. With the prior of ``prior.py`` corrected by the learned ``k_tpot``/``k_ttft``:

    n      = prompt tokens (estimate), g = max_tokens (256 when absent), C = n + g/2
    active = max(in_flight + peers' in_flight, running + queued)   (ours are exact, the
             other replicas' one sync interval old, the engine's one scrape old)
    B_max  = floor(min(max_batch, kv_capacity_tokens / (n + g)))  (KV memory limits the
             running batch; counted at full length, so admitted requests are never preempted)
    tpot   = k_tpot * (step_base + step_per_ctx_token * C * min(active + 1, B_max))
    wait   = ceil(max(0, active + 1 - B_max) / B_max) * tpot * g   (beyond the batch a request
             waits, at worst, for a whole generation to free a slot: the running requests may
             all have started together)
    ttft   = k_ttft * (step_base + prefill_per_token * n * (1 + queued) + wait)
    B_slo  = the largest batch whose tpot meets the SLO: (0.8*slo_tpot/k_tpot - step_base)
             / (step_per_ctx_token * C), clipped to [0, B_max]  (B_max without a TPOT SLO)
    usd_per_mtok = usd_per_s / (B_slo / tpot(B_slo)) * 1e6   (replica $/s over the tokens/s
             it sustains at the SLO; infinite when it cannot meet the SLO at all)
    meets_slo = tpot <= 0.8 * slo_tpot and ttft <= 0.8 * slo_ttft   (20% headroom: the
             predictions are averages, the SLO is judged per request)

May touch: numpy and routing types. Must not touch: I/O, clocks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

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


class Estimates:
    """Lazily computed predictions, aligned with the candidate indices ``idx``."""

    def __init__(self, snap: Snapshot, idx: IntArray, req: RoutingRequest, slo: Slo) -> None:
        whole = len(idx) == len(snap.endpoints)
        self._live = snap.live if whole else snap.live[:, idx]
        self._static = snap.static if whole else snap.static[:, idx]
        self._n = float(req.prompt_tokens_estimate)
        self._g = float(req.max_tokens or DEFAULT_MAX_TOKENS)
        self._ctx = self._n + self._g / 2
        self._slo = slo
        self._snap, self._idx, self._req = snap, idx, req

    def __getitem__(self, name: str) -> Any:
        if name not in NAMES:
            raise KeyError(name)
        return getattr(self, name)

    def subset(self, keep: BoolArray) -> Estimates:
        return Estimates(self._snap, self._idx[keep], self._req, self._slo)

    def as_dict(self) -> dict[str, FloatArray]:
        return {name: np.asarray(getattr(self, name), dtype=float) for name in NAMES}

    def _l(self, name: str) -> FloatArray:
        return self._live[LIVE_ROW[name]]

    def _s(self, name: str) -> FloatArray:
        return self._static[STATIC_ROW[name]]

    @lazy
    def active(self) -> FloatArray:
        ours = self._l("in_flight") + self._l("peer_in_flight")
        return np.fmax(ours, self._l("running") + self._l("queued"))

    @lazy
    def b_max(self) -> FloatArray:
        full = self._n + self._g
        cap = np.minimum(self._s("max_batch"), self._s("kv_capacity_tokens") / full)
        return np.maximum(np.floor(cap), 1.0)

    def _tpot_at(self, batch: FloatArray) -> FloatArray:
        base, per_ctx = self._s("step_base_s"), self._s("step_per_ctx_token_s")
        return self._l("k_tpot") * (base + per_ctx * (self._ctx * batch))

    @lazy
    def tpot_s(self) -> FloatArray:
        return self._tpot_at(np.minimum(self.active + 1, self.b_max))

    @lazy
    def ttft_s(self) -> FloatArray:
        excess = np.maximum(self.active + (1 - self.b_max), 0.0)
        wait = np.ceil(excess / self.b_max) * self.tpot_s * self._g
        prefill = self._s("prefill_s_per_token") * (self._n * (1 + self._l("queued")))
        return self._l("k_ttft") * (self._s("step_base_s") + prefill + wait)

    @lazy
    def e2e_s(self) -> FloatArray:
        return self.ttft_s + self.tpot_s * (self._g - 1)

    @lazy
    def slo_capacity(self) -> FloatArray:
        if self._slo.tpot_s is None:
            return self.b_max
        base, per_ctx = self._s("step_base_s"), self._s("step_per_ctx_token_s")
        target = SLO_HEADROOM * self._slo.tpot_s / self._l("k_tpot")
        fit = np.floor((target - base) / (per_ctx * self._ctx))
        return np.clip(fit, 0.0, self.b_max)

    @lazy
    def usd_per_mtok(self) -> FloatArray:
        batch = self.slo_capacity
        tokens_per_s = batch / self._tpot_at(batch)
        out = np.full(len(batch), np.inf)
        np.divide(self._s("usd_per_s") * 1e6, tokens_per_s, out=out, where=tokens_per_s > 0)
        return out

    @lazy
    def load(self) -> FloatArray:
        return self.active / np.maximum(self.slo_capacity, 1.0)

    @lazy
    def meets_slo(self) -> FloatArray:
        ok = np.ones(len(self._idx), dtype=bool)
        if self._slo.tpot_s is not None:
            ok &= self.tpot_s <= SLO_HEADROOM * self._slo.tpot_s
        if self._slo.ttft_s is not None:
            ok &= self.ttft_s <= SLO_HEADROOM * self._slo.ttft_s
        return ok.astype(float)

    @lazy
    def kv_headroom_tokens(self) -> FloatArray:
        cap = self._s("kv_capacity_tokens")
        usage = self._l("kv_usage")
        guess = np.minimum(self.active * self._ctx / cap, 1.0)
        return (1.0 - np.where(np.isnan(usage), guess, usage)) * cap

    @lazy
    def fits_context(self) -> FloatArray:
        return (self._s("max_model_len") >= self._n + self._g).astype(float)
