"""The one classifier of upstream outcomes: what may be retried elsewhere, and what the client
is told when nothing more can be tried.

Before the first byte reaches the client, a connect error, a timeout, HTTP 429/502/503/504,
or an in-band SSE error frame with such a status as the first frame (SGLang's queue-full)
is a ``RetryableFailure`` of this attempt: the service moves on to the next endpoint. A
timeout is 504, any other transport failure 502. Other engine errors are the client's
answer (a 4xx passes through; the engine refusing the gateway itself, 401/403, or breaking,
5xx, becomes 502). When every attempt failed, the last failure picks the error: 429/503 ->
503 no capacity, 504 -> 504, else 502.

May touch: backends (UpstreamError), gateway errors. Must not touch: routing, HTTP.
"""

from __future__ import annotations

from fleetgate.backends.relay import UpstreamError
from fleetgate.gateway.errors import GatewayError, NoCapacity, UpstreamFailed, UpstreamTimeout

RETRYABLE_STATUS = frozenset({429, 502, 503, 504})


class RetryableFailure(Exception):
    """This attempt failed in a way another endpoint may not."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def transport_status(exc: UpstreamError) -> int:
    return 504 if exc.kind == "timeout" else 502


def transport_failure(exc: UpstreamError, endpoint_id: str) -> RetryableFailure:
    return RetryableFailure(transport_status(exc), f"{endpoint_id}: {exc}")


def client_status(engine_status: int) -> int:
    """The status a client gets for an engine's non-retryable error answer."""
    return 502 if engine_status in (401, 403) or engine_status >= 500 else engine_status


def exhausted(last: RetryableFailure, attempts: int) -> GatewayError:
    """The error for a request whose every attempt failed."""
    message = f"all {attempts} attempts failed; last: {last.message}"
    if last.status in (429, 503):
        return NoCapacity(message)
    if last.status == 504:
        return UpstreamTimeout(message)
    return UpstreamFailed(message)
