"""Synthetic prompt hashes for simulated requests: shared prefixes hash alike, the rest never.

A request of prefix group g (``workload.requests.prefix``) starts with the group's
``prefix_tokens`` tokens, then its own. Two sets of chained hashes follow from that, with no
prompt text:

* the engine's prefix-cache blocks (``emulator/prefixcache.py``, ``BLOCK_TOKENS`` each), for
  the replica (``EngineSim.add``);
* the router's chunks (``routing/plugins/prefix_cache.py``, ``CHUNK_TOKENS`` each), for the
  ``prefix_cache`` scorer and the prefix index, as the gateway computes from the text.

Block j of a group's prefix hashes the same for every request of the group; a block that
reaches into a request's own tokens is unique to that request (so it fills caches, and
never hits). Hashes are plain integers, so a run is deterministic. A request without a
group (a trace, a workload without ``prefix``) has unique blocks only; where no request has
a group, nothing can ever hit, so no request gets hashes at all: the caches and the prefix
index then have nothing to do, the results are the same and a run is ~25% faster.

May touch: numpy, the request set. Must not touch: the router, the engine model, I/O.
"""

from __future__ import annotations

from fleetgate.emulator.prefixcache import BLOCK_TOKENS
from fleetgate.routing.plugins.prefix_cache import CHUNK_TOKENS
from fleetgate.sim.arrivals import RequestSet

_SPAN = 1 << 20  # blocks per prompt at most (far beyond any context length)
_SHARED = 1 << 62  # group hashes live above this, request-unique ones below


class SimPrefixes:
    def __init__(self, requests: RequestSet) -> None:
        self._req = requests
        self._shared: dict[tuple[int, int], tuple[int, ...]] = {}  # (size, group) -> hashes
        self._any = requests.prefix_tokens > 0 and bool((requests.prefix_group >= 0).any())

    def engine_blocks(self, r: int) -> tuple[int, ...]:
        return self._hashes(r, BLOCK_TOKENS)

    def routing_chunks(self, r: int) -> tuple[int, ...]:
        return self._hashes(r, CHUNK_TOKENS)

    def _hashes(self, r: int, size: int) -> tuple[int, ...]:
        if not self._any:
            return ()
        req = self._req
        group = int(req.prefix_group[r])
        shared: tuple[int, ...] = ()
        if group >= 0 and req.prefix_tokens >= size:
            key = (size, group)
            shared = self._shared.get(key) or self._shared.setdefault(
                key, shared_hashes(group, req.prefix_tokens, size))
        return _with_own(shared, r, int(req.prompt_tokens[r]) // size)


def shared_hashes(group: int, prefix_tokens: int, size: int = BLOCK_TOKENS) -> tuple[int, ...]:
    """The hashes of group ``group``'s shared prefix (the same for every request of it)."""
    if group < 0 or prefix_tokens < size:
        return ()
    start = _SHARED + group * _SPAN
    return tuple(range(start, start + prefix_tokens // size))


def block_hashes(r: int, prompt_tokens: int, group: int, prefix_tokens: int,
                 size: int = BLOCK_TOKENS) -> tuple[int, ...]:
    """Request ``r``'s hashes (``SimPrefixes`` for one request, without a request set): the
    capacity probe (``capacity.py``) gives its replica the blocks the gateway would."""
    return _with_own(shared_hashes(group, prefix_tokens, size), r, prompt_tokens // size)


def _with_own(shared: tuple[int, ...], r: int, total: int) -> tuple[int, ...]:
    own = (r + 1) * _SPAN + len(shared)
    return shared + tuple(range(own, own + total - len(shared)))
