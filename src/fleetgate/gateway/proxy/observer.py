"""The observation seam of the request path: what happened, told once, to whoever listens.

The proxy service reports each request's life through these small protocols; tracing,
Prometheus metrics, cost accounting and the request log implement them (``telemetry/``).
The request path never knows which are installed. ``NOOP`` is the default.

Order of calls for one request: ``Observer.request(...)`` -> ``routed(decision)`` ->
for each upstream attempt ``attempt(...)`` -> the attempt's ``headers()`` (merged into the
upstream request, e.g. ``traceparent``), then ``first_token()`` and exactly one of
``finished(...)`` / ``failed(...)`` / ``cancelled()`` -> finally the request's ``end(status)``
(a stream ends when its last byte is sent or the client leaves, not when the handler
returns).

May touch: routing and backends types. Must not touch: HTTP, telemetry libraries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from fleetgate.gateway.proxy.request import ProxyRequest
from fleetgate.routing import Decision, Endpoint


@dataclass(frozen=True, slots=True)
class AttemptResult:
    """What one finished upstream attempt cost and delivered."""

    status: int
    usage: dict[str, Any] | None  # the engine's usage object (prompt/completion tokens)
    ttft_s: float | None  # None for a non-streamed answer
    e2e_s: float
    mean_concurrency: float  # requests in flight on the endpoint, averaged start/end (>= 1)
    # a resumed stream's continuation: the tokens other endpoints had sent before it (its
    # usage is then the whole answer's); None for an ordinary attempt
    migrated_after: int | None = None


class AttemptObserver(Protocol):
    def headers(self) -> dict[str, str]: ...
    def first_token(self, ttft_s: float) -> None: ...
    def finished(self, result: AttemptResult) -> None: ...
    def failed(self, status: int, error: str) -> None: ...
    def cancelled(self) -> None: ...


class RequestObserver(Protocol):
    def routed(self, decision: Decision) -> None: ...
    def attempt(self, endpoint: Endpoint, served_model: str, number: int) -> AttemptObserver: ...
    def end(self, status: int, error: str | None = None) -> None: ...


class Observer(Protocol):
    def request(self, req: ProxyRequest) -> RequestObserver: ...


class _NoopAttempt:
    def headers(self) -> dict[str, str]:
        return {}

    def first_token(self, ttft_s: float) -> None:
        pass

    def finished(self, result: AttemptResult) -> None:
        pass

    def failed(self, status: int, error: str) -> None:
        pass

    def cancelled(self) -> None:
        pass


class _NoopRequest:
    def routed(self, decision: Decision) -> None:
        pass

    def attempt(self, endpoint: Endpoint, served_model: str, number: int) -> AttemptObserver:
        return NOOP_ATTEMPT

    def end(self, status: int, error: str | None = None) -> None:
        pass


class NoopObserver:
    def request(self, req: ProxyRequest) -> RequestObserver:
        return NOOP_REQUEST


NOOP_ATTEMPT = _NoopAttempt()
NOOP_REQUEST = _NoopRequest()
NOOP = NoopObserver()


class CompositeObserver:
    """Fans each event out to several observers (telemetry, limits, ...). An observer with
    nothing to watch in a request answers ``NOOP_REQUEST`` (or ``NOOP_ATTEMPT``) and is
    left out of it; where one remains, its events go to it directly, with no fan."""

    def __init__(self, *observers: Observer) -> None:
        self._observers = observers

    def request(self, req: ProxyRequest) -> RequestObserver:
        return _fan([o.request(req) for o in self._observers], NOOP_REQUEST, _FanRequest)


def _fan(children: list[Any], noop: Any, fan: Any) -> Any:
    live = [c for c in children if c is not noop]
    if len(live) > 1:
        return fan(live)
    return live[0] if live else noop


class _FanRequest:
    def __init__(self, children: list[RequestObserver]) -> None:
        self._children = children

    def routed(self, decision: Decision) -> None:
        for c in self._children:
            c.routed(decision)

    def attempt(self, endpoint: Endpoint, served_model: str, number: int) -> AttemptObserver:
        return _fan([c.attempt(endpoint, served_model, number) for c in self._children],
                    NOOP_ATTEMPT, _FanAttempt)

    def end(self, status: int, error: str | None = None) -> None:
        for c in self._children:
            c.end(status, error)


class _FanAttempt:
    def __init__(self, children: list[AttemptObserver]) -> None:
        self._children = children

    def headers(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for c in self._children:
            out.update(c.headers())
        return out

    def first_token(self, ttft_s: float) -> None:
        for c in self._children:
            c.first_token(ttft_s)

    def finished(self, result: AttemptResult) -> None:
        for c in self._children:
            c.finished(result)

    def failed(self, status: int, error: str) -> None:
        for c in self._children:
            c.failed(status, error)

    def cancelled(self) -> None:
        for c in self._children:
            c.cancelled()
