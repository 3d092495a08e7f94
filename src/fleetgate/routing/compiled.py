"""numba for the router's inner loops: one decorator, one policy for its on-disk cache.

``compiled(fn)`` is ``numba.njit`` with IEEE arithmetic (inf and NaN, never a
ZeroDivisionError) and numba's on-disk cache wherever a writable place exists (beside the
package, the user's cache directory, or ``NUMBA_CACHE_DIR``). Where none does (a read-only
root filesystem), the kernels compile in memory at every start (a few seconds) instead of
failing the import. Each module compiles its kernels at import, never on a request.

May touch: numba. Must not touch: the gateway, I/O of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import numba

F = TypeVar("F", bound=Callable[..., Any])
log = logging.getLogger("fleetgate.routing")


def compiled(fn: F) -> F:
    try:
        return numba.njit(cache=True, error_model="numpy")(fn)  # type: ignore[return-value]
    except RuntimeError as exc:  # "cannot cache function ...: no locator available ..."
        log.warning("numba cannot cache %s (%s); compiling it in memory", fn.__name__, exc)
        return numba.njit(error_model="numpy")(fn)  # type: ignore[return-value]
