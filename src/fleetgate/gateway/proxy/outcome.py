"""The one classifier of upstream outcomes: what may be retried elsewhere, what the client is
told when nothing more can be tried, and what counts against an engine's breaker.

Before the first byte reaches the client, a connect error, a timeout, HTTP 429/502/503/504,
or an in-band SSE error frame with such a status as the first frame (SGLang's queue-full)
is a ``RetryableFailure`` of this attempt: the service moves on to the next endpoint, and
the breaker counts it (the engine's failure). A timeout is 504, any other transport failure
502. Other engine errors are the client's answer: a 4xx passes through (no verdict); the
engine refusing the gateway itself (401/403) becomes 502 and counts.

**Suspect failures** (``SuspectFailure``): an engine's 5xx answer other than 502/503/504
(typically a 500 from code that tripped over this request's content), or a connection that
dropped before the answer (``protocol``). One request's content can cause these, so they are
not counted at once: the request is tried on the next candidate, and ``settle`` judges every
suspect attempt by what that one said:

| the next endpoint | verdict on the suspect attempts |
|---|---|
| fails the same way (5xx / dropped) | a *poison request*: no breaker counts; the client gets 502 |
| answers a 4xx | the request was bad: no verdict; the client gets that 4xx |
| succeeds, same engine and served model | the engine's fault: counted |
| succeeds on another engine, or nothing else answered | counted once per tenant per failure run |

so any number of requests one tenant shapes opens no breaker (``state/breaker.py``).

When every attempt failed, the last failure picks the error: 429/503 -> 503 no capacity,
504 -> 504, else 502.

May touch: backends (UpstreamError), gateway errors, attempts. Must not touch: routing, HTTP.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetgate.backends.relay import UpstreamError
from fleetgate.gateway.errors import GatewayError, NoCapacity, UpstreamFailed, UpstreamTimeout

if TYPE_CHECKING:
    from fleetgate.gateway.proxy.attempt import Attempt

RETRYABLE_STATUS = frozenset({429, 502, 503, 504})


class RetryableFailure(Exception):
    """This attempt failed in a way another endpoint may not."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class SuspectFailure(RetryableFailure):
    """This attempt failed in a way the request itself may have caused (see the module)."""


def transport_status(exc: UpstreamError) -> int:
    return 504 if exc.kind == "timeout" else 502


def transport_failure(exc: UpstreamError, endpoint_id: str) -> RetryableFailure:
    kind = SuspectFailure if exc.kind == "protocol" else RetryableFailure
    return kind(transport_status(exc), f"{endpoint_id}: {exc}")


def engine_failure(engine_status: int) -> bool:
    """Whether an engine's non-retryable error answer is a suspect failure (a 5xx)."""
    return engine_status >= 500 and engine_status not in RETRYABLE_STATUS


def client_status(engine_status: int) -> int:
    """The status a client gets for an engine's non-retryable error answer."""
    return 502 if engine_status in (401, 403) or engine_status >= 500 else engine_status


def poison(last: SuspectFailure, attempts: int) -> GatewayError:
    """The answer to a request that failed the same way on two endpoints."""
    return UpstreamFailed(f"the request failed the same way on {attempts} endpoints (not "
                          f"counted against them); last: {last.message}",
                          code="upstream_request_failed")


def settle(suspects: list[Attempt], status: int | None, answered: Attempt | None) -> None:
    """Judge the ``suspects`` of a request by the answer that ended it: ``status`` of the
    ``answered`` attempt (None: no endpoint answered)."""
    if status is not None and 400 <= status < 500:
        return  # the request was bad: no verdict
    for attempt in suspects:
        same = (answered is not None and status == 200
                and answered.ep.spec.name == attempt.ep.spec.name
                and answered.served == attempt.served)
        attempt.blame(engine_fault=same)


def exhausted(last: RetryableFailure, attempts: int) -> GatewayError:
    """The error for a request whose every attempt failed."""
    message = f"all {attempts} attempts failed; last: {last.message}"
    if last.status in (429, 503):
        return NoCapacity(message)
    if last.status == 504:
        return UpstreamTimeout(message)
    return UpstreamFailed(message)
