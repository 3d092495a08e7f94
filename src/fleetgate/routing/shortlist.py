"""The candidates a decision looks at when a model has thousands of endpoints.

A decision over every endpoint serving a model is one pass over their rows: ~20 ns a
candidate in the estimate kernel alone, ~300 µs at 10,000 endpoints against a 50 µs
budget. Above ``SHORTLIST_FROM`` candidates the pipeline decides over a shortlist of a few
hundred instead (the full set stays the fallback when none of it is eligible):

- **every pool's window**: each pool's endpoints in a fixed shuffled order, of which a
  window of ``ceil(SHORTLIST_SIZE * pool / candidates)`` moves on by its own length every
  decision; for a picker that scores, at least ``SHORTLIST_SIZE / (2 * pools)`` (and
  ``MIN_PER_POOL``), so a small pool, often the cheap one, is looked at whole. Every
  endpoint is looked at at least every ``candidates / SHORTLIST_SIZE`` decisions;
- **the recent winners**: the endpoints this pipeline chose in its last ``RECENT``
  decisions for the model. The cost strategy fills the cheapest busy replica up to its SLO
  capacity; the replica being filled stays in view until it is full, wherever the windows
  are;
- **the session's endpoints**, for a policy with the ``affinity`` scorer: the ``SESSION``
  endpoints with the highest rendezvous weight for the session over *all* the candidates
  (computed once per session and kept), so the session's endpoint is the same as without a
  shortlist while any of them is eligible;
- **where the prompt's prefix is**: up to ``PREFIX`` endpoints holding the most of its
  leading chunks (the prefix index), so neither the ``prefix_cache`` scorer nor the
  estimates' cache hits lose them;
- **where a LoRA adapter is loaded** (up to ``ADAPTER`` of them), for a request naming one.

For a picker that draws or takes turns (``power_of_two``, ``weighted_random``,
``round_robin``: ``sampling``) the shortlist is the windows, strictly in proportion to the
pools, and the adapter's endpoints only: a fair sample. Recent winners in it were drawn
again and again (herding), and a small pool's endpoints more often than the others. For
``round_robin`` (``cycles``) the windows hold still for as many decisions as they hold
endpoints, so the picker's turn goes round each window once, then round the next: every
endpoint in turn, as without a shortlist.

Building it is one compiled pass over the shortlist (windows, then the others without
duplicates); the windows' order is a per-fleet shuffle.

Pure apart from its own counters and caches (no I/O, no clock). May touch: numpy, routing
types and plugins.
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict

import numpy as np

from fleetgate.routing.compiled import compiled
from fleetgate.routing.plugins.affinity import session_top
from fleetgate.routing.types import Endpoint, IntArray, RoutingRequest, Snapshot

SHORTLIST_FROM = 512  # a model's candidates above which a decision looks at a shortlist
SHORTLIST_SIZE = 256  # the pools' windows together
MIN_PER_POOL = 4
RECENT = 32
SESSION = 4
SESSIONS_KEPT = 4096
PREFIX = 16
ADAPTER = 32


class _Layout:
    """One model's candidates as the windows walk them (built once per fleet)."""

    def __init__(self, endpoints: tuple[Endpoint, ...], idx: IntArray, rng: random.Random) -> None:
        pools: dict[str, list[int]] = {}
        for i in idx.tolist():
            pools.setdefault(endpoints[i].pool, []).append(i)
        order: list[int] = []
        starts, sizes, shares = [], [], []
        for members in pools.values():
            rng.shuffle(members)
            starts.append(len(order))
            sizes.append(len(members))
            shares.append(math.ceil(SHORTLIST_SIZE * len(members) / len(idx)))
            order += members
        floor = max(MIN_PER_POOL, SHORTLIST_SIZE // (2 * len(pools)))
        self.order = np.array(order, dtype=np.intp)
        self.starts = np.array(starts, dtype=np.intp)
        self.sizes = np.array(sizes, dtype=np.intp)
        # per pool, how many a window holds: for a picker that scores (small pools whole), and
        # for one that draws or takes turns (strictly in proportion: a fair sample)
        self.takes = np.minimum(self.sizes, np.maximum(floor, shares))
        self.fair = np.minimum(self.sizes, shares)
        self.window, self.fair_window = int(self.takes.sum()), int(self.fair.sum())
        self.serves = np.zeros(len(endpoints), dtype=np.bool_)
        self.serves[idx] = True
        self.recent = np.full(RECENT, -1, dtype=np.intp)
        self.recent_at = 0
        self.turns = 0  # decisions made on this layout
        self.sessions: OrderedDict[str, IntArray] = OrderedDict()


class Shortlist:
    """A pipeline's shortlists: per model, the windows' layout, its recent winners and its
    sessions' endpoints, rebuilt when the fleet changes."""

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)
        self._fleet: tuple[Endpoint, ...] | None = None
        self._layouts: dict[tuple[str, str], _Layout] = {}
        self._mark = np.zeros(0, dtype=np.int64)  # per endpoint: the decision that took it
        self._tick = 0

    def pick(self, snap: Snapshot, req: RoutingRequest, idx: IntArray, sticky: bool,
             sampling: bool = False, cycles: bool = False) -> IntArray:
        """The shortlist of ``idx`` (a model's candidates) for ``req``: ``sticky`` with the
        session's endpoints, ``sampling`` the windows alone, ``cycles`` windows that move
        once per turn of them (the module doc)."""
        if self._fleet is not snap.endpoints:  # a reload or a registration: start over
            self._fleet, self._layouts = snap.endpoints, {}
            self._mark = np.zeros(len(snap.endpoints), dtype=np.int64)
        key = (req.model, req.api)
        lay = self._layouts.get(key)
        if lay is None:
            lay = self._layouts[key] = _Layout(snap.endpoints, idx, self._rng)
        extras = [_NONE if sampling else lay.recent]
        if sticky and req.session_key is not None:
            extras.append(self._session(lay, snap, idx, req.session_key))
        if req.prefix_hashes and snap.prefix is not None and not sampling:
            extras.append(np.asarray(snap.prefix.holders(req.prefix_hashes, PREFIX),
                                     dtype=np.intp))
        if snap.adapters is not None:
            loaded = snap.adapters.loaded.get(req.model)
            if loaded is not None:
                extras.append(np.flatnonzero(loaded)[:ADAPTER])
        self._tick += 1
        lay.turns += 1
        takes, window = (lay.fair, lay.fair_window) if sampling else (lay.takes, lay.window)
        step = lay.turns // window if cycles else lay.turns
        more = extras[0] if len(extras) == 1 else np.concatenate(extras)
        out = np.empty(window + len(more), dtype=np.intp)
        n = _gather(lay.order, lay.starts, lay.sizes, takes, step, self._tick, more,
                    lay.serves, self._mark, out)
        return out[:n]

    def chose(self, req: RoutingRequest, i: int) -> None:
        """The decision for ``req`` put endpoint ``i`` first: keep it in view for a while."""
        lay = self._layouts.get((req.model, req.api))
        if lay is not None:
            lay.recent[lay.recent_at % RECENT] = i
            lay.recent_at += 1

    def _session(self, lay: _Layout, snap: Snapshot, idx: IntArray, key: str) -> IntArray:
        top = lay.sessions.get(key)
        if top is None:
            top = lay.sessions[key] = session_top(snap.endpoints, idx, key, SESSION)
            if len(lay.sessions) > SESSIONS_KEPT:
                lay.sessions.popitem(last=False)
        else:
            lay.sessions.move_to_end(key)
        return top


