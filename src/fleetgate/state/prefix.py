"""The approximate prefix index: which prompt chunks each endpoint was recently sent.

The gateway cannot see an engine's prefix cache, so it remembers what it sent (as SGLang's
cache-aware router and llm-d's prefix scorer do): per endpoint, an LRU of the chained chunk
hashes of the prompts dispatched to it (``RoutingRequest.prefix_hashes``), bounded by what
its KV cache can hold (``kv_capacity_tokens / CHUNK_TOKENS`` chunks). The engine keeps at most
that much, usually less (running requests use part of it), so the index is optimistic; it
is a routing hint, never a promise.

``record(i, hashes)`` on every dispatch (``Attempt.start``, the simulator's ``_try_next``);
``matched_at(hashes, idx)`` for the estimates and the ``prefix_cache`` scorer: how many
leading chunks each candidate holds; ``holders(hashes, limit)`` for a large fleet's
shortlist: the few endpoints holding the most of them. A chunk's owners are a bit set (one
Python int, bit i = endpoint i), so a lookup is one dict read and one AND per matched
chunk, and the candidates' bits are read in one compiled pass, however many endpoints
there are and hold the prompt. A prompt's chunks are recorded tail first, so its head is
the most recently used and is evicted last: an endpoint that holds chunk i holds chunks
0..i-1 too (as a radix tree would), and the walk can stop at the first chunk nobody holds.

Positions are the ``LiveFleet``'s; ``inherit`` carries the entries of endpoints that are
still there (matched by URL) into a new fleet's index on a reload.

May touch: numpy, numba (``routing.compiled``), routing types. Must not touch: I/O,
asyncio, clocks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from fleetgate.routing.compiled import compiled
from fleetgate.routing.plugins.prefix_cache import CHUNK_TOKENS
from fleetgate.routing.types import Endpoint, FloatArray, IntArray


class PrefixIndex:
    def __init__(self, endpoints: Sequence[Endpoint], kv_capacity_tokens: Sequence[float]) -> None:
        self._keys = [ep.url or ep.id for ep in endpoints]
        self._capacity = [max(1, int(c // CHUNK_TOKENS)) if c == c else 1
                          for c in kv_capacity_tokens]  # NaN (unknown): 1 chunk
        self._lru: list[OrderedDict[int, None]] = [OrderedDict() for _ in endpoints]
        self._owners: dict[int, int] = {}  # chunk hash -> bit set of endpoints holding it
        self._walked: tuple[Sequence[int], list[int]] | None = None  # _levels' last answer

    def record(self, i: int, hashes: Sequence[int]) -> int:
        """Endpoint ``i`` was sent a prompt with these chunk hashes; returns how many leading
        chunks it held already (the prefill its cache saves, in chunks)."""
        if not hashes:
            return 0
        lru, owners, bit = self._lru[i], self._owners, 1 << i
        self._walked = None
        held = 0
        while held < len(hashes) and hashes[held] in lru:
            held += 1
        for h in reversed(hashes):  # the head last: most recent, evicted last
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
                owners[h] = owners.get(h, 0) | bit
        while len(lru) > self._capacity[i]:
            self._drop(lru.popitem(last=False)[0], bit)
        return held

    def matched(self, hashes: Sequence[int], count: int) -> FloatArray:
        """How many leading ``hashes`` each of the first ``count`` endpoints holds."""
        return self.matched_at(hashes, np.arange(count))

    def matched_at(self, hashes: Sequence[int], idx: IntArray) -> FloatArray:
        """``matched`` for the endpoints ``idx``: a bytes copy of each matched chunk's owners
        (one for a run of chunks held by the same endpoints) and one compiled pass over
        ``idx``, at a cost that does not grow with how many endpoints hold the prompt
        (walking every holder's bit took 6.3 ms at 10,000 endpoints for a system prompt
        all of them were sent)."""
        out = np.zeros(len(idx))
        levels = self._levels(hashes)
        if levels:
            size = (len(self._lru) + 7) // 8
            rows, last, raw = [], 0, b""
            for held in levels:
                if held != last:
                    last, raw = held, held.to_bytes(size, "little")
                rows.append(raw)
            bits = np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(len(rows), size)
            _depths(bits, idx, out)
        return out

    def holders(self, hashes: Sequence[int], limit: int) -> list[int]:
        """Up to ``limit`` endpoints holding the most leading ``hashes``, deepest first (the
        shortlist's, ``routing/shortlist.py``). Where more than ``limit`` hold a depth, none
        of that depth or shallower are named: a prefix that common is in any sample of the
        fleet, and naming the first ``limit`` would herd requests onto them."""
        out: list[int] = []
        for held in reversed(self._levels(hashes)):  # each level holds the deeper ones too
            if held.bit_count() > limit:
                break
            fresh = held
            for i in out:
                fresh &= ~(1 << i)
            while fresh:
                low = fresh & -fresh
                out.append(low.bit_length() - 1)
                fresh ^= low
        return out

    def _levels(self, hashes: Sequence[int]) -> list[int]:
        """Per depth d, the endpoints holding the first d chunks (nested sets). The last
        answer is kept until the index changes: a decision asks twice (its shortlist, its
        estimates) for the same request's hashes."""
        walked = self._walked
        if walked is not None and walked[0] is hashes:
            return walked[1]
        levels: list[int] = []
        held = self._owners.get(hashes[0], 0) if hashes else 0
        while held:
            levels.append(held)
            depth = len(levels)
            held = self._owners.get(hashes[depth], 0) & held if depth < len(hashes) else 0
        self._walked = (hashes, levels)
        return levels

    def resize(self, i: int, kv_capacity_tokens: float) -> None:
        """Endpoint ``i`` reported its KV capacity: hold that many tokens' chunks."""
        self._capacity[i] = max(1, int(kv_capacity_tokens // CHUNK_TOKENS))
        lru, bit = self._lru[i], 1 << i
        while len(lru) > self._capacity[i]:
            self._drop(lru.popitem(last=False)[0], bit)

    def size(self, i: int) -> int:
        return len(self._lru[i])

    def inherit(self, old: PrefixIndex) -> None:
        """Take over ``old``'s entries for the endpoints (by URL) that are still here."""
        where = {key: j for j, key in enumerate(old._keys)}
        for i, key in enumerate(self._keys):
            j = where.get(key)
            if j is not None and old._lru[j]:
                self.record(i, list(old._lru[j])[::-1])  # same order, trimmed to fit

    def _drop(self, h: int, bit: int) -> None:
        self._walked = None
        left = self._owners[h] & ~bit
        if left:
            self._owners[h] = left
        else:
            del self._owners[h]


@compiled
def _depths(bits: np.ndarray, idx: np.ndarray, out: np.ndarray) -> None:
    """out[j] = how many leading levels (rows of ``bits``, one bit per endpoint) have
    endpoint idx[j]'s bit set; the levels are nested, so the first miss ends it."""
    for j in range(idx.shape[0]):
        byte, mask = idx[j] >> 3, np.uint8(1 << (idx[j] & 7))
        depth = 0
        while depth < bits.shape[0] and bits[depth, byte] & mask:
            depth += 1
        out[j] = depth


_depths(np.ones((1, 1), dtype=np.uint8), np.zeros(1, dtype=np.intp), np.zeros(1))  # compile