@compiled
def _gather(order: IntArray, starts: IntArray, sizes: IntArray, takes: IntArray, step: int,
            tick: int, extras: IntArray, serves: np.ndarray, mark: np.ndarray,
            out: IntArray) -> int:
    """Each pool's window at ``step``, then the ``extras`` that serve the model and are not
    in yet (-1: an empty slot; ``mark``: per endpoint, the ``tick`` that took it); returns
    how many were written to ``out``."""
    n = 0
    for p in range(starts.shape[0]):
        first = (step * takes[p]) % sizes[p]
        for k in range(takes[p]):
            i = order[starts[p] + (first + k) % sizes[p]]
            mark[i] = tick
            out[n] = i
            n += 1
    for k in range(extras.shape[0]):
        i = extras[k]
        if i >= 0 and i < serves.shape[0] and serves[i] and mark[i] != tick:
            mark[i] = tick
            out[n] = i
            n += 1
    return n


_NONE = np.zeros(0, dtype=np.intp)
_gather(np.zeros(1, dtype=np.intp), np.zeros(1, dtype=np.intp), np.ones(1, dtype=np.intp),
        np.ones(1, dtype=np.intp), 1, 1, np.full(1, -1, dtype=np.intp), np.ones(1, dtype=np.bool_),
        np.zeros(1, dtype=np.int64), np.empty(2, dtype=np.intp))  # compile at import
